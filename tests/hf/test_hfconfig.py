"""Reading config.json: published models' totals, what is recorded, and one-line errors."""

from __future__ import annotations

import json
import shutil

import pytest

from zlayout import catalog, hfconfig
from tests.hf.conftest import CONFIGS, PUBLISHED_CONFIGS

PUBLISHED = CONFIGS / "published"

# Totals the model cards and papers publish (exact where the publisher gives the exact count).
PUBLISHED_PARAMS = {
    "Meta-Llama-3-8B": 8_030_261_248,
    "Qwen2.5-7B": 7_615_616_512,
    "Mistral-7B-v0.1": 7_241_732_096,
    "gemma-7b": 8_537_680_896,
    "gemma-2-2b": 2_614_341_888,
    "Phi-3-mini-4k-instruct": 3_821_079_552,
    "falcon-7b": 6_921_720_704,
    "gpt2": 124_439_808,
    "pythia-160m": 162_322_944,
    "Mixtral-8x7B-v0.1": 46_702_792_704,
    "Qwen1.5-MoE-A2.7B": 14_315_784_192,
}
# MoE models' totals and activated parameters as their cards round them (billions).
PUBLISHED_MOE_BILLIONS = {
    "Mixtral-8x7B-v0.1": (46.7, 12.9),
    "Qwen1.5-MoE-A2.7B": (14.3, 2.7),
    "DeepSeek-V2-Lite": (15.7, None),  # its 2.4B activated leaves out the embeddings
}


def published(name: str):
    return hfconfig.load(PUBLISHED / f"{name}.json")


@pytest.mark.parametrize("name,params", sorted(PUBLISHED_PARAMS.items()))
def test_published_models_have_their_published_parameter_counts(name, params):
    assert published(name).params == params


@pytest.mark.parametrize("name,billions", sorted(PUBLISHED_MOE_BILLIONS.items()))
def test_moe_totals_and_active_parameters_round_to_the_published_figures(name, billions):
    model = published(name)
    total, active = billions
    assert round(model.params / 1e9, 1) == total
    if active is not None:
        assert round(model.active_params / 1e9, 1) == active
    assert model.is_moe and model.active_params < model.params


def test_every_supported_type_has_a_fixture():
    types = {json.loads(p.read_text())["model_type"] for p in (CONFIGS / "small").glob("*.json")}
    assert types == set(hfconfig.SUPPORTED_MODEL_TYPES)
    assert len(PUBLISHED_CONFIGS) >= 4


@pytest.mark.parametrize("preset,config", [("llama3-8b", "Meta-Llama-3-8B"), ("qwen2.5-7b", "Qwen2.5-7B"),
                                           ("mistral-7b", "Mistral-7B-v0.1")])
def test_dense_presets_are_the_architecture_their_config_json_describes(preset, config):
    fields = ("layers", "hidden", "heads", "num_kv_heads", "head_dim", "ffn_size", "vocab", "mlp", "norm",
              "tie_embeddings", "params")
    a, b = catalog.load_model(preset), published(config)
    assert {f: getattr(a, f) for f in fields} == {f: getattr(b, f) for f in fields}


@pytest.mark.parametrize("preset,config", [("mixtral-8x7b", "Mixtral-8x7B-v0.1"),
                                           ("qwen1.5-moe-a2.7b", "Qwen1.5-MoE-A2.7B"),
                                           ("deepseek-v2-lite", "DeepSeek-V2-Lite")])
def test_moe_presets_are_their_config_json(preset, config):
    a, b = catalog.load_model(preset), published(config)
    ignore = {"name", "family", "hf_model_type", "hf_config", "card"}  # the config.json has a shipped card
    assert a.model_dump(exclude=ignore) == b.model_dump(exclude=ignore)
    assert a.params == b.params


def test_what_the_spec_records_and_reads(tmp_path):
    folder = tmp_path / "my-llama"
    folder.mkdir()
    shutil.copy(PUBLISHED / "Meta-Llama-3-8B.json", folder / "config.json")
    by_dir, by_file = hfconfig.load(folder), hfconfig.load(folder / "config.json")
    assert by_dir == by_file
    # _name_or_path names it; the file and its model_type are recorded
    assert by_dir.name == "Meta-Llama-3-8B"
    assert by_dir.hf_model_type == "llama" and by_dir.hf_config == str((folder / "config.json").resolve())
    assert (by_dir.layers, by_dir.hidden, by_dir.heads, by_dir.kv_heads, by_dir.ffn, by_dir.vocab) == \
        (32, 4096, 32, 8, 14336, 128256)
    assert by_dir.family is None  # break-even grows it in depth, not along a preset family


def test_without_name_or_path_the_folder_names_the_model(tmp_path):
    folder = tmp_path / "Qwen2.5-7B-Instruct"
    folder.mkdir()
    shutil.copy(PUBLISHED / "Qwen2.5-7B.json", folder / "config.json")
    model = hfconfig.load(folder)
    assert model.name == "Qwen2.5-7B-Instruct"
    assert model.qkv_bias is True and model.bias is False and not model.tie_embeddings


def test_moe_fields_read_from_the_files():
    mixtral = published("Mixtral-8x7B-v0.1")
    assert (mixtral.experts, mixtral.top_k, mixtral.expert_ffn_size, mixtral.shared_experts) == (8, 2, 14336, 0)
    qwen = published("Qwen1.5-MoE-A2.7B")
    assert (qwen.experts, qwen.top_k, qwen.expert_ffn, qwen.shared_experts, qwen.shared_expert_ffn,
            qwen.shared_expert_gate, qwen.ffn) == (60, 4, 1408, 1, 5632, True, 5632)
    deepseek = published("DeepSeek-V2-Lite")
    assert (deepseek.experts, deepseek.top_k, deepseek.shared_experts, deepseek.dense_layers) == (64, 6, 2, (0,))
    assert deepseek.mla is not None and deepseek.mla.q_lora_rank is None and deepseek.mla.kv_lora_rank == 512
    step = hfconfig.load(CONFIGS / "small" / "qwen2_moe-sparse-step.json")
    assert step.dense_layers == (0, 2, 3, 4)  # (i + 1) % 2 != 0, and block 3 is MLP-only


def _write(tmp_path, config: dict | str, name: str = "config.json"):
    path = tmp_path / name
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    return path


def _llama(**changes) -> dict:
    config = json.loads((PUBLISHED / "Meta-Llama-3-8B.json").read_text())
    config.update(changes)
    return {k: v for k, v in config.items() if v is not ...}


@pytest.mark.parametrize("config,words", [
    (_llama(num_hidden_layers=...), ["'num_hidden_layers'", "llama"]),
    (_llama(vocab_size=...), ["'vocab_size'"]),
    (_llama(hidden_size="4096"), ["'hidden_size'", "whole number", "'4096'"]),
    (_llama(num_attention_heads=0), ["'num_attention_heads'", "at least 1"]),
    (_llama(tie_word_embeddings="no"), ["'tie_word_embeddings'", "true or false"]),
    (_llama(num_key_value_heads=5), ["heads (32) must be a multiple of kv-heads (5)"]),
    (_llama(model_type="bert"), ["model_type 'bert'", "model card", "zlayout learn --hf-config"]),
    (_llama(model_type=...), ["no 'model_type' key"]),
    # found by a QA pass: a null read as a missing key, a number as a type to learn
    (_llama(hidden_size=None), ["'hidden_size' is null", "needs a number"]),
    (_llama(model_type=123), ["'model_type' must be a string", "123"]),
    (_llama(model_type="zamba"), ["state-space", "--layers --hidden --heads --vocab"]),
    ('{"model_type": "llama", "vocab_size": ' + "9" * 5000 + "}", ["a number in it is too long"]),
    ({**json.loads((PUBLISHED / "Mixtral-8x7B-v0.1.json").read_text()), "num_experts_per_tok": 9},
     ["top_k (9) must be at most experts (8)"]),
    ({k: v for k, v in json.loads((PUBLISHED / "Qwen1.5-MoE-A2.7B.json").read_text()).items()
      if k != "moe_intermediate_size"}, ["'moe_intermediate_size'", "qwen2_moe"]),
    ({**json.loads((PUBLISHED / "Qwen1.5-MoE-A2.7B.json").read_text()), "mlp_only_layers": "0"},
     ["'mlp_only_layers'", "list"]),
    ([1, 2], ["one JSON object"]),
    ("{\"model_type\": \"llama\",", ["not valid JSON", "line 1"]),
])
def test_bad_config_is_one_line_naming_the_file_and_the_key(tmp_path, config, words):
    path = _write(tmp_path, config)
    with pytest.raises(hfconfig.HfConfigError) as err:
        hfconfig.load(path)
    message = str(err.value)
    assert "\n" not in message and message.startswith(str(path))
    for word in words:
        assert word in message


def test_paths_that_hold_no_config(tmp_path):
    with pytest.raises(hfconfig.HfConfigError, match="no such file"):
        hfconfig.load(tmp_path / "missing.json")
    with pytest.raises(hfconfig.HfConfigError, match="directory without a config.json"):
        hfconfig.load(tmp_path)
    binary = tmp_path / "weights.bin"
    binary.write_bytes(b"\xff\xfe\x00\x01" * 8)
    with pytest.raises(hfconfig.HfConfigError, match="not a text file"):
        hfconfig.load(binary)
    big = _write(tmp_path, "{" + " " * (hfconfig.MAX_CONFIG_BYTES + 1) + "}", "big.json")
    with pytest.raises(hfconfig.HfConfigError, match="not a config.json"):
        hfconfig.load(big)


def test_dense_models_dump_as_before_and_moe_models_round_trip():
    dense = catalog.load_model("llama3-8b").model_dump()
    assert not {"experts", "head_size", "norms_per_layer", "hf_config", "mla"} & dense.keys()
    for path in PUBLISHED_CONFIGS:
        model = hfconfig.load(path)
        assert type(model).model_validate(model.model_dump(mode="json")) == model


@pytest.mark.parametrize("changes,words", [
    (dict(mlp="gelu", norm="rmsnorm"), ["no supported transformers class", "gelu, rmsnorm"]),
    (dict(position_embeddings=1024), ["learned positions", "--hf-config"]),
])
def test_shapes_no_transformers_class_builds_are_refused_in_one_line(changes, words):
    from zlayout.spec import ModelSpec

    model = ModelSpec(name="odd", layers=2, hidden=64, heads=4, vocab=100, mlp="swiglu", norm="rmsnorm",
                      bias=False).model_copy(update=changes)
    with pytest.raises(hfconfig.HfConfigError) as err:
        hfconfig.to_hf_config(model)
    assert "\n" not in str(err.value) and all(word in str(err.value) for word in words)


def test_hand_entered_models_map_to_the_class_that_builds_them():
    from zlayout.spec import ModelSpec

    qwen_like = ModelSpec(layers=2, hidden=64, heads=4, kv_heads=2, vocab=100, mlp="swiglu", norm="rmsnorm",
                          bias=False, qkv_bias=True, tie_embeddings=True)
    assert hfconfig.to_hf_config(qwen_like)["model_type"] == "qwen2"
    gqa_gelu = ModelSpec(layers=2, hidden=64, heads=4, kv_heads=2, vocab=100)
    assert hfconfig.to_hf_config(gqa_gelu)["model_type"] == "falcon"
    moe = ModelSpec(layers=2, hidden=64, heads=4, vocab=100, mlp="swiglu", norm="rmsnorm", bias=False,
                    experts=4, top_k=2)
    assert hfconfig.to_hf_config(moe)["model_type"] == "mixtral"


def test_a_type_without_a_hand_reader_or_torch_says_how_to_install_the_learner(tmp_path, monkeypatch):
    """Without a card and without torch (the planner's own install), one line: what learns the
    card and the pip command that installs it; found by importlib, never imported."""
    import importlib.util

    from zlayout import cards

    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(tmp_path / "cards"))
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else find_spec(name, *a))
    path = PUBLISHED / "OLMoE-1B-7B-0924.json"
    monkeypatch.setattr(cards, "SHIPPED_CARDS_DIR", tmp_path)
    with pytest.raises(hfconfig.HfConfigError) as err:
        hfconfig.load(path)
    message = str(err.value)
    assert "\n" not in message and "'olmoe'" in message and "needs torch and transformers" in message
    assert "pip install" in message and "[learn]" in message


def _planned(*flags: str):
    from zlayout.cli import build_parser, plan_input_from_args

    return plan_input_from_args(build_parser().parse_args(["verify", *flags]))


def test_a_family_read_through_its_card_verifies_at_the_planned_depth():
    # OLMoE has no hand reader: its card is its shape. `--layers 8` must build the user's own
    # config at 8 layers (h200-2026-12-15: verify stopped its batch with a traceback here)
    path = CONFIGS / "published" / "OLMoE-1B-7B-0924.json"
    inp = _planned("--hf-config", str(path), "--layers", "8", "--stage", "3")
    user, _ = hfconfig.read_config(path)
    built = hfconfig.config_to_build(user, inp.model)
    assert built["num_hidden_layers"] == 8 != user["num_hidden_layers"]
    # the user's own keys, the padding id included (XLM's forward reads it: 'pad_index' is its alias)
    assert {k: v for k, v in built.items() if k != "num_hidden_layers"} == \
        {k: v for k, v in user.items() if k != "num_hidden_layers" and not k.startswith("_")}
    assert built["pad_token_id"] == user["pad_token_id"] == 1
    rebuilt = hfconfig.with_card(hfconfig.model_from_config(built), built, "test")
    assert (rebuilt.layers, rebuilt.params) == (8, inp.model.params)


def test_a_depth_verify_cannot_build_is_refused_before_the_run_in_one_line():
    # a multimodal card counts the whole model; its config's layers are its text_config's
    from zlayout.verify.options import LaunchError, VerifyOptions, check_request

    path = CONFIGS / "published" / "llava-1.5-7b-hf.json"
    inp = _planned("--hf-config", str(path), "--layers", "8", "--stage", "3", "--cpu")
    user, _ = hfconfig.read_config(path)
    with pytest.raises(LaunchError) as exc:
        check_request(inp, VerifyOptions(cpu=True, processes=1, hf_config=user))
    assert "llava" in str(exc.value) and "\n" not in str(exc.value)


def test_the_common_keys_read_a_dense_model_that_names_experts_and_dense_blocks_by_type():
    """Doge's defaults name 16,384 experts with is_moe false (a dense model: the shape read 3.3T
    'active' parameters below zero); beam's and axk2's mark their dense first blocks only in
    mlp_layer_types (the shape counted them as expert blocks: beam's active count below zero)."""
    from zlayout.hfconfig import _generic_shape, _Reader

    base = {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 128,
            "vocab_size": 256}
    dense = _generic_shape(_Reader({**base, "num_experts": 16384, "num_experts_per_tok": 64, "is_moe": False},
                                   "config.json", "doge"))
    assert "experts" not in dense
    typed = _generic_shape(_Reader({**base, "n_routed_experts": 8, "num_experts_per_tok": 2,
                                    "mlp_layer_types": ["dense", "dense", "sparse", "sparse"]}, "config.json", "beam"))
    assert typed["experts"] == 8 and typed["dense_layers"] == (0, 1)


def test_the_common_keys_read_an_encoder_decoder_family_s_causal_lm_as_its_decoder():
    """Whisper's, BART's and TrOCR's ForCausalLM classes are their decoders: the shape from
    decoder_layers, decoder_attention_heads and decoder_ffn_dim (plan had refused 'no num_hidden_layers')."""
    from zlayout.hfconfig import _generic_shape, _Reader

    shape = _generic_shape(_Reader({"d_model": 384, "decoder_layers": 4, "encoder_layers": 6, "decoder_attention_heads": 6,
                                    "decoder_ffn_dim": 1536, "vocab_size": 51865}, "config.json", "whisper"))
    assert (shape["layers"], shape["heads"], shape["ffn"]) == (4, 6, 1536)


def test_a_per_block_ffn_list_reads_as_its_widest_and_a_bad_value_is_shown_short():
    """Gemma-3n lists one intermediate size per layer: the shape's ffn is the widest (the card holds
    each block's own). A list that is not whole numbers is refused in one line that shows the start
    of the value, not 100,000 entries of it."""
    base = {"model_type": "gemma3n_text", "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 2,
            "vocab_size": 256}
    shape = hfconfig._generic_shape(hfconfig._Reader({**base, "intermediate_size": [128, 256, 128]}, "c.json", "g"))
    assert shape["ffn"] == 256
    with pytest.raises(hfconfig.HfConfigError) as err:
        hfconfig._generic_shape(hfconfig._Reader({**base, "intermediate_size": ["x"] * 100_000}, "c.json", "g"))
    message = str(err.value)
    assert "'intermediate_size' must be a whole number" in message and len(message) < 200 and "\n" not in message


def test_attention_dropout_reads_the_keys_configs_use_and_nothing_else():
    """GPT-2's attn_pdrop, most decoders' attention_dropout, BERT-style attention_probs_dropout_prob;
    a value that is not a probability strictly between 0 and 1 (a string, a bool, 1.5) is no dropout."""
    attention_dropout = hfconfig.attention_dropout
    assert attention_dropout({"attn_pdrop": 0.1}) == 0.1
    assert attention_dropout({"attention_dropout": 0.0, "attention_probs_dropout_prob": 0.2}) == 0.2
    assert attention_dropout({"hidden_dropout": 0.3}) == 0.0
    for odd in ("0.1", True, 1.5, -0.1, None, float("nan")):
        assert attention_dropout({"attention_dropout": odd}) == 0.0
