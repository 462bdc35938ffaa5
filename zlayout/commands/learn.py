"""`zlayout learn --hf-config PATH`: learn a model card from the transformers class.

Builds the class on the meta device (no GPU, no weights, nothing downloaded), traces a few
blocks' forward and backward at several token counts and writes the card the planner then
uses for this config (`zlayout plan --hf-config PATH`). Needs torch and transformers
(`pip install 'zlayout[learn]'`); they are imported only when the command runs.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from zlayout.cli import UsageError
from zlayout.core.card import STATE_SPACE_KERNELS, STATE_SPACE_TORCH


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("learn", help="learn a model card (activations, requests, op work) from "
                                          "the transformers class of a config.json",
                            description=__doc__.splitlines()[0])
    parser.add_argument("--hf-config", required=True, metavar="PATH",
                        help="the model's config.json, or the directory holding it")
    parser.add_argument("--out", metavar="DIR",
                        help="folder to write KEY.toml into (default: $ZLAYOUT_CARDS_DIR, else "
                             "~/.cache/zlayout/cards, where plan looks)")
    parser.add_argument("--force", action="store_true", help="learn again over this config's card")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from zlayout import cards, hfconfig
    from zlayout.outfile import OutFileError

    try:
        config, path = hfconfig.read_config(args.hf_config)
    except hfconfig.HfConfigError as exc:
        raise UsageError(str(exc)) from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise UsageError(f"{path}: no 'model_type' key (is this a transformers config.json?)")
    if config["model_type"] in hfconfig.RECURRENT_TYPES:
        raise UsageError(f"{path}: {hfconfig.recurrent_refusal(config['model_type'])}")
    if config.get("auto_map"):  # before the card's target is checked: --force would not help
        raise UsageError(f"{path}: model_type {config['model_type']!r} is built by the model's own remote code "
                         "(auto_map), which zlayout does not run; plan it with --layers --hidden --heads --vocab")
    try:
        from zlayout.learn.learner import LearnError, learn
    except ImportError as exc:
        from zlayout.install import pip_install_command  # a clone's hint is its own -e install

        raise UsageError(f"zlayout learn needs torch and transformers ({exc.name} is missing): "
                         f"{pip_install_command('learn')}") from None
    key = cards.config_key(config)
    folder = Path(args.out).expanduser() if args.out else cards.cache_dir()
    try:  # refused before the tracing, by the rule the write applies
        if args.out:
            from zlayout.outfile import refuse_system_dir

            refuse_system_dir("--out", folder, "./cards")
        cards.check_card_target(folder, key, replace=args.force)
    except OutFileError as exc:
        raise UsageError(str(exc)) from None
    started = time.perf_counter()
    try:
        card = learn(config)
    except LearnError as exc:
        raise UsageError(f"{path}: {exc}") from None
    try:
        written = cards.write_card(folder, key, cards.dumps_card(card, key, path.name), replace=args.force)
        cards.write_depth_alias(folder, config, key)  # the same config cut or built to other depths
    except OutFileError as exc:
        raise UsageError(str(exc)) from None
    asked = next((config.get(k) for k in ("attn_implementation", "_attn_implementation") if config.get(k)), None)
    if isinstance(asked, str) and asked != card["attention"]:
        asked = asked if len(asked) <= 40 else asked[:40] + "..."  # a config's value, shown quoted and short
        from zlayout.cli import _note

        # the verify worker builds the class the same way (zlayout.verify.worker_model.hf_builder)
        _note(args, f"{path.name} asks for {asked!r} attention; the card is learned, and zlayout verify trains, "
                    f"with {card['attention']!r}, the implementation transformers picks for this class"
                    + (" (sdpa runs PyTorch's flash kernel where flash-attn would run its own, keeping the same "
                       "tensors)" if card["attention"] == "sdpa" and "flash" in asked else ""))
    kinds = len(set(card["layers"]["kinds"]))
    fitted = " / ".join(", ".join(map(str, r["tokens_fitted"])) for r in card["regimes"])
    checked = " / ".join(str(r["tokens_checked"]) for r in card["regimes"])
    linear = "" if not card.get("linear_attention") else (
        f", {'state-space blocks' if card['linear_attention'] in (STATE_SPACE_TORCH, STATE_SPACE_KERNELS) else 'linear attention'} "
        f"as {card['linear_attention']}")
    if (positions := card["regimes"][-1].get("max_positions")) is not None:  # learner.positions_regime
        checked += f" (the model holds {positions:,} positions: plan refuses longer sequences)"
    if (shortest := card["regimes"][0].get("min_tokens")) is not None:  # learner._learn_regimes
        checked += f" (sequences of {shortest:,} tokens or more: its memory steps with shorter ones)"
    print(f"{written}: {card['model_type']} ({card['attention']} attention{linear}), {card['parameters']['count']:,} "
          f"parameters in {len(card['parameters']['names'])} tensors, {card['layers']['count']} blocks of "
          f"{kinds} kind{'s' if kinds > 1 else ''}; fitted at {fitted} tokens, {card['fit_error']:.2%} off "
          f"at {checked}; learned in {time.perf_counter() - started:.1f} s")
    if card.get("buffer_dtype"):  # learner.buffer_cast_needed
        from zlayout.cli import _note
        _note(args, f"{card['model_type']}'s float32 buffers meet its bf16 weights, which fails where DeepSpeed casts "
                    "the weights only: the ds_config zlayout writes (export, verify) casts them too "
                    "(data_types.buffer_dtype)")
    return 0
