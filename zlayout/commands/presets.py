"""`zlayout presets [gpus|models|links|profiles]`: what is built in (and in your preset
directories), with the figures each preset carries.

GPUs: memory, dense BF16 FLOP/s, HBM and host PCIe bandwidth, the intra-node link they come
with. Links: bandwidth per GPU per direction, efficiency, latency. Models: family, parameters,
layers, hidden, heads, kv heads, ffn, vocabulary, experts. Profiles: the layout, model,
hardware, predicted device memory and step time, and whether it was verified. With --json,
one object: {"gpus": [...], "links": [...], "models": [...], "profiles": [...]} (only the kind
asked for, when one is). A preset file that cannot be read is listed with its error.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from zlayout.cli import UsageError, _check_presets_dirs
from zlayout.messages import printable, quoted

KIND_WORDS = {"gpus": "gpus", "gpu": "gpus", "models": "models", "model": "models",
              "links": "links", "link": "links", "profiles": "profiles", "profile": "profiles"}
ORDER = ("gpus", "links", "models", "profiles")
TITLES = {"gpus": "GPUs (--gpu NAME)", "links": "Links (--intra-link NAME, --inter-link NAME)",
          "models": "Models (--preset NAME; --params SIZE --family FAMILY)",
          "profiles": "Ready profiles (zlayout show NAME)"}


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("presets", help="list the built-in GPUs, links, models and profiles with their figures",
                            description=" ".join(__doc__.split("\n\n")[0].split()).replace("`", ""))
    parser.add_argument("kind", nargs="?", metavar="gpus|models|links|profiles",
                        help="list only this kind (default: all four)")
    parser.add_argument("--presets-dir", action="append", default=[], metavar="DIR",
                        help="extra directory of preset TOML files, listed first (repeatable)")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.set_defaults(func=run)


def _kinds(typed: str | None) -> tuple[str, ...]:
    if typed is None:
        return ORDER
    kind = KIND_WORDS.get(typed.strip().lower())
    if kind is None:
        from zlayout.suggest import did_you_mean

        close = did_you_mean(typed.strip().lower(), list(KIND_WORDS))
        for word, kind in KIND_WORDS.items():  # the suggestion names the kind as listed (gpus)
            close = close.replace(f"mean {word}?", f"mean {kind}?")
        raise UsageError(f"presets: {quoted(typed)} is not one of gpus, models, links, profiles{close}")
    return (kind,)


def _gib(nbytes: float) -> float:
    return round(nbytes / 2**30, 1)


def _row(kind: str, name: str, dirs: tuple[str, ...]) -> dict[str, Any]:
    """One preset's figures (JSON-ready), or its name and the error that stops reading it."""
    from zlayout import catalog

    path = catalog.preset_path(kind, name, dirs)
    row: dict[str, Any] = {"name": name, "path": str(path)}
    try:
        if kind == "profiles":
            return {**row, **_profile_summary(path)}
        spec = {"gpus": catalog.load_gpu, "links": catalog.load_link, "models": catalog.load_model}[kind](name, dirs)
        row.update(catalog.preset_metadata(kind, name, dirs))
    except (catalog.PresetFileError, KeyError, ValueError, OSError) as exc:
        return {**row, "error": str(exc)}
    data = spec.model_dump()
    data.pop("name", None)
    if kind == "models":
        data.update(params=spec.params, active_params=spec.active_params)
        data = {key: value for key, value in data.items() if value is not None}
    return {**row, **data}


def _profile_summary(path: Path) -> dict[str, Any]:
    """A ready profile's [summary] and its inputs' sequence and batch, read as TOML (checking the
    whole set is `zlayout check`'s work)."""
    from zlayout import tomlsafe

    toml = path / "profile.toml" if path.is_dir() else path
    if toml.stat().st_size > tomlsafe.MAX_TOML_BYTES:
        raise ValueError(f"{toml}: too big for a profile")
    data = tomlsafe.loads(toml.read_text(encoding="utf-8"), str(toml))
    summary = data.get("summary") if isinstance(data.get("summary"), dict) else {}
    training = data.get("inputs", {}).get("training", {}) if isinstance(data.get("inputs"), dict) else {}
    keep = ("layout", "model", "hardware", "fits", "gpu_device_used_gib", "gpu_capacity_gib",
            "host_peak_gib", "step_time_s", "tokens_per_s", "verdict")
    out = {key: summary[key] for key in keep if key in summary}
    for key in ("seq", "micro_batch", "grad_accum"):
        if isinstance(training, dict) and key in training:
            out[key] = training[key]
    if "description" in data:
        out["description"] = data["description"]
    return out


def presets_json(kinds: tuple[str, ...], dirs: tuple[str, ...] = ()) -> dict[str, list[dict[str, Any]]]:
    from zlayout import catalog

    return {kind: [_row(kind, name, dirs) for name in catalog.list_presets(kind, dirs)] for kind in kinds}


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]], right: set[int]) -> list[str]:
    rows = [tuple(printable(cell) for cell in row) for row in rows]  # a file's text: no escapes acted on
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]

    def line(cells) -> str:
        return "  ".join(str(c).rjust(w) if i in right else str(c).ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return [line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def _number(value: Any, digits: int = 0) -> str:
    return f"{value:,.{digits}f}" if isinstance(value, (int, float)) else "?"


def _text(kind: str, rows: list[dict[str, Any]], dirs: tuple[str, ...]) -> list[str]:
    from zlayout import catalog

    good = [r for r in rows if "error" not in r]
    lines = [TITLES[kind]]
    if kind == "gpus":
        lines += _table(("name", "memory GiB", "bf16 TFLOP/s", "HBM GB/s", "PCIe GB/s", "link", "description"),
                        [(r["name"], _number(_gib(r["memory_bytes"]), 1), _number(r["peak_bf16_flops"] / 1e12),
                          _number(r["hbm_gbps"]), _number(r["pcie_gbps"]),
                          r.get("default_intra_link", catalog.FALLBACK_INTRA_LINK), r.get("description", ""))
                         for r in good], {1, 2, 3, 4})
        lines += _alias_lines(catalog.ALIASES, {r["name"] for r in good})
        lines += [f"{name} is more than one card: give {' or '.join(options)}"
                  for name, options in catalog.AMBIGUOUS.items() if name.isalnum()]
    elif kind == "links":
        lines += _table(("name", "GB/s per GPU", "efficiency", "latency us", "description"),
                        [(r["name"], _number(r["bandwidth_gbps"], 1 if r["bandwidth_gbps"] % 1 else 0),
                          f"{r['efficiency']:g}", f"{r['latency_us']:g}", r.get("description", ""))
                         for r in good], {1, 2, 3})
        lines += _alias_lines(catalog.ALIASES, {r["name"] for r in good})
    elif kind == "models":
        from zlayout.catalog import format_params

        lines += _table(("name", "family", "params", "layers", "hidden", "heads", "kv", "ffn", "vocab",
                         "experts", "description"),
                        [(r["name"], r.get("family") or "-", format_params(r["params"]), str(r["layers"]),
                          str(r["hidden"]), str(r["heads"]), str(r.get("kv_heads") or r["heads"]),
                          str(r.get("ffn") or 4 * r["hidden"]), str(r["vocab"]),
                          f"{r['experts']} (top {r['top_k']})" if r.get("experts") else "-",
                          r.get("description", ""))
                         for r in good], {2, 3, 4, 5, 6, 7, 8})
        lines += _alias_lines(catalog.ALIASES, {r["name"] for r in good})
        # from the rows read: catalog.list_families reads every file again and raises on a
        # broken one, which is already listed below with its error
        families = sorted({catalog._normalize(r["family"]) for r in good if r.get("family")})
        lines.append(f"families for --params SIZE --family F: {', '.join(families)}" if families else "")
    else:
        lines += _table(("name", "layout", "model", "hardware", "seq", "device GiB", "step s", "fits", "verified"),
                        [(r["name"], r.get("layout", "?"), str(r.get("model", "?")).split(":")[0],
                          r.get("hardware", "?"), str(r.get("seq", "?")),
                          f"{_number(r.get('gpu_device_used_gib'), 1)} of {_number(r.get('gpu_capacity_gib'), 1)}",
                          _number(r.get("step_time_s"), 2), {True: "yes", False: "no"}.get(r.get("fits"), "?"),
                          "no" if str(r.get("verdict", "")).startswith("unverified") else "yes")
                         for r in good], {4, 6})
    lines += [printable(f"{r['name']}: cannot be read: {r['error']}") for r in rows if "error" in r]
    if not rows:
        lines.append("(none)")
    return [line for line in lines if line != ""]


def _alias_lines(aliases: dict[str, str], names: set[str]) -> list[str]:
    """'also h100: h100-sxm, h100-sxm5, h100-80gb': the other names each preset answers to."""
    by_target: dict[str, list[str]] = {}
    for alias, target in aliases.items():
        if target in names:
            by_target.setdefault(target, []).append(alias)
    return [f"also {target}: {', '.join(others)}" for target, others in sorted(by_target.items())]


def run(args: argparse.Namespace) -> int:
    kinds = _kinds(args.kind)
    dirs = tuple(args.presets_dir)
    _check_presets_dirs(dirs)
    data = presets_json(kinds, dirs)
    if args.json:
        print(json.dumps(data, allow_nan=False))
        return 0
    blocks = ["\n".join(_fit(line) for line in _text(kind, data[kind], dirs)) for kind in kinds]
    print("\n\n".join(blocks))
    if len(kinds) > 1:
        print(f"\nPreset directories, first match wins: {', '.join(_dirs_shown(dirs))} "
              "(docs/presets.md: adding your own)")
    return 0


def _fit(line: str) -> str:
    """A line cut to the terminal's width (the description, last, goes first); whole when
    the output is not a terminal, for scripts and pagers."""
    line = printable(line)  # names and lists from files too (the table's cells already are)
    if not sys.stdout.isatty():
        return line
    width = shutil.get_terminal_size().columns
    return line if len(line) <= width else line[:width - 1] + "…"


def _dirs_shown(dirs: tuple[str, ...]) -> list[str]:
    from zlayout import catalog

    home = str(Path.home())
    shown = []
    for folder in catalog.search_dirs(dirs):
        text = str(folder)
        text = "~" + text[len(home):] if home and text.startswith(home + os.sep) else text
        shown.append(text)
    return shown
