"""Peak allocated GPU memory planned from learned model cards against the H200 ground truth of
14 transformers families (benchmarks/measurements/h200-2026-12-02c/family-truth: ZeRO-0, one GPU,
two blocks of each family's flagship shape, the trainer loop), beside the hand model's figure.

    python benchmarks/card_accuracy.py [--cards DIR]

`--cards DIR`: a folder holding the configs' cards (`zlayout learn --hf-config CONFIG --out DIR`);
without it each card is learned into a temporary folder first (needs `zlayout[learn]`, about
ten seconds a family).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRUTH = HERE / "measurements" / "h200-2026-12-02c" / "family-truth"
GiB = 2**30


def plan_peak(config: Path, row: dict, cards_dir: Path, with_card: bool) -> tuple[float | None, str]:
    """(planned peak allocated in GiB or None where the plan refuses the config, the one line why)."""
    from zlayout import cards
    from zlayout.cli import main

    shipped = cards.SHIPPED_CARDS_DIR
    os.environ[cards.CARDS_DIR_ENV] = str(cards_dir if with_card else cards_dir / "none")
    cards.SHIPPED_CARDS_DIR = shipped if with_card else cards_dir / "none"
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["plan", "--hf-config", str(config), "--impl", "hf", "--stage", "0", "--gpu", "h200",
                         "--gpus-per-node", "1", "--seq", str(row["seq"]), "--micro-batch", str(row["micro_batch"]),
                         "--loop", "trainer", "--json"])
    finally:
        cards.SHIPPED_CARDS_DIR = shipped
    if code:
        return None, err.getvalue().strip().splitlines()[0]
    data = json.loads(out.getvalue())
    assert bool(data["model"].get("card")) == with_card, config
    return data["gpu_peak_allocated_bytes"] / GiB, ""


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cards", type=Path, help="folder of the configs' cards (default: learn them now)")
    args = parser.parse_args(argv)
    rows = [json.loads(line) for line in (TRUTH / "truth.jsonl").read_text().splitlines() if line.strip()]
    configs = {row["name"]: TRUTH / "configs" / f"{row['model_type']}.json" for row in rows}
    with tempfile.TemporaryDirectory() as scratch:
        cards_dir = args.cards or Path(scratch)
        if args.cards is None:
            from zlayout import cards, hfconfig
            from zlayout.learn.learner import learn

            for config in configs.values():
                data, where = hfconfig.read_config(config)
                key = cards.config_key(data)
                cards.write_card(cards_dir, key, cards.dumps_card(learn(data), key, where.name), replace=True)
        print(f"{'family':12} {'seq x mb':>9} {'measured':>9} {'card':>8} {'err':>7} {'hand':>8} {'err':>7}  (GiB)")
        errors = []
        for row in rows:
            measured = row["peak_gib_trainer"][-1]
            carded, why = plan_peak(configs[row["name"]], row, cards_dir, True)
            hand, hand_why = plan_peak(configs[row["name"]], row, cards_dir, False)
            card_err = f"{carded / measured - 1:+.1%}" if carded else "-"
            hand_cell = f"{hand:8.2f} {hand / measured - 1:+7.1%}" if hand else f"{'refused':>16}"
            if carded:
                errors.append(abs(carded / measured - 1))
            print(f"{row['name']:12} {row['seq']:>5} x {row['micro_batch']:<2} {measured:9.2f} "
                  f"{carded or 0:8.2f} {card_err:>7} {hand_cell}" + (f"  {why}" if why else ""))
        if errors:
            print(f"cards: {len(errors)} families, mean |error| {sum(errors) / len(errors):.1%}, "
                  f"worst {max(errors):.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
