"""The caching-allocator replay writes, for a grid of varied layouts, exactly the request
sequences recorded in tests/core/replay_golden.json (tests/core/replay_golden.py): a rewrite
of allocation_sequence that means to change nothing changes no digest."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import replay_golden as golden  # noqa: E402  tests/core/replay_golden.py: the grid and its recorder

RECORDED = json.loads(golden.GOLDEN.read_text())


@pytest.fixture(autouse=True)
def _own_cards_dir(monkeypatch):
    # replay_golden points ZLAYOUT_CARDS_DIR at presets' or heldout's cards per case
    monkeypatch.delenv("ZLAYOUT_CARDS_DIR", raising=False)


def test_the_grid_covers_what_the_replay_distinguishes():
    cases = RECORDED.values()
    assert len(RECORDED) == len(golden.CASES) >= 40
    assert sum(c["replayed"] and c["carded"] for c in cases) >= 10
    assert sum(c["replayed"] and not c["carded"] for c in cases) >= 20


@pytest.mark.parametrize("name", sorted(golden.CASES))
def test_the_replay_writes_the_recorded_requests(name):
    assert golden.record(name) == RECORDED[name]
