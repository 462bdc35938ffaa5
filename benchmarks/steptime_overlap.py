"""How a pass's two sides combine: each forward and backward verify timed against its GPU side and
host side as the step model prices them, at each exponent of the smooth maximum (steptime.pass_s),
by how close the two sides are. This is where OVERLAP_P (the forward's) and BACKWARD_OVERLAP_P
were read from.

    python benchmarks/steptime_overlap.py [--cards DIR]

Rows: the one-GPU, GPU-resident runs with a model card and verify's phase times (the rows of
steptime_relearned.py; `--cards DIR`: plan each with the cards in DIR, e.g. that script's relearned
folder; default: the cards its batch ran with). A pass's sides are its GPU side (kernels and their
per-kernel cost) and its host side (`host_pass_s`), times the gradient-accumulation steps; the
bands are the shorter side over the longer. Prints the mean error (signed and absolute) per band
and exponent, for each pass.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXPONENTS = (2.0, 2.5, 3.0, 3.5, 4.0, 5.0, math.inf)
BANDS = ((0.0, 0.3), (0.3, 0.5), (0.5, 0.7), (0.7, 0.85), (0.85, 1.0001))


def pass_sides(cards_dir: Path | None) -> list[dict]:
    """Per row: its label and, per pass, (GPU side s, host side s, measured s)."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.steptime_relearned import card_rows
    from zlayout import cards
    from zlayout.core import steptime as st
    from zlayout.profile.calibration import read_results

    files, _ = card_rows(None)
    rows, seen = [], set()
    for path, folder in sorted(files.items()):
        os.environ[cards.CARDS_DIR_ENV] = str(cards_dir or folder)
        measured = [(json.loads(line).get("measured") or {}) for line in path.read_text().splitlines() if line.strip()]
        for row in read_results([path])[0]:
            inp, layout = row.inp, row.layout
            if inp.model.card is None or inp.hardware.world != 1 or layout.offload_optimizer != "gpu" \
                    or layout.offload_param != "gpu":
                continue
            m = next((m for m in measured if m.get("step_time_s") == row.measured_step_s), None)
            key = (path.parent.name, row.label, row.measured_step_s)
            if not m or not m.get("backward_s") or key in seen:
                continue
            seen.add(key)
            accum = inp.training.grad_accum
            sides = {}
            for name, work, seconds in zip(("forward", "backward"), st.micro_step_work(inp, layout),
                                           (m["forward_s"], m["backward_s"])):
                gpu_s = st.phase_kernel_s(inp, work) + work.kernels * st.SHIPPED.kernel_overhead_s
                sides[name] = (gpu_s * accum, st.host_pass_s(inp, work) * accum, seconds)
            rows.append({"label": f"{path.parent.name} {row.label}", **sides})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cards", type=Path, help="plan every row with the cards in this folder")
    args = parser.parse_args(argv)
    from zlayout.core.steptime import pass_s

    rows = pass_sides(args.cards)
    print(f"{len(rows)} one-GPU GPU-resident rows with phase times")
    for name in ("forward", "backward"):
        print(f"\n{name}: mean error (mean |error|) by the shorter side over the longer")
        print(f"{'p':>5s} " + " ".join(f"{f'{lo:.2f}-{min(hi, 1):.2f}':>17s}" for lo, hi in BANDS) + f" {'all':>15s}")
        for p in EXPONENTS:
            cells, every = [], []
            for lo, hi in BANDS:
                errs = [100 * (pass_s(g, h, p) / m - 1) for g, h, m in (r[name] for r in rows)
                        if lo <= min(g, h) / max(g, h) < hi]
                every += errs
                cells.append(f"n{len(errs):3d} {sum(errs) / len(errs):+5.1f} ({sum(map(abs, errs)) / len(errs):4.1f})"
                             if errs else f"{'-':>17s}")
            print(f"{p:>5} " + " ".join(cells) + f" {sum(every) / len(every):+5.1f} ({sum(map(abs, every)) / len(every):4.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
