"""Where the default allocator's verdict turns over: a depth sweep replayed on cards of several sizes.

    python benchmarks/edge_bands.py                       # Qwen3-8B, ZeRO-1, 2 x 4096, one H200, 18-25 layers
    python benchmarks/edge_bands.py --layers 56-66 -- --layers 0 --hidden 2048 --heads 16 --kv-heads 8 \
        --ffn 5632 --vocab 32000 --impl hf --seq 16384 --micro-batch 1 --stage 2 --gpu h200

For each depth: the allocated peak, then whether the replay (`allocator_sim.replay_at_capacity`)
runs its steps on the whole card and on cards 1, 2, ... GiB smaller ("rN": it ran, freeing its
cache N times a step; "OOM": a request found no room after the retry), and the plan's verdict at
--headroom 0 and at the default 5%. Near the edge best fit is chaotic in the card's size: a
depth can run out where a deeper one runs, and run on a slightly smaller card. The plan's verdict
asks the step to run on the whole card and on the card less the headroom
(`memory.allocator_on_the_card`), so the headroom covers where the blocks land as well as how
many bytes they hold. Nothing here is measured: the replay's own figures, no GPU needed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from zlayout.cli import UsageError, build_parser, layout_from_args, plan_input_from_args  # noqa: E402
from zlayout.core.allocator_sim import replay_at_capacity  # noqa: E402
from zlayout.core.memory import estimate_memory, small_pool_bytes  # noqa: E402

GiB = 2**30
DEFAULT = ["--hf-config", str(ROOT / "tests" / "hf" / "configs" / "published" / "Qwen3-8B.json"), "--stage", "1",
           "--seq", "4096", "--micro-batch", "2", "--gpus-per-node", "1", "--gpu", "h200"]


def depth_range(text: str) -> tuple[int, int]:
    first, sep, last = text.partition("-")
    if not (sep and first.isdigit() and last.isdigit() and 1 <= int(first) <= int(last) <= 1000):
        raise argparse.ArgumentTypeError(f"{text!r}: FIRST-LAST, 1 <= FIRST <= LAST <= 1000")
    return int(first), int(last)


def gib_steps(text: str) -> int:
    if not (text.isdigit() and int(text) <= 64):
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number of GiB, 0-64")
    return int(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=depth_range, default=(18, 25), help="depths to sweep, FIRST-LAST (default 18-25)")
    parser.add_argument("--cuts", type=gib_steps, default=8, help="cards up to this many GiB smaller, 0-64 (default 8)")
    parser.add_argument("plan_args", nargs="*", help="after --: `zlayout plan` arguments (one layout: --stage)")
    args = parser.parse_args()
    first, last = args.layers
    plan_args = args.plan_args or DEFAULT
    cli = build_parser()
    try:
        checked = cli.parse_args(["plan", *plan_args, "--layers", str(first)])
        plan_input_from_args(checked)
        if layout_from_args(checked) is None:
            raise UsageError("name one layout (--stage, --offload-optimizer, --offload-param)")
    except UsageError as err:
        sys.exit(f"edge_bands: {err}")
    print(f"{'layers':>6} {'alloc GiB':>9}  " + " ".join(f"{'-' + str(c):>4}" if c else "card" for c in range(args.cuts + 1))
          + "   headroom 0   headroom 5%")
    for layers in range(first, last + 1):
        ns = cli.parse_args(["plan", *plan_args, "--layers", str(layers)])
        inp = plan_input_from_args(ns)
        layout = layout_from_args(ns)
        exact = estimate_memory(inp.model_copy(update={"headroom_fraction": 0.0}), layout)
        default = estimate_memory(inp.model_copy(update={"headroom_fraction": 0.05}), layout)
        gpu = inp.hardware.gpu
        context = exact.gpu_device_used_bytes - exact.gpu_peak_reserved_bytes
        card = gpu.memory_bytes - gpu.driver_reserved_bytes - context - small_pool_bytes(inp.model, inp.training)
        cells = []
        for cut in range(args.cuts + 1):
            replay = replay_at_capacity(inp, layout, card - cut * GiB)
            cells.append("-" if replay is None else "OOM" if replay.out_of_memory else f"r{replay.retries_per_step}")
        print(f"{layers:>6} {exact.gpu_peak_allocated_bytes / GiB:9.1f}  " + " ".join(f"{c:>4}" for c in cells)
              + f"   {exact.gpu_fit.state:<12} {default.gpu_fit.state}")


if __name__ == "__main__":
    main()
