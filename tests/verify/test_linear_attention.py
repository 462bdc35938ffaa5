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
