"""Predictions for a `zlayout verify --batch` file, written before the batch runs (this folder's
held-out calls): for each line, the plan's figures exactly as verify will record them
(`zlayout.verify.result.predicted_figures`), the fit verdict, and the commit that made them.

    python benchmarks/measurements/h200-2026-12-02c/predict.py BATCH OUT.jsonl
    python benchmarks/measurements/h200-2026-12-02c/predict.py --score OUT.jsonl RESULTS.jsonl
"""
from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
GiB = 1 << 30


def predict(batch: Path, out: Path) -> None:
    from zlayout.cli import build_parser, layout_from_args, plan_input_from_args
    from zlayout.core.plan import plan_layout
    from zlayout.verify.result import predicted_figures

    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    rows = []
    for line in batch.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        args = build_parser().parse_args(["verify", *shlex.split(line)])
        inp, layout = plan_input_from_args(args), layout_from_args(args)
        fig = predicted_figures(inp, layout)
        est = plan_layout(inp, layout, with_breakeven=False).memory
        rows.append({"flags": line, "layout": layout.key, "commit": commit,
                     "card": getattr(inp.model, "card", None) is not None,
                     "fits": getattr(est, "fits", None), **fig})
        print(f"{layout.key:28s} alloc {fig['gpu_peak_allocated_bytes'] / GiB:8.2f}  used "
              f"{(fig.get('gpu_device_used_bytes') or 0) / GiB:8.2f}  step {fig.get('step_time_s') or 0:.3f}  {line[:60]}")
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))


def score(predictions: Path, results: Path) -> None:
    preds = [json.loads(l) for l in predictions.read_text().splitlines() if l.strip()]
    res = [json.loads(l) for l in results.read_text().splitlines() if l.strip()]
    for p, r in zip(preds, res):
        m = r.get("measured") or {}
        def err(key):
            a, b = p.get(key), m.get(key)
            return None if not a or not b else 100 * (a / b - 1)
        e = {k: err(k) for k in ("gpu_peak_allocated_bytes", "gpu_device_used_bytes", "step_time_s")}
        fmt = lambda v: "   n/a" if v is None else f"{v:+6.1f}%"
        print(f"{r.get('status', '?'):12s} alloc {fmt(e['gpu_peak_allocated_bytes'])} used {fmt(e['gpu_device_used_bytes'])} "
              f"step {fmt(e['step_time_s'])}  {p['flags'][:90]}")


if __name__ == "__main__":
    if sys.argv[1] == "--score":
        score(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        predict(Path(sys.argv[1]), Path(sys.argv[2]))
