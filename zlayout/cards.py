"""Model cards on disk: the key of a config.json, where cards are looked up, reading and writing.

A card is `KEY.toml`, KEY a hash of the config.json's keys that decide the model (not its
name, the transformers version that saved it, token ids or generation settings). Lookup order:
the cache `zlayout learn` writes to (`$ZLAYOUT_CARDS_DIR`, else ~/.cache/zlayout/cards), then
the cards shipped in presets/cards/. No torch: the planner reads cards through here.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import tomllib
from pathlib import Path
from typing import Any, Mapping

from zlayout import tomlsafe
from zlayout.shipped import BUILTIN_PRESETS_DIR
from zlayout.core.card import CardError, ModelCard, card_from_dict, linear_attention_assumed
from zlayout.smallfile import TooLarge, read_small_file

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

    stripped = strip(config)
    if (assumed := linear_attention_assumed(config)) is not None:
        # the card prices kernels the config does not name (core.card.LINEAR_ATTENTION_FLA): a
        # key of its own, never that of a card of the same config learned without the assumption
        stripped = {**stripped, "zlayout_linear_attention": assumed}
    text = json.dumps(stripped, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_dir() -> Path:
    env = os.environ.get(CARDS_DIR_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "zlayout" / "cards"


def card_dirs() -> list[Path]:
    return [cache_dir(), SHIPPED_CARDS_DIR]


def read_card(path: Path, key: str | None = None, *, shipped: bool = False) -> ModelCard:
    """The card in `path`; CardError (one line) when it is not a card zlayout wrote.

    `shipped`: a card of zlayout's own (SHIPPED_CARDS_DIR) skips the nesting and dotted-key
    scan that guards the parser from files of unknown origin: tests/spec/test_toml_limits.py
    holds every shipped card within those limits, and the scan took 3-4 ms of a carded plan."""
    try:
        data = read_small_file(path, MAX_CARD_BYTES)
    except TooLarge:
        raise CardError(f"{path}: larger than {MAX_CARD_BYTES // 2**20} MiB, not a model card") from None
    except OSError as exc:
        raise CardError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        text = data.decode("utf-8")
        if not shipped:
            tomlsafe.check_toml_limits(text, str(path), max_chars=None)
        parsed = tomllib.loads(text)
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, tomlsafe.TomlLimitError) as exc:
        raise CardError(f"{path}: not a model card ({str(exc).splitlines()[0]})") from None
    if not text.startswith(HEADER):
        raise CardError(f"{path}: not a model card zlayout wrote (no {HEADER!r} first line)")
    return card_from_dict(parsed, key or path.stem, source=str(path), digest=hashlib.sha256(data).hexdigest()[:16])


@functools.lru_cache(maxsize=64)
def _read_once(path: str, key: str, mtime_ns: int, size: int, shipped: bool) -> ModelCard:
    """A card file read once per version of it: a plan validates its model more than once."""
    return read_card(Path(path), key, shipped=shipped)


def _card_file(key: str) -> ModelCard | None:
    for folder in card_dirs():
        path = folder / f"{key}.toml"
        try:
            status = path.stat()
        except OSError:
            continue
        return _read_once(str(path), key, status.st_mtime_ns, status.st_size, folder == SHIPPED_CARDS_DIR)
    return None


# A config that differs from a learned one only in its number of blocks (a model cut to a few
# layers to try, or built deeper) has the same blocks: its card is that one, resized by the
# planner (`ModelCard.at_layers`). Each cards folder keeps, beside KEY.toml, by-depth/DKEY.toml
# naming the card of every config whose depth-free key is DKEY (`zlayout learn` and
# scripts/learn_cards.py write them).
DEPTH_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
BY_DEPTH = "by-depth"
_ALIAS = re.compile(r'card = "([0-9a-f]{16})"\n')


def depth_key(config: Mapping[str, Any]) -> str | None:
    """The key of this config at any depth: its model keys less the block count (at the top and
    in a multimodal model's text_config; a vision tower's depth stays). None when it names none."""
    def depth_free(keys: Mapping[str, Any]) -> dict[str, Any]:
        free = {k: v for k, v in keys.items() if k not in DEPTH_KEYS}
        if isinstance(kinds := free.get("layer_types"), list) and kinds:
            # the per-block kinds (Qwen3.5's 3 linear : 1 full) are listed block by block; at
            # another depth the list is the first blocks of the same repeating pattern
            free["layer_types"] = _shortest_period(kinds)
        return free

    stripped = depth_free(config)
    nested = config.get("text_config")
    if isinstance(nested, Mapping):
        stripped["text_config"] = depth_free(nested)
    if not any(k in DEPTH_KEYS for k in config) and not (isinstance(nested, Mapping)
                                                         and any(k in DEPTH_KEYS for k in nested)):
        return None
    return config_key({**stripped, "zlayout_depth_free": True})


def _shortest_period(items: list[Any]) -> list[Any]:
    """The shortest prefix whose repetition gives `items` (a last repetition may be cut short):
    the list's length less its longest proper border (Knuth-Morris-Pratt's prefix function), in
    linear time, so a config.json's long list cannot stall the key."""
    border = [0] * len(items)
    for i in range(1, len(items)):
        k = border[i - 1]
        while k and items[i] != items[k]:
            k = border[k - 1]
        border[i] = k + (items[i] == items[k])
    return items[:len(items) - border[-1]] if items else items


def depth_alias_path(folder: Path, config: Mapping[str, Any]) -> Path | None:
    """FOLDER/by-depth/DKEY.toml for this config; None when the config names no depth."""
    dkey = depth_key(config)
    return None if dkey is None else folder / BY_DEPTH / f"{dkey}.toml"


def read_depth_alias(path: Path) -> str | None | bool:
    """The card key a by-depth entry names; None when there is no readable file, False when the
    file there is not such an entry."""
    try:
        text = read_small_file(path, 4096).decode()
    except (OSError, TooLarge, UnicodeDecodeError):
        return None
    alias = _ALIAS.fullmatch(text)
    return alias.group(1) if alias else False


def write_depth_alias(folder: Path, config: Mapping[str, Any], key: str) -> Path | None:
    """by-depth/DKEY.toml in `folder`, naming card `key` for this config at any depth; None when
    the config names no depth. Written through a temporary file; a file there that is not such
    an alias is left alone (None)."""
    path = depth_alias_path(folder, config)
    if path is None or read_depth_alias(path) is False:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(f'card = "{key}"\n')
    os.replace(temporary, path)
    return path


def find_card(config: Mapping[str, Any]) -> ModelCard | None:
    """The card of this config, from the cache or the shipped cards, or None. Where no card was
    learned from this config, that of the same config at another depth (by-depth/), at the depth
    it was learned at: callers resize it to the model's (`ModelCard.at_layers`)."""
    card = _card_file(config_key(config))
    if card is not None:
        return card
    for folder in card_dirs():
        path = depth_alias_path(folder, config)
        if path is None:
            return None
        key = read_depth_alias(path)
        if key and (card := _card_file(key)) is not None:
            return card
    return None


def card_by_key(key: str) -> ModelCard:
    """The card a profile or a JSON model names by its key; ValueError (one line) when no
    cards folder holds it."""
    if not re.fullmatch(r"[0-9a-f]{16}", key):
        raise ValueError(f"card {key!r} is not a model card's key (16 hex digits)")
    card = _card_file(key)
    if card is None:
        raise ValueError(f"model card {key} is in neither {cache_dir()} nor {SHIPPED_CARDS_DIR}: "
                         "learn it again with zlayout learn --hf-config CONFIG")
    return card


def _number(x: float) -> str:
    """A coefficient as short as it is exact: most are whole bytes per token."""
    return str(int(round(x))) if abs(x - round(x)) < 1e-6 else repr(float(x))


PHASES = ("preamble", "forward", "backward", "checkpointed_forward", "checkpointed_backward", "recompute")


def _polys_text(polys: list) -> str:
    return ", ".join(" ".join(_number(x) for x in poly) for poly in polys)


def _parameters_text(params: dict) -> dict:
    """The parameter tensors' names, shapes and dtypes (hundreds each) as strings "a, b, ...", a
    shape "d d" like a request: as TOML arrays they were 90% of parsing a card. A list the string
    cannot hold exactly (a name with a comma or a space, a 0-d shape) stays an array."""
    out = dict(params)
    for key in ("names", "dtypes"):
        items = params.get(key)
        if items and all(isinstance(x, str) and x and not re.search(r"[,\s]", x) for x in items):
            out[key] = ", ".join(items)
    shapes = params.get("shapes")
    if shapes and all(shapes):
        out["shapes"] = ", ".join(" ".join(str(d) for d in shape) for shape in shapes)
    return out


def _compact(value: Any) -> Any:
    """Each phase's requests ([q, a, c] lists, hundreds a phase) as one string "q a c, q a c,
    ...": TOML arrays of arrays parse ten times slower, and the planner reads a card every plan.
    The work tables likewise: each op's flops, bytes, kernel launches and ops as "q a c, q a c,
    q a c, q a c"; and the parameter tensors (`_parameters_text`)."""
    if isinstance(value, dict) and isinstance(value.get("parameters"), dict):
        value = {**value, "parameters": _parameters_text(value["parameters"])}
    if isinstance(value, dict):
        return {k: (_polys_text(v) if (k in PHASES or k.endswith(("_reductions", "_frees"))) and isinstance(v, list)
                    else {phase: {op: _polys_text(polys) for op, polys in ops.items()} for phase, ops in v.items()}
                    if k == "work" and isinstance(v, dict) else _compact(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_compact(v) for v in value]
    return value


def dumps_card(card: Mapping[str, Any], key: str, config_name: str) -> str:
    import tomli_w

    header = (f"{HEADER} ({config_name}), written by `zlayout learn`: each request \"q a c\" is\n"
              "# q*T^2 + a*T + c bytes for one sequence of T tokens (+ allocate, - free), in order;\n"
              "# each op of a phase's work: \"flops, bytes moved, kernel launches, ops\", each \"q a c\" likewise\n")
    text = tomli_w.dumps({"key": key, **_compact(card)})
    # the request and parameter strings as TOML literal strings: no escapes to scan for, they
    # parse 5x faster
    literal = lambda m: f"{m.group(1)}'{m.group(2)}'"  # noqa: E731
    return header + _NAMES_STRING.sub(literal, _NUMBER_STRING.sub(literal, text))


_NUMBER_STRING = re.compile(r'^((?:\w+) = )"([-0-9., e+]*)"$', re.MULTILINE)
_NAMES_STRING = re.compile(r'^((?:names|dtypes) = )"([^"\\\']*)"$', re.MULTILINE)


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
