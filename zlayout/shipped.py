"""Where the data zlayout ships sits: presets (GPUs, links, models, profiles) and model cards.

Inside the package in a wheel (pyproject.toml maps presets/ into zlayout/presets), else the
checkout's top-level presets/: an editable install or PYTHONPATH=<clone> imports zlayout from the
checkout, where the data sits beside the package. The catalog (presets by name) and the cards
(`zlayout learn`'s, by config) both read from here; neither imports the other for it.
"""

from __future__ import annotations

from pathlib import Path


def _builtin_presets_dir() -> Path:
    package_dir = Path(__file__).resolve().parent
    inside = package_dir / "presets"
    return inside if inside.is_dir() else package_dir.parent / "presets"


BUILTIN_PRESETS_DIR = _builtin_presets_dir()
