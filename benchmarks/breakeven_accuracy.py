"""Break-even at zero headroom against the largest model that really trains on one H200.

    python benchmarks/breakeven_accuracy.py

For each measured layer sweep (benchmarks/measurements/h200-2026-12-01/bisections.json: a
shape, a layout, an allocator, the largest layer count that ran and the smallest that ran out
of memory, each from a `zlayout verify` run), `break_even` with `--headroom 0` scales the
same shape in depth and reports the largest layer count it says fits. Target: within one
layer of the measured boundary (right when it equals the largest that ran).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from zlayout.cli import build_parser, plan_input_from_args  # noqa: E402
from zlayout.core.breakeven import break_even  # noqa: E402
from zlayout.spec import Layout  # noqa: E402

SWEEPS = ROOT / "benchmarks" / "measurements" / "h200-2026-12-01" / "bisections.json"


def main() -> int:
    sweeps = json.loads(SWEEPS.read_text())
    off = 0
    print(f"{'sweep':44} {'allocator':10} {'ran':>4} {'OOM':>4} {'zlayout':>8}  verdict")
    for sweep in sweeps:
        args = build_parser().parse_args(["plan", *sweep["flags"].split(), "--layers", "1",
                                          "--allocator", sweep["allocator"], "--headroom", "0",
                                          "--loop", "trainer"])  # the sweeps ran the loss-only wrapper
        inp = plan_input_from_args(args)
        layout = Layout(stage=args.stage, offload_optimizer=args.offload_optimizer,
                        offload_param=args.offload_param)
        result = break_even(inp, layout)
        layers = result.max_model.layers if result.max_model else 0
        ran, oom = sweep["largest_ran"], sweep["smallest_oom"]
        miss = 0 if ran <= layers < (oom or 10**9) else min(abs(layers - ran), abs(layers - (oom or ran)))
        off = max(off, miss)
        print(f"{sweep['name']:44} {sweep['allocator']:10} {ran:>4} {oom or '-':>4} {layers:>8}  "
              f"{'right' if miss == 0 else f'{miss} layer(s) off'}")
    print(f"\nworst: {off} layer(s) from the measured boundary (target: at most 1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
