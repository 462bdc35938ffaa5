"""Predicted vs measured step time on every measured layout (the steps after the first).

    python benchmarks/steptime_accuracy.py           # table + mean/max error per group
    python benchmarks/steptime_accuracy.py --terms   # also the predicted breakdown

Targets (docs/tradeoffs.md): within 25% on GPU-resident layouts, 50% on offloaded ones.

The CPU optimizer's threads: a row may say how many threads each rank ran with
(`cpu_threads`, or `omp_num_threads`); otherwise torchrun's default is assumed: it sets
OMP_NUM_THREADS=1 when it starts several processes, and leaves it unset for one.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from measurements import MeasuredLayout, load_measured  # noqa: E402

from zlayout.core.comm import estimate_comm  # noqa: E402
from zlayout.core.steptime import StepTimeEstimate, estimate_step_time  # noqa: E402


def cpu_threads_per_rank(m: MeasuredLayout) -> int | None:
    for key in ("cpu_threads", "omp_num_threads"):
        if m.row.get(key):
            return int(m.row[key])
    return 1 if m.row["world"] > 1 else None


# Host memory bandwidth of the measuring machines (1-2 GPU slices of H200 hosts, 16 cores
# per GPU), pinned here so a change of the planner's default does not move the calibration.
MEASURED_HOST_MEM_GBPS = 200.0


def predict(m: MeasuredLayout) -> StepTimeEstimate:
    hardware = m.inp.hardware.model_copy(update={"host_mem_gbps": MEASURED_HOST_MEM_GBPS})
    inp = m.inp.model_copy(update={"hardware": hardware})
    comm = estimate_comm(inp, m.layout)
    return estimate_step_time(inp, m.layout, comm, cpu_threads_per_rank=cpu_threads_per_rank(m))


def is_offloaded(m: MeasuredLayout) -> bool:
    return m.layout.offload_optimizer != "gpu" or m.layout.offload_param != "gpu"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--terms", action="store_true", help="print the predicted breakdown too")
    args = parser.parse_args()
    rows = [m for m in load_measured() if m.steady_step_s]
    errors: dict[str, list[float]] = {"GPU-resident": [], "offloaded": []}
    print(f"{'layout':<52} {'source':<24} {'meas s':>7} {'pred s':>7} {'err':>7}")
    for m in rows:
        est = predict(m)
        measured = m.steady_step_s
        err = (est.step_time_s - measured) / measured
        errors["offloaded" if is_offloaded(m) else "GPU-resident"].append(abs(err))
        print(f"{m.label:<52} {m.source[:24]:<24} {measured:7.3f} {est.step_time_s:7.3f} {err:+7.1%}")
        if args.terms:
            print(f"    compute {est.compute_s:.3f}  gpu-opt {est.gpu_optimizer_s:.3f}  "
                  f"z3-hooks {est.stage3_overhead_s:.3f}  comm {est.comm_s:.3f}/{est.comm_total_s:.3f}  "
                  f"cpu-opt {est.cpu_optimizer_s:.3f}  pcie {est.pcie_s:.3f}  nvme {est.nvme_s:.3f}  "
                  f"mfu {est.mfu:.0%}  threads {cpu_threads_per_rank(m)}")
    print()
    targets = {"GPU-resident": 0.25, "offloaded": 0.50}
    for group, errs in errors.items():
        if not errs:
            print(f"{group:<13} no measured layouts")
            continue
        mean, worst = sum(errs) / len(errs), max(errs)
        verdict = "within" if worst <= targets[group] else "OVER"
        print(f"{group:<13} n={len(errs):<3} mean |err| {mean:6.1%}  max |err| {worst:6.1%}  "
              f"({verdict} the {targets[group]:.0%} target)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
