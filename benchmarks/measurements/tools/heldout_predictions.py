"""The step-time model's predictions for a held-out batch, written before the batch runs.

    python benchmarks/measurements/tools/heldout_predictions.py            # (re)write the predictions file
    python benchmarks/measurements/tools/heldout_predictions.py --check    # the model still predicts what was committed
    python benchmarks/measurements/tools/heldout_predictions.py --batch benchmarks/measurements/h200-2026-12-01b/batch-h200-heldout2.txt \
        --section "step time" --out benchmarks/measurements/h200-2026-12-01b/heldout2-steptime-predictions.jsonl

`--section NAME`: only the lines under the comment `# NAME`, up to the next comment line (a batch
file other helpers append their own sections to).

One JSON line per batch line: the flags, the layout, the predicted step time and its parts,
and the commit of the model that made them. benchmarks/steptime_accuracy.py scores the
batch's results against the live model and against these committed figures.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]  # the repository (this is benchmarks/measurements/tools/)
BATCH = ROOT / "benchmarks" / "measurements" / "h200-2026-12-01b" / "batch-h200-heldout-steptime.txt"
PREDICTIONS = ROOT / "benchmarks" / "measurements" / "h200-2026-12-01b" / "heldout-steptime-predictions.jsonl"


def section_lines(batch: Path, section: str | None) -> list[tuple[int, str]]:
    """(line number, flags) of the batch's lines, or of one `# section`'s."""
    out, inside = [], section is None
    for number, raw in enumerate(batch.read_text().splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("#"):
            if section is not None:
                if stripped.lstrip("#").strip() == section:
                    inside = True
                elif inside and out:
                    break  # the next comment after the section's lines ends it
            continue
        line = raw.split("#", 1)[0].strip()
        if line and inside:
            out.append((number, line))
    return out


def predictions(batch: Path = BATCH, section: str | None = None) -> list[dict]:
    from zlayout.cli import build_parser
    from zlayout.commands import verify as verify_cmd
    from zlayout.core.comm import estimate_comm
    from zlayout.core.steptime import estimate_step_time

    build_parser()  # sets verify's own parser, which reads a batch line
    out = []
    for number, line in section_lines(batch, section):
        args = verify_cmd._VERIFY_PARSER.parse_args(shlex.split(line))
        inp, layout, _, _ = verify_cmd._inputs(args)
        est = estimate_step_time(inp, layout, estimate_comm(inp, layout))
        out.append({"line": number, "flags": line, "layout": layout.key, "impl": inp.training.impl,
                    "params": inp.model.params, "predicted_step_s": round(est.step_time_s, 5),
                    "compute_s": round(est.compute_s, 5), "gpu_optimizer_s": round(est.gpu_optimizer_s, 5),
                    "step_overhead_s": round(est.step_overhead_s, 5),
                    "host_overhead_s": round(est.host_overhead_s, 5),
                    "launch_overhead_s": round(est.launch_overhead_s, 5),
                    "predicted_forward_s": round(est.forward_s, 5), "predicted_backward_s": round(est.backward_s, 5),
                    "predicted_optimizer_s": round(est.optimizer_s, 5)})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed file, write nothing")
    parser.add_argument("--batch", type=Path, default=BATCH, help="the batch file")
    parser.add_argument("--section", help="only the lines under this `# heading` of the batch")
    parser.add_argument("--out", type=Path, default=PREDICTIONS, help="the predictions file")
    args = parser.parse_args()
    rows = predictions(args.batch, args.section)
    if args.check:
        committed = [json.loads(x) for x in args.out.read_text().splitlines() if x.strip()]
        same = [(c["flags"], c["predicted_step_s"]) for c in committed] == [(r["flags"], r["predicted_step_s"])
                                                                           for r in rows]
        print("predictions unchanged" if same else "the model now predicts otherwise than the committed file")
        return 0 if same else 1
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as f:
        for r in rows:
            f.write(json.dumps({**r, "model_commit": commit}) + "\n")
    for r in rows:
        print(f"{r['line']:>3} {r['layout']:<24} {r['impl']:<8} {r['params'] / 1e9:5.2f}B  {r['predicted_step_s']:.4f} s"
              f"  (fwd {r['predicted_forward_s']:.4f} bwd {r['predicted_backward_s']:.4f} opt {r['predicted_optimizer_s']:.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
