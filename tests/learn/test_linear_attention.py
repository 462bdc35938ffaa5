"""Qwen3.5's hybrid linear attention: learned with flash-linear-attention's and causal-conv1d's
kernels as stand-ins (learn/trace.py), the card saying so and keyed apart, the plan saying so.
Real transformers classes, the real CLI; the kernels themselves are not run (no GPU here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from zlayout import cards
from zlayout.core.card import LINEAR_ATTENTION_FLA, CardError, card_from_dict, linear_attention_assumed
from zlayout.learn.learner import block_list, build_model, learn, measure, trace_step
from zlayout.learn.trace import StorageLedger, causal_conv1d_standin, fla_chunk_gated_delta_rule

from .test_learn import run_cli

TINY = Path(__file__).resolve().parent / "configs" / "qwen3_5_text-tiny.json"


def tiny() -> dict:
    return json.loads(TINY.read_text())


def test_a_qwen3_5_card_is_learned_with_a_fixed_request_count_and_says_what_it_priced():
    """Without the stand-ins transformers' torch loop over 64-token chunks makes more requests
    the longer the sequence, and the learner refused the model; with them each kind of block asks
    for the same requests at every token count, and the card records the assumption."""
    card = learn(tiny())
    assert card["linear_attention"] == LINEAR_ATTENTION_FLA
    regime = card["regimes"][-1]
    assert card["layers"]["kinds"] == [0, 0, 0, 1] and card["fit_error"] == 0.0
    linear = next(b for b in regime["blocks"] if b["kind"] == 0)
    assert "linear_attention_forward" in linear["work"]["forward"]
    assert "linear_attention_backward" in linear["work"]["backward"]
    # one request list fitted over 1024-4096 tokens (fla's chunked kernels: 112 forward requests
    # per block at the default width, the torch loop 172 + 14 per chunk)
    read = card_from_dict(card, "x")
    assert read.linear_attention == LINEAR_ATTENTION_FLA and read.linear_attention_note()
    full = next(b for b in regime["blocks"] if b["kind"] == 1)
    assert "linear_attention_forward" not in full["work"]["forward"]


def test_each_linear_block_asks_for_the_same_requests_at_every_token_count():
    """The traces themselves: fla's chunked kernels allocate per call, not per 64-token chunk, so a
    GDN block's request lists have one length at 1024 and 2048 tokens; sizes grow with T."""
    model, _ = build_model(tiny())
    model.bfloat16()
    blocks = block_list(model)
    traced = {tokens: measure(trace_step(model, blocks, tokens, checkpointing=False), len(blocks))["blocks"][0]
              for tokens in (1024, 2048)}
    for phase in ("forward", "backward"):
        assert len(traced[1024][phase]) == len(traced[2048][phase]) > 0
    # what it keeps is linear in T (a constant of a few hundred bytes aside)
    assert sum(traced[2048]["forward"]) == pytest.approx(2 * sum(traced[1024]["forward"]), rel=1e-3)


def test_the_stand_in_keeps_what_fla_saves_for_backward():
    """fla's ChunkGatedDeltaRuleFunction.forward (fla/ops/gated_delta_rule/chunk.py) saves the
    l2-normalised q and k with their float32 rstd, v (input_guard's contiguous copy of
    transformers' strided view), the float32 cumsum of g and A [B, T, HV, 64]; beta is the
    caller's. Add its output: what one call leaves allocated, at the tiny config's shapes."""
    config = tiny()
    B, T = 2, 1024
    H, HV = config["linear_num_key_heads"], config["linear_num_value_heads"]
    K, V = config["linear_key_head_dim"], config["linear_value_head_dim"]
    ledger = StorageLedger()
    bf16 = dict(dtype=torch.bfloat16, device="meta")
    # as Qwen3_5GatedDeltaNet passes them: q, k, v split from one conv output, beta contiguous
    mixed = torch.empty(B, T, 2 * H * K + HV * V, **bf16, requires_grad=True)
    g = torch.empty(B, T, HV, dtype=torch.float32, device="meta", requires_grad=True)
    beta = torch.empty(B, T, HV, **bf16, requires_grad=True)
    ledger.exclude([mixed, g, beta])
    with ledger:
        q, k, v = torch.split(mixed, [H * K, H * K, HV * V], dim=-1)
        q, k, v = q.reshape(B, T, H, K), k.reshape(B, T, H, K), v.reshape(B, T, HV, V)
        out, state = fla_chunk_gated_delta_rule(ledger)(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)
    saved = B * T * (2 * H * K * 2 + 2 * H * 4 + HV * V * 2 + HV * 4 + HV * 64 * 2)
    assert ledger.current == saved + B * T * HV * V * 2  # + the output o
    assert out.shape == (B, T, HV, V) and state is None

    # causal-conv1d saves its channel-last input (no copy) and returns out = empty_like(x)
    conv_ledger = StorageLedger()
    x = torch.empty(B, T, 64, **bf16, requires_grad=True).transpose(1, 2)
    weight = torch.empty(64, 4, **bf16, requires_grad=True)
    conv_ledger.exclude([x, weight])
    with conv_ledger:
        y = causal_conv1d_standin(conv_ledger)(x, weight, None, activation="silu")
    assert conv_ledger.current == B * 64 * T * 2 and y.stride() == x.stride()


def test_the_assumption_keys_the_card_apart_and_old_cards_still_read(monkeypatch):
    """A card priced with fla's kernels is never served to a card of the same config learned
    without them: the key holds the assumption. Other models keep their keys (the shipped cards'
    are checked by scripts/learn_cards.py --check) and cards without the field read as before."""
    config = tiny()
    assert linear_attention_assumed(config) == LINEAR_ATTENTION_FLA
    assert linear_attention_assumed({"model_type": "qwen3_5", "text_config": {"model_type": "qwen3_5_text"}})
    assert linear_attention_assumed({"model_type": "qwen3_next"}) == LINEAR_ATTENTION_FLA
    assert linear_attention_assumed({"model_type": "llama"}) is None
    llama = {"model_type": "llama", "hidden_size": 8}
    keyed = cards.config_key(config), cards.config_key(llama)
    monkeypatch.setattr(cards, "linear_attention_assumed", lambda config: None)
    assert cards.config_key(config) != keyed[0] and cards.config_key(llama) == keyed[1]
    assert card_from_dict(learn_free_card(), "x").linear_attention is None
    with pytest.raises(CardError, match="linear_attention must be"):
        card_from_dict({**learn_free_card(), "linear_attention": "torch"}, "x")


def learn_free_card() -> dict:
    """The smallest format-1 card (no linear_attention key, as every card before it)."""
    poly = [0.0, 0.0, 0.0]
    phase = {"forward": [poly], "backward": [poly], "checkpointed_forward": [poly], "checkpointed_backward": [poly]}
    return {"format": 1, "model_type": "llama", "attention": "sdpa",
            "parameters": {"count": 4, "shapes": [[2, 2]]}, "layers": {"count": 1, "kinds": [0]},
            "regimes": [{"blocks": [{"kind": 0, **phase}], "head": dict(phase)}]}


def test_the_plan_says_how_linear_attention_was_priced(tmp_path, monkeypatch):
    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(tmp_path / "cards"))
    code, out, err = run_cli(["learn", "--hf-config", str(TINY)])
    assert code == 0, err
    plan = ["plan", "--hf-config", str(TINY), "--seq", "4096", "--gpu", "h200", "--gpus-per-node", "1",
            "--stage", "2"]
    code, out, err = run_cli(plan)
    assert code == 0, err
    notes = [line for line in out.splitlines() if "linear attention" in line]
    assert len(notes) == 1 and "flash-linear-attention" in notes[0] and "causal-conv1d" in notes[0]
    assert "not yet measured on a GPU" in notes[0] and "64-token chunks" in notes[0]
    # the activations term says it too: the app's detail, the web view and the profile show terms
    activations = [line for line in out.splitlines() if line.split()[1:2] == ["activations"]]
    assert len(activations) == 1 and f"as {LINEAR_ATTENTION_FLA} kernels" in activations[0], out
    code, out, err = run_cli([*plan, "--json"])
    assert code == 0, err
    linear = json.loads(out)["linear_attention"]
    assert linear == {"priced_as": LINEAR_ATTENTION_FLA, "measured_on_gpu": False, "note": linear["note"]}
    # a model without linear attention: no such line, no such key
    llama = tmp_path / "llama.json"
    llama.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
                                 "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 256}))
    code, out, _ = run_cli(["plan", "--hf-config", str(llama), "--seq", "512", "--stage", "2", "--json"])
    assert code == 0 and "linear_attention" not in json.loads(out)


def test_the_runbook_asks_the_team_for_the_kernels_the_plan_priced(tmp_path, monkeypatch):
    # the handoff: a profile of a card priced with fla's kernels says, in "What the training script
    # must do", that the job's environment needs them, and what the torch loop costs instead
    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(tmp_path / "cards"))
    code, _, err = run_cli(["learn", "--hf-config", str(TINY)])
    assert code == 0, err
    out_dir = tmp_path / "profile"
    code, _, err = run_cli(["export", "--hf-config", str(TINY), "--seq", "4096", "--gpu", "h200",
                            "--gpus-per-node", "1", "--stage", "2", "--host-ram-gib", "512", "--out", str(out_dir)])
    assert code == 0, err
    runbook = (out_dir / "RUNBOOK.md").read_text()
    rows = [line for line in runbook.splitlines() if "Install flash-linear-attention and causal-conv1d" in line]
    assert len(rows) == 1 and "about 1.9x the linear blocks' activations" in rows[0]
    assert "`zlayout verify` stops before training" in rows[0]
    assert "on Hopper GPUs (H100, H200) also `pip install tilelang`" in rows[0]


def test_a_hybrid_config_at_another_depth_finds_its_card_and_verify_builds_it(tmp_path, monkeypatch):
    # Qwen3.5 lists its blocks' kinds one by one (layer_types); at another depth the list is the
    # same pattern's first blocks. The card learned at 4 layers serves the config at 6 (a file the
    # user cut or grew), and verify's worker config at --layers 2 finds it: before, verify --batch
    # refused every truncated Qwen3.5 line ("learn it first") while plan accepted it
    from zlayout import hfconfig
    from zlayout.cli import build_parser, plan_input_from_args

    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(tmp_path / "cards"))
    code, _, err = run_cli(["learn", "--hf-config", str(TINY)])
    assert code == 0, err
    deeper = tiny()
    deeper["num_hidden_layers"] = 6
    deeper["layer_types"] = (deeper["layer_types"] * 2)[:6]
    path = tmp_path / "deeper.json"
    path.write_text(json.dumps(deeper))
    model = hfconfig.load(path)
    assert model.card is not None and model.layers == 6 and model.card.learned_layers == 4
    args = build_parser().parse_args(["verify", "--hf-config", str(TINY), "--layers", "2", "--seq", "256"])
    planned = plan_input_from_args(args).model
    assert planned.layers == 2 and planned.card is not None
    built = hfconfig.config_to_build(tiny(), planned)
    assert built["num_hidden_layers"] == 2 and built["layer_types"] == ["linear_attention", "linear_attention"]
    # a pattern that is not the card's is another model: no card, and the error names the user's file
    other = tiny()
    other["layer_types"] = ["full_attention", "linear_attention", "linear_attention", "linear_attention"]
    path.write_text(json.dumps(other))
    with pytest.raises(hfconfig.HfConfigError, match="learn it first with `zlayout learn --hf-config"):
        hfconfig.load(path)


# ------------------------------------------- the other GDN models of transformers 5.24
# OLMo-Hybrid, Lara-Mini and Qwen4-Exp define `torch_chunk_gated_delta_rule` and `causal_conv1d_fn`
# as qwen3_5 does and call them with the same arguments (learn/trace.py, LINEAR_ATTENTION_PACKAGES).
# Each tiny config keeps its model's pattern of block kinds: OLMo-Hybrid's 3 linear : 1 full,
# Lara-Mini's period of 5 (linear, sliding, linear, full, sliding), Qwen4-Exp's 3 linear : 1 indexed.
CONFIGS = TINY.parent


def hybrid(name: str) -> dict:
    config = json.loads((CONFIGS / f"{name}-tiny.json").read_text())
    if name == "qwen4_exp_text":
        # its indexed (QSA) layers select each query's tokens with torch.nonzero, which the meta device
        # cannot run (test below): its GDN blocks are learned in a config of GDN blocks only
        config["layer_types"] = ["linear_attention"] * config["num_hidden_layers"]
    return config


HYBRIDS = ("olmo_hybrid", "lara_mini", "qwen4_exp_text")


@pytest.mark.parametrize("name", HYBRIDS)
def test_the_other_gdn_models_learn_with_a_fixed_request_count(name, monkeypatch):
    """transformers' torch loop makes more requests the longer the sequence (the learner refused
    these models); with fla's and causal-conv1d's stand-ins a GDN block asks for the same number at
    1024 and 2048 tokens, the card learns and records the assumption."""
    from zlayout.learn import trace

    config = hybrid(name)
    model, _ = build_model(config)
    model.bfloat16()
    blocks = block_list(model)
    first = config["layer_types"].index("linear_attention")

    def gdn_block(tokens: int) -> dict:
        return measure(trace_step(model, blocks, tokens, checkpointing=False), len(blocks))["blocks"][first]

    traced = {tokens: gdn_block(tokens) for tokens in (1024, 2048)}
    for phase in ("forward", "backward"):
        assert len(traced[1024][phase]) == len(traced[2048][phase]) > 0
    assert sum(traced[2048]["forward"]) == pytest.approx(2 * sum(traced[1024]["forward"]), rel=1e-3)
    assert "linear_attention_forward" in traced[1024]["work_forward"]
    # the torch loop (the packages not routed): 14 more forward requests per 64-token chunk
    monkeypatch.setattr(trace, "LINEAR_ATTENTION_PACKAGES", ())
    loop = gdn_block(1024)
    assert len(loop["forward"]) > len(traced[1024]["forward"]) + 14 * (1024 // 64)
    monkeypatch.undo()

    card = learn(config)
    assert card["linear_attention"] == LINEAR_ATTENTION_FLA and card["fit_error"] < 0.01
    linear_kind = card["layers"]["kinds"][first]
    for regime in card["regimes"]:
        for block in regime["blocks"]:
            ran = "linear_attention_forward" in block["work"]["forward"]
            assert ran == (block["kind"] == linear_kind), (name, block["kind"])
    assert card_from_dict(card, "x").linear_attention_note()
    assert linear_attention_assumed(config) == LINEAR_ATTENTION_FLA


def test_every_gdn_model_type_is_priced_and_its_package_routed():
    """A model type in LINEAR_ATTENTION_MODEL_TYPES whose package the learner did not route would
    learn nothing (the torch loop's requests grow); a routed package whose model types the card
    does not name would be refused (learner.linear_attention_entry). Multimodal Qwen4-Exp by its
    text_config."""
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    from zlayout.core.card import LINEAR_ATTENTION_MODEL_TYPES
    from zlayout.learn.trace import LINEAR_ATTENTION_PACKAGES

    routed = {model_type_to_module_name(t) for t in LINEAR_ATTENTION_MODEL_TYPES}
    assert routed == set(LINEAR_ATTENTION_PACKAGES)
    for model_type in ("olmo_hybrid", "lara_mini", "qwen4_exp_text"):
        assert linear_attention_assumed({"model_type": model_type}) == LINEAR_ATTENTION_FLA
    assert linear_attention_assumed({"model_type": "qwen4_exp",
                                     "text_config": {"model_type": "qwen4_exp_text"}}) == LINEAR_ATTENTION_FLA
    assert linear_attention_assumed({"model_type": "qwen4_exp_vision"}) is None
    assert linear_attention_assumed({"model_type": "olmo3"}) is None


def test_qwen4_exp_indexed_layers_are_refused_as_reading_tensor_values():
    # the QSA indexer loops over every query and calls torch.nonzero on its mask row: no meta trace
    # follows it (and its requests would grow with B x T whatever the kernels); the learner says so
    from zlayout.learn.learner import LearnError

    config = json.loads((CONFIGS / "qwen4_exp_text-tiny.json").read_text())
    with pytest.raises(LearnError, match="reads tensor values while it runs.*torch.nonzero"):
        learn(config)


@pytest.mark.parametrize("name", HYBRIDS)
def test_the_plan_of_the_other_gdn_models_says_how_linear_attention_was_priced(name, tmp_path, monkeypatch):
    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(tmp_path / "cards"))
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(hybrid(name)))
    code, out, err = run_cli(["learn", "--hf-config", str(path)])
    assert code == 0, err
    assert "linear attention as flash-linear-attention + causal-conv1d" in out + err
    code, out, err = run_cli(["plan", "--hf-config", str(path), "--seq", "4096", "--gpu", "h200",
                              "--gpus-per-node", "1", "--stage", "2", "--json"])
    assert code == 0, err
    linear = json.loads(out)["linear_attention"]
    assert linear["priced_as"] == LINEAR_ATTENTION_FLA and linear["measured_on_gpu"] is False
    code, out, err = run_cli(["plan", "--hf-config", str(path), "--seq", "4096", "--gpu", "h200",
                              "--gpus-per-node", "1", "--stage", "2"])
    assert code == 0, err
    notes = [line for line in out.splitlines() if "linear attention" in line]
    assert len(notes) == 1 and "not yet measured on a GPU" in notes[0] and "64-token chunks" in notes[0]
