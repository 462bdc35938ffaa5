"""verify trains the model the user's config.json describes, not the class's defaults (held-out
run of 2026-12-02: santacoder's `activation_function = "gelu_fast"` and dropouts were dropped,
the worker built gpt_bigcode's default `gelu_pytorch_tanh`, and a plan that was right for the
user's model read +59% against a different one). The plan's shape still rules: `--layers` beside
`--hf-config` changes what trains as it changes the plan."""

from __future__ import annotations

import json

import pytest

from zlayout.cli import build_parser
from zlayout.commands.verify import _inputs, _options
from zlayout.verify.launcher import run_spec

SANTACODER_LIKE = {"model_type": "gpt_bigcode", "n_embd": 128, "n_layer": 4, "n_head": 4, "n_inner": 512,
                   "vocab_size": 1000, "n_positions": 256, "multi_query": True,
                   "activation_function": "gelu_fast", "attn_pdrop": 0.1, "resid_pdrop": 0.1,
                   "bos_token_id": 999, "eos_token_id": 999, "_name_or_path": "tiny-santacoder"}


def spec_for(tmp_path, *flags: str) -> dict:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(SANTACODER_LIKE))
    args = build_parser().parse_args(["verify", "--hf-config", str(config), "--stage", "2", "--cpu",
                                      "--seq", "64", "--micro-batch", "1", *flags])
    inp, layout, profile, _ = _inputs(args)
    return run_spec(inp, layout, _options(args, profile, inp), tmp_path), inp


def test_the_worker_builds_the_users_config_as_written(tmp_path):
    spec, inp = spec_for(tmp_path)
    built = spec["hf_config"]
    assert built["activation_function"] == "gelu_fast" and built["attn_pdrop"] == 0.1
    assert built["bos_token_id"] == 999 and built["n_layer"] == 4
    assert not any(k.startswith("_") for k in built)
    assert "pad_token_id" not in built  # none in the user's file, and verify adds none


def test_a_shape_flag_beside_the_config_changes_the_shape_only(tmp_path):
    spec, inp = spec_for(tmp_path, "--layers", "2")
    built = spec["hf_config"]
    assert built["n_layer"] == 2 and inp.model.layers == 2
    assert built["activation_function"] == "gelu_fast" and built["resid_pdrop"] == 0.1


def test_a_model_without_a_config_builds_from_the_plans_shape(tmp_path):
    args = build_parser().parse_args(["verify", "--preset", "llama3-8b", "--impl", "hf", "--layers", "2",
                                      "--stage", "2", "--cpu"])
    inp, layout, profile, _ = _inputs(args)
    assert run_spec(inp, layout, _options(args, profile, inp), tmp_path)["hf_config"] is None


COHERE_WITH_PAD = {"model_type": "cohere", "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "intermediate_size": 256, "vocab_size": 1000, "use_qk_norm": True,
                   "pad_token_id": 0}
# XLM counts each row's tokens with its padding id (`pad_index`, the alias of pad_token_id): without it
# its forward fails (`(input_ids != None).sum`), as verify's once did where it dropped the id
XLM_WITH_PAD = {"model_type": "xlm", "n_layers": 2, "emb_dim": 64, "n_heads": 2, "vocab_size": 128, "pad_index": 2}


# openai-gpt multiplies a float32 causal mask into its attention weights; DeepSpeed casts only the
# weights unless data_types.buffer_dtype is set, and the first matmul failed (float != BFloat16)
OPENAI_GPT = {"model_type": "openai-gpt", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 256,
              "n_positions": 512, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
LEARNED_FIRST = (XLM_WITH_PAD, OPENAI_GPT)


@pytest.mark.slow
@pytest.mark.parametrize(("config_json", "stage"), [(SANTACODER_LIKE, "2"), (COHERE_WITH_PAD, "3"),
                                                   (XLM_WITH_PAD, "3"), (OPENAI_GPT, "2")],
                         ids=["gpt_bigcode-gelu_fast-zero2", "cohere-pad-id-zero3", "xlm-pad-index-zero3",
                              "openai-gpt-float32-mask-zero2"])
def test_the_users_config_trains_with_the_planned_parameter_count(tmp_path, monkeypatch, config_json, stage):
    """A real DeepSpeed engine on CPU builds the user's config (the worker asserts the count);
    a padding id in it does not break the ZeRO-3 build (command-r's did on the H200), and reaches
    the model that reads it (XLM, planned from its card: learned first)."""
    from zlayout import cards
    from zlayout.cli import main

    config = tmp_path / "config.json"
    config.write_text(json.dumps(config_json))
    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(tmp_path / "cards"))
    if any(config_json is c for c in LEARNED_FIRST):
        assert main(["learn", "--hf-config", str(config)]) == 0
    code = main(["verify", "--hf-config", str(config), "--stage", stage, "--cpu", "--seq", "64",
                 "--micro-batch", "1", "--steps", "2", "--out", str(tmp_path / "run")])
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert code == 0 and result["status"] == "cpu-ok", result.get("cause")
    assert result["measured"]["params"] == result["predicted"]["params"]
