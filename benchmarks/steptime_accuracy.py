"""Predicted vs measured step time on every measured layout: in-sample, cross-validated, held out.

    python benchmarks/steptime_accuracy.py              # table + error per host and group
    python benchmarks/steptime_accuracy.py --terms      # also the predicted breakdown
    python benchmarks/steptime_accuracy.py --phases     # also forward/backward/optimizer, measured vs predicted
    python benchmarks/steptime_accuracy.py --no-loo     # skip the leave-one-out refits (a few seconds)
    python benchmarks/steptime_accuracy.py --cpu-points # CPU optimizer s/param each offloaded row implies

Three figures, kept apart:
1. In-sample: the GPU-resident constants were fitted (benchmarks/steptime_fit.py) on every
   GPU-resident row of the hosts in `FITTED_ON` (rows whose allocator had to flush and retry are
   shown but not fitted); the offloaded rows' CPU-optimizer constants come from
   measurements/cpu-adam-scaling.jsonl, and those rows were looked at while the offload model
   was built: all in-sample.
2. Leave-one-out: the same fit run again without each GPU-resident row, that row predicted by the
   constants it did not see. The estimate of the error on a layout the fit has not seen.
3. Held out: the rows of a hosts.toml entry's `heldout_results` (a batch chosen after the fit, its
   predictions committed before it ran: benchmarks/measurements/tools/heldout_predictions.py), scored against the
   live model and against the committed predictions. The live model has since been changed with
   that batch in view (ZeRO-3's hooks overlapping the kernels), so only the committed figures
   are a clean hold-out.
Beside them, the host-floor rows (a hosts.toml entry's `host_floor_results`: layouts at 128 tokens
a micro-step, each pass the host's time), the rows the host's constants were measured on
(benchmarks/steptime_fit.py --host-floor): in-sample for those, in no fit of the step rows.
Then run to run: the layouts measured in several processes (batch 10 runs each twice; batch 9's
ZeRO-3 miss was profiled five more times, benchmarks/measurements/tools/steptime_profile.py), their spread and the
error against the runs' median. Then leave-one-host-out through `zlayout calibrate`'s fit (the
calibration factors only).

Targets (docs/tradeoffs.md, DESIGN.md): held out, GPU-resident within 15% at worst,
offloaded within 25%. The CPU optimizer's threads per rank: as the row records them, else
torchrun's default (OMP_NUM_THREADS=1 for several processes, all the host's cores for one).
Measured step: the median of the third and later steps where there are three or more (the
second still warms up under ZeRO-3 and checkpointing), else the mean after the first; the same
for each phase (core.steptime.steady_step_s).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from measurements import FITTED_ON, HOSTS, ROOT, Row, load_rows  # noqa: E402, F401 (FITTED_ON, Row: read from here too)

from zlayout.core.calibrate import fit_calibration, predict_step  # noqa: E402
from zlayout.core.steptime import (CPU_OPTIMIZER_BYTES_PER_PARAM,  # noqa: E402
                                   STAGE3_HOST_CAST_BYTES_PER_PARAM, StepTimeEstimate)
from zlayout.spec import StepTimeCalibration  # noqa: E402

PREDICTIONS = ROOT / "benchmarks" / "measurements" / "h200-2026-12-01b" / "heldout2-steptime-predictions.jsonl"
HELDOUT_BATCH = "benchmarks/measurements/h200-2026-12-01b/batch-h200-heldout2.txt"
# batch 3 (benchmarks/measurements/h200-2026-12-01c/batch-h200-heldout3.txt): predicted by main at c00c30b before it ran, no
# step-time change since
PREDICTIONS_3 = ROOT / "benchmarks" / "measurements" / "h200-2026-12-01c" / "heldout3-steptime-predictions.jsonl"
# batch 4 (benchmarks/measurements/h200-2026-12-01e/batch-h200-heldout4.txt): predicted by main at 5609f6d before it ran
PREDICTIONS_4 = ROOT / "benchmarks" / "measurements" / "h200-2026-12-01e" / "heldout4-steptime-predictions.jsonl"
# batch 5 (benchmarks/measurements/h200-2026-12-01e/batch-h200-heldout5.txt): predicted by main at 666d1ca before it ran
PREDICTIONS_5 = ROOT / "benchmarks" / "measurements" / "h200-2026-12-01e" / "heldout5-steptime-predictions.jsonl"
# batch 7 (benchmarks/measurements/h200-2026-12-01f/batch-h200-heldout7.txt, three ZeRO-0 layouts): predicted by main at 47f1c5d
# (the ZeRO-0 optimizer priced as FP16_Optimizer's per-tensor walk) before it ran
PREDICTIONS_7 = ROOT / "benchmarks" / "measurements" / "h200-2026-12-01f" / "heldout7-steptime-predictions.jsonl"
# batch 9 (benchmarks/measurements/h200-2026-12-02/batch-h200-heldout9.txt, eight layouts): predicted by main at d2a3b3f (the
# host's side of a pass, from the host floor) before it ran
PREDICTIONS_9 = ROOT / "benchmarks" / "measurements" / "h200-2026-12-02" / "heldout9-steptime-predictions.jsonl"
# batch 10 (benchmarks/measurements/h200-2026-12-02b/batch-h200-heldout10.txt, six layouts each run twice in separate processes):
# predicted by main at 23711b6 (no step-time change since batch 9) before it ran
PREDICTIONS_10 = ROOT / "benchmarks" / "measurements" / "h200-2026-12-02b" / "heldout10-steptime-predictions.jsonl"
# batch 11 (benchmarks/measurements/h200-2026-12-02b/batch-h200-heldout11.txt, five offloaded layouts): predicted by main at 2e45549
PREDICTIONS_11 = ROOT / "benchmarks" / "measurements" / "h200-2026-12-02b" / "heldout11-steptime-predictions.jsonl"
# each batch's results file and the predictions committed for it (two batches may share a layout)
COMMITTED = {"heldout2-results.jsonl": PREDICTIONS, "heldout3-results.jsonl": PREDICTIONS_3,
             "heldout4-results.jsonl": PREDICTIONS_4, "heldout5-results.jsonl": PREDICTIONS_5,
             "heldout7-results.jsonl": PREDICTIONS_7, "heldout9-results.jsonl": PREDICTIONS_9,
             "heldout10-results.jsonl": PREDICTIONS_10, "heldout11-results.jsonl": PREDICTIONS_11}
TARGETS = {"GPU-resident": 0.15, "offloaded": 0.25}


def verify_inputs(flags: str):
    """The plan input and layout a `zlayout verify` command line gives (as the verify command reads it)."""
    import shlex
    from zlayout.cli import build_parser
    from zlayout.commands import verify as verify_cmd
    if verify_cmd._VERIFY_PARSER is None:
        build_parser()
    inp, layout, _, _ = verify_cmd._inputs(verify_cmd._VERIFY_PARSER.parse_args(shlex.split(flags)))
    return inp, layout


def committed_predictions() -> dict[tuple[str, str], float]:
    """The held-out batches' predictions as committed before they ran, by (results file, layout
    label): the same layout in two batches keeps each batch's own prediction."""
    from zlayout.profile.calibration import _label  # the label read_results gives a row
    out = {}
    for results, f in COMMITTED.items():
        if not f.exists():
            continue
        for line in f.read_text().splitlines():
            if line.strip():
                p = json.loads(line)
                inp, layout = verify_inputs(p["flags"])
                label = _label(inp, layout) + (f" ({inp.training.impl})" if inp.training.impl != "zlayout" else "")
                out[(results, label)] = p["predicted_step_s"]
    return out


def committed_key(m: Row) -> tuple[str, str]:
    return (m.source.split(":")[0], m.label)


def predict(m: Row, calibration: StepTimeCalibration | None = None) -> StepTimeEstimate:
    return predict_step(m.step, calibration)


def is_offloaded(m: Row) -> bool:
    return m.layout.offload_optimizer != "gpu" or m.layout.offload_param != "gpu"


def group(m: Row) -> str:
    return "offloaded" if is_offloaded(m) else "GPU-resident"


def summary(title: str, rows: list[Row], errors: list[float], with_target: bool) -> None:
    for name in TARGETS:
        errs = [abs(e) for m, e in zip(rows, errors) if group(m) == name]
        if not errs:
            continue
        mean, worst = sum(errs) / len(errs), max(errs)
        verdict = ""
        if with_target:
            verdict = f"  ({'within' if worst <= TARGETS[name] else 'OVER'} the {TARGETS[name]:.0%} target)"
        print(f"  {title:<34} {name:<13} n={len(errs):<3} mean |err| {mean:6.1%}  max |err| {worst:6.1%}{verdict}")


def cpu_points(rows: list[Row]) -> None:
    """JSON lines: the CPU optimizer's s/param per thread count that each offloaded row implies
    (measured step minus every other predicted part), for measurements/cpu-adam-scaling.jsonl."""
    for m in rows:
        if m.layout.offload_optimizer != "cpu":
            continue
        est = predict(m)
        cpu_s = m.steady_step_s - (est.step_time_s - est.cpu_optimizer_s)
        bytes_per_param = CPU_OPTIMIZER_BYTES_PER_PARAM
        if m.layout.stage == 3 and m.layout.offload_param == "gpu":
            bytes_per_param += STAGE3_HOST_CAST_BYTES_PER_PARAM  # the pageable cast: scale it out
        per_param_s = cpu_s / (m.inp.model.params / m.world) * CPU_OPTIMIZER_BYTES_PER_PARAM / bytes_per_param
        print(json.dumps({"kind": "step-derived", "host": m.host, "host_cores": HOSTS[m.host]["host_cores"],
                          "threads": m.cpu_threads_per_rank, "s_per_param": round(per_param_s, 13),
                          "layout": m.label, "measured_step_s": round(m.steady_step_s, 4)}))


# Profiles of one layout in separate processes (benchmarks/measurements/tools/steptime_profile.py's unprofiled steps:
# each phase's wall time, synchronised between phases as verify times them), beside its verify rows.
PROFILES = ROOT / "benchmarks" / "measurements" / "h200-2026-12-02b" / "profiles"


def profiled_steps() -> list[tuple[tuple[str, str], float]]:
    """((plan input, layout key), step s) of each profile: the sum over phases of the median
    unprofiled wall time, keyed as `run_to_run` keys the verify rows."""
    from statistics import median
    out = []
    for path in sorted(PROFILES.glob("*.json")):
        d = json.loads(path.read_text())
        walls = [d["phases"][p].get("timed_wall_ms") for p in ("forward", "backward", "step")]
        if all(walls):
            inp, layout = verify_inputs(d["argv"])
            out.append(((inp.model_dump_json(), layout.key), sum(median(w) for w in walls) / 1e3))
    return out


def run_to_run(rows: list[Row]) -> None:
    """One layout measured in several processes: the spread of its steady step, and the error
    against the runs' median, beside the error against each run."""
    from statistics import median
    runs: dict[tuple[str, str], list[float]] = {}
    first: dict[tuple[str, str], Row] = {}
    for m in rows:
        if m.floor or m.world != 1:
            continue
        key = (m.inp.model_dump_json(), m.layout.key)
        runs.setdefault(key, []).append(m.steady_step_s)
        first.setdefault(key, m)
    for key, step in profiled_steps():
        if key in runs:
            runs[key].append(step)
    lines = []
    for key, steps in runs.items():
        if len(steps) < 2:
            continue
        steps = sorted(steps)
        lines.append((first[key].label, len(steps), steps[0], steps[-1], median(steps),
                      predict(first[key]).step_time_s))
    if not lines:
        return
    print("\nRun to run: layouts measured in several processes (verify rows, and profiles' unprofiled steps):")
    print(f"  {'layout':<52} {'runs':>4} {'min s':>7} {'max s':>7} {'spread':>7} {'median':>7} {'pred s':>7} "
          f"{'vs median':>9} {'vs runs':>15}")
    for label, n, lo, hi, mid, pred in lines:
        print(f"  {label:<52} {n:>4} {lo:7.3f} {hi:7.3f} {hi / lo - 1:+7.1%} {mid:7.3f} {pred:7.3f} "
              f"{pred / mid - 1:+9.1%} {pred / hi - 1:+7.1%}..{pred / lo - 1:+.1%}")


def phase_errors(rows: list[Row]) -> None:
    """Mean and max |error| of each phase over the rows that timed them apart (GPU-resident)."""
    names = ("forward", "backward", "optimizer")
    errs: dict[str, list[float]] = {n: [] for n in names}
    for m in rows:
        if m.step.phases_s is None or is_offloaded(m):
            continue
        est = predict(m)
        for name, measured, predicted in zip(names, m.step.phases_s, (est.forward_s, est.backward_s, est.optimizer_s)):
            errs[name].append(abs(predicted - measured) / measured)
    for name in names:
        if errs[name]:
            print(f"  {name:<10} n={len(errs[name]):<3} mean |err| {sum(errs[name]) / len(errs[name]):6.1%}  "
                  f"max |err| {max(errs[name]):6.1%}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--terms", action="store_true", help="print the predicted breakdown too")
    parser.add_argument("--phases", action="store_true",
                        help="print forward/backward/optimizer, measured / predicted, where the row has them")
    parser.add_argument("--no-loo", action="store_true", help="skip the leave-one-out refits")
    parser.add_argument("--cpu-points", action="store_true",
                        help="print the CPU optimizer time per parameter the offloaded rows imply")
    args = parser.parse_args()
    rows = load_rows()
    if args.cpu_points:
        cpu_points(rows)
        return 0
    from steptime_fit import is_fitted, leave_one_out

    hosts = sorted({m.host for m in rows}, key=lambda h: (h not in FITTED_ON, h))
    # (host, held out, host floor): in-sample, the host floor, held out
    sections = [(h, False, False) for h in hosts]
    sections += [(h, False, True) for h in hosts if any(m.floor and m.host == h for m in rows)]
    sections += [(h, True, False) for h in hosts if any(m.held_out and m.host == h for m in rows)]
    rows = sorted(rows, key=lambda m: sections.index((m.host, m.held_out, m.floor)))  # stable: file order within
    committed = committed_predictions()
    errors = []
    for host, held, floor in sections:
        fitted = host in FITTED_ON and not held and not floor
        kind = ("in-sample (the constants were fitted on these rows)" if fitted else
                "HOST FLOOR (128 tokens a micro-step; in-sample for the host constants, measured on them)"
                if floor else "HELD OUT")
        print(f"{host}: {HOSTS[host]['description']}\n  {kind}")
        print(f"  {'layout':<52} {'source':<24} {'meas s':>7} {'pred s':>7} {'err':>7}"
              + ("   committed pred, err" if held else ""))
        for m in (m for m in rows if (m.host, m.held_out, m.floor) == (host, held, floor)):
            est = predict(m)
            err = (est.step_time_s - m.steady_step_s) / m.steady_step_s
            errors.append(err)
            extra = ""
            if held and committed_key(m) in committed:
                c = committed[committed_key(m)]
                extra = f"   {c:7.3f} {(c - m.steady_step_s) / m.steady_step_s:+7.1%}"
            if fitted and not is_offloaded(m) and not is_fitted(m.step):
                extra += f"   not fitted: {m.step.alloc_retries} allocator retries"
            print(f"  {m.label:<52} {m.source[:24]:<24} {m.steady_step_s:7.3f} {est.step_time_s:7.3f} {err:+7.1%}{extra}")
            if args.phases and m.step.phases_s is not None:
                f, b, o = m.step.phases_s
                print(f"      fwd {f:.4f}/{est.forward_s:.4f}  bwd {b:.4f}/{est.backward_s:.4f}  "
                      f"opt {o:.4f}/{est.optimizer_s:.4f}  (measured/predicted s)")
            if args.terms:
                print(f"      compute {est.compute_s:.3f} (loss {est.loss_s:.3f})  launches {est.launch_overhead_s:.3f}  "
                      f"gpu-opt {est.gpu_optimizer_s:.3f}  step-overhead {est.step_overhead_s:.3f}  "
                      f"host {est.host_overhead_s:.3f}  comm {est.comm_s:.3f}/{est.comm_total_s:.3f}  "
                      f"cpu-opt {est.cpu_optimizer_s:.3f}  pcie {est.pcie_s:.3f}  nvme {est.nvme_s:.3f}  "
                      f"mfu {est.mfu:.0%}  threads {est.cpu_threads_per_rank}")
        print()
    print("Shipped constants:")
    in_sample = [(m, e) for m, e in zip(rows, errors) if m.host in FITTED_ON and not m.held_out and not m.floor]
    for host in hosts:
        if host in FITTED_ON:
            pairs = [(m, e) for m, e in in_sample if m.host == host]
            summary(f"(1) in-sample ({host})", [m for m, _ in pairs], [e for _, e in pairs], False)
    fitted_pairs = [(m, e) for m, e in in_sample if is_offloaded(m) or is_fitted(m.step)]
    summary("(1) in-sample, rows fitted", [m for m, _ in fitted_pairs], [e for _, e in fitted_pairs], False)
    print("  phases (in-sample rows that timed them apart):")
    phase_errors([m for m, _ in in_sample])

    if not args.no_loo:
        steps = [m.step for m, _ in in_sample]
        loo = leave_one_out(steps)
        by_step = {id(s): e for s, e in loo}
        loo_rows = [m for m, _ in in_sample if id(m.step) in by_step]
        print("\n(2) Leave-one-out: benchmarks/steptime_fit.py's fit run again without each fitted GPU-resident row,"
              "\n    that row predicted by the constants it did not see (the estimate of the error on an unseen layout):")
        summary("(2) leave-one-out", loo_rows, [by_step[id(m.step)] for m in loo_rows], True)
        worst = sorted(loo_rows, key=lambda m: -abs(by_step[id(m.step)]))[:5]
        for m in worst:
            print(f"      {m.label:<52} {by_step[id(m.step)]:+7.1%}")

    floor_pairs = [(m, e) for m, e in zip(rows, errors) if m.floor]
    if floor_pairs:
        print()
        summary("(1b) host floor", [m for m, _ in floor_pairs], [e for _, e in floor_pairs], False)
        print("  phases (host-floor rows):")
        phase_errors([m for m, _ in floor_pairs])
    held_out = [(m, e) for m, e in zip(rows, errors) if m.held_out or (m.host not in FITTED_ON and not m.floor)]
    print()
    if held_out:
        summary("(3) held out, this model", [m for m, _ in held_out], [e for _, e in held_out], True)
        pre = [(m, (committed[committed_key(m)] - m.steady_step_s) / m.steady_step_s) for m, _ in held_out
               if committed_key(m) in committed]
        if pre:
            summary("(3) held out, committed predictions", [m for m, _ in pre], [e for _, e in pre], True)
            print("      (the model was changed after this batch ran, its ZeRO-3 rows looked at: ZeRO-3's hooks"
                  "\n       overlapping the kernels; 'this model' is no longer a clean hold-out, the committed"
                  "\n       predictions are, and leave-one-out is the estimate for an unseen layout)")
        for source in sorted({m.source.split(":")[0] for m, _ in held_out}):
            batch = [(m, e) for m, e in held_out if m.source.split(":")[0] == source]
            summary(f"    {source[:30]}, this model", [m for m, _ in batch], [e for _, e in batch], True)
            pre = [(m, (committed[committed_key(m)] - m.steady_step_s) / m.steady_step_s) for m, _ in batch
                   if committed_key(m) in committed]
            summary(f"    {source[:30]}, committed", [m for m, _ in pre], [e for _, e in pre], True)
        print("  phases (held-out rows):")
        phase_errors([m for m, _ in held_out])
    else:
        results = [f for desc in HOSTS.values() for f in desc.get("heldout_results", [])]
        print(f"  (3) held out: no rows yet (the step-time section of {HELDOUT_BATCH}, predictions committed in "
              f"{PREDICTIONS.relative_to(ROOT)}; its results go to benchmarks/measurements/{', '.join(results)})")

    run_to_run(rows)

    if len(hosts) > 1:
        print("\nLeave-one-host-out through `zlayout calibrate` (factors fitted on the other hosts' rows; the model's"
              "\nconstants themselves saw every in-sample row):")
        for host in hosts:
            train = [m.step for m in rows if m.host != host and not m.held_out and not m.floor]
            test = [m for m in rows if m.host == host and not m.floor]
            fit = fit_calibration(train)
            cal = fit.calibration
            errs = [(predict(m, cal).step_time_s - m.steady_step_s) / m.steady_step_s for m in test]
            factors = " ".join(f"{g}={getattr(cal, g + '_factor'):.3f}" for g in
                               ("gpu", "overhead", "cpu_optimizer", "transfer"))
            print(f"  {host} held out; factors from {len(train)} rows: {factors}")
            summary(f"{host} held out, calibrated", test, errs, True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
