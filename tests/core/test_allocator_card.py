"""The caching-allocator replay takes a carded model's blocks from its learned card
(allocator_sim.CardBlocks): the card's requests in its order, sized at the layout's tokens, the
weight gradients handed to DeepSpeed's hook, and the replay keyed on the card's text."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from zlayout import catalog, cards
from zlayout.core.reductions import device_of
from zlayout.cli import build_parser, plan_input_from_args
from zlayout.core import allocator_sim as sim
from zlayout.core.memory import estimate_memory
from zlayout.spec import Layout

HELDOUT = Path(__file__).resolve().parents[2] / "benchmarks" / "measurements" / "h200-2026-12-02c" / "heldout"
MiB = 2**20
GiB = 2**30


@pytest.fixture
def carded(monkeypatch):
    """A PlanInput for one of the held-out configs, planned from its shipped held-out card."""
    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(HELDOUT / "cards"))

    def make(config: str, *flags: str):
        args = build_parser().parse_args([
            "plan", "--hf-config", str(HELDOUT / "configs" / config), "--impl", "hf", "--gpu", "h200",
            "--gpus-per-node", "1", *flags])
        inp = plan_input_from_args(args)
        assert inp.model.card is not None, config
        return inp
    return make


def _allocations(events) -> list[int]:
    return [e[2] for e in events if e[0] == "a"]


def _live_at_marks(events, marks) -> dict[str, int]:
    """Bytes allocated (large pool) at each phase mark, walking the event list."""
    at = dict((index, phase) for phase, index in marks)
    sizes, live, out = {}, 0, {}
    for i, event in enumerate(events):
        if i in at:
            out[at[i]] = live
        kind, name, size = event[:3]
        if kind == "a":
            sizes[name] = size if size > sim.SMALL_SIZE else 0
            live += sizes[name]
        elif kind == "f":
            live -= sizes.pop(name)
    for phase, index in marks:
        out.setdefault(phase, live)
    return out


def _sublist_count(haystack: list[int], needle: list[int]) -> int:
    n = len(needle)
    return sum(haystack[i:i + n] == needle for i in range(len(haystack) - n + 1))


def test_gemma2_eager_attention_probabilities_are_replayed_at_their_size(carded):
    # Gemma-2 trains with eager attention: each block's forward makes the (heads x T x T)
    # scores and probabilities, which the hand-written blocks (flash attention) never ask for
    inp = carded("gemma-2-2b-L8.json", "--seq", "4096", "--micro-batch", "1")
    layout = Layout(stage=2, offload_optimizer="gpu", offload_param="gpu")
    heads, seq = 8, 4096
    probabilities = heads * seq * seq * 2  # bf16: 256 MiB
    events = sim.allocation_sequence(inp, layout, steps=1)
    assert probabilities == 256 * MiB
    assert _allocations(events).count(probabilities) >= inp.model.layers
    # with the hand-written blocks (the card switched off), no such request
    sim.blocks_from_cards = False
    try:
        assert probabilities not in _allocations(sim.allocation_sequence(inp, layout, steps=1))
    finally:
        sim.blocks_from_cards = True


def test_each_block_replays_the_cards_forward_requests_in_order(carded):
    inp = carded("pythia-1b.json", "--seq", "2048", "--micro-batch", "4")
    layout = Layout(stage=0, offload_optimizer="gpu", offload_param="gpu")
    block = inp.model.card.regime(2048, 4).block(inp.model.card.layer_kinds[0])
    forward = [x for x in block.forward.sizes(4, 2048, device_of(catalog.load_gpu("h200"))) if x > sim.SMALL_SIZE]
    assert len(forward) > 5
    events = sim.allocation_sequence(inp, layout, steps=1)
    # every block but the first (whose forward also takes the cuBLAS workspace) asks for the
    # card's allocations in the card's order, at micro-batch 4 x 2048 tokens
    assert _sublist_count(_allocations(events), forward) >= inp.model.layers - 1


@pytest.mark.parametrize("config, flags, layout", [
    ("gemma-2-2b-L8.json", ("--seq", "4096", "--micro-batch", "1", "--checkpointing", "full"), (2, "gpu", "gpu")),
    ("gpt2-medium.json", ("--seq", "1024", "--micro-batch", "4"), (1, "gpu", "gpu")),
    ("pythia-1b.json", ("--seq", "2048", "--micro-batch", "4"), (0, "gpu", "gpu")),
    ("gemma-2b.json", ("--seq", "2048", "--micro-batch", "1", "--grad-accum", "2"), (3, "gpu", "gpu")),
])
def test_a_carded_step_frees_what_it_makes(carded, config, flags, layout):
    # the card records sizes, not tensors: every free must find its tensor, and each step must
    # leave the allocator as the one before it did (nothing carried over, nothing leaked)
    inp = carded(config, *flags)
    made = []
    original = sim.card_blocks
    sim.card_blocks = lambda *a: made.append(original(*a)) or made[-1]
    try:
        seq = sim._Seq()
        events = sim.allocation_sequence(inp, Layout(stage=layout[0], offload_optimizer=layout[1],
                                                     offload_param=layout[2]), 3, seq)
    finally:
        sim.card_blocks = original
    # a free that finds no tensor of its size is one the step made outside the block; with
    # checkpointing the card's backward window sees one such (autograd releases the block
    # above's recompute late): at most one a block's backward, none without checkpointing
    passes = inp.model.layers * 3 * min(inp.training.grad_accum, sim.REPLAYED_MICRO_STEPS)
    assert made[0] is not None
    assert made[0].unmatched <= (passes if inp.training.checkpointing == "full" else 0)
    live = _live_at_marks(events, seq.marks)
    assert live["step2.step"] == live["step3.step"] > 0


def test_device_used_follows_the_card(carded):
    # the card's blocks change what the replay reserves: gpt2's dropout masks and GELU (its
    # config's gelu_new) are requests the hand-written blocks do not make
    inp = carded("gpt2-medium.json", "--seq", "1024", "--micro-batch", "16")
    layout = Layout(stage=1, offload_optimizer="gpu", offload_param="gpu")
    with_card = estimate_memory(inp, layout).gpu_peak_reserved_bytes
    sim.blocks_from_cards = False
    try:
        hand = estimate_memory(inp, layout).gpu_peak_reserved_bytes
    finally:
        sim.blocks_from_cards = True
    assert with_card - hand > 1024 * MiB


def test_the_replay_key_holds_the_cards_text(carded):
    inp = carded("gpt2-medium.json", "--seq", "1024", "--micro-batch", "4")
    layout = Layout(stage=1, offload_optimizer="gpu", offload_param="gpu")
    relearned = dataclasses.replace(inp.model.card, digest="0" * 16)
    other = inp.model_copy(update={"model": inp.model.model_copy(update={"card": relearned})})
    assert inp.model.card.digest and inp.model.card.digest != "0" * 16
    assert inp.model.model_dump_json() == other.model.model_dump_json()  # the JSON names the key only
    assert sim._key(inp, layout) != sim._key(other, layout)


# --- the head and loss from the card -------------------------------------------------------


def _with_hand_head(make):
    sim.heads_from_cards = False
    try:
        return make()
    finally:
        sim.heads_from_cards = True


def test_gemma2s_softcapped_logits_are_replayed_from_its_card(carded):
    # Gemma-2 caps its logits (logits / cap, tanh, * cap: three more tokens x vocab bf16
    # tensors) before the loss; the hand-written head does not, the card's head records them
    inp = carded("gemma-2-2b-L8.json", "--seq", "4096", "--micro-batch", "1", "--loop", "trainer")
    layout = Layout(stage=0, offload_optimizer="gpu", offload_param="gpu")
    logits = 4096 * inp.model.vocab * 2

    def head_forward_logits() -> int:
        seq = sim._Seq()
        events = sim.allocation_sequence(inp, layout, 1, seq)
        marks = dict(seq.marks)
        forward = events[marks["step1.forward"] - 40:marks["step1.forward"]]
        return _allocations(forward).count(logits)

    assert head_forward_logits() == 4  # the logits, the capped quotient, its tanh, the product
    assert _with_hand_head(head_forward_logits) == 1
    sim._CACHE.clear()
    with_card = sim.replayed_peak_reserved(inp, layout)
    by_hand = _with_hand_head(lambda: sim.replayed_peak_reserved(inp, layout))
    assert with_card - by_hand >= logits


def test_the_deepspeed_loop_keeps_the_cards_logits(carded):
    # `outputs = engine(...)` holds the bf16 logits through backward and the step: the card's
    # head drops them (the trainer loop) unless the loop keeps them
    layout = Layout(stage=2, offload_optimizer="gpu", offload_param="gpu")
    live = {}
    for loop in ("deepspeed", "trainer"):
        inp = carded("llama-3.2-1b.json", "--seq", "2048", "--micro-batch", "2", "--loop", loop)
        seq = sim._Seq()
        live[loop] = _live_at_marks(sim.allocation_sequence(inp, layout, 2, seq), seq.marks)
    logits = 2 * 2048 * inp.model.vocab * 2
    for mark in ("step1.forward", "step1.backward", "step2.step"):
        assert live["deepspeed"][mark] - live["trainer"][mark] == logits, mark


def test_a_tied_heads_gradient_from_the_card_waits_for_the_embeddings(carded):
    # Llama-3.2-1B ties its head to its embedding: autograd holds the head's gradient until the
    # embedding's is made and sums the two (a third tensor); the card's head backward never
    # drops it, so it must not be hooked (freed) there
    inp = carded("llama-3.2-1b.json", "--seq", "1000", "--micro-batch", "1")  # no tokens x vocab as large
    weight = inp.model.vocab * inp.model.hidden * 2
    assert inp.model.tie_embeddings
    seq = sim._Seq()
    events = sim.allocation_sequence(inp, Layout(stage=0, offload_optimizer="gpu", offload_param="gpu"), 1, seq)
    backward = events[dict(seq.marks)["step1.forward"]:dict(seq.marks)["step1.backward"]]
    made = [e[1] for e in backward if e[0] == "a" and e[2] == weight]
    assert len(made) == 3  # the head's gradient, the embedding's, their sum
    head, embedding, total = made
    order = [e[:2] for e in backward]
    # the head's gradient lives until the embedding's is made, then both die for their sum
    assert order.index(("a", embedding)) < order.index(("f", head))
    assert order.index(("a", total)) < order.index(("f", head))


# --- latent attention (MLA) from the card ----------------------------------------------------

BATCH_H = Path(__file__).resolve().parents[2] / "benchmarks" / "measurements" / "h200-2026-12-04"


@pytest.fixture
def deepseek_v2_lite(monkeypatch):
    """DeepSeek-V2-Lite-L4 (MLA, 64 experts top-6, block 0 dense) at 2 x 4096, planned from the
    card batch h ran with (heldout/cards-bias)."""
    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(BATCH_H / "heldout" / "cards-bias"))
    args = build_parser().parse_args([
        "plan", "--hf-config", str(BATCH_H / "heldout" / "configs" / "deepseek-v2-lite-L4.json"), "--impl", "hf",
        "--gpu", "h200", "--gpus-per-node", "1", "--seq", "4096", "--micro-batch", "2", "--loop", "deepspeed"])
    inp = plan_input_from_args(args)
    assert inp.model.mla is not None and inp.model.card is not None
    return inp


def test_a_carded_mla_model_is_replayed_where_zero3_gathers_no_weights(deepseek_v2_lite):
    # the card records MLA's projections' requests as it does any block's; only ZeRO-3's
    # gathers (a block's weights as the hand-written tensor list) are not this model's
    inp = deepseek_v2_lite
    sim._CACHE.clear()
    for layout in (Layout(stage=0), Layout(stage=1), Layout(stage=2), Layout(stage=2, offload_optimizer="cpu"),
                   Layout(stage=3), Layout(stage=3, offload_optimizer="cpu")):
        assert sim.replayed_peak_reserved(inp, layout) is not None, layout.label
    assert sim.replayed_peak_reserved(inp, Layout(stage=3, offload_optimizer="cpu", offload_param="cpu")) is None
    sim.blocks_from_cards = False  # without the card's blocks MLA is not replayed
    try:
        sim._CACHE.clear()
        assert sim.replayed_peak_reserved(inp, Layout(stage=2)) is None
    finally:
        sim.blocks_from_cards = True
        sim._CACHE.clear()


def test_a_carded_mla_step_frees_what_it_makes(deepseek_v2_lite):
    seq = sim._Seq()
    events = sim.allocation_sequence(deepseek_v2_lite, Layout(stage=2), 3, seq)
    live = _live_at_marks(events, seq.marks)
    assert live["step2.step"] == live["step3.step"] > 0


def test_deepseek_v2_lites_replay_makes_the_large_segments_its_run_made(deepseek_v2_lite):
    # batch h's run (ZeRO-2, the optimizer on the GPU, default allocator) ended with 44
    # segments: five of the fp32 partition (the master, two moments, and two the step's fp32
    # gradients left free), three of the bf16 weights', two of the fp32 logits'... The
    # per-phase rule, which makes no segments, had it 14.9% under
    run = next(json.loads(line) for line in (BATCH_H / "results" / "results-h.jsonl").read_text().splitlines()
               if "deepseek-v2-lite" in line)
    measured = sorted(size for size, _ in run["ranks"][0]["allocator_stats"]["segments_end"] if size >= GiB)
    pools = sim.replay(sim.allocation_sequence(deepseek_v2_lite, Layout(stage=2), 2))
    assert sorted(size for size in pools.segments if size >= GiB) == measured
    assert len(measured) == 10


def test_a_block_s_leftovers_die_in_the_next_block_s_window_not_at_its_backward(monkeypatch):
    """MPT's block returns its attention weights beside its output; the model's loop drops them
    in the next block's window (the card's free of a tensor made before it). Checkpointed, nothing
    else holds them: at the forward's end none is alive. The replay kept each block's to its
    backward (h200-2026-12-29, MPT-7B at 8 blocks, ZeRO-3, checkpointed: 45.27 GiB planned,
    37.29 measured; 37.27 with them freed)."""
    folder = Path(__file__).resolve().parents[2] / "benchmarks" / "measurements" / "h200-2026-12-29"
    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(folder / "heldout" / "cards"))
    args = build_parser().parse_args([
        "plan", "--hf-config", str(folder / "configs" / "mpt-7b.json"), "--layers", "4", "--seq", "1024",
        "--micro-batch", "2", "--checkpointing", "full", "--gpu", "h100", "--gpus-per-node", "1"])
    inp = plan_input_from_args(args)
    assert inp.model.card is not None
    weights = 2 * 32 * 1024 * 1024 * 2  # micro-batch x heads x T^2, bf16
    for stage in (3, 2):
        seq = sim._Seq()
        events = sim.allocation_sequence(inp, Layout(stage=stage), 2, seq)
        end = dict(seq.marks)["step2.forward"]
        live: dict[int, int] = {}
        for kind, name, size, *_ in events[:end]:
            if kind == "a":
                live[name] = size
            else:
                live.pop(name, None)
        assert sum(size == weights for size in live.values()) == 0, stage
