"""zlayout's memory predictions for every line of a verify batch, one JSON object per line.

    python benchmarks/measurements/tools/allocator_predict.py benchmarks/measurements/h200-2026-12-01b/batch-h200-heldout-allocator.txt \
        > benchmarks/measurements/h200-2026-12-01b/heldout-allocator-predictions.jsonl

Written before the batch runs, and committed with it, so the batch is a true hold-out for the
allocator replay (`zlayout/core/allocator_sim.py`). `reserved_from` says which model gave
peak reserved: "replay" (default allocator: ZeRO 0-2 with the optimizer on the GPU, ZeRO-3
with or without CPU offload; dense bf16 models) or "phases" (the per-phase trapped-segment
rule, everything else).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]  # the repository (this is benchmarks/measurements/tools/)
sys.path.insert(0, str(ROOT))

from zlayout.cli import build_parser, layout_from_args, plan_input_from_args  # noqa: E402
from zlayout.core.memory import estimate_memory, replayed_reserved_bytes  # noqa: E402
from zlayout.spec import GiB  # noqa: E402


def predictions(batch: Path) -> list[dict]:
    out = []
    for line in batch.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        args = build_parser().parse_args(["verify", *shlex.split(line)])
        inp = plan_input_from_args(args)
        inp = inp.model_copy(update={"headroom_fraction": 0.0})
        layout = layout_from_args(args)
        est = estimate_memory(inp, layout)
        out.append({
            "line": line.strip(), "layout": layout.label, "impl": inp.training.impl,
            "params": inp.model.params,
            "gpu_peak_allocated_gib": round(est.gpu_peak_allocated_bytes / GiB, 3),
            "gpu_peak_reserved_gib": round(est.gpu_peak_reserved_bytes / GiB, 3),
            "gpu_device_used_gib": round(est.gpu_device_used_bytes / GiB, 3),
            "gpu_needed_gib": round(est.gpu_needed_bytes / GiB, 3),
            "fits_zero_headroom": est.fits_gpu,
            "reserved_from": "replay" if replayed_reserved_bytes(inp, layout) is not None else "phases",
            # the model card the activations came from (zlayout learn; presets/cards/), if any
            "card": inp.model.card.key if inp.model.card is not None else None,
        })
    return out


def main() -> int:
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    for row in predictions(Path(sys.argv[1])):
        print(json.dumps({**row, "model_commit": commit}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
