"""Keep the user's own preset directories out of these tests: each test sees only the built-ins
plus what it writes under tmp_path."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _isolated_preset_dirs(tmp_path_factory, monkeypatch):
    monkeypatch.delenv("ZLAYOUT_PRESETS_DIR", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("xdg-config")))
