"""Issue 28's edge, predicted before the runs: break-even at zero headroom (loop deepspeed) for
shape E and a new shape F on both allocators, and the plan's figures at N and N+1 layers.

    python benchmarks/measurements/h200-2026-12-02d/predict_edge.py > benchmarks/measurements/h200-2026-12-02d/edge-predictions.txt

Lines: `shape allocator layers flags` (the format of ../h200-2026-12-02c/heldout/edge-predictions.txt,
read by its call3.sh: `zlayout verify FLAGS --layers N --allocator A`), each after a comment with
the plan's figures at that count.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from zlayout.cli import build_parser, plan_input_from_args  # noqa: E402
from zlayout.core.breakeven import break_even  # noqa: E402
from zlayout.core.plan import plan_layout  # noqa: E402
from zlayout.spec import Layout  # noqa: E402

GiB = 2**30
COMMON = "--gpus-per-node 1 --gpu h200 --host-cores 16 --headroom 0"
VERIFY_ONLY = "--steps 3"
SHAPES = {
    # held out at aeac6af: 101 and 102 ran out of memory, smaller counts not run
    "E": "--hidden 1024 --heads 8 --kv-heads 4 --ffn 4096 --vocab 50304 --mlp gelu --norm layernorm "
         "--seq 32768 --micro-batch 1 --stage 1",
    # new: a transformers Llama-class GQA model at ZeRO-1, seq 8192 x 2 (16384 tokens a step)
    "F": "--impl hf --hidden 2560 --heads 20 --kv-heads 4 --ffn 6912 --vocab 32000 --mlp swiglu --norm rmsnorm "
         "--no-bias --seq 8192 --micro-batch 2 --stage 1",
}


def figures(flags: str, allocator: str, layers: int) -> str:
    args = build_parser().parse_args(["plan", *flags.split(), *COMMON.split(), "--layers", str(layers),
                                      "--allocator", allocator, "--loop", "deepspeed"])
    inp = plan_input_from_args(args)
    lp = plan_layout(inp, Layout(stage=args.stage), with_breakeven=False)
    m, fit = lp.memory, lp.memory.gpu_fit
    return (f"L{layers}: {fit.state}; peak allocated {m.gpu_peak_allocated_bytes / GiB:.2f}, reserved "
            f"{m.gpu_peak_reserved_bytes / GiB:.2f}, device used {m.gpu_device_used_bytes / GiB:.2f}, needs "
            f"{fit.needed_bytes / GiB:.2f} of {fit.allocatable_bytes / GiB:.2f} GiB, retries a step "
            f"{m.gpu_flushes_per_step if m.gpu_flushes_per_step is not None else '-'}, step {lp.time.step_time_s:.3f} s")


def main() -> int:
    print("# Issue 28's edge, predicted before the runs (zlayout breakeven --headroom 0, loop deepspeed, one H200),")
    print("# by predict_edge.py: the largest layer count that trains (N), then N and N+1 for a bisection.")
    print("# Figures in GiB; 'needs' is what the step needs against what cudaMalloc can hand out (139.80).")
    print("# shape allocator layers flags")
    for shape, flags in SHAPES.items():
        for allocator in ("default", "expandable"):
            args = build_parser().parse_args(["plan", *flags.split(), *COMMON.split(), "--layers", "1",
                                              "--allocator", allocator, "--loop", "deepspeed"])
            inp = plan_input_from_args(args)
            result = break_even(inp, Layout(stage=args.stage))
            n = result.max_model.layers if result.max_model else 0
            print(f"# {shape} {allocator}: predicted largest {n}")
            for layers in (n, n + 1):
                print(f"# {figures(flags, allocator, layers)}")
                print(f"{shape} {allocator} {layers} {flags} {COMMON} {VERIFY_ONLY}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
