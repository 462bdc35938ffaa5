"""Step time of the measured transformers MoE rows: the hand model (MOE_* constants) against the
card's recorded work (the grouped experts' FLOPs counted by `zlayout.learn.trace.grouped_mm_flops`).

    python benchmarks/steptime_moe.py     # learns a card per row's config (CPU, ~10 s each)

Rows: the ninth session's held-out family runs (h200-2026-12-02d/families-results.jsonl and its
re-runs: qwen3_moe, phimoe, each from its own config.json) and every MoE row steptime_accuracy.py
reads (the earlier sessions' Mixtral-, Qwen2-MoE- and DeepSeek-V2-class shapes, built by the verify
worker as transformers classes from the plan's shape, `hfconfig.to_hf_config`). Each row says
whether it is in-sample for the hand model's step fit (a fitted row of steptime_accuracy.py) or
held out; the card's work adds no constant, and no row was used to write it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
FAMILIES = ROOT / "benchmarks" / "measurements" / "h200-2026-12-02d"
RESULTS = [FAMILIES / "families-results.jsonl", FAMILIES / "fam-rerun-results.jsonl"]


def error(predicted: float, measured: float) -> float:
    return 100 * (predicted / measured - 1)


def card_for(config: dict, learned: dict):
    from zlayout import cards
    from zlayout.core.card import card_from_dict
    from zlayout.learn.learner import learn

    key = cards.config_key(config)
    if key not in learned:
        learned[key] = card_from_dict(learn(config), key)
    return learned[key]


def with_card(step, card):
    """The measured step with its model carrying `card` (the card decides the work model)."""
    model = step.inp.model.model_copy(update={"card": card})
    return step.__class__(**{**{f: getattr(step, f) for f in step.__dataclass_fields__},
                             "inp": step.inp.model_copy(update={"model": model})})


def rows():
    """(source, in-sample?, measured step, the config its card is learned from)."""
    from measurements import FITTED_ON, load_rows, read_batch_results

    from zlayout.hfconfig import to_hf_config

    steps, _ = read_batch_results(RESULTS)  # with the cards h200-2026-12-02d ran with
    for step in steps:
        if step.inp.model.is_moe:
            config = json.loads(Path(step.inp.model.hf_config).read_text()) if step.inp.model.hf_config else None
            if config is None or not Path(step.inp.model.hf_config).is_file():
                name = Path(str(step.inp.model.hf_config)).name
                config = json.loads((ROOT / "benchmarks/measurements/h200-2026-12-02c/heldout/configs" / name).read_text())
            yield "02d held-out", False, step, config
    for row in load_rows():
        m = row.inp.model
        if not m.is_moe or row.inp.training.impl != "hf" or row.floor:
            continue
        config = dict(to_hf_config(m))
        config["max_position_embeddings"] = max(int(config.get("max_position_embeddings") or 0), row.inp.training.seq)
        in_sample = not row.held_out and row.host in FITTED_ON and not row.step.alloc_retries
        yield row.host, in_sample, row.step, config


def main() -> int:
    from zlayout.core.calibrate import predict_step

    learned: dict = {}
    print(f"{'source':13s} {'fit':4s} {'model type':11s} {'layout':44s} {'meas s':>7s} {'hand':>7s} {'err':>7s} "
          f"{'card':>7s} {'err':>7s}")
    errs: dict[str, list[float]] = {"hand": [], "card": []}
    for source, in_sample, step, config in rows():
        measured = step.measured_step_s
        hand = predict_step(with_card(step, None)).step_time_s
        card = predict_step(with_card(step, card_for(config, learned))).step_time_s
        errs["hand"].append(abs(error(hand, measured)))
        errs["card"].append(abs(error(card, measured)))
        label = f"{step.layout.label} | L{step.inp.model.layers} h{step.inp.model.hidden} s{step.inp.training.seq} " \
                f"b{step.inp.training.micro_batch}" + (" ckpt" if step.inp.training.checkpointing == "full" else "")
        print(f"{source:13s} {'in' if in_sample else 'out':4s} {config['model_type']:11s} {label[:44]:44s} "
              f"{measured:7.3f} {hand:7.3f} {error(hand, measured):+6.1f}% {card:7.3f} {error(card, measured):+6.1f}%")
    for name, values in errs.items():
        print(f"{name:5s} n={len(values)}  mean |err| {sum(values) / len(values):5.1f}%  max |err| {max(values):5.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
