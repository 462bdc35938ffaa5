"""How fast the planner answers: `zlayout plan` wall time against a bare Python start, and every
layout in-process.

    python benchmarks/speed_plan.py [--runs 9]

Targets (the project's design): `zlayout plan` under 0.25 s, and at most 3x a bare
`python -c "import pydantic"` started on the same machine in the same minute (runs alternate
plan, baseline, plan, ...; the ratio is taken pair by pair, so a machine whose speed drifts
still gives a fair ratio); every layout evaluated in-process under 5 ms; torch and deepspeed
never imported on that path. "cached": the allocator replays kept by an earlier plan with the
same inputs ($XDG_CACHE_HOME/zlayout/replay.json); "first": an empty cache folder each run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from zlayout import catalog
from zlayout.core.memory import estimate_memory
from zlayout.core.plan import make_plan
from zlayout.spec import HardwareSpec, PlanInput, TrainingSpec, all_layouts

CONTRACT = ["plan", "--layers", "8", "--hidden", "4096", "--heads", "32", "--vocab", "32000", "--seq", "2048",
            "--micro-batch", "2", "--gpus-per-node", "2", "--gpu", "h200", "--stage", "3", "--json"]
EVERY_LAYOUT = [a for a in CONTRACT if a not in ("--stage", "3")]
LARGE = ["plan", "--preset", "llama3-70b", "--gpu", "h100", "--gpus-per-node", "8", "--nodes", "8",
         "--checkpointing", "full", "--json"]
# a model_type without a hand reader (issue 27): its shape from the common keys, the rest from its shipped card
OLMOE = ["plan", "--hf-config", str(Path(__file__).resolve().parent.parent / "tests" / "hf" / "configs" / "published"
                                    / "OLMoE-1B-7B-0924.json"), "--gpus-per-node", "8", "--stage", "3", "--json"]
BASELINE = [sys.executable, "-c", "import pydantic"]


def wall_s(cmd: list[str], env: dict[str, str] | None = None) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env=env)
    return time.perf_counter() - t0


def paired(args: list[str], runs: int, cached: bool) -> tuple[float, float, float, float]:
    """(plan median s, plan max s, baseline median s, median of the pair-by-pair ratios), after
    one pair not counted."""
    cmd = [sys.executable, "-m", "zlayout", *args]
    plans, baselines, ratios = [], [], []
    with tempfile.TemporaryDirectory() as kept:
        for index in range(runs + 1):
            cache = kept if cached else tempfile.mkdtemp(dir=kept)
            plan = wall_s(cmd, {**os.environ, "XDG_CACHE_HOME": cache})
            baseline = wall_s(BASELINE)
            if index:
                plans.append(plan)
                baselines.append(baseline)
                ratios.append(plan / baseline)
    return statistics.median(plans), max(plans), statistics.median(baselines), statistics.median(ratios)


def per_call(fn, runs: int = 200) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(runs):
        fn()
    return (time.perf_counter() - t0) / runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9, help="timed pairs per command (default 9)")
    runs = parser.parse_args().runs
    if sys.flags.dont_write_bytecode:
        print("note: PYTHONDONTWRITEBYTECODE is set: modules without a cached .pyc are compiled on "
              "every start (python -m compileall zlayout once makes the figures an install's)")
    print(f"{'command (wall, median of ' + str(runs) + ')':52} {'plan':>7} {'max':>7} {'python+pydantic':>15} {'ratio':>6}")
    for label, args in (("zlayout plan --json, one layout (the contract)", CONTRACT),
                        ("zlayout plan --json, every layout", EVERY_LAYOUT),
                        ("zlayout plan --preset llama3-70b, 8x8 H100", LARGE),
                        ("zlayout plan --hf-config OLMoE (card only), ZeRO-3", OLMOE)):
        for cached in (True, False):
            plan, worst, baseline, ratio = paired(args, runs, cached)
            name = f"{label}, {'cached' if cached else 'first'}"
            print(f"{name:52} {plan * 1e3:5.0f}ms {worst * 1e3:5.0f}ms {baseline * 1e3:13.0f}ms {ratio:5.2f}x")
    code = ("import sys, io, contextlib\nfrom zlayout.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n    main(%r)\n"
            "print([m for m in ('torch', 'deepspeed', 'zlayout.profile', 'textual') if m in sys.modules])" % CONTRACT)
    heavy = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    print(f"torch/deepspeed/zlayout.profile/textual in sys.modules after a plan: {heavy}")

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
