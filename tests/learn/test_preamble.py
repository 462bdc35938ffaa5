"""What a model's forward makes before its first block (the embedding's output, the attention
masks, the rotary tables) and the math attention's mask add, as a CUDA run makes them: the card's
`head.preamble` with the requests made once a step whatever the micro-batch, and the scores the
mask is added into in place (h200-2026-12-19 traces of Falcon-7B on an H100)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from zlayout import cards
from zlayout.cli import build_parser, layout_from_args, plan_input_from_args
from zlayout.core.allocator_sim import _Seq, allocation_sequence
from zlayout.core.card import FREED_OUTSIDE, CardError, card_from_dict
from zlayout.learn.learner import learn
from zlayout.learn.trace import StorageLedger, fused_attention

SMALL = Path(__file__).resolve().parents[1] / "hf" / "configs" / "small"
PUBLISHED = Path(__file__).resolve().parents[1] / "hf" / "configs" / "published"


@pytest.fixture(autouse=True)
def shipped_cards_only(tmp_path, monkeypatch):
    """The shipped cards answer: an empty cards cache, whatever an earlier test of the worker left."""
    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(tmp_path / "empty-cache"))


def small_config(name: str) -> dict:
    return json.loads((SMALL / f"{name}.json").read_text())


def _attention(device: str, stand_in: bool):
    """Falcon's multi-query attention with a mask (the math path), its forward's requests and q's gradient."""
    torch.manual_seed(0)
    q = torch.randn(1, 6, 64, 16, device=device, requires_grad=True)
    k = torch.randn(1, 1, 64, 16, device=device, requires_grad=True)
    mask = torch.zeros(1, 1, 64, 64, device=device)
    ledger = StorageLedger()
    ledger.exclude([q, k, mask])
    sdpa = fused_attention(ledger, F.scaled_dot_product_attention) if stand_in else F.scaled_dot_product_attention
    window = ledger.open_window("forward", 0)
    with ledger:
        out = sdpa(q, k, k, attn_mask=mask)  # one kv head against six: no fused kernel takes it
        ledger.close_window(window)
        out.sum().backward()
    return window.events, q.grad


def test_the_math_attention_adds_its_mask_into_the_scores_in_place():
    """attention.cpp adds the mask with `attn.add_` unless a tensor is subclass-like, which a
    dispatch mode makes every tensor: the stand-in puts the in-place add back. One heads x T x T
    float32 tensor fewer a block, and the gradient unchanged."""
    scores = 6 * 64 * 64 * 4
    for device in ("meta", "cpu"):
        plain, _ = _attention(device, stand_in=False)
        ours, _ = _attention(device, stand_in=True)
        assert plain.count(scores) == 3  # the scores, the sum with the mask, softmax's output
        assert ours.count(scores) == 2
    (_, reference), (_, grad) = _attention("cpu", False), _attention("cpu", True)
    assert torch.allclose(reference, grad)


@pytest.mark.parametrize("name", ["falcon-multi-query", "llama-defaults"])
def test_the_preamble_is_recorded_with_what_it_makes_once_a_step(name):
    """Falcon materializes a (1, 1, T, T) bool mask before its blocks (transformers'
    `allow_is_causal_skip=False`); Llama's rotary tables are over positions (1, T): both once a
    step, which the card marks; the embedding's output is one a sequence."""
    config = small_config(name)
    head = learn(config)["regimes"][-1]["head"]
    preamble, per_step = head["preamble"], set(head["preamble_per_step"])
    hidden = 2 * config["hidden_size"]  # bf16 bytes a token
    embedding = next(i for i, (q, a, c) in enumerate(preamble) if a == hidden and q == 0)
    assert embedding not in per_step
    assert per_step and all(preamble[i] != [0.0, 0.0, 0.0] for i in per_step)
    quadratic = [i for i, (q, _, _) in enumerate(preamble) if q > 0]
    if name.startswith("falcon"):
        assert quadratic and set(quadratic) <= per_step  # the mask, 1 byte a position pair, allocated and freed
        assert [preamble[i][0] for i in quadratic if preamble[i][0] > 0] == [1.0]
    else:
        assert not quadratic


def test_a_card_prices_the_once_a_step_requests_once_at_any_micro_batch():
    head = {"preamble": [[0, 100, 0], [1, 0, 0], [0, 0, 4096]], "preamble_per_step": [1],
            "forward": [], "backward": [], "checkpointed_forward": [], "checkpointed_backward": []}
    card = card_from_dict(_card(head), "k")
    phase = card.regimes[-1].head_preamble
    assert phase.sizes(4, 64, None) == [4 * 100 * 64, 64 * 64, 4096]
    assert phase.net(4, 64) == 4 * 100 * 64 + 64 * 64 + 4096
    with pytest.raises(CardError, match="preamble_per_step"):
        card_from_dict(_card({**head, "preamble_per_step": [3]}), "k")
    older = {k: v for k, v in head.items() if not k.startswith("preamble")}
    assert card_from_dict(_card(older), "k").regimes[-1].head_preamble is None


def _card(head: dict) -> dict:
    """The shipped Falcon-7B card with this head in its unbounded regime."""
    path = next(p for p in cards.SHIPPED_CARDS_DIR.glob("*.toml") if "(falcon-7b.json)" in p.read_text()[:200])
    data = tomllib.loads(path.read_text())
    data["regimes"][-1]["head"] = head
    return data


def test_the_replay_holds_falcons_mask_through_the_forward():
    """Falcon-7B's shipped card: the step's forward makes the embedding's output, then the 16 MiB
    mask at 4,096 tokens (once, at a micro-batch of 2 too), which dies before the backward."""
    args = build_parser().parse_args(["plan", "--hf-config", str(PUBLISHED / "falcon-7b.json"), "--layers", "2",
                                      "--stage", "0", "--seq", "4096", "--micro-batch", "2",
                                      "--gpus-per-node", "1", "--gpu", "h200"])
    seq = _Seq()
    assert allocation_sequence(plan_input_from_args(args), layout_from_args(args), steps=1, _seq=seq) is not None
    marks = dict(seq.marks)
    forward = seq.events[marks["initialize"]:marks["step1.forward"]]
    masks = [e[1] for e in forward if e[0] == "a" and e[2] == 4096 * 4096]
    assert len(masks) == 1
    assert any(e[0] == "f" and e[1] == masks[0] for e in forward)
    embedding = next(e for e in forward if e[0] == "a" and e[2] > 2**20)
    assert embedding[2] == 2 * 4096 * 4544 * 2


def test_a_free_names_the_tensor_it_takes_where_the_latest_of_its_size_is_not_it():
    """A card records sizes; the replay frees the latest live tensor of a free's size unless the card
    names another (`exceptional_frees`). `attn = softmax(attn)`: the scores, made first, die."""
    from zlayout.learn.trace import exceptional_frees

    assert exceptional_frees([8, 8, -8], {2: 0}) == [[2, 0]]
    assert exceptional_frees([8, 8, -8], {2: 1}) == []
    assert exceptional_frees([8, 4, -8, -4], {2: 0, 3: 1}) == []
    # a tensor made before the window: the replay's own matching takes one made before it, unless one of
    # the window's own of that size lives
    assert exceptional_frees([-8, 8], {0: FREED_OUTSIDE}) == []
    assert exceptional_frees([8, -8], {1: FREED_OUTSIDE}) == [[1, FREED_OUTSIDE]]
    assert exceptional_frees([4, -8], {1: FREED_OUTSIDE}) == []


def test_the_losss_backward_frees_the_log_softmax_its_forward_saved():
    """Cross-entropy over float32 logits (transformers' ForCausalLMLoss): the forward saves the
    log-softmax; the backward makes nll_loss's gradient and log_softmax's, both its size, and frees
    the saved one while its own gradient lives. The rule (the latest of the size) freed the gradient
    and kept the saved one: a gemma-3-1b step reserved one tokens x vocab x 4 segment less than the
    run (h200-2026-12-02c gemma3_text trace: free, free of the forward's, then the bf16 gradient)."""
    from zlayout.learn.trace import exceptional_frees

    logits = torch.randn(64, 1000, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, 1000, (64,))
    ledger = StorageLedger()
    ledger.exclude([logits, labels])
    with ledger:
        forward = ledger.open_window("head_forward", -1)
        loss = F.cross_entropy(logits.float(), labels)
        ledger.close_window(forward)
        backward = ledger.open_window("head_backward", -1)
        loss.backward()
        ledger.close_window(backward)
    fp32 = 64 * 1000 * 4
    assert forward.events.count(fp32) == 2 and forward.events.count(-fp32) == 1  # the float copy dies
    pairs = exceptional_frees(backward.events, backward.frees)
    outside = [free for free, made in pairs if made == FREED_OUTSIDE and backward.events[free] == -fp32]
    assert len(outside) == 1
    made = [i for i, e in enumerate(backward.events) if e == fp32]
    assert len(made) == 2 and made[0] < made[1] < outside[0]


def test_falcons_card_names_the_math_attentions_scores_as_what_its_softmax_frees():
    """Falcon-7B's shipped card: in its block's forward the float32 scores (heads x T x T) die once the
    softmax's output of their size is made, which the latest-of-its-size rule got the wrong way round."""
    path = next(p for p in cards.SHIPPED_CARDS_DIR.glob("*.toml") if "(falcon-7b.json)" in p.read_text()[:200])
    card = cards.read_card(path)
    forward = card.regimes[-1].blocks[0].forward
    scores = 71 * 4  # bytes a position pair, float32, one sequence: the T^2 term
    quadratic = [i for i, (q, _, _) in enumerate(forward.requests) if q == scores]
    assert any(made in quadratic and free in [i for i, (q, _, _) in enumerate(forward.requests) if q == -scores]
               for free, made in forward.frees)


def test_a_cards_frees_must_name_an_earlier_request_of_the_phase():
    head = {"forward": [[0, 1, 0], [0, 1, 0], [0, -1, 0]], "forward_frees": "2 0", "backward": [],
            "checkpointed_forward": [], "checkpointed_backward": []}
    assert card_from_dict(_card(head), "k").regimes[-1].head_forward.frees == ((2, 0),)
    assert card_from_dict(_card({**head, "forward_frees": "2 -1"}), "k").regimes[-1].head_forward.frees == \
        ((2, FREED_OUTSIDE),)
    for bad in ("0 2", "3 0", "2", "a b", "2 -2"):
        with pytest.raises(CardError, match="forward_frees"):
            card_from_dict(_card({**head, "forward_frees": bad}), "k")


def test_the_replay_frees_the_saved_log_softmax_where_the_card_names_it_made_before():
    """gemma-3-1b (262,144-entry vocabulary) at 2 x 8,192 tokens: each loss tensor is 16 GiB in float32.
    The run (h200-2026-12-04, ZeRO-2 on an H200) made five 16 GiB segments (and released the 8 GiB
    one of step 1's logits in its one retry); with the saved log-softmax kept into the bf16
    gradient's cast (the latest-of-its-size rule) the replay made four, and reserved 6 GiB less
    than the card-filling run."""
    args = build_parser().parse_args(["plan", "--hf-config", str(PUBLISHED / "gemma-3-1b-pt.json"), "--stage", "2", "--seq", "8192", "--micro-batch", "2",
                                      "--gpus-per-node", "1", "--gpu", "h200"])
    seq = _Seq(live=True)
    assert allocation_sequence(plan_input_from_args(args), layout_from_args(args), steps=2, _seq=seq) is not None
    segments = sorted((size for pool in seq.pools.values() for size in pool.segment_sizes), reverse=True)
    fp32_logits = 2 * 8192 * 262144 * 4
    assert segments[:6] == [fp32_logits] * 5 + [fp32_logits // 2]  # and step 1's bf16 logits'
