"""How fast the planner answers: `zlayout plan --json` wall time, and every layout in-process.

    python benchmarks/speed_plan.py

Targets (the project's design): `zlayout plan --json` well under 0.5 s on a 2-core login node; every
layout evaluated in-process under 5 ms; torch and deepspeed never imported on that path.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

from zlayout import catalog
from zlayout.core.memory import estimate_memory
from zlayout.core.plan import make_plan
from zlayout.spec import HardwareSpec, PlanInput, TrainingSpec, all_layouts

CONTRACT = ["plan", "--layers", "8", "--hidden", "4096", "--heads", "32", "--vocab", "32000", "--seq", "2048",
            "--micro-batch", "2", "--gpus-per-node", "2", "--gpu", "h200", "--stage", "3", "--json"]


def wall(cmd: list[str], runs: int = 7) -> list[float]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return times


def per_call(fn, runs: int = 200) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(runs):
        fn()
    return (time.perf_counter() - t0) / runs


def main() -> None:
    times = wall([sys.executable, "-m", "zlayout", *CONTRACT])
    print(f"zlayout plan --json (one layout), wall: median {statistics.median(times) * 1e3:.0f} ms, "
          f"max {max(times) * 1e3:.0f} ms over {len(times)} runs")
    times = wall([sys.executable, "-m", "zlayout", *[a for a in CONTRACT if a not in ("--stage", "3")]])
    print(f"zlayout plan --json (every layout), wall: median {statistics.median(times) * 1e3:.0f} ms")
    code = ("import sys, io, contextlib\nfrom zlayout.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n    main(%r)\n"
            "print([m for m in ('torch', 'deepspeed') if m in sys.modules])" % CONTRACT)
    heavy = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    print(f"torch/deepspeed in sys.modules after a plan: {heavy}")

    inp = PlanInput(model=catalog.load_model("llama3-70b"),
                    hardware=HardwareSpec(gpu=catalog.load_gpu("h100"), gpus_per_node=8, nodes=8,
                                          intra_link=catalog.load_link("nvlink4"),
                                          inter_link=catalog.load_link("ib-ndr")),
                    training=TrainingSpec(seq=4096, micro_batch=1, grad_accum=8, checkpointing="full"))
    layouts = all_layouts()
    memory_s = per_call(lambda: [estimate_memory(inp, lay) for lay in layouts])
    print(f"memory of all {len(layouts)} layouts in-process: {memory_s * 1e3:.2f} ms "
          f"({memory_s / len(layouts) * 1e6:.0f} µs per layout)")
    plan_s = per_call(lambda: make_plan(inp, with_breakeven=False), runs=100)
    print(f"make_plan without break-even (memory, comm, step time, recommendation): {plan_s * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
