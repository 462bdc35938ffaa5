"""Model cards on disk: the key of a config.json, where cards are looked up, reading and writing.

A card is `KEY.toml`, KEY a hash of the config.json's keys that decide the model (not its
name, the transformers version that saved it, token ids or generation settings). Lookup order:
the cache `zlayout learn` writes to (`$ZLAYOUT_CARDS_DIR`, else ~/.cache/zlayout/cards), then
the cards shipped in presets/cards/. No torch: the planner reads cards through here.
"""

from __future__ import annotations

import hashlib
import json
import os
import tomllib
from pathlib import Path
from typing import Any, Mapping

from zlayout import tomlsafe
from zlayout.catalog import BUILTIN_PRESETS_DIR
from zlayout.core.card import CardError, ModelCard, card_from_dict

CARDS_DIR_ENV = "ZLAYOUT_CARDS_DIR"
SHIPPED_CARDS_DIR = BUILTIN_PRESETS_DIR / "cards"
HEADER = "# zlayout model card"
MAX_CARD_BYTES = 8 * 2**20

# Keys that name, tokenize or generate, and do not change what is built or trained.
_NOT_THE_MODEL = frozenset({
    "_name_or_path", "transformers_version", "architectures", "torch_dtype", "dtype", "use_cache",
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
    "auto_map", "max_length", "min_length", "do_sample", "temperature", "top_p", "top_k_sampling",
    "task_specific_params", "id2label", "label2id", "tokenizer_class", "prefix", "_commit_hash",
    "initializer_range", "output_attentions", "output_hidden_states", "return_dict",
})


def config_key(config: Mapping[str, Any]) -> str:
    """The card key of a parsed config.json: 16 hex digits of the sha256 of its model keys."""
    def strip(value: Any) -> Any:
        if isinstance(value, Mapping):
            return {k: strip(v) for k, v in sorted(value.items()) if k not in _NOT_THE_MODEL}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    text = json.dumps(strip(config), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_dir() -> Path:
    env = os.environ.get(CARDS_DIR_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "zlayout" / "cards"


def card_dirs() -> list[Path]:
    return [cache_dir(), SHIPPED_CARDS_DIR]


def read_card(path: Path, key: str | None = None) -> ModelCard:
    """The card in `path`; CardError (one line) when it is not a card zlayout wrote."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_CARD_BYTES + 1)
    except OSError as exc:
        raise CardError(f"{path}: cannot read: {exc.strerror}") from None
    if len(data) > MAX_CARD_BYTES:
        raise CardError(f"{path}: larger than {MAX_CARD_BYTES // 2**20} MiB, not a model card")
    try:
        text = data.decode("utf-8")
        tomlsafe.check_toml_limits(text, str(path), max_chars=None)
        parsed = tomllib.loads(text)
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, tomlsafe.TomlLimitError) as exc:
        raise CardError(f"{path}: not a model card ({str(exc).splitlines()[0]})") from None
    if not text.startswith(HEADER):
        raise CardError(f"{path}: not a model card zlayout wrote (no {HEADER!r} first line)")
    return card_from_dict(parsed, key or path.stem, source=str(path))


def find_card(config: Mapping[str, Any]) -> ModelCard | None:
    """The card of this config, from the cache or the shipped cards, or None."""
    key = config_key(config)
    for folder in card_dirs():
        path = folder / f"{key}.toml"
        if path.is_file():
            return read_card(path, key)
    return None


def dumps_card(card: Mapping[str, Any], key: str, config_name: str) -> str:
    import tomli_w

    header = (f"{HEADER} ({config_name}), written by `zlayout learn`: requests as [q, a, c],\n"
              "# q*T^2 + a*T + c bytes for one sequence of T tokens (+ allocate, - free), in order\n")
    return header + tomli_w.dumps({"key": key, **card})


def check_card_target(folder: Path, key: str, *, replace: bool) -> Path:
    """FOLDER/KEY.toml, when it may be written: nothing there, or a card and `replace` asked
    (the same config's card, learned again). OutFileError (one line) otherwise."""
    from zlayout.outfile import check_replaceable

    path = folder / f"{key}.toml"
    check_replaceable(path, read_card, replace=replace,
                      not_ours="zlayout writes cards only over its own cards",
                      exists_message=lambda _: f"{path} holds this config's card already: add --force "
                                               "to learn it again")
    return path


def write_card(folder: Path, key: str, text: str, *, replace: bool) -> Path:
    """Write the card as FOLDER/KEY.toml (through a temporary file, renamed into place)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = check_card_target(folder, key, replace=replace)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)
    return path
