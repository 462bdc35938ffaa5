"""Regenerate the model cards shipped in presets/cards/ with `zlayout learn`'s learner.

    .venv/bin/python scripts/learn_cards.py                 # the popular families' configs
    .venv/bin/python scripts/learn_cards.py CONFIG.json ... # these configs' cards too
    .venv/bin/python scripts/learn_cards.py --check         # exit 1 if a shipped card is stale
    .venv/bin/python scripts/learn_cards.py --out DIR CONFIG.json ...  # write into DIR instead

A card is keyed by its config's hash (zlayout.cards.config_key), so `zlayout plan --hf-config`
finds the shipped card of exactly that config.json. Learning is deterministic: the same
transformers and torch give the same card, byte for byte. Needs `pip install 'zlayout[learn]'`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from zlayout import cards, hfconfig

ROOT = Path(__file__).resolve().parent.parent
CARDS_DIR = ROOT / "presets" / "cards"
PUBLISHED = ROOT / "tests" / "hf" / "configs" / "published"
# one or two configs per family users train (the published config.json files tests/hf holds)
POPULAR = ["gpt2", "pythia-160m", "pythia-1b", "Phi-3-mini-4k-instruct", "gemma-2b", "gemma-7b",
           "gemma-2-2b", "gemma-3-1b-pt", "Meta-Llama-3-8B", "Llama-3.2-1B", "Mistral-7B-v0.1",
           "Qwen2.5-7B", "Qwen2.5-0.5B", "Qwen3-0.6B", "Qwen3-8B", "OLMo-2-0425-1B",
           "Mixtral-8x7B-v0.1", "Qwen1.5-MoE-A2.7B", "DeepSeek-V2-Lite", "falcon-7b",
           # multimodal: only a card counts the vision tower (hfconfig refuses them without one)
           "llava-1.5-7b-hf", "Qwen2.5-VL-3B-Instruct",
           # no hand reader: the card is all hfconfig plans them from (shape from the common keys)
           "OLMoE-1B-7B-0924", "OLMo-1B-hf", "granite-3.0-2b-base", "granite-3.0-1b-a400m-base",
           "stablelm-2-1_6b", "LFM2-1.2B",
           # Mamba-1, priced as mamba-ssm's kernels (core.card.STATE_SPACE_KERNELS)
           "mamba-130m-hf",
           # families the hand model was not written for, at their other published sizes: without a
           # card it plans them by the hand model, under (Gemma-2-9B at 6 layers: 46.48 GiB for 61.62
           # measured, h200-2026-12-13 batch v)
           "gemma-2-9b", "gpt2-medium", "gpt2-xl", "gpt_bigcode-santacoder", "starcoderbase-1b",
           "starcoder2-3b", "starcoder2-7b", "pythia-6.9b", "Phi-3-medium-4k-instruct", "Phi-3.5-MoE-instruct",
           "falcon-40b", "OLMo-2-1124-7B", "aya-23-8B", "c4ai-command-r-v01", "Qwen3-30B-A3B"]


def card_text(path: Path) -> tuple[str, str]:
    from zlayout.learn.learner import learn

    config, where = hfconfig.read_config(path)
    key = cards.config_key(config)
    return key, cards.dumps_card(learn(config), key, where.name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="*", type=Path, help="config.json files (default: the popular families')")
    parser.add_argument("--check", action="store_true", help="exit 1 when a shipped card differs from a new one")
    parser.add_argument("--out", type=Path, default=CARDS_DIR,
                        help="the cards folder to write or check (default: presets/cards)")
    args = parser.parse_args(argv)
    paths = args.configs or [PUBLISHED / f"{name}.json" for name in POPULAR]
    stale = []
    for path in paths:
        started = time.perf_counter()
        key, text = card_text(path)
        target = args.out / f"{key}.toml"
        config = hfconfig.read_config(path)[0]
        alias = cards.depth_alias_path(args.out, config)
        if args.check:
            if not target.is_file() or target.read_text() != text:
                stale.append(f"{path.name} ({target.name})")
            if alias is not None and cards.read_depth_alias(alias) != key:
                stale.append(f"{path.name} ({cards.BY_DEPTH}/{alias.name})")
            continue
        cards.write_card(args.out, key, text, replace=True)
        cards.write_depth_alias(args.out, config, key)
        print(f"{target}  {path.name}  {time.perf_counter() - started:.1f} s")
    if stale:
        print("stale cards: " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
