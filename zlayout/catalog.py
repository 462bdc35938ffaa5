"""Presets by name: GPUs, links, models (TOML files), and models of any size in a family.

A preset is one TOML file, `<kind>/<name>.toml`, whose keys are the fields of the matching
spec model plus `description` and `source` (where the figures are published); GPU presets
also name their `default_intra_link`. Lookup order, first match wins: each `extra_dirs`
entry, the `ZLAYOUT_PRESETS_DIR` directories (os.pathsep-separated), the user's
`~/.config/zlayout/presets`, then the built-in presets (`presets/` at the top of a source
checkout, `zlayout/presets` inside an installed wheel). Each of these is a directory with
`gpus/`, `links/`, `models/` and `profiles/` subfolders.

The TUI calls these functions on every keystroke, so parsed files are cached on
(path, mtime, size) and `model_for_size` answers from a table built once per family.
"""

from __future__ import annotations

import bisect
import functools
import math
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping

from pydantic import BaseModel, ValidationError

from zlayout import tomlsafe
from zlayout.messages import type_error_text
from zlayout.shipped import BUILTIN_PRESETS_DIR
from zlayout.smallfile import read_small_file
from zlayout.spec import BOUNDS, GpuSpec, LinkSpec, ModelSpec, check_model_size

KINDS = ("gpus", "links", "models", "profiles")
PRESETS_DIR_ENV = "ZLAYOUT_PRESETS_DIR"

METADATA_KEYS = frozenset({"description", "source"})
GPU_ONLY_KEYS = frozenset({"default_intra_link"})
FALLBACK_INTRA_LINK = "pcie4"

_KIND_LABELS = {"gpus": "GPU", "links": "link", "models": "model", "profiles": "profile"}
_SPEC_TYPES: dict[str, type[BaseModel]] = {"gpus": GpuSpec, "links": LinkSpec, "models": ModelSpec}

# Names people type for the same thing; kept small on purpose (normalization does the rest).
ALIASES: Mapping[str, str] = {
    "h100-sxm": "h100", "h100-sxm5": "h100", "h100-80gb": "h100", "h100-80gb-hbm3": "h100",
    "h100-sxm5-80gb": "h100",
    "h200-sxm": "h200", "h200-141gb": "h200",
    "a100-sxm4-80gb": "a100-80gb", "a100-sxm4-40gb": "a100-40gb", "a100-80g": "a100-80gb",
    "a100-40g": "a100-40gb", "a100-80": "a100-80gb", "a100-40": "a100-40gb",
    "mi300": "mi300x", "b200-sxm": "b200",
    "infiniband-ndr": "ib-ndr", "infiniband-hdr": "ib-hdr",
    "llama3.1-8b": "llama3-8b", "llama3.1-70b": "llama3-70b", "llama3.1-405b": "llama3-405b",
    "gpt3": "gpt3-175b",
}

# Names of more than one card: a question, never a silent pick (`a100` meaning the 80 GB card
# planned a 40 GB A100 with twice its memory).
AMBIGUOUS: Mapping[str, tuple[str, ...]] = {
    "a100": ("a100-40gb", "a100-80gb"), "a100-sxm4": ("a100-40gb", "a100-80gb"),
    "a100-sxm": ("a100-40gb", "a100-80gb"), "a100-pcie": ("a100-40gb", "a100-80gb"),
}


class UnknownPresetError(KeyError, ValueError):
    """A name that matches no preset; the message lists the names that exist."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class PresetFileError(ValueError):
    """A preset file that cannot be read: the message names the file (and the line for TOML)."""


# --------------------------------------------------------------------------- lookup


def search_dirs(extra_dirs: Iterable[str | os.PathLike[str]] = ()) -> tuple[Path, ...]:
    """The preset roots in lookup order (they need not exist)."""
    dirs = [Path(d).expanduser() for d in extra_dirs]
    env = os.environ.get(PRESETS_DIR_ENV, "")
    dirs += [Path(d).expanduser() for d in env.split(os.pathsep) if d.strip()]
    config_home = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    dirs.append(Path(config_home) / "zlayout" / "presets")
    dirs.append(BUILTIN_PRESETS_DIR)
    return tuple(dirs)


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown preset kind {kind!r}; use one of: {', '.join(KINDS)}")


@functools.lru_cache(maxsize=256)
def _listing(folder: str, mtime_ns: int, kind: str) -> tuple[tuple[str, str], ...]:
    """(name, path) of the presets in one folder; cached until the folder changes."""
    entries = []
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if entry.name.startswith("."):
            continue
        if entry.name.endswith(".toml") and entry.is_file():
            entries.append((entry.name[: -len(".toml")].lower(), entry.path))
        elif kind == "profiles" and entry.is_dir():
            entries.append((entry.name.lower(), entry.path))
    return tuple(entries)


def _index(kind: str, extra_dirs: Iterable[str | os.PathLike[str]]) -> dict[str, Path]:
    """Every preset name of a kind -> its file, the first directory in lookup order winning."""
    _check_kind(kind)
    index: dict[str, Path] = {}
    for root in search_dirs(extra_dirs):
        folder = root / kind
        try:
            mtime_ns = folder.stat().st_mtime_ns
        except OSError:
            continue
        if not folder.is_dir():
            continue
        for name, path in _listing(str(folder), mtime_ns, kind):
            index.setdefault(name, Path(path))
    return index


def list_presets(kind: str, extra_dirs: Iterable[str | os.PathLike[str]] = ()) -> list[str]:
    """Sorted preset names of one kind (gpus, links, models or profiles)."""
    return sorted(_index(kind, extra_dirs))


def _normalize(name: str) -> str:
    return re.sub(r"[\s_]+", "-", name.strip().lower())


# nvidia-smi and rocm-smi name cards with the vendor first: "NVIDIA A100-SXM4-80GB"
_VENDOR_PREFIX = re.compile(r"^(?:nvidia|amd)-(?:instinct-)?")


def _name_candidates(name: str) -> list[str]:
    """The spellings tried for a name: as typed, aliased, with 'llama-3' joined to 'llama3',
    then the same without a vendor's name in front ('NVIDIA A100-SXM4-80GB')."""
    out: list[str] = []
    typed = _normalize(name)
    for normalized in (typed, _VENDOR_PREFIX.sub("", typed)):
        joined = re.sub(r"(?<=[a-z])-(?=\d)", "", normalized)  # llama-3-8b -> llama3-8b
        for candidate in (normalized, ALIASES.get(normalized), joined, ALIASES.get(joined)):
            if candidate and candidate not in out:
                out.append(candidate)
    return out


def preset_path(kind: str, name: str, extra_dirs: Iterable[str | os.PathLike[str]] = ()) -> Path:
    """The file (or, for profiles, possibly the directory) a preset name resolves to."""
    index = _index(kind, extra_dirs)
    for candidate in _name_candidates(name):
        if candidate in index:
            return index[candidate]
    for candidate in _name_candidates(name):
        meant = [option for option in AMBIGUOUS.get(candidate, ()) if option in index]
        if len(meant) > 1:
            raise UnknownPresetError(f"{_KIND_LABELS[kind]} {_shown(name)} is more than one card: "
                                     f"{_ambiguous_choices(kind, meant, extra_dirs)}? give its full name")
    # the start of several names ('nvlink', 'ib', 'llama3'): which one, never the nearest
    # spelling ('nvlink' read 'did you mean nvlink5?' for an H100's nvlink4)
    typed = _normalize(name)
    started = sorted(option for option in index if option.startswith(typed)) if len(typed) >= 2 else []
    if len(started) > 1:
        noun = "card" if kind == "gpus" else _KIND_LABELS[kind]
        raise UnknownPresetError(f"{_KIND_LABELS[kind]} {_shown(name)} is more than one {noun}: "
                                 f"{_ambiguous_choices(kind, started, extra_dirs)}? give its full name")
    available = ", ".join(sorted(index)) or "(none)"
    aliases = [alias for alias, target in ALIASES.items() if target in index]
    raise UnknownPresetError(f"unknown {_KIND_LABELS[kind]} {_shown(name)}"
                             f"{_did_you_mean(name, list(index) + aliases)}; available: {available}")


def _ambiguous_choices(kind: str, names: list[str], extra_dirs: Iterable[str | os.PathLike[str]]) -> str:
    """'a100-40gb (40 GiB) or a100-80gb (80 GiB)': the cards a name could be, by memory."""
    shown = []
    for option in names:
        try:
            memory = getattr(_load(kind, option, extra_dirs), "memory_bytes", None)
        except (PresetFileError, KeyError, ValueError):
            memory = None
        shown.append(f"{option} ({memory / 2**30:.0f} GiB)" if memory else option)
    return ", ".join(shown[:-1]) + " or " + shown[-1]


def _shown(name: str) -> str:
    return repr(name) if len(name) <= 60 else repr(name[:60] + "...")


def _did_you_mean(name: str, options: Iterable[str]) -> str:
    """' (did you mean llama3-70b?)' for a near miss (aliases resolve to their preset)."""
    import difflib  # for a name that is not a preset only

    close = difflib.get_close_matches(_normalize(name)[:200], list(options), n=1, cutoff=0.6)
    return f" (did you mean {ALIASES.get(close[0], close[0])}?)" if close else ""


# --------------------------------------------------------------------------- reading files


@functools.lru_cache(maxsize=512)
def _read_toml(path: str, mtime_ns: int, size: int) -> Mapping[str, object]:
    if size > tomlsafe.MAX_TOML_BYTES:  # before reading it: a preset is a few hundred bytes
        raise PresetFileError(f"{path}: {size:,} bytes is too big for a preset file")
    try:
        text = read_small_file(path, tomlsafe.MAX_TOML_BYTES).decode("utf-8")
        return tomlsafe.loads(text, path)
    except tomlsafe.TomlLimitError as err:
        raise PresetFileError(str(err)) from None
    except tomllib.TOMLDecodeError as err:  # its message ends "(at line N, column M)"
        raise PresetFileError(f"{path}: invalid TOML: {err}") from None
    except UnicodeDecodeError:
        raise PresetFileError(f"{path}: not UTF-8 text; a preset is a TOML file") from None
    except OSError as err:
        raise PresetFileError(f"{path}: cannot read: {err.strerror}") from None


def _table(path: Path) -> Mapping[str, object]:
    try:
        stat = path.stat()
    except OSError as err:
        raise PresetFileError(f"{path}: cannot read: {err.strerror}") from None
    return _read_toml(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=512)
def _build_spec(kind: str, name: str, path: str, mtime_ns: int, size: int) -> BaseModel:
    table = dict(_read_toml(path, mtime_ns, size))
    declared = table.pop("name", name)
    if str(declared).lower() != name:
        raise PresetFileError(f"{path}: name = {declared!r} differs from the file name; "
                              f"rename the file to {declared}.toml or remove the name key")
    drop = METADATA_KEYS | (GPU_ONLY_KEYS if kind == "gpus" else frozenset())
    fields = {key: value for key, value in table.items() if key not in drop}
    try:
        # strict: hidden = "4096" or bias = 0 in a preset file is an error naming the key
        return _SPEC_TYPES[kind].model_validate({"name": name, **fields}, strict=True)
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'file'}: "
            f"{type_error_text(e) or e['msg'].removeprefix('Value error, ')}" for e in err.errors())
        raise PresetFileError(f"{path}: invalid {_KIND_LABELS[kind]} preset: {problems}") from None


def _load(kind: str, name: str, extra_dirs: Iterable[str | os.PathLike[str]]) -> BaseModel:
    path = preset_path(kind, name, extra_dirs)
    try:
        stat = path.stat()
    except OSError as err:
        raise PresetFileError(f"{path}: cannot read: {err.strerror}") from None
    return _build_spec(kind, path.name[: -len(".toml")].lower(), str(path), stat.st_mtime_ns, stat.st_size)


def load_gpu(name: str, extra_dirs: Iterable[str | os.PathLike[str]] = ()) -> GpuSpec:
    return _load("gpus", name, extra_dirs)  # type: ignore[return-value]


def load_link(name: str, extra_dirs: Iterable[str | os.PathLike[str]] = ()) -> LinkSpec:
    return _load("links", name, extra_dirs)  # type: ignore[return-value]


def load_model(name: str, extra_dirs: Iterable[str | os.PathLike[str]] = ()) -> ModelSpec:
    return _load("models", name, extra_dirs)  # type: ignore[return-value]


def preset_metadata(kind: str, name: str,
                    extra_dirs: Iterable[str | os.PathLike[str]] = ()) -> dict[str, str]:
    """`description`, `source` (and for GPUs `default_intra_link`) of a preset, for display."""
    if kind == "profiles":
        raise ValueError("profiles have no preset metadata; read them with zlayout.profile")
    path = preset_path(kind, name, extra_dirs)
    table = _table(path)
    keys = METADATA_KEYS | (GPU_ONLY_KEYS if kind == "gpus" else frozenset())
    return {key: str(table[key]) for key in sorted(keys) if key in table}


def default_intra_link(gpu_name: str, extra_dirs: Iterable[str | os.PathLike[str]] = ()) -> str:
    """The intra-node link a GPU normally comes with (a GPU preset without one: PCIe 4)."""
    load_gpu(gpu_name, extra_dirs)  # validates the file and the name
    value = _table(preset_path("gpus", gpu_name, extra_dirs)).get("default_intra_link")
    if value is None:
        return FALLBACK_INTRA_LINK
    if not isinstance(value, str):
        raise PresetFileError(f"{preset_path('gpus', gpu_name, extra_dirs)}: default_intra_link "
                              f"must be a link name such as \"nvlink4\", not {value!r}")
    return value.lower()


# --------------------------------------------------------------------------- sizes

_SIZE_SUFFIXES = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}
_SIZE_RE = re.compile(r"^\s*([0-9][0-9_,]{0,40}(?:\.[0-9]{0,40})?)(e[+-]?[0-9]{1,4})?\s*([kmbgt]?)\s*$",
                      re.I)
_SIZE_FORMS = "a number with a unit (M, B or T) or an exponent, e.g. 13B, 1.5T, 350M, 7b or 13e9"


def parse_size(text: str | int | float) -> int:
    """A parameter count from '13B', '1.5T', '350M', '7b' or '13e9', from 10M to 20T.

    Text needs a unit or an exponent: a bare '7' is far more often 7B typed short than a
    7-parameter model, so it is refused with "did you mean 7B?". Numbers are counts.
    """
    if isinstance(text, bool):
        raise ValueError(f"can't read {text!r} as a model size: use {_SIZE_FORMS}")
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        match = _SIZE_RE.match(str(text))
        if not match:
            shown = str(text) if len(str(text)) <= 40 else str(text)[:40] + "..."
            raise ValueError(f"can't read {shown!r} as a model size: use {_SIZE_FORMS}")
        number, exponent, suffix = match.groups()
        bare = float(number.replace("_", "").replace(",", ""))
        if not exponent and not suffix and bare > 0:
            # small: a count of billions typed short; large: a count, written with a unit
            guess = f"{bare:g}B" if bare < 10**6 else format_params(bare)
            raise ValueError(f"size {text.strip()} has no unit: did you mean {guess}? "
                             "(e.g. 13B, 1.5T, 350M or 13e9)")
        value = (float(number.replace("_", "").replace(",", "") + (exponent or ""))
                 * _SIZE_SUFFIXES[suffix.lower()])
    if not math.isfinite(value) or value < 1:
        raise ValueError(f"a model size must be a positive count, got {text!r}: use {_SIZE_FORMS}")
    try:
        check_model_size(value)
    except ValueError:
        raise ValueError(f"a model size must be from 10M to 20T parameters (got {format_params(value)}); "
                         f"e.g. 350M, 13B or 1.5T") from None
    return int(round(value))


def format_params(params: float) -> str:
    """A parameter count as people say it, for every place zlayout shows one (the command
    line, show, the runbook, the app): 8.03B, 70.6B, 350M, 17.7M, 950K, 1.2T; under a
    thousand, the count itself. Three significant digits (whole units from 100 up); a value
    that rounds up to 1000 of a unit is shown in the next one (999.96M is 1B, not 1000M).

    `format_size` is something else: the size part of a generated model's name, kept stable
    because profiles and break-even results store those names."""
    if not math.isfinite(params) or params < 1000:
        return f"{params:,.0f}" if math.isfinite(params) else str(params)
    units = (("K", 1e3), ("M", 1e6), ("B", 1e9), ("T", 1e12))
    for index, (unit, scale) in enumerate(units):
        value = params / scale
        text = f"{value:.0f}" if value >= 100 else f"{value:.3g}"
        if float(text) < 1000 or index == len(units) - 1:
            return f"{float(text):,.0f}{unit}" if float(text) >= 1000 else f"{text}{unit}"
    raise AssertionError("unreachable")  # pragma: no cover


def format_size(params: float) -> str:
    """'350M', '13.0B', '1.20T': the size part of a generated model's name (see
    `format_params` for showing a count)."""
    if params >= 1e12:
        return f"{params / 1e12:.2f}T"
    if params >= 1e9:
        return f"{params / 1e9:.1f}B"
    if params >= 1e6:
        return f"{params / 1e6:.0f}M"
    return f"{params:,.0f}"


# --------------------------------------------------------------------------- family scaling

HIDDEN_MULTIPLE = 128
FFN_MULTIPLE = 256
# A shape's cost, weighed against the size miss (ln params/requested)^2, is
#   aspect weight * (ln layers/ideal layers)^2  (+ KV_HALVED_COST if the kv heads were halved).
# The aspect weight ramps from SMALL (at 1B and below: few shapes exist there, so hit the size)
# to LARGE (at 10B and above: shapes are dense, so keep the family's depth): at 13B a depth 30%
# off costs as much as missing the size by 1.5%.
ASPECT_WEIGHT_SMALL = 0.0003
ASPECT_WEIGHT_LARGE = 0.003
KV_HALVED_COST = 0.01 ** 2
_TABLE_MAX_PARAMS = 2e13  # requests above this get the largest shape (20T)
_MAX_HIDDEN = int(BOUNDS["hidden"].high)  # stops the width scan for families whose shapes grow oddly
_MAX_LAYERS = int(BOUNDS["layers"].high)
_WINDOW_NEIGHBOURS = 2  # each width offers depths reaching its second neighbours' ideal sizes
_WINDOW_OVERLAP = 0.3  # ... and 30% beyond


@dataclass(frozen=True, eq=False)  # hashed by identity: one table per family, cached
class _FamilyTable:
    family: str
    params: tuple[int, ...]  # every allowed shape, sorted by params
    log_params: tuple[float, ...]
    hidden: tuple[int, ...]
    layers: tuple[int, ...]
    aspect_cost: tuple[float, ...]  # how far the depth is from the family's for that width
    templates: Mapping[int, ModelSpec]  # hidden -> a one-layer model of that width


def list_families(extra_dirs: Iterable[str | os.PathLike[str]] = ()) -> list[str]:
    """The families named by model presets; each can be scaled with `model_for_size`."""
    return sorted(_anchors_by_family(_models_key(extra_dirs)))


def _models_key(extra_dirs: Iterable[str | os.PathLike[str]]) -> tuple[tuple[str, str, int, int], ...]:
    """(name, path, mtime, size) of every model preset: changes when any file does."""
    key = []
    for name, path in sorted(_index("models", extra_dirs).items()):
        try:
            stat = path.stat()
        except OSError:
            continue
        key.append((name, str(path), stat.st_mtime_ns, stat.st_size))
    return tuple(key)


@functools.lru_cache(maxsize=64)
def _anchors_by_family(models_key: tuple[tuple[str, str, int, int], ...]) -> Mapping[str, tuple[ModelSpec, ...]]:
    families: dict[str, list[ModelSpec]] = {}
    for name, path, mtime_ns, size in models_key:
        model = _build_spec("models", name, path, mtime_ns, size)
        assert isinstance(model, ModelSpec)
        if model.family:
            families.setdefault(_normalize(model.family), []).append(model)
    return {family: tuple(sorted(models, key=lambda m: (m.params, m.name)))
            for family, models in families.items()}


def _interpolate(anchors: tuple[ModelSpec, ...], log_params: float, value,
                 logs: tuple[float, ...] | None = None) -> float:
    """`value(anchor)` interpolated linearly in log(params), held flat beyond the end anchors.
    `logs`: the anchors' log(params), where the caller has them."""
    logs = logs or _log_params(anchors)
    points = [(x, value(a)) for x, a in zip(logs, anchors)]
    if log_params <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if log_params <= x1:
            return y0 + (y1 - y0) * (log_params - x0) / (x1 - x0)
    return points[-1][1]


def _log_params(anchors: tuple[ModelSpec, ...]) -> tuple[float, ...]:
    # ModelSpec.params adds up every block's tensors on each call: the family table asks for
    # the anchors' thousands of times (a --params plan spent two thirds of 110 ms there)
    return tuple(math.log(a.params) for a in anchors)


def _nearest_anchor(anchors: tuple[ModelSpec, ...], log_params: float,
                    logs: tuple[float, ...] | None = None) -> ModelSpec:
    logs = logs or _log_params(anchors)
    # the nearest in log(params); of two as near, the smaller (log is increasing: as by params)
    return anchors[min(range(len(anchors)), key=lambda i: (abs(logs[i] - log_params), logs[i]))]


def _width_template(anchors: tuple[ModelSpec, ...], hidden: int, head_dim: int,
                    log_params: float, logs: tuple[float, ...] | None = None) -> tuple[ModelSpec, float] | None:
    """A one-layer model of this width (heads, kv heads, ffn, vocab and style from the family)
    and the cost of its kv heads, or None when the width does not split into kv-head groups."""
    logs = logs or _log_params(anchors)
    nearest = _nearest_anchor(anchors, log_params, logs)
    heads = hidden // head_dim
    kv_heads = None
    if nearest.kv_heads is not None:
        # the family's kv heads, or half as many (llama 3.2 3B: 24 heads, 8 kv), or all of them
        # for widths below that many heads; other widths are skipped
        options = [nearest.kv_heads, nearest.kv_heads // 2] if heads >= nearest.kv_heads else [heads]
        kv_heads = next((kv for kv in options if kv >= 1 and heads % kv == 0), None)
        if kv_heads is None:
            return None
    ffn = None
    if nearest.hidden == hidden:
        ffn = nearest.ffn
    elif any(a.ffn is not None for a in anchors):
        ratio = _interpolate(anchors, log_params, lambda a: a.ffn_size / a.hidden, logs)
        ffn = max(FFN_MULTIPLE, round(ratio * hidden / FFN_MULTIPLE) * FFN_MULTIPLE)
    try:
        template = ModelSpec(
            name="template", family=nearest.family, layers=1, hidden=hidden, heads=heads,
            kv_heads=kv_heads, ffn=ffn, vocab=nearest.vocab, mlp=nearest.mlp, norm=nearest.norm,
            bias=nearest.bias, qkv_bias=nearest.qkv_bias, tie_embeddings=nearest.tie_embeddings)
    except ValidationError:  # beyond the spec's bounds (heads, ffn): not a shape to offer
        return None
    halved = nearest.kv_heads is not None and kv_heads is not None and kv_heads < min(nearest.kv_heads, heads)
    return template, (KV_HALVED_COST if halved else 0.0)


@functools.lru_cache(maxsize=32)
def _family_table(family: str, anchors: tuple[ModelSpec, ...]) -> _FamilyTable:
    """Every shape the family rule allows, sorted by params (the rule: docs/presets.md)."""
    head_dim = anchors[0].head_dim
    step = math.lcm(HIDDEN_MULTIPLE, head_dim)
    if step > _MAX_HIDDEN // 8:
        raise ValueError(f"family {family!r}: head size {head_dim} is too odd to scale; "
                         "use a head size that divides a multiple of 128 (e.g. 64, 96, 128)")
    # (hidden, template, ideal layers, ideal params, kv cost) of each allowed width
    widths: list[tuple[int, ModelSpec, float, float, float]] = []
    logs = _log_params(anchors)
    log_params = logs[0]
    hidden = 0
    while not widths or widths[-1][3] <= _TABLE_MAX_PARAMS:
        hidden += step
        if hidden > _MAX_HIDDEN:
            break
        made = None
        for _ in range(4):  # fixed point: the aspect and the ffn depend on the size they give
            made = _width_template(anchors, hidden, head_dim, log_params, logs)
            if made is None:
                break
            template, kv_cost = made
            aspect = _interpolate(anchors, log_params, lambda a: a.layers / a.hidden, logs)
            ideal_layers = max(1.0, aspect * hidden)
            layer = template.layer_params()
            log_params = math.log(template.params - layer + ideal_layers * layer)
        if made is not None:
            widths.append((hidden, template, ideal_layers, math.exp(log_params), kv_cost))
    rows: list[tuple[int, float, int, int]] = []  # params, aspect cost, hidden, layers
    for i, (hidden, template, ideal_layers, ideal_params, kv_cost) in enumerate(widths):
        lower = widths[max(0, i - _WINDOW_NEIGHBOURS)][3]
        upper = widths[min(len(widths) - 1, i + _WINDOW_NEIGHBOURS)][3]
        layer = template.layer_params()
        fixed = template.params - layer
        first = max(1, math.floor((lower / (1 + _WINDOW_OVERLAP) - fixed) / layer))
        last = max(first, math.ceil((upper * (1 + _WINDOW_OVERLAP) - fixed) / layer),
                   round(ideal_layers))
        # a family whose presets are odd (1000 layers at hidden 128) would ask for millions
        # of depths per width: only depths the spec accepts are shapes
        for layers in range(first, min(last, _MAX_LAYERS) + 1):
            params = fixed + layers * layer
            cost = _aspect_weight(params) * math.log(layers / ideal_layers) ** 2 + kv_cost
            rows.append((params, cost, hidden, layers))
    if not rows:
        raise ValueError(f"family {family!r}: its presets give no shape within the spec's bounds; "
                         "check their layers and hidden sizes")
    rows.sort()
    return _FamilyTable(
        family=family,
        params=tuple(r[0] for r in rows),
        log_params=tuple(math.log(r[0]) for r in rows),
        aspect_cost=tuple(r[1] for r in rows),
        hidden=tuple(r[2] for r in rows),
        layers=tuple(r[3] for r in rows),
        templates={w[0]: w[1] for w in widths})


def _aspect_weight(params: float) -> float:
    ramp = min(1.0, max(0.0, math.log10(params) - 9.0))
    return ASPECT_WEIGHT_SMALL + (ASPECT_WEIGHT_LARGE - ASPECT_WEIGHT_SMALL) * ramp


def _family_anchors(family: str, extra_dirs: Iterable[str | os.PathLike[str]]) -> tuple[ModelSpec, ...]:
    by_family = _anchors_by_family(_models_key(extra_dirs))
    anchors = by_family.get(_normalize(family))
    if not anchors:
        families = ", ".join(sorted(by_family)) or "(none)"
        raise UnknownPresetError(f"unknown model family {_shown(family)}"
                                 f"{_did_you_mean(family, by_family)}; available: {families}")
    return anchors


@functools.lru_cache(maxsize=4096)
def _model_from_row(table: _FamilyTable, row: int) -> ModelSpec:
    template = table.templates[table.hidden[row]]
    return template.model_copy(update={
        "name": f"{table.family}-{format_size(table.params[row])}", "layers": table.layers[row]})


def _best_row(table: _FamilyTable, log_target: float) -> int:
    """The row minimising (ln params - ln target)^2 + aspect cost.

    A cost of this form makes the choice monotone: the winner's params never decrease as the
    target grows (the rows' costs are lines in ln target whose slopes fall with ln params).
    The scan leaves each side once the size error alone exceeds the best cost found.
    """
    start = bisect.bisect_left(table.log_params, log_target)
    best_row, best_cost = -1, math.inf
    row = start
    while row < len(table.params):
        miss = (table.log_params[row] - log_target) ** 2
        if miss > best_cost:
            break
        cost = miss + table.aspect_cost[row]
        if cost < best_cost:
            best_row, best_cost = row, cost
        row += 1
    row = start - 1
    while row >= 0:
        miss = (table.log_params[row] - log_target) ** 2
        if miss > best_cost:
            break
        cost = miss + table.aspect_cost[row]
        if cost <= best_cost:  # ties go to the smaller model
            best_row, best_cost = row, cost
        row -= 1
    return best_row


def model_for_size(params: float | str, family: str = "llama3",
                   extra_dirs: Iterable[str | os.PathLike[str]] = ()) -> ModelSpec:
    """The family's shape nearest `params` (deterministic; never smaller for a larger request).

    Shapes come from a fixed table built once from the family's presets (docs/presets.md).
    Requests beyond the table's ends (tens of millions; 20T) get its smallest or largest shape.
    """
    target = parse_size(params) if isinstance(params, str) else float(params)
    if not math.isfinite(target) or target <= 0:
        raise ValueError(f"a model size must be a positive count, got {params!r}")
    return family_scaler(family, extra_dirs)(target)


def family_scaler(family: str = "llama3",
                  extra_dirs: Iterable[str | os.PathLike[str]] = ()) -> Callable[[float], ModelSpec]:
    """`model_for_size` for one family with its presets read once: a function of the size alone.

    For searches that ask many sizes (break-even bisections on every keystroke): it skips
    the preset files' freshness check (~90 µs) that `model_for_size` makes on each call.
    """
    anchors = _family_anchors(family, extra_dirs)
    table = _family_table(anchors[0].family or family, anchors)

    def model(params: float) -> ModelSpec:
        return _model_from_row(table, _best_row(table, math.log(params)))

    return model
