"""How long break-even takes for every layout, and a full plan (the TUI's per-keystroke budget: 20 ms).

    python benchmarks/speed_breakeven.py

Cases per model: "cold" (every cache empty, the family's shape table already built once),
"keystroke" (a new input, e.g. the sequence length changed: break-even recomputed, the
family's shapes partly cached), "warm" (the same input again: memoized), and a full
`make_plan` (memory, comm, step time, break-even, recommendation) on a keystroke.
Figures are the median of several repetitions, in milliseconds.
"""

from __future__ import annotations

import statistics
import time

from zlayout import catalog
from zlayout.core import breakeven
from zlayout.core.breakeven import break_even, crossovers
from zlayout.core.plan import make_plan
from zlayout.spec import HardwareSpec, ModelSpec, PlanInput, TrainingSpec, all_layouts

REPEATS = 7


def make_input(model: ModelSpec, seq: int, gpus_per_node: int = 8) -> PlanInput:
    hardware = HardwareSpec(gpu=catalog.load_gpu("h200"), gpus_per_node=gpus_per_node,
                            intra_link=catalog.load_link("nvlink4"))
    return PlanInput(model=model, hardware=hardware, training=TrainingSpec(seq=seq, micro_batch=1))


def all_break_even(inp: PlanInput) -> None:
    for layout in all_layouts():
        break_even(inp, layout)


def timed_ms(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def count_memory_evaluations(inp: PlanInput) -> int:
    original = breakeven.estimate_memory
    calls = 0

    def counting(*args, **kwargs):
        nonlocal calls
        calls += 1
        return original(*args, **kwargs)

    breakeven.estimate_memory = counting
    try:
        breakeven.clear_caches()
        all_break_even(inp)
    finally:
        breakeven.estimate_memory = original
    return calls


def main() -> None:
    models = [catalog.load_model("llama3-8b"), catalog.load_model("reference-gpt"),
              ModelSpec(name="custom (depth)", layers=8, hidden=4096, heads=32, vocab=32000)]
    print(f"{'model':16} {'cold':>8} {'keystroke':>10} {'warm':>8} {'make_plan':>10} {'crossovers':>11} "
          f"{'evals':>6}   (ms; median of {REPEATS}; all {len(all_layouts())} layouts)")
    for model in models:
        make_plan(make_input(model, 1000))  # builds the family's shape table once
        cold, keystroke, warm, plan, cross = [], [], [], [], []
        for i in range(REPEATS):
            inp = make_input(model, 2048 + 64 * i)
            breakeven.clear_caches()  # break_even's own memo too
            cold.append(timed_ms(lambda: all_break_even(inp)))
            warm.append(timed_ms(lambda: all_break_even(inp)))
            moved = make_input(model, 4096 + 64 * i)  # the user typed a new sequence length
            keystroke.append(timed_ms(lambda: all_break_even(moved)))
            cross.append(timed_ms(lambda: crossovers(moved)))
            typed = make_input(model, 3000 + 64 * i)
            plan.append(timed_ms(lambda: make_plan(typed)))
        evals = count_memory_evaluations(make_input(model, 2500))
        print(f"{model.name:16} {statistics.median(cold):8.1f} {statistics.median(keystroke):10.1f} "
              f"{statistics.median(warm):8.2f} {statistics.median(plan):10.1f} "
              f"{statistics.median(cross):11.1f} {evals:6d}")


if __name__ == "__main__":
    main()
