"""Peak allocated GPU memory planned from learned model cards against the H200 ground truth of
14 transformers families (benchmarks/measurements/h200-2026-12-02c/family-truth: ZeRO-0, one GPU,
two blocks of each family's flagship shape, the trainer loop), beside the hand model's figure.
Then what the caching allocator's replay makes of it: peak reserved and device used with the
replay's blocks from the card against the hand-written blocks (the activation terms from the card
in both), for the same 14 families (in-sample: used while the cards' learner was built) and for
the held-out rows of calls 3-4 (heldout/, planned from heldout/cards).

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
HELDOUT = HERE / "measurements" / "h200-2026-12-02c" / "heldout"
GiB = 2**30


def replayed(inp, layout) -> dict[str, tuple[float, float]]:
    """{"hand": ..., "card": ...}: (peak reserved, device used) in GiB with the replay's blocks
    hand-written and from the card."""
    from zlayout.core import allocator_sim
    from zlayout.core.memory import estimate_memory

    figures = {}
    try:
        for blocks, from_cards in (("hand", False), ("card", True)):
            allocator_sim.blocks_from_cards = from_cards
            memory = estimate_memory(inp, layout)
            figures[blocks] = (memory.gpu_peak_reserved_bytes / GiB, memory.gpu_device_used_bytes / GiB)
    finally:
        allocator_sim.blocks_from_cards = True
    return figures


def replay_row(label: str, measured: tuple[float, float], figures: dict, errors: dict) -> str:
    cells = []
    for i in (0, 1):
        for blocks in ("hand", "card"):
            err = figures[blocks][i] / measured[i] - 1
            errors.setdefault((i, blocks), []).append(err)
            cells.append(f"{figures[blocks][i]:7.2f} {err:+6.1%}")
        cells.insert(len(cells) - 2, f"{measured[i]:7.2f}")
    return f"{label:34} " + "  ".join(cells)


def replay_header() -> str:
    return (f"{'':34} {'reserved: measured':>18} {'hand blocks':>14}  {'card blocks':>14}  "
            f"{'used: measured':>7} {'hand blocks':>14}  {'card blocks':>14}  (GiB)")


def replay_summary(errors: dict) -> str:
    def mean(values: list[float]) -> str:
        return f"mean |error| {sum(abs(v) for v in values) / len(values):.1%}, worst {max(values, key=abs):+.1%}"
    return "\n".join(f"  {('reserved', 'device used')[i]:11} {blocks} blocks: {mean(errors[(i, blocks)])}"
                     for i in (0, 1) for blocks in ("hand", "card"))


def in_sample_replays(rows: list[dict], configs: dict, cards_dir: Path) -> None:
    """Call 2's families at ZeRO-0, one H200, the trainer loop (the truth's reserved figure is
    that loop's; its device used was read once per family, as the table in the README)."""
    from zlayout import cards
    from zlayout.cli import build_parser, plan_input_from_args
    from zlayout.spec import Layout

    os.environ[cards.CARDS_DIR_ENV] = str(cards_dir)
    print("\nin-sample (call 2, family-truth): the replay's blocks, head and loss from the card against the hand-written ones")
    print(replay_header())
    errors: dict = {}
    for row in rows:
        args = build_parser().parse_args([
            "plan", "--hf-config", str(configs[row["name"]]), "--impl", "hf", "--stage", "0", "--gpu", "h200",
            "--gpus-per-node", "1", "--seq", str(row["seq"]), "--micro-batch", str(row["micro_batch"]),
            "--loop", "trainer"])
        try:
            inp = plan_input_from_args(args)
        except Exception as exc:  # noqa: BLE001 (a config the planner refuses: its one line)
            print(f"{row['name']:34} refused: {str(exc).splitlines()[0]}")
            continue
        if inp.model.card is None:
            print(f"{row['name']:34} no card")
            continue
        figures = replayed(inp, Layout(stage=0, offload_optimizer="gpu", offload_param="gpu"))
        print(replay_row(f"{row['name']} {row['seq']}x{row['micro_batch']}",
                         (row["reserved_gib_trainer"], row["device_used_gib"]), figures, errors))
    if errors:
        print(replay_summary(errors))
        print("  (call 2's device used is one reading per family in a process that ran them in turn: cohere's and "
              "llama-ctl's are both 117.58 GiB; reserved is the per-family figure)")


def held_out_replays() -> None:
    """Calls 3-4's validated rows, planned from their recorded inputs and heldout/cards."""
    from zlayout import cards
    from zlayout.spec import Layout, PlanInput, recorded_inputs

    os.environ[cards.CARDS_DIR_ENV] = str(HELDOUT / "cards")
    print("\nheld-out (calls 3-4, heldout/): the replay's blocks, head and loss from the card against the hand-written ones")
    print(replay_header())
    errors: dict = {}
    for name in ("call3-families-results.jsonl", "call4-families-results.jsonl"):
        for line in (HELDOUT / name).read_text().splitlines():
            result = json.loads(line)
            if result["status"] != "validated":
                continue
            inp = PlanInput.model_validate(recorded_inputs(result["inputs"]))
            layout = Layout(**{k: result["layout"][k] for k in ("stage", "offload_optimizer", "offload_param")})
            measured = result["measured"]
            t = inp.training
            label = (f"{inp.model.name} {layout.label}{' ckpt' if t.checkpointing == 'full' else ''} "
                     f"{t.micro_batch}x{t.seq}")
            print(replay_row(label, (measured["gpu_peak_reserved_bytes"] / GiB, measured["gpu_device_used_bytes"] / GiB),
                             replayed(inp, layout), errors))
    print(replay_summary(errors))


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
        in_sample_replays(rows, configs, cards_dir)
    held_out_replays()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
