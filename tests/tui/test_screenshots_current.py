"""screenshots/ is what the app draws today: every SVG there is rewritten by
scripts/screenshots.py (the real planner and presets) into a temporary folder and compared
byte for byte, and the script writes no file that is not committed. All eight were stale
once (the README's showed figures the app no longer computed)."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def load_script():
    spec = importlib.util.spec_from_file_location("zlayout_screenshots", REPO / "scripts" / "screenshots.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_screenshots_are_what_the_app_draws(tmp_path):
    written = asyncio.run(load_script().shoot(tmp_path))
    committed = sorted(path.name for path in (REPO / "screenshots").glob("*.svg"))
    assert sorted(path.name for path in written) == committed, \
        "scripts/screenshots.py and screenshots/ list different scenes: run python scripts/screenshots.py"
    stale = [path.name for path in written
             if path.read_bytes() != (REPO / "screenshots" / path.name).read_bytes()]
    assert not stale, f"stale screenshots {stale}: run python scripts/screenshots.py and commit them"
