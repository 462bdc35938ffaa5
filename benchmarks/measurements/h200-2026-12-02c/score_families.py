"""Call 2's 14 families (family-truth/truth.jsonl) against the plan: learns each config's card
when it has none (`zlayout learn`, CPU), then plans the measured layout with both loops and prints
the error of peak allocated. `--no-learn`: plan with whatever cards exist (the hand model where none).

    python benchmarks/measurements/h200-2026-12-02c/score_families.py [--no-learn]
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
GiB = 1 << 30


def plan(config: Path, row: dict, loop: str) -> tuple[int, float] | str:
    cmd = [sys.executable, "-m", "zlayout", "plan", "--hf-config", str(config), "--impl", "hf", "--stage", "0",
           "--gpu", "h200", "--gpus-per-node", "1", "--seq", str(row["seq"]), "--micro-batch", str(row["micro_batch"]),
           "--loop", loop, "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        return (p.stderr.strip().splitlines() or ["?"])[0][:70]
    d = json.loads(p.stdout)
    return d["params"], d["gpu_peak_allocated_bytes"] / GiB


def main() -> None:
    learn = "--no-learn" not in sys.argv
    errors = []
    print(f"{'family':12s} {'params':>8s} {'trainer: measured plan err':>28s} {'deepspeed: measured plan err':>30s}")
    for line in (HERE / "family-truth" / "truth.jsonl").read_text().splitlines():
        row = json.loads(line)
        config = HERE / "family-truth" / "configs" / f"{row['model_type']}.json"
        if learn:
            subprocess.run([sys.executable, "-m", "zlayout", "learn", "--hf-config", str(config)],
                           capture_output=True, text=True)
        cells = []
        for loop in ("trainer", "deepspeed"):
            measured = row[f"peak_gib_{loop}"][-1]
            got = plan(config, row, loop)
            if isinstance(got, str):
                cells.append(f"{measured:7.2f}  {got}")
                continue
            params, planned = got
            err = 100 * (planned / measured - 1)
            errors.append(abs(err))
            flag = "" if params == row["params"] else f" (params {params:,} != {row['params']:,})"
            cells.append(f"{measured:7.2f} {planned:7.2f} {err:+6.1f}%{flag}")
        print(f"{row['name']:12s} {row['params'] / 1e9:7.3f}B   {cells[0]:>28s}   {cells[1]:>30s}")
    if errors:
        print(f"{len(errors)} rows: mean {sum(errors) / len(errors):.1f}%, worst {max(errors):.1f}%")


if __name__ == "__main__":
    main()
