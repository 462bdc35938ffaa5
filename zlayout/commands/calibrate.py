"""`zlayout calibrate RESULTS...`: fit the step-time model to this cluster's own verify runs.

RESULTS are `zlayout verify` result.json files, a batch's results.jsonl, or folders holding
them. Complete GPU runs are used; the rest are listed as skipped. The fitted factors go to a
calibration TOML (`--out`) that plan, breakeven, export and verify load with `--calibration
FILE`; no measured row ends up further from its measurement than before.
"""

from __future__ import annotations

import argparse
import json

from zlayout.cli import UsageError


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("calibrate", help="fit step-time factors to your own verify results",
                            description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", metavar="RESULTS",
                        help="result.json, results.jsonl, or a folder of them (from zlayout verify)")
    parser.add_argument("--out", default="zlayout-calibration.toml",
                        help="calibration file to write (default zlayout-calibration.toml); an existing "
                             "file is replaced only if it is a zlayout calibration and --force is given")
    parser.add_argument("--force", action="store_true",
                        help="replace an existing calibration file at --out")
    parser.add_argument("--host-cores", type=int, default=None,
                        help="CPU cores per node of the hosts that ran the results, where a result "
                             "does not record them (default: the GPU preset's)")
    parser.add_argument("--json", action="store_true", help="print the calibration as one JSON object")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from zlayout import __version__
    from zlayout.core.calibrate import fit_calibration, merge_repeats
    from zlayout.profile.calibration import (CalibrationError, absurd_fit, calibration_document, read_results,
                                             write_calibration)

    if args.host_cores is not None and not 0 < args.host_cores <= 65536:
        raise UsageError(f"--host-cores must be a core count from 1 to 65536, not {args.host_cores}")
    check_calibration_out(args.out, args.force)  # before reading the results: nothing to lose
    try:
        rows, skipped = read_results(args.results, default_host_cores=args.host_cores)
    except CalibrationError as exc:
        raise UsageError(str(exc)) from None
    if not rows:
        why = f" ({skipped[0]}{'; ...' if len(skipped) > 1 else ''})" if skipped else ""
        raise UsageError(f"no complete GPU verification in {' '.join(args.results)}{why}: give the "
                         "result.json or results.jsonl of `zlayout verify` runs on GPUs")
    fit = fit_calibration(merge_repeats(rows), source=None)
    absurd = absurd_fit(fit)
    if absurd is not None:
        raise UsageError(f"not writing {args.out}: {absurd}: check that the results' times are seconds of "
                         "complete GPU runs on this cluster")
    check_calibration_out(args.out, args.force)  # again: the results may have taken a while
    try:
        path = write_calibration(args.out, fit, __version__)
    except OSError as exc:
        raise UsageError(f"cannot write --out {args.out}: {exc.strerror}; choose another path") from None
    doc = calibration_document(fit, __version__)
    noisy = host_bound_rows(fit)
    if args.json:
        print(json.dumps({**doc, "created": doc["created"].isoformat(), "path": str(path),
                          "skipped": skipped, "host_bound_rows": [r.row.label for r in noisy]}))
        return 0
    print(f"{'layout':<56} {'threads':>7} {'meas s':>8} {'before':>8} {'after':>8}")
    for r in fit.rows:
        threads = r.row.cpu_threads_per_rank or r.row.inp.hardware.cpu_threads_per_rank
        print(f"{r.row.label[:56]:<56} {threads:>7} {r.row.measured_step_s:8.3f} "
              f"{r.error_before:+8.1%} {r.error_after:+8.1%}")
    (mb, xb), (ma, xa) = fit.before, fit.after
    factors = ", ".join(f"{k} {v:.3f}" for k, v in doc["factors"].items())
    print(f"\n{len(fit.rows)} rows: mean |error| {mb:.1%} -> {ma:.1%}, max {xb:.1%} -> {xa:.1%}")
    print(f"factors: {factors} (free to move: {', '.join(fit.fitted_groups) or 'none'}; a factor stays "
          "where moving it would leave a row further from its measurement)")
    single = [r for r in noisy if r.row.runs == 1]
    if single:
        print(f"note: {len(single)} of the {len(fit.rows)} rows {'is' if len(single) == 1 else 'are'} host-bound and "
              f"{'one run' if len(single) == 1 else 'one run each'} (the host's Python sets a quarter or more of the "
              "step): such a step varies from process to process on one host (one layout: 0.438-0.686 s in three "
              "processes), so one run is a noisy row. Give several runs of each layout (a verify --batch that "
              "repeats its line): calibrate fits their median")
    for line in skipped:
        print(f"skipped {line}")
    print(f"wrote {path}; use it with --calibration {path}")
    return 0


def host_bound_rows(fit) -> list:
    """The rows (`RowFit`) whose step the shipped model prices host-bound (steptime.host_bound_share);
    not matched by label: two models of one shape and layout share one."""
    from zlayout.core.calibrate import predict_step
    from zlayout.core.steptime import host_bound_share

    return [r for r in fit.rows
            if host_bound_share((est := predict_step(r.row)).host_overhead_s, est.step_time_s) is not None]


def check_calibration_out(out: str, force: bool) -> None:
    """export's rule (zlayout.outfile) for --out: an empty name or a directory is refused, a link is
    never replaced, an existing file only when it is a calibration and --force is given."""
    from pathlib import Path

    from zlayout.outfile import OutFileError, check_replaceable
    from zlayout.profile.calibration import CalibrationError

    if not out.strip():
        raise UsageError("--out is empty: give a file name, e.g. --out zlayout-calibration.toml")
    if out.endswith("/"):
        raise UsageError(f"--out {out} names a directory: give a file name, e.g. "
                         f"--out {out}zlayout-calibration.toml")
    try:
        check_replaceable(Path(out), _read_small_calibration, replace=force,
                          not_ours="Not replacing a file that is not a zlayout calibration: move it aside "
                                   "or choose another --out",
                          exists_message=lambda _: f"{out} already exists (a zlayout calibration): add --force to "
                                                   "replace it or choose another --out",
                          unreadable=lambda exc: isinstance(exc, CalibrationError))
    except OutFileError as exc:
        raise UsageError(str(exc)) from None


def _read_small_calibration(path):
    """load_calibration, refusing at once a file far bigger than any calibration (a data file
    given as --out is not read into memory to find out it is not one)."""
    from zlayout import tomlsafe
    from zlayout.profile.calibration import CalibrationError, load_calibration

    size = path.stat().st_size
    if size > tomlsafe.MAX_TOML_BYTES:
        raise CalibrationError(f"{path} is {size:,} bytes, not a zlayout calibration")
    return load_calibration(path)
