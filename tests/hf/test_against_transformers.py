"""zlayout's parameter count of a config.json equals what transformers builds from it, exactly.

Each model is built with `AutoModelForCausalLM.from_config` on the meta device (no memory,
no download), for every fixture: the small configs cover each supported model_type and its
variants (defaults, biases, explicit head_dim, tied heads, Falcon's layouts, MoE sparse steps,
dense first blocks, latent attention); the published ones are full-size public models.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

from zlayout import catalog, hfconfig
from zlayout.core.tensors import parameter_tensor_sizes
from zlayout.spec import ModelSpec
from tests.hf.conftest import PUBLISHED_CONFIGS, SMALL_CONFIGS


def transformers_model(path: Path) -> torch.nn.Module:
    """The model transformers' auto class builds: the causal LM, else the whole
    image-text-to-text model (LLaVA, Qwen2.5-VL: vision tower included)."""
    config = json.loads(path.read_text())
    hf_config = AutoConfig.for_model(config.pop("model_type"), **config)
    auto = AutoModelForCausalLM if type(hf_config) in AutoModelForCausalLM._model_mapping else AutoModelForImageTextToText
    with torch.device("meta"):
        return auto.from_config(hf_config)


@pytest.mark.parametrize("path", SMALL_CONFIGS + PUBLISHED_CONFIGS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_the_parameter_count_equals_the_transformers_model(path):
    built = transformers_model(path)
    model = hfconfig.load(path)
    assert model.params == sum(p.numel() for p in built.parameters())


def hand_read(path: Path) -> bool:
    """Whether zlayout reads this config's model_type by hand (else: from its card alone)."""
    return json.loads(path.read_text())["model_type"] in hfconfig.READERS


def multimodal(path: Path) -> bool:
    return json.loads(path.read_text())["model_type"] in hfconfig.MULTIMODAL_TEXT_TYPES


@pytest.mark.parametrize("path", [p for p in SMALL_CONFIGS + PUBLISHED_CONFIGS
                                  if hand_read(p) and hfconfig.load(p).is_moe], ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_moe_blocks_and_experts_are_where_transformers_puts_them(path):
    """The blocks holding routed experts, and each MoE block's size, match the built model."""
    built = transformers_model(path)
    model = hfconfig.load(path)
    layers = built.model.layers
    moe_blocks = [i for i, layer in enumerate(layers) if hasattr(layer.mlp, "experts")]
    assert moe_blocks == [i for i in range(model.layers) if i not in model.dense_layers]
    block = layers[moe_blocks[0]]
    assert sum(p.numel() for p in block.parameters()) == model.moe_layer_params()
    expert_params = sum(p.numel() for p in block.mlp.experts.parameters())
    assert expert_params == model.experts * model.mlp_params(model.expert_ffn_size, with_bias=False)
    assert max(p.numel() for p in built.parameters()) == max(parameter_tensor_sizes(model, "hf"))


def build_from_dict(config: dict) -> torch.nn.Module:
    config = dict(config)
    hf_config = AutoConfig.for_model(config.pop("model_type"), **config)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(hf_config)


@pytest.mark.parametrize("name", catalog.list_presets("models"))
def test_every_model_preset_has_a_transformers_config_with_its_count(name):
    """`to_hf_config` is what `--impl hf` verification builds for a preset or hand-entered model."""
    model = catalog.load_model(name)
    config = hfconfig.to_hf_config(model)
    assert sum(p.numel() for p in build_from_dict(config).parameters()) == model.params


@pytest.mark.parametrize("path", [p for p in SMALL_CONFIGS + PUBLISHED_CONFIGS if hand_read(p)],
                         ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_config_read_and_written_back_builds_the_same_model(path):
    model = hfconfig.load(path)
    config = hfconfig.to_hf_config(model)
    assert config["model_type"] == json.loads(path.read_text())["model_type"]
    assert sum(p.numel() for p in build_from_dict(config).parameters()) == model.params


@pytest.mark.parametrize("fields", [
    dict(kv_heads=2, mlp="swiglu", norm="rmsnorm", bias=False, qkv_bias=True, tie_embeddings=True),  # qwen2
    dict(kv_heads=2),  # GELU + LayerNorm + biases with grouped-query attention: falcon's new layout
    dict(kv_heads=2, bias=False),  # the same without biases
    dict(mlp="swiglu", norm="rmsnorm", bias=False, experts=4, top_k=2, ffn=96),  # mixtral
    dict(mlp="swiglu", norm="rmsnorm", bias=False, qkv_bias=True, experts=4, top_k=2, expert_ffn=32,
         shared_experts=1, shared_expert_ffn=80, shared_expert_gate=True, dense_layers=(1,)),  # qwen2_moe
], ids=["qwen2", "falcon-bias", "falcon", "mixtral", "qwen2_moe"])
def test_hand_entered_models_build_with_their_count(fields):
    model = ModelSpec(name="hand", layers=3, hidden=64, heads=4, vocab=256, **fields)
    built = build_from_dict(hfconfig.to_hf_config(model))
    assert sum(p.numel() for p in built.parameters()) == model.params


# the model types users bring that the planner must count exactly (issue 27 named the last eight)
REQUIRED_TYPES = {"llama", "mistral", "qwen2", "gemma", "gemma2", "phi3", "gpt2", "gpt_neox", "mixtral",
                  "qwen2_moe", "deepseek_v2", "qwen3", "qwen3_moe", "gemma3_text", "olmo2", "phimoe",
                  "starcoder2", "cohere", "gpt_bigcode", "llava", "qwen2_5_vl",
                  # read from their shipped cards alone (no hand reader)
                  "olmoe", "olmo", "granite", "granitemoe", "stablelm"}


def test_the_published_configs_cover_the_model_types_users_bring():
    types = [json.loads(p.read_text())["model_type"] for p in PUBLISHED_CONFIGS]
    assert len(types) >= 40 and len(set(types)) >= 15
    assert REQUIRED_TYPES <= set(types)


def test_a_config_built_by_its_own_remote_code_is_one_line(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "internlm2", "auto_map": {"AutoModelForCausalLM": "x.Model"},
                                "hidden_size": 64, "num_hidden_layers": 2}))
    with pytest.raises(hfconfig.HfConfigError) as raised:
        hfconfig.load(path)
    message = str(raised.value)
    assert "\n" not in message and "'internlm2'" in message and "own code" in message


def test_a_multimodal_config_counts_its_vision_tower_through_its_card(tmp_path, monkeypatch):
    """LLaVA's language model reads as llama; its vision tower and projector only the card
    counts: without a card (no shipped one, none learned) the plan is one line saying so."""
    from zlayout import cards

    path = next(p for p in PUBLISHED_CONFIGS if p.stem == "llava-1.5-7b-hf")
    assert hfconfig.load(path).extra_params > 0  # the shipped card
    monkeypatch.setattr(cards, "SHIPPED_CARDS_DIR", tmp_path)
    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(tmp_path))
    with pytest.raises(hfconfig.HfConfigError) as raised:
        hfconfig.load(path)
    assert "\n" not in str(raised.value) and "zlayout learn --hf-config" in str(raised.value)


def test_a_state_space_model_with_an_attention_block_shared_between_layers_is_one_line(tmp_path, monkeypatch):
    """Zamba's one attention block serves several of its layers, which no card is checked against:
    plan and learn both say, in one line, what zlayout plans instead, and do not send the user to
    `zlayout learn`. (Mamba-130M, refused here before for its per-token loop, is planned now from
    mamba-ssm's kernels: it is one of the published configs.)"""
    from zlayout import cards

    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(tmp_path))
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "zamba", "hidden_size": 64, "num_hidden_layers": 6,
                                "num_attention_heads": 4, "vocab_size": 256}))
    with pytest.raises(hfconfig.HfConfigError) as raised:
        hfconfig.load(path)
    message = str(raised.value)
    assert "\n" not in message and "'zamba'" in message and "state-space" in message
    assert "zlayout learn" not in message and "--layers --hidden --heads --vocab" in message


CARD_ONLY = [p for p in PUBLISHED_CONFIGS if not hand_read(p) and not multimodal(p)]


@pytest.mark.parametrize("path", CARD_ONLY, ids=lambda p: p.stem)
def test_a_type_without_a_hand_reader_reads_its_shape_from_the_common_keys(path):
    """The shape the plan shows is the config's (a model without attention keys, Mamba, as one head);
    the count is the card's, exactly the built model's (test_the_parameter_count_equals_the_transformers_model),
    and the experts are where transformers puts them."""
    config = json.loads(path.read_text())
    model = hfconfig.load(path)
    assert model.card is not None and model.hf_model_type == config["model_type"]
    assert (model.layers, model.hidden, model.heads, model.vocab) == (
        config["num_hidden_layers"], config["hidden_size"], config.get("num_attention_heads", 1), config["vocab_size"])
    assert model.num_kv_heads == config.get("num_key_value_heads", model.heads)
    built = transformers_model(path)
    experts = [next((m for n, m in layer.named_modules() if n.endswith("experts")), None)
               for layer in built.base_model.layers]  # Mamba's blocks: backbone.layers
    moe_blocks = [e for e in experts if e is not None]
    assert model.is_moe == bool(moe_blocks) and model.moe_layer_count == len(moe_blocks)
    if model.is_moe:  # the fused experts' tensors: (experts, ...)
        assert model.experts == next(moe_blocks[0].parameters()).shape[0]
        assert model.top_k == built.config.num_experts_per_tok


def test_the_new_card_only_types_include_a_mixture_of_experts_and_olmoe():
    types = {json.loads(p.read_text())["model_type"] for p in CARD_ONLY}
    assert {"olmoe", "granitemoe"} <= types and len(types) >= 3
    olmoe = hfconfig.load(next(p for p in CARD_ONLY if p.stem == "OLMoE-1B-7B-0924"))
    assert (olmoe.experts, olmoe.top_k, olmoe.expert_ffn_size, olmoe.tie_embeddings) == (64, 8, 1024, False)
