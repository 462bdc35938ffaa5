"""verify trains Qwen3.5's linear attention as the card priced it (flash-linear-attention +
causal-conv1d) or stops before training. On this CPU machine neither package is installed, so
transformers resolves its torch fallback: the worker must say so, in one line naming both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zlayout import cards
from zlayout.core.card import LINEAR_ATTENTION_FLA
from zlayout.verify.worker_model import (TORCH_FALLBACK, hf_builder, linear_attention_implementation,
                                         linear_attention_refusal)

TINY = Path(__file__).resolve().parent.parent / "learn" / "configs" / "qwen3_5_text-tiny.json"


def test_the_worker_reads_which_kernels_transformers_resolved_for_the_model_built():
    build = hf_builder({**json.loads(TINY.read_text()), "use_cache": False}, checkpointing=False)
    model = build()
    assert type(model.model).__module__ == build.model_module.__name__  # the module the layers call into
    resolved = linear_attention_implementation(build.model_module)
    assert resolved == {"chunk_gated_delta_rule": TORCH_FALLBACK, "causal_conv1d_fn": TORCH_FALLBACK}
    refusal = linear_attention_refusal(LINEAR_ATTENTION_FLA, resolved)
    assert "\n" not in refusal and "flash-linear-attention and causal-conv1d are not installed" in refusal
    assert f"the plan priced linear attention as {LINEAR_ATTENTION_FLA}" in refusal
    # one package missing names that one; the kernels resolved, or a card without the assumption: no refusal
    mixed = {**resolved, "chunk_gated_delta_rule": "flash-linear-attention"}
    assert "because causal-conv1d is not installed" in linear_attention_refusal(LINEAR_ATTENTION_FLA, mixed)
    assert linear_attention_refusal(LINEAR_ATTENTION_FLA, {"chunk_gated_delta_rule": "flash-linear-attention",
                                                           "causal_conv1d_fn": "causal-conv1d"}) is None
    assert linear_attention_refusal(None, resolved) is None
    # a model without linear attention resolves nothing
    llama = hf_builder({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
                        "num_attention_heads": 4, "vocab_size": 128}, checkpointing=False)
    assert linear_attention_implementation(llama.model_module) is None


@pytest.mark.slow
def test_verify_stops_before_training_where_the_plan_assumed_kernels_the_node_lacks(tmp_path, monkeypatch):
    """The real CLI: learn the card, verify on CPU; the worker stops in its build phase with the
    one line, and the result records what transformers resolved."""
    from zlayout.cli import main

    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(tmp_path / "cards"))
    assert main(["learn", "--hf-config", str(TINY)]) == 0
    code = main(["verify", "--hf-config", str(TINY), "--stage", "2", "--cpu", "--seq", "128",
                 "--micro-batch", "1", "--steps", "1", "--out", str(tmp_path / "run")])
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert code != 0 and result["status"] == "failed"
    assert "failed during build" in result["cause"] and "PlanAssumptionError" in result["cause"]
    assert "flash-linear-attention and causal-conv1d are not installed" in result["cause"]
    assert result["environment"]["linear_attention"] == {"chunk_gated_delta_rule": TORCH_FALLBACK,
                                                         "causal_conv1d_fn": TORCH_FALLBACK}
    assert not any(rank.get("steps_run") for rank in result["ranks"])


@pytest.mark.parametrize("name", ["olmo_hybrid", "lara_mini", "qwen4_exp_text"])
def test_the_worker_reads_the_other_gdn_models_resolution(name):
    # OLMo-Hybrid, Lara-Mini and Qwen4-Exp bind the same two module globals (learn/trace.py,
    # LINEAR_ATTENTION_PACKAGES); on this CPU machine both resolve to the torch fallback
    config = json.loads((TINY.parent / f"{name}-tiny.json").read_text())
    build = hf_builder({**config, "use_cache": False}, checkpointing=False)
    model = build()
    assert build.model_module.__name__.startswith(f"transformers.models.{name.removesuffix('_text')}.")
    assert type(model.model).__module__ == build.model_module.__name__  # the module the layers call into
    resolved = linear_attention_implementation(build.model_module)
    assert resolved == {"chunk_gated_delta_rule": TORCH_FALLBACK, "causal_conv1d_fn": TORCH_FALLBACK}
    assert "flash-linear-attention and causal-conv1d are not installed" in linear_attention_refusal(
        LINEAR_ATTENTION_FLA, resolved)


def test_fla_gated_backward_on_hopper_is_refused_with_a_triton_that_computes_it_wrong():
    """fla 0.6.0 raises in the first backward of a GDN block on Hopper under Triton 3.4.0 up to 3.7.1
    (fla issue #640) unless tilelang takes the kernel: measured on an H100 with torch 2.11's Triton
    3.6.0 after a 92-second engine build. The rule, as the preflight and the worker apply it."""
    from zlayout.verify.environment import fla_hopper_refusal

    refusal = fla_hopper_refusal([9], "3.6.0", tilelang=False)
    assert "\n" not in refusal and "Hopper" in refusal and "Triton 3.6.0" in refusal
    assert "pip install tilelang" in refusal and "3.7.1 or later" in refusal
    assert fla_hopper_refusal([9], "3.7.0+git1234", tilelang=False) is not None
    assert fla_hopper_refusal([9], "3.4.0", tilelang=False) is not None
    assert fla_hopper_refusal([9], "3.7.1", tilelang=False) is None  # fixed there
    assert fla_hopper_refusal([9], "3.3.1", tilelang=False) is None  # before the regression
    assert fla_hopper_refusal([9], "3.6.0", tilelang=True) is None  # fla runs TileLang's kernel
    assert fla_hopper_refusal([8], "3.6.0", tilelang=False) is None  # an A100
    assert fla_hopper_refusal([10], "3.6.0", tilelang=False) is None  # a B200
    assert fla_hopper_refusal([9], None, tilelang=False) is None  # no Triton: fla does not import either


def test_the_preflight_refuses_a_hopper_node_whose_triton_fla_cannot_train_with(tmp_path, monkeypatch):
    """The preflight's check, on the facts the probe records (an H100 with Triton 3.6.0, as measured),
    for a plan from the learned Qwen3.5 card; a model without linear attention is not checked."""
    from zlayout.cli import build_parser, main, plan_input_from_args
    from zlayout.verify.preflight import check_linear_attention_kernels

    def plan_input(config: Path):
        return plan_input_from_args(build_parser().parse_args(["verify", "--hf-config", str(config), "--gpu", "h100",
                                                               "--gpus-per-node", "1", "--seq", "1024"]))

    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(tmp_path / "cards"))
    assert main(["learn", "--hf-config", str(TINY)]) == 0
    inp = plan_input(TINY)
    h100 = {"cuda_devices": 1, "cuda_capability_majors": [9], "triton": "3.6.0", "tilelang": False}
    [check] = check_linear_attention_kernels(inp, h100)
    assert not check.ok and check.blocking and "Triton 3.6.0" in check.line()
    assert check.line().startswith("preflight FAIL linear attention kernels: ")
    [check] = check_linear_attention_kernels(inp, {**h100, "tilelang": True})
    assert check.ok and "tilelang installed" in check.detail
    assert check_linear_attention_kernels(inp, {**h100, "cuda_devices": 0}) == []  # CPU mode
    llama = plan_input(Path(__file__).resolve().parents[1] / "hf" / "configs" / "published" / "Llama-3.2-1B.json")
    assert check_linear_attention_kernels(llama, h100) == []


def test_a_triton_version_a_terminal_would_act_on_is_shown_escaped():
    """The version is read from the node's package metadata and printed in the preflight's line."""
    from zlayout.verify.environment import fla_hopper_refusal

    refusal = fla_hopper_refusal([9], "3.6.0\x1b[2J\nrm -rf", tilelang=False)
    assert "\x1b" not in refusal and "\n" not in refusal and "Triton 3.6.0\\x1b[2J\\nrm -rf" in refusal


# ------------------------------------------- Mamba-2 and its hybrids: priced as the torch reference
MAMBA2 = Path(__file__).resolve().parent.parent / "learn" / "configs" / "mamba2-tiny.json"


def test_a_mamba2_card_stops_verify_where_mamba_ssm_would_run_instead():
    """The card priced transformers' torch reference (core.card.STATE_SPACE_TORCH): on this CPU
    machine transformers resolves the fallback too, so the run trains what was planned; a node
    where mamba-ssm imports would train its kernels, which keep less: one line, before training."""
    from zlayout.core.card import STATE_SPACE_TORCH

    build = hf_builder({**json.loads(MAMBA2.read_text()), "use_cache": False}, checkpointing=False)
    resolved = linear_attention_implementation(build.model_module)
    assert resolved == {"causal_conv1d_fn": TORCH_FALLBACK, "mamba_split_conv1d_scan_combined": TORCH_FALLBACK,
                        "mamba_chunk_scan_combined": TORCH_FALLBACK}
    assert linear_attention_refusal(STATE_SPACE_TORCH, resolved) is None
    kernels = {**resolved, "mamba_split_conv1d_scan_combined": "mamba-ssm", "mamba_chunk_scan_combined": "mamba-ssm"}
    refusal = linear_attention_refusal(STATE_SPACE_TORCH, kernels)
    assert "\n" not in refusal and "resolved mamba-ssm's kernel," in refusal
    assert "verify in an environment without mamba-ssm and causal-conv1d" in refusal
    both = {**kernels, "causal_conv1d_fn": "causal-conv1d"}
    assert "causal-conv1d and mamba-ssm's kernels" in linear_attention_refusal(STATE_SPACE_TORCH, both)


# ------------------------------------ Jamba, Mamba, Falcon-Mamba: priced with mamba-ssm's kernels
JAMBA = Path(__file__).resolve().parent.parent / "learn" / "configs" / "jamba-tiny.json"


@pytest.mark.parametrize("name", ["jamba", "mamba", "falcon_mamba"])
def test_a_mamba1_card_stops_verify_where_the_per_token_loop_would_run(name):
    """The card priced mamba-ssm's and causal-conv1d's kernels (core.card.STATE_SPACE_KERNELS): on
    this CPU machine transformers resolves its per-token loop, so the worker stops in one line
    naming both packages; with both resolved it trains (Jamba calls the selective scan, Mamba and
    Falcon-Mamba the fused `mamba_inner_fn`: each module wraps all three)."""
    from zlayout.core.card import STATE_SPACE_KERNELS

    config = json.loads((JAMBA.parent / f"{name}-tiny.json").read_text())
    build = hf_builder({**config, "use_cache": False}, checkpointing=False)
    resolved = linear_attention_implementation(build.model_module)
    assert resolved == {"causal_conv1d_fn": TORCH_FALLBACK, "selective_scan_fn": TORCH_FALLBACK,
                        "mamba_inner_fn": TORCH_FALLBACK}
    refusal = linear_attention_refusal(STATE_SPACE_KERNELS, resolved)
    assert "\n" not in refusal and f"the plan priced state-space blocks as {STATE_SPACE_KERNELS}" in refusal
    assert "causal-conv1d and mamba-ssm are not installed" in refusal and "loops over every token" in refusal
    assert linear_attention_refusal(STATE_SPACE_KERNELS, {"causal_conv1d_fn": "causal-conv1d",
                                                          "selective_scan_fn": "mamba-ssm",
                                                          "mamba_inner_fn": "mamba-ssm"}) is None


@pytest.mark.slow
def test_a_mamba2_hybrid_trains_at_zero3_on_a_real_engine(tmp_path, monkeypatch):
    """ZeRO-3 builds the model inside zero.Init: transformers' initialiser wrote Mamba-2's A_log
    (a whole tensor) into an empty partition and the build failed; it is built without it and
    initialised on the gathered weights, as transformers does under ZeRO-3."""
    from zlayout.cli import main

    config = MAMBA2.parent / "nemotron_h-tiny.json"  # Mamba-2, MoE, attention and MLP blocks
    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(tmp_path / "cards"))
    assert main(["learn", "--hf-config", str(config)]) == 0
    code = main(["verify", "--hf-config", str(config), "--stage", "3", "--cpu", "--seq", "128",
                 "--micro-batch", "1", "--steps", "2", "--out", str(tmp_path / "run")])
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert code == 0 and result["status"] != "failed", result.get("cause")
    rank = result["ranks"][0]
    # the loss of random tokens over a 256-token vocabulary: ln 256 = 5.55, finite (initialised weights)
    assert rank["steps_run"] == [1, 2] and all(5.0 < loss < 6.2 for loss in rank["losses"])
    assert result["environment"]["linear_attention"]["mamba_chunk_scan_combined"] == TORCH_FALLBACK
