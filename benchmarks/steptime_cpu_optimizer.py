"""The CPU optimizer's rate (core.steptime.CPU_OPTIMIZER_S_PER_PARAM_ONE_THREAD) against every
offloaded one-GPU verify row: the least-squares factor on the rows measured before a held-out
batch, and the step errors it gives in-sample and on the batches from that one on.

    python benchmarks/steptime_cpu_optimizer.py [--cards DIR] [--held-out h200-2026-12-31g]

Rows: every GPU verify run under benchmarks/measurements/ with the optimizer on the CPU and one
GPU (`measurements.verify_results`' runs, each once), planned with the cards
`steptime_relearned.py --cards DIR` learns (default a temporary folder: about ten seconds a
config the first time). The fit scales the CPU optimizer's part of
the step (`StepTimeCalibration.cpu_optimizer_factor`, what `zlayout calibrate` fits for one
cluster) to minimise the rows' squared relative errors; factor 1.00 is the shipped constant.
Figures are split by the host kind (the GPU named) because the lent nodes' hosts differ.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.steptime_relearned import MEASUREMENTS, card_rows, relearn  # noqa: E402

FACTORS = [round(0.60 + 0.01 * i, 2) for i in range(61)]  # 0.60 .. 1.20


def offloaded_rows(held_out: str):
    """(row, host kind, 'fit' or 'held out') of each offloaded one-GPU run, from the results
    `benchmarks.measurements.verify_results` keeps (not a run of another model than the planned
    one), each run once (a batch's merged results file repeats its calls' lines)."""
    from benchmarks.measurements import verify_results
    from zlayout.profile.calibration import read_results

    kept: dict[Path, list[dict]] = defaultdict(list)
    for path, result in verify_results():
        kept[path].append(result)
    seen: set[tuple] = set()
    for path, results in sorted(kept.items()):
        lines = path.read_text().splitlines()
        batch = path.relative_to(MEASUREMENTS).parts[0]
        for row in read_results([str(path)])[0]:
            run = (row.inp.model.name, row.label, row.measured_step_s)
            if row.layout.offload_optimizer == "gpu" or row.inp.hardware.world != 1 or run in seen \
                    or json.loads(lines[int(row.source.rsplit(":", 1)[1]) - 1]) not in results:
                continue
            seen.add(run)
            kind = "h100" if "h100" in row.inp.hardware.gpu.name.lower() else "h200"
            # a batch folder from the held-out one on (a file at the top: the first runs, 2026-11-30)
            later = path.parent != MEASUREMENTS and batch >= held_out
            yield row, kind, "held out" if later else "fit"


def errors(rows, factor: float) -> list[float]:
    from zlayout.core.calibrate import predict_step
    from zlayout.spec import StepTimeCalibration

    cal = StepTimeCalibration(cpu_optimizer_factor=factor)
    return [predict_step(row, cal).step_time_s / row.measured_step_s - 1 for row in rows]


def summary(errs: list[float]) -> str:
    if not errs:
        return "no rows"
    worst = max(errs, key=abs)
    return (f"n={len(errs):3d}  mean {sum(errs) / len(errs):+6.1%}  mean |err| {sum(map(abs, errs)) / len(errs):5.1%}"
            f"  worst {worst:+6.1%}  beyond 25%: {sum(abs(e) > 0.25 for e in errs)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cards", type=Path, help="folder for the relearned cards (kept; default: a temporary one)")
    parser.add_argument("--held-out", default="h200-2026-12-31g",
                        help="the first batch folder left out of the fit (it and later ones are scored apart)")
    args = parser.parse_args(argv)

    from zlayout import cards

    with tempfile.TemporaryDirectory() as scratch:
        out = args.cards or Path(scratch)
        relearn(card_rows(None)[1], out)
        os.environ[cards.CARDS_DIR_ENV] = str(out)
        rows = list(offloaded_rows(args.held_out))
        fit = [row for row, _, part in rows if part == "fit"]
        if not fit:
            print("no offloaded rows before", args.held_out)
            return 1
        rms = {f: math.sqrt(sum(e * e for e in errors(fit, f)) / len(fit)) for f in FACTORS}
        best = min(rms, key=rms.get)
        print(f"{len(rows)} offloaded one-GPU rows, {len(fit)} before {args.held_out} (fitted on)")
        print(f"least-squares factor on them: {best:.2f} (rms {rms[best]:.1%}; at 1.00: {rms[1.0]:.1%})")
        for factor in sorted({1.0, best}):
            print(f"\nfactor {factor:.2f}")
            for part in ("fit", "held out"):
                for kind in ("h100", "h200", None):
                    chosen = [row for row, k, p in rows if p == part and (kind is None or k == kind)]
                    if chosen:
                        print(f"  {part:8s} {kind or 'all':4s}  {summary(errors(chosen, factor))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
