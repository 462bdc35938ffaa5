"""The caching-allocator replay writes, for a grid of varied layouts, exactly the request
sequences recorded in tests/core/replay_golden.json (tests/core/replay_golden.py): a rewrite
of allocation_sequence that means to change nothing changes no digest."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import replay_golden as golden  # noqa: E402  tests/core/replay_golden.py: the grid and its recorder

RECORDED = json.loads(golden.GOLDEN.read_text())


@pytest.fixture(autouse=True)
def _own_cards_dir(monkeypatch, tmp_path):
    # replay_golden points ZLAYOUT_CARDS_DIR at presets' or heldout's cards per case, and gives the
    # caller's value back (`plan_input`); set here too, so no test of this module sees another's
    monkeypatch.setenv("ZLAYOUT_CARDS_DIR", str(tmp_path / "no-cards"))


@pytest.mark.parametrize("outside", [None, "elsewhere"])
def test_a_case_leaves_the_cards_folder_as_it_found_it(monkeypatch, outside):
    """heldout/cards holds older cards of shipped keys (gemma-3-1b's without its outside frees):
    left as the cards folder, it answered every later test of the worker (ci83)."""
    from zlayout import cards

    if outside is None:
        monkeypatch.delenv(cards.CARDS_DIR_ENV)
    else:
        monkeypatch.setenv(cards.CARDS_DIR_ENV, outside)
    inp, _ = golden.plan_input(*golden.CASES["phimoe-L2-z3-opt-cpu-heldout"])
    assert inp.model.card is not None  # read from heldout/cards while the input was built
    assert os.environ.get(cards.CARDS_DIR_ENV) == outside


def test_the_grid_covers_what_the_replay_distinguishes():
    cases = RECORDED.values()
    assert len(RECORDED) == len(golden.CASES) >= 40
    assert sum(c["replayed"] and c["carded"] for c in cases) >= 10
    assert sum(c["replayed"] and not c["carded"] for c in cases) >= 20


@pytest.mark.parametrize("name", sorted(golden.CASES))
def test_the_replay_writes_the_recorded_requests(name):
    assert golden.record(name) == RECORDED[name]


def test_a_gradient_larger_than_the_bucket_lives_through_its_reduction():
    """phi3.5-moe's 3-D expert weight (16 x 12800 x 4096 = 838.9M elements) is larger than
    reduce_bucket_size (500M): DeepSpeed 0.19.8's stage3.py does not copy it into the IPG bucket
    but keeps it whole as param.grad, reduces it alone at the next gradient's hook, and drops it in
    partition_grads after record_stream on the reduce stream. Its block is requested before the
    next weight gradient and its own partition's copy on the reduce stream, and freed after both
    (it was freed at its own hook)."""
    from zlayout.core import allocator_sim as sim
    from zlayout.core.replay_state import REDUCE_STREAM

    inp, layout = golden.plan_input(*golden.CASES["phimoe-L2-z3-opt-cpu-heldout"])
    events = sim.allocation_sequence(inp, layout, 2, sim._Seq())
    grad_bytes = 838_860_800 * 2
    later_grads = (419_430_400 * 2, grad_bytes, 32064 * 4096 * 2)  # the next layer's weights, the embedding
    live: dict[int, int] = {}  # the compute stream's blocks of the gradient's size: name -> made at
    reductions = 0
    for i, event in enumerate(events):
        kind, name, size, *stream = event
        if kind == "a" and size == grad_bytes and not stream:
            live[name] = i
        elif kind == "a" and size == grad_bytes and stream == [REDUCE_STREAM]:
            # its partition's copy back from the host buffer (one GPU: the whole gradient)
            assert live, f"event {i}: the gradient being reduced was freed at its hook"
            reductions += 1
            held = max(live, key=live.get)
            freed = next(j for j in range(i, len(events)) if events[j][:2] == ("f", held))
            # still held when the backward requests the next weight gradient (freed one bucket later)
            assert any(e[0] == "a" and e[2] in later_grads and len(e) == 3
                       for e in events[i:freed])
        elif kind == "f":
            live.pop(name, None)
    assert reductions >= 4  # two layers, two steps (the fp32 casts of 419.4M-element buckets match too)


@pytest.mark.parametrize("name", sorted(n for n, c in RECORDED.items() if c["replayed"] and c["carded"]))
def test_a_live_replay_leaves_the_pools_as_its_recorded_requests_do(name):
    """Planning serves a card's block phases from a compiled program (CardBlocks.program, with
    transients) rather than request by request: the tensors it numbers and the pools it leaves
    (segments, free blocks per stream) are those of the recorded events replayed in order."""
    from zlayout.core import allocator_sim as sim

    inp, layout = golden.plan_input(*golden.CASES[name])
    recorded, live = sim._Seq(), sim._Seq(live=True)
    events = sim.allocation_sequence(inp, layout, 2, recorded)
    sim.allocation_sequence(inp, layout, 2, live)
    assert live.sizes == recorded.sizes
    pools = sim.replay(events, track_allocated=False).pools
    assert {stream: (pool.segment_sizes, pool.free_index) for stream, pool in pools.items()} == \
        {stream: (pool.segment_sizes, pool.free_index) for stream, pool in live.pools.items()}
