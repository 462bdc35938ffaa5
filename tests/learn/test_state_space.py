"""Mamba-2 and the hybrids built on its mixer (mamba2, bamba, granitemoehybrid, nemotron_h,
falcon_h1): learned from transformers' torch reference scan, a chunked scan with no Python loop in
training, so each block asks for the same requests at every token count; the card, the plan, the
runbook and verify say what was priced. Real transformers classes, the real CLI, a real DeepSpeed
engine on CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zlayout import cards, hfconfig
from zlayout.core.card import STATE_SPACE_MODEL_TYPES, STATE_SPACE_TORCH, card_from_dict
from zlayout.learn.learner import build_model, learn

from .test_learn import run_cli

CONFIGS = Path(__file__).resolve().parent / "configs"
TYPES = ("mamba2", "bamba", "granitemoehybrid", "nemotron_h", "falcon_h1")


def tiny(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}-tiny.json").read_text())


def test_every_state_space_type_has_a_tiny_config_and_none_is_refused():
    assert set(TYPES) == STATE_SPACE_MODEL_TYPES
    assert not STATE_SPACE_MODEL_TYPES & hfconfig.RECURRENT_TYPES
    # Mamba-1's reference loops over the tokens: Jamba, Mamba and Falcon-Mamba are priced with mamba-ssm's
    # kernels; Zamba (an attention block shared between layers) and zamba2 stay one line
    assert {"zamba", "zamba2"} <= hfconfig.RECURRENT_TYPES
    assert not {"jamba", "mamba", "falcon_mamba"} & hfconfig.RECURRENT_TYPES


@pytest.mark.parametrize("name", TYPES)
def test_a_mamba2_card_is_learned_from_the_torch_reference_with_a_fixed_request_count(name):
    card = learn(tiny(name))
    assert card["linear_attention"] == STATE_SPACE_TORCH
    # one request list per phase fits 1024-4096 tokens and predicts 3072 exactly: the scan's
    # requests do not grow in number with the chunks
    assert card["fit_error"] == 0.0
    model, _ = build_model(tiny(name))
    assert card["parameters"]["count"] == sum(p.numel() for p in model.parameters())
    read = card_from_dict(card, "x")
    assert read.linear_attention == STATE_SPACE_TORCH
    assert "torch reference scan" in read.linear_attention_note()


def test_the_plan_says_the_blocks_were_priced_as_the_torch_reference(tmp_path, monkeypatch):
    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(tmp_path / "cards"))
    path = CONFIGS / "nemotron_h-tiny.json"
    code, out, err = run_cli(["learn", "--hf-config", str(path)])
    assert code == 0, err
    assert "state-space blocks as transformers' torch reference" in out
    plan = ["plan", "--hf-config", str(path), "--seq", "1024", "--gpu", "h200", "--gpus-per-node", "1", "--stage", "2"]
    code, out, err = run_cli(plan)
    assert code == 0, err
    notes = [line for line in out.splitlines() if line.startswith("Note: state-space")]
    assert len(notes) == 1 and "without mamba-ssm and causal-conv1d" in notes[0]
    # a card of a model with attention blocks records the kernels: no "learned before" note
    assert "learned before zlayout priced" not in err
    activations = [line for line in out.splitlines() if line.split()[1:2] == ["activations"]]
    assert len(activations) == 1 and "torch reference scan" in activations[0]
    code, out, err = run_cli([*plan, "--json"])
    assert code == 0, err
    linear = json.loads(out)["linear_attention"]
    # measured on a GPU (h200-2026-12-27), unlike fla's stand-ins
    assert linear["priced_as"] == STATE_SPACE_TORCH and linear["measured_on_gpu"] is True
    # the exact parameter count is transformers' own
    model, _ = build_model(tiny("nemotron_h"))
    assert json.loads(out)["params"] == sum(p.numel() for p in model.parameters())


def test_a_pure_mamba2_card_runs_no_attention_and_is_not_called_stale(tmp_path, monkeypatch):
    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(tmp_path / "cards"))
    path = CONFIGS / "mamba2-tiny.json"
    assert run_cli(["learn", "--hf-config", str(path)])[0] == 0
    code, out, err = run_cli(["plan", "--hf-config", str(path), "--seq", "1024", "--stage", "0"])
    assert code == 0, err
    assert "learned before zlayout priced" not in err


def test_a_shallower_cut_of_a_card_whose_shape_overcounts_keeps_the_exact_count(tmp_path, monkeypatch):
    """Mamba-2's common keys read as a transformer block overcount it (extra_params < 0); at
    --layers 1 that correction scales with the blocks instead of leaving a negative model."""
    from zlayout.cli import build_parser, plan_input_from_args

    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(tmp_path / "cards"))
    path = CONFIGS / "mamba2-tiny.json"
    assert run_cli(["learn", "--hf-config", str(path)])[0] == 0
    full = hfconfig.load(path)
    assert full.extra_params < 0
    args = build_parser().parse_args(["plan", "--hf-config", str(path), "--layers", "1"])
    cut = plan_input_from_args(args).model
    model, _ = build_model({**tiny("mamba2"), "num_hidden_layers": 1})
    assert cut.layers == 1 and cut.params == sum(p.numel() for p in model.parameters())


def test_nemotron_h_reads_its_depth_from_its_block_pattern(tmp_path, monkeypatch):
    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(tmp_path / "cards"))
    config = tiny("nemotron_h")
    assert "num_hidden_layers" not in config and len(config["layers_block_type"]) == 4
    path = CONFIGS / "nemotron_h-tiny.json"
    assert run_cli(["learn", "--hf-config", str(path)])[0] == 0
    assert hfconfig.load(path).layers == 4
    # the older spelling: one letter a block
    r = hfconfig._Reader({"hybrid_override_pattern": "M-*E", "hidden_size": 64, "vocab_size": 256},
                         "x", "nemotron_h")
    assert hfconfig._generic_shape(r)["layers"] == 4


def test_the_runbook_states_the_environment_the_plan_priced(tmp_path, monkeypatch):
    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(tmp_path / "cards"))
    path = CONFIGS / "bamba-tiny.json"
    assert run_cli(["learn", "--hf-config", str(path)])[0] == 0
    out_dir = tmp_path / "profile"
    code, _, err = run_cli(["export", "--hf-config", str(path), "--seq", "1024", "--gpu", "h200",
                            "--gpus-per-node", "1", "--stage", "2", "--out", str(out_dir)])
    assert code == 0, err
    rows = [line for line in (out_dir / "RUNBOOK.md").read_text().splitlines()
            if "Train the Mamba-2 blocks with transformers' torch reference" in line]
    assert len(rows) == 1 and "`python -c 'import mamba_ssm'` fails" in rows[0]
    assert "Install flash-linear-attention" not in (out_dir / "RUNBOOK.md").read_text()
    # Jamba's card priced the kernels: the runbook asks for them instead
    jamba = CONFIGS / "jamba-tiny.json"
    assert run_cli(["learn", "--hf-config", str(jamba)])[0] == 0
    code, _, err = run_cli(["export", "--hf-config", str(jamba), "--seq", "1024", "--gpu", "h200",
                            "--gpus-per-node", "1", "--stage", "2", "--out", str(tmp_path / "jamba")])
    assert code == 0, err
    runbook = (tmp_path / "jamba" / "RUNBOOK.md").read_text()
    rows = [line for line in runbook.splitlines() if "Install mamba-ssm and causal-conv1d" in line]
    assert len(rows) == 1 and "not yet measured on a GPU" in rows[0] and "Train the Mamba-2" not in runbook


def test_a_sequence_the_scan_would_pad_is_refused_with_the_two_nearest(tmp_path, monkeypatch):
    """The torch reference pads the sequence to a multiple of its chunk (64 tokens in the tiny
    config); the card, fitted at multiples, would price the padded tensors short: one line."""
    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(tmp_path / "cards"))
    path = CONFIGS / "mamba2-tiny.json"
    assert run_cli(["learn", "--hf-config", str(path)])[0] == 0
    assert hfconfig.load(path).card.token_quantum == 64
    code, out, err = run_cli(["plan", "--hf-config", str(path), "--seq", "1000", "--stage", "0"])
    assert code == 2 and out == ""
    assert "chunk (64 tokens: 1,000 runs as 1,024)" in err and "use --seq 1024 or 960" in err
    assert "\n" not in err.strip()
    assert run_cli(["plan", "--hf-config", str(path), "--seq", "1024", "--stage", "0"])[0] == 0


@pytest.mark.parametrize("value", [0, -64, True, 2.5, "64", "$(id)", 10**9])
def test_a_card_with_a_token_quantum_that_is_not_a_token_count_is_refused(value):
    from zlayout.core.card import CardError

    card = learn(tiny("mamba2"))
    assert card["token_quantum"] == 64
    with pytest.raises(CardError, match="token_quantum must be a whole number of tokens"):
        card_from_dict({**card, "token_quantum": value}, "x")


# ---------------------------------------------------------------- Jamba: mamba-ssm's selective scan


def test_jamba_is_learned_with_mamba_ssm_kernels_and_its_experts_every_other_block(tmp_path, monkeypatch):
    """Jamba's Mamba-1 mixer binds mamba-ssm's selective scan (a loop over every token without it):
    the learner runs the scan's and causal-conv1d's stand-ins, the card says so, the plan says the
    kernels are not yet measured on a GPU, and the header counts Jamba's MoE blocks (every
    `expert_layer_period`-th from the offset), while the parameter count is transformers' own."""
    from zlayout.core.card import STATE_SPACE_KERNELS

    config = tiny("jamba")
    card = learn(config)
    assert card["linear_attention"] == STATE_SPACE_KERNELS and "token_quantum" not in card
    assert card["parameters"]["count"] == sum(p.numel() for p in build_model(config)[0].parameters())
    # blocks 0, 1, 3: Mamba (1 and 3 with experts); block 2: attention with a dense MLP
    assert card["layers"]["kinds"] == [0, 1, 2, 1]
    works = {block["kind"]: block["work"]["forward"] for block in card["regimes"][0]["blocks"]}
    assert "selective_scan_forward" in works[0] and "selective_scan_forward" in works[1]
    assert "selective_scan_forward" not in works[2] and "attention_forward" in works[2]
    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(tmp_path / "cards"))
    path = tmp_path / "jamba.json"
    path.write_text(json.dumps(config))
    code, out, err = run_cli(["learn", "--hf-config", str(path)])
    assert code == 0 and "state-space blocks as mamba-ssm + causal-conv1d" in out + err
    code, out, err = run_cli(["plan", "--hf-config", str(path), "--seq", "4096", "--gpus-per-node", "1",
                              "--stage", "2", "--json"])
    assert code == 0, err
    plan = json.loads(out)
    assert plan["linear_attention"]["priced_as"] == STATE_SPACE_KERNELS
    assert plan["linear_attention"]["measured_on_gpu"] is False
    code, out, err = run_cli(["plan", "--hf-config", str(path), "--seq", "4096", "--gpus-per-node", "1", "--stage", "2"])
    assert code == 0 and "2 MoE blocks" in out and "mamba-ssm's kernels" in out


def test_the_selective_scan_stand_in_makes_the_kernels_tensors():
    """`_SelectiveScan` as mamba-ssm's SelectiveScanFn allocates (selective_scan.cpp): with z, the
    output gated (out_z) and out kept for backward; the chunk states float32, one (2 x dstate) row a
    channel per 2,048 tokens plus one; gradients in the inputs' shapes and dtypes."""
    import torch

    from zlayout.learn.trace import StorageLedger, selective_scan_standin

    batch, dim, length, state = 2, 16, 4096, 8
    ledger = StorageLedger()
    scan = selective_scan_standin(ledger)
    meta = dict(device="meta", requires_grad=True)
    u, delta, z = (torch.empty(batch, dim, length, dtype=torch.bfloat16, **meta) for _ in range(3))
    A = torch.empty(dim, state, dtype=torch.float32, **meta)
    B, C = (torch.empty(batch, state, length, dtype=torch.bfloat16, **meta) for _ in range(2))
    D, bias = (torch.empty(dim, dtype=torch.float32, **meta) for _ in range(2))
    out = scan(u, delta, A, B, C, D=D, z=z, delta_bias=bias, delta_softplus=True, use_mambapy=False)
    assert out.shape == (batch, dim, length) and out.dtype == torch.bfloat16
    saved = out.grad_fn.saved_tensors
    states = saved[8]
    assert states.dtype == torch.float32 and states.numel() == batch * dim * 2 * state * (length // 2048 + 1)
    assert saved[9] is not None and saved[9].shape == out.shape  # out, kept where z gates it
    grads = torch.autograd.grad(out, (u, delta, A, B, C, D, z, bias), torch.empty_like(out))
    for grad, given in zip(grads, (u, delta, A, B, C, D, z, bias)):
        assert grad.shape == given.shape and grad.dtype == given.dtype


@pytest.mark.parametrize("name", ["mamba", "falcon_mamba"])
def test_mamba_and_falcon_mamba_are_learned_with_mamba_ssms_fused_inner_function(name):
    """Mamba and Falcon-Mamba train through mamba-ssm's fused `mamba_inner_fn` (the per-token loop
    without it): its stand-in runs, the card says the kernels were priced, every parameter that
    trains gets a gradient (Falcon-Mamba's B/C/dt norms are weightless), and the count is
    transformers' own. The scan's requests are fixed in number: the fit predicts 3,072 tokens exactly."""
    from zlayout.core.card import STATE_SPACE_KERNELS

    config = tiny(name)
    card = learn(config)
    assert card["linear_attention"] == STATE_SPACE_KERNELS and card["fit_error"] == 0
    assert card["parameters"]["count"] == sum(p.numel() for p in build_model(config)[0].parameters())
    assert card["parameters"]["untrained"] == []
    forward = card["regimes"][0]["blocks"][0]["work"]["forward"]
    assert "selective_scan_forward" in forward


def test_the_mamba_inner_stand_in_saves_what_mamba_ssm_saves():
    """`_MambaInner` at checkpoint level 1 saves xz (made contiguous), x_dbl, B and C, the float32 chunk
    states and the ungated out, not the convolution's output or delta; gradients come back in the
    inputs' shapes and dtypes."""
    import torch

    from zlayout.learn.trace import StorageLedger, mamba_inner_standin

    batch, length, dim, state, rank, hidden = 1, 2048, 32, 4, 6, 16
    meta = dict(device="meta", dtype=torch.bfloat16, requires_grad=True)
    xz = torch.empty(batch, length, 2 * dim, **meta).transpose(1, 2)  # transformers' transposed projection
    conv_w, conv_b = torch.empty(dim, 1, 4, **meta), torch.empty(dim, **meta)
    x_proj, dt_proj = torch.empty(rank + 2 * state, dim, **meta), torch.empty(dim, rank, **meta)
    out_proj = torch.empty(hidden, dim, **meta)
    A = torch.empty(dim, state, device="meta", dtype=torch.float32, requires_grad=True)
    D, dt_bias = (torch.empty(dim, device="meta", dtype=torch.float32, requires_grad=True) for _ in range(2))
    out = mamba_inner_standin(StorageLedger())(xz, conv_w, conv_b, x_proj, dt_proj, out_proj, None, A, None, None,
                                               D, delta_bias=dt_bias, delta_softplus=True)
    assert out.shape == (batch, length, hidden)
    saved = out.grad_fn.saved_tensors
    shapes = [tuple(t.shape) for t in saved if t is not None]
    assert (batch, 2 * dim, length) in shapes and (batch * length, rank + 2 * state) in shapes
    assert (batch * dim * 2 * state * 2,) in shapes  # chunk states: 2,048 tokens priced as 2 chunks
    assert (batch, dim, length) in shapes  # out
    given = (xz, conv_w, conv_b, x_proj, dt_proj, out_proj, A, D, dt_bias)
    grads = torch.autograd.grad(out, given, torch.empty_like(out))
    for grad, tensor in zip(grads, given):
        assert grad.shape == tensor.shape and grad.dtype == tensor.dtype
