"""A Hugging Face `config.json` as a `ModelSpec`, read without importing transformers.

`load(path)` takes a config.json (or the directory holding one) and returns the model with
the same parameter count as `AutoModelForCausalLM.from_config(config)` builds (transformers
5.x; tests/hf builds every supported type on the meta device and compares). Keys the planner
needs that a file leaves out take transformers' default for that model type; the keys that
fix the shape (layers, hidden, heads, vocab, MLP sizes, expert counts) must be present.

Supported model types, dense: llama, mistral, qwen2, qwen3, gemma, gemma2, gemma3_text, phi3,
olmo2, cohere, starcoder2, gpt2, gpt_bigcode, gpt_neox, falcon; mixture of experts: mixtral,
phimoe, qwen2_moe, qwen3_moe, deepseek_v2, deepseek_v3 (shared experts, dense first blocks and
latent attention as the file says). Multimodal LLaVA and Qwen2.5-VL read their language model
by hand and the vision tower from the model card (`zlayout learn`), which counts every tensor the
class builds. Any other model_type transformers builds (OLMoE, Granite, StableLM...) is planned
from its card alone: the common keys (hidden_size, num_hidden_layers, heads, experts, top-k...)
give the shape the plan shows, the card the exact parameter count and every block's requests.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Mapping

from pydantic import ValidationError

from zlayout import tomlsafe
from zlayout.smallfile import NotARegularFile, TooLarge, read_small_file
from zlayout.spec import MlaSpec, ModelSpec

CONFIG_FILE = "config.json"
MAX_CONFIG_BYTES = 4 * 2**20  # config.json files are a few KiB; anything this large is not one


class HfConfigError(ValueError):
    """A config.json zlayout cannot read: one line naming the file and the key."""


_REQUIRED = object()


def _shown(value: Any, limit: int = 60) -> str:
    """A value as an error shows it: its repr, cut to `limit` characters (a config's list may be long)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


class _Reader:
    """Typed access to one config's keys; errors name the key and the file."""

    def __init__(self, config: Mapping[str, Any], where: str, model_type: str,
                 paths: Mapping[str, str] | None = None):
        self.config, self.where, self.model_type = config, where, model_type
        self.paths = paths or {}  # a key read from a nested part: its name there (DBRX's attn_config.kv_n_heads)

    def _name(self, key: str) -> str:
        return self.paths.get(key, key)

    def _fail(self, message: str) -> HfConfigError:
        return HfConfigError(f"{self.where}: {message}")

    def _raw(self, keys: tuple[str, ...], default: Any, null: bool = False) -> tuple[str, Any]:
        """The first key present; `null`: an explicit null is the value (else it means absent)."""
        for key in keys:
            if key in self.config and (null or self.config[key] is not None):
                return key, self.config[key]
        if default is _REQUIRED:
            null_key = next((key for key in keys if key in self.config), None)
            if null_key is not None:  # there, but null
                raise self._fail(f"{self._name(null_key)!r} is null; model_type {self.model_type!r} "
                                 "needs a number there")
            raise self._fail(f"no {keys[0]!r} key, which model_type {self.model_type!r} needs "
                             "(is this the model's config.json?)")
        return keys[0], default

    def int(self, *keys: str, default: Any = _REQUIRED, minimum: int = 1, null: bool = False) -> Any:
        key, value = self._raw(keys, default, null)
        return self._whole(key, value, minimum)

    def widest(self, *keys: str, default: Any = _REQUIRED) -> Any:
        """`int`, or the largest of a list of one whole number per block (Gemma-3n's per-layer
        `intermediate_size`)."""
        key, value = self._raw(keys, default)
        if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            value = max(value)
        return self._whole(key, value, 1)

    def _whole(self, key: str, value: Any, minimum: int) -> Any:
        """`value` where it is a whole number of at least `minimum` (None passes); else the error."""
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._fail(f"{self._name(key)!r} must be a whole number, got {_shown(value)}")
        if value < minimum:
            raise self._fail(f"{self._name(key)!r} must be at least {minimum}, got {value}")
        return value

    def bool(self, *keys: str, default: Any = _REQUIRED) -> bool:
        key, value = self._raw(keys, default)
        if not isinstance(value, bool):
            raise self._fail(f"{self._name(key)!r} must be true or false, got {_shown(value)}")
        return value

    def int_list(self, *keys: str, default: Any = _REQUIRED) -> list[int]:
        key, value = self._raw(keys, default)
        if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
            raise self._fail(f"{self._name(key)!r} must be a list of block numbers, got {_shown(value)}")
        return value


def _llama_like(r: _Reader, *, kv_default: int | None, head_dim_default: int | None, tie_default: bool,
                attention_bias: bool | None = False, mlp_bias: bool | None = False,
                qkv_bias: bool | None = None, norms: int = 2) -> dict[str, Any]:
    """The pre-norm, rotary, gated-MLP, RMSNorm block of Llama and its descendants.

    `attention_bias`/`mlp_bias`: the key's default for this type, or None when the type
    ignores the key (biases fixed by the modeling code, as Mistral's)."""
    heads = r.int("num_attention_heads")
    hidden = r.int("hidden_size")
    spec: dict[str, Any] = dict(
        layers=r.int("num_hidden_layers"), hidden=hidden, heads=heads,
        kv_heads=r.int("num_key_value_heads", default=kv_default if kv_default is not None else heads),
        ffn=r.int("intermediate_size"), vocab=r.int("vocab_size"),
        mlp="swiglu", norm="rmsnorm", bias=False, norms_per_layer=norms,
        tie_embeddings=r.bool("tie_word_embeddings", default=tie_default))
    head_dim = r.int("head_dim", default=head_dim_default)
    if head_dim is not None and head_dim * heads != hidden:
        spec["head_size"] = head_dim
    elif head_dim is None and hidden % heads:
        raise r._fail(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads} "
                      "and the file gives no 'head_dim'")
    if attention_bias is not None and r.bool("attention_bias", default=attention_bias):
        spec["qkv_bias"] = spec["out_bias"] = True
    if qkv_bias is not None:
        spec["qkv_bias"] = qkv_bias
    if mlp_bias is not None and r.bool("mlp_bias", default=mlp_bias):
        spec["mlp_bias"] = True
    return spec


def _llama(r: _Reader) -> dict[str, Any]:
    return _llama_like(r, kv_default=None, head_dim_default=None, tie_default=False)


def _mistral(r: _Reader) -> dict[str, Any]:
    return _llama_like(r, kv_default=8, head_dim_default=None, tie_default=False,
                       attention_bias=None, mlp_bias=None)


def _qwen2(r: _Reader) -> dict[str, Any]:
    # transformers' Qwen2 always has q/k/v biases and none elsewhere
    return _llama_like(r, kv_default=32, head_dim_default=None, tie_default=False,
                       attention_bias=None, mlp_bias=None, qkv_bias=True)


def _gemma(r: _Reader) -> dict[str, Any]:
    return _llama_like(r, kv_default=16, head_dim_default=256, tie_default=True, mlp_bias=None)


def _gemma2(r: _Reader) -> dict[str, Any]:
    # Gemma 2 norms both sides of attention and of the MLP
    return _llama_like(r, kv_default=4, head_dim_default=256, tie_default=True, mlp_bias=None, norms=4)


def _phi3(r: _Reader) -> dict[str, Any]:
    return _llama_like(r, kv_default=None, head_dim_default=None, tie_default=False,
                       attention_bias=None, mlp_bias=None)


def _gpt2(r: _Reader) -> dict[str, Any]:
    hidden = r.int("n_embd", "hidden_size")
    return dict(layers=r.int("n_layer", "num_hidden_layers"), hidden=hidden,
                heads=r.int("n_head", "num_attention_heads"),
                ffn=r.int("n_inner", default=4 * hidden), vocab=r.int("vocab_size"),
                mlp="gelu", norm="layernorm", bias=True,
                position_embeddings=r.int("n_positions", "max_position_embeddings", default=1024),
                tie_embeddings=r.bool("tie_word_embeddings", default=True))


def _gpt_neox(r: _Reader) -> dict[str, Any]:
    # one fused q/k/v of 3*hidden (no grouped-query attention), MLP biases always
    attention_bias = r.bool("attention_bias", default=True)
    return dict(layers=r.int("num_hidden_layers"), hidden=r.int("hidden_size"),
                heads=r.int("num_attention_heads"), ffn=r.int("intermediate_size"),
                vocab=r.int("vocab_size"), mlp="gelu", norm="layernorm", bias=True,
                qkv_bias=attention_bias, out_bias=attention_bias,
                tie_embeddings=r.bool("tie_word_embeddings", default=False))


def _falcon(r: _Reader) -> dict[str, Any]:
    hidden = r.int("hidden_size", "n_embed")
    heads = r.int("num_attention_heads")
    new_arch = r.bool("new_decoder_architecture", default=False)
    multi_query = r.bool("multi_query", default=True)
    parallel = r.bool("parallel_attn", default=True)
    if new_arch:
        kv_heads = r.int("num_kv_heads", default=heads)
    else:  # the old layout: one shared k/v head (multi_query) or a full 3*hidden q/k/v
        kv_heads = 1 if multi_query else heads
    if not parallel:
        norms = 2
    else:
        norms_in_parallel = r.int("num_ln_in_parallel_attn", default=2 if new_arch else 1)
        norms = 2 if norms_in_parallel == 2 else 1
    return dict(layers=r.int("num_hidden_layers"), hidden=hidden, heads=heads, kv_heads=kv_heads,
                ffn=r.int("ffn_hidden_size", default=4 * hidden), vocab=r.int("vocab_size"),
                mlp="gelu", norm="layernorm", bias=r.bool("bias", default=False), norms_per_layer=norms,
                tie_embeddings=r.bool("tie_word_embeddings", default=True))


def _mixtral(r: _Reader) -> dict[str, Any]:
    spec = _llama_like(r, kv_default=8, head_dim_default=None, tie_default=False,
                       attention_bias=None, mlp_bias=None)
    spec.update(experts=r.int("num_local_experts", "num_experts"),
                top_k=r.int("num_experts_per_tok", default=2))
    return spec


def _qwen2_moe(r: _Reader) -> dict[str, Any]:
    spec = _llama_like(r, kv_default=16, head_dim_default=None, tie_default=False,
                       attention_bias=None, mlp_bias=None, qkv_bias=r.bool("qkv_bias", default=True))
    experts = r.int("num_experts", minimum=0)
    if experts == 0:
        return spec
    step = r.int("decoder_sparse_step", default=1)
    mlp_only = set(r.int_list("mlp_only_layers", default=[]))
    layers = spec["layers"]
    spec.update(
        experts=experts, top_k=r.int("num_experts_per_tok", default=4),
        expert_ffn=r.int("moe_intermediate_size"),
        shared_experts=1, shared_expert_ffn=r.int("shared_expert_intermediate_size"),
        shared_expert_gate=True,
        # transformers: block i is sparse when it is not MLP-only and (i + 1) % step == 0
        dense_layers=tuple(i for i in range(layers) if i in mlp_only or (i + 1) % step))
    return spec


def _deepseek(r: _Reader, *, shared_default: int, first_dense_default: int,
              top_k_default: int | None, q_lora_default: int, v_head_default: int) -> dict[str, Any]:
    heads = r.int("num_attention_heads")
    attention_bias = r.bool("attention_bias", default=False)
    mla = MlaSpec(q_lora_rank=r.int("q_lora_rank", default=q_lora_default, null=True),
                  kv_lora_rank=r.int("kv_lora_rank", default=512),
                  qk_nope_head_dim=r.int("qk_nope_head_dim", default=128),
                  qk_rope_head_dim=r.int("qk_rope_head_dim", default=64, minimum=0),
                  v_head_dim=r.int("v_head_dim", default=v_head_default))
    layers = r.int("num_hidden_layers")
    shared = r.int("n_shared_experts", default=shared_default, minimum=0)
    expert_ffn = r.int("moe_intermediate_size")
    first_dense = r.int("first_k_dense_replace", default=first_dense_default, minimum=0)
    top_k = r.int("num_experts_per_tok", default=_REQUIRED if top_k_default is None else top_k_default)
    spec: dict[str, Any] = dict(
        layers=layers, hidden=r.int("hidden_size"), heads=heads,
        kv_heads=heads, ffn=r.int("intermediate_size"), vocab=r.int("vocab_size"),
        mlp="swiglu", norm="rmsnorm", bias=False, mla=mla,
        qkv_bias=attention_bias, out_bias=attention_bias,
        mlp_bias=r.bool("mlp_bias", default=False) if r.model_type == "deepseek_v2" else False,
        tie_embeddings=r.bool("tie_word_embeddings", default=False),
        experts=r.int("n_routed_experts"), top_k=top_k, expert_ffn=expert_ffn,
        # transformers builds the shared experts as one MLP of n_shared * moe_intermediate_size
        shared_experts=shared, shared_expert_ffn=expert_ffn if shared else None,
        dense_layers=tuple(range(min(first_dense, layers))))
    return spec


def _deepseek_v2(r: _Reader) -> dict[str, Any]:
    return _deepseek(r, shared_default=2, first_dense_default=0, top_k_default=None,
                     q_lora_default=1536, v_head_default=128)


def _deepseek_v3(r: _Reader) -> dict[str, Any]:
    return _deepseek(r, shared_default=1, first_dense_default=3, top_k_default=8,
                     q_lora_default=1536, v_head_default=128)


def _qwen3(r: _Reader) -> dict[str, Any]:
    # Qwen2's block without q/k/v biases, with an RMSNorm per head on the queries and keys
    spec = _llama_like(r, kv_default=32, head_dim_default=128, tie_default=False, mlp_bias=None)
    return {**spec, "qk_norm": "head"}


def _qwen3_moe(r: _Reader) -> dict[str, Any]:
    spec = _llama_like(r, kv_default=4, head_dim_default=None, tie_default=False, mlp_bias=None)
    spec["qk_norm"] = "head"
    experts = r.int("num_experts", minimum=0, default=128)
    if experts == 0:
        return spec
    step = r.int("decoder_sparse_step", default=1)
    mlp_only = set(r.int_list("mlp_only_layers", default=[]))
    spec.update(experts=experts, top_k=r.int("num_experts_per_tok", default=8),
                expert_ffn=r.int("moe_intermediate_size", default=768),
                # as Qwen2-MoE: block i is sparse unless MLP-only or (i + 1) % step
                dense_layers=tuple(i for i in range(spec["layers"]) if i in mlp_only or (i + 1) % step))
    return spec


def _olmo2(r: _Reader) -> dict[str, Any]:
    # norms after attention and after the MLP (two a block), RMSNorm over the whole q and k
    spec = _llama_like(r, kv_default=None, head_dim_default=None, tie_default=False, mlp_bias=None)
    return {**spec, "qk_norm": "full"}


def _gemma3_text(r: _Reader) -> dict[str, Any]:
    # Gemma 2's four norms a block, plus an RMSNorm per head on the queries and keys
    spec = _llama_like(r, kv_default=4, head_dim_default=256, tie_default=True, mlp_bias=None, norms=4)
    return {**spec, "qk_norm": "head"}


def _cohere(r: _Reader) -> dict[str, Any]:
    # attention and MLP in parallel behind one norm; Cohere's LayerNorm has a weight and no
    # bias (an RMSNorm's parameters); use_qk_norm adds norms over the whole q and k widths
    spec = _llama_like(r, kv_default=None, head_dim_default=None, tie_default=True, mlp_bias=None, norms=1)
    if r.bool("use_qk_norm", default=False):
        spec["qk_norm"] = "full"
    return spec


def _starcoder2(r: _Reader) -> dict[str, Any]:
    # LayerNorm, a plain GELU MLP, grouped-query attention, biases everywhere when use_bias
    bias = r.bool("use_bias", default=True)
    return dict(layers=r.int("num_hidden_layers"), hidden=r.int("hidden_size"),
                heads=r.int("num_attention_heads"), kv_heads=r.int("num_key_value_heads", default=2),
                ffn=r.int("intermediate_size"), vocab=r.int("vocab_size"), mlp="gelu", norm="layernorm",
                bias=bias, tie_embeddings=r.bool("tie_word_embeddings", default=True))


def _gpt_bigcode(r: _Reader) -> dict[str, Any]:
    # GPT-2 with one shared key/value head (multi_query, the default)
    spec = _gpt2(r)
    if r.bool("multi_query", default=True):
        spec["kv_heads"] = 1
    return spec


def _phimoe(r: _Reader) -> dict[str, Any]:
    # Mixtral's experts behind LayerNorms (weight and bias); biases on attention and the head
    # as the file says
    spec = _llama_like(r, kv_default=8, head_dim_default=None, tie_default=False,
                       attention_bias=False, mlp_bias=None)
    spec.update(norm="layernorm", experts=r.int("num_local_experts", default=16),
                top_k=r.int("num_experts_per_tok", default=2),
                head_bias=r.bool("lm_head_bias", default=False))
    return spec


READERS: Mapping[str, Callable[[_Reader], dict[str, Any]]] = {
    "qwen3": _qwen3, "qwen3_moe": _qwen3_moe, "olmo2": _olmo2, "gemma3_text": _gemma3_text,
    "cohere": _cohere, "starcoder2": _starcoder2, "gpt_bigcode": _gpt_bigcode, "phimoe": _phimoe,
    "llama": _llama, "mistral": _mistral, "qwen2": _qwen2, "gemma": _gemma, "gemma2": _gemma2,
    "phi3": _phi3, "gpt2": _gpt2, "gpt_neox": _gpt_neox, "falcon": _falcon,
    "mixtral": _mixtral, "qwen2_moe": _qwen2_moe, "deepseek_v2": _deepseek_v2, "deepseek_v3": _deepseek_v3,
}
SUPPORTED_MODEL_TYPES = tuple(sorted(READERS))


# Models whose blocks are (or include) a recurrent scan that transformers' reference (what it runs
# without the CUDA kernels) writes as a loop over the tokens: their requests grow in number with the
# sequence, no card holds them, and `zlayout learn` cannot trace them in any time (Mamba-130M's loop:
# over 5 minutes at full CPU, not done). zamba2 shares one block's weights between layers whose backward
# asks for different memory. Mamba-2 and its hybrids are learned (core.card.STATE_SPACE_MODEL_TYPES),
# and Jamba, Mamba and Falcon-Mamba with mamba-ssm's kernels (core.card.MAMBA_KERNEL_MODEL_TYPES);
# Zamba shares one attention block's weights between layers, which no card is checked against.
RECURRENT_TYPES = frozenset({"rwkv", "recurrent_gemma", "xlstm", "zamba", "zamba2"})


def recurrent_refusal(model_type: str) -> str:
    """One line for a model_type in RECURRENT_TYPES (plan and learn say the same)."""
    return (f"model_type {model_type!r} has state-space or recurrent blocks, not only attention: zlayout plans "
            "transformer decoders, Mamba-2 and its hybrids, Mamba, Falcon-Mamba and Jamba, and cannot learn a per-token "
            "scan or a block shared between layers; plan a transformer of "
            "its size with --layers --hidden --heads --vocab")


def model_from_config(config: Mapping[str, Any], *, where: str = CONFIG_FILE, name: str | None = None,
                      source: str | None = None, card: Any = None) -> ModelSpec:
    """The model a parsed config.json describes. `where` names it in errors, `source` is
    recorded as the spec's `hf_config`; `card`: the card a family without a hand reader is read
    through, where the caller holds it (else it is looked up)."""
    if not isinstance(config, Mapping):
        raise HfConfigError(f"{where}: a config.json holds one JSON object, not {type(config).__name__}")
    model_type = config.get("model_type")
    if model_type is None:
        raise HfConfigError(f"{where}: no 'model_type' key (is this a transformers config.json?)")
    if not isinstance(model_type, str):
        raise HfConfigError(f"{where}: 'model_type' must be a string like \"llama\", not {json.dumps(model_type)[:40]}")
    if model_type in RECURRENT_TYPES:
        raise HfConfigError(f"{where}: {recurrent_refusal(model_type)}")
    if model_type not in READERS and model_type in MULTIMODAL_TEXT_TYPES:
        return _multimodal(config, model_type, where=where, name=name, source=source)
    if model_type not in READERS and config.get("auto_map"):
        raise HfConfigError(f"{where}: model_type {model_type!r} is built by the model's own code (auto_map), "
                            "which zlayout does not run; enter the architecture with --layers --hidden "
                            "--heads --vocab")
    if model_type not in READERS:
        return _generic(config, model_type, where=where, name=name, source=source, card=card)
    spec = READERS[model_type](_Reader(config, where, model_type))
    spec.update(name=name or _config_name(config) or model_type, hf_model_type=model_type, hf_config=source)
    return _validated(spec, where)


def _validated(spec: dict[str, Any], where: str) -> ModelSpec:
    try:
        return ModelSpec(**spec)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        message = err["msg"].removeprefix("Value error, ")
        raise HfConfigError(f"{where}: {field + ': ' if field else ''}{message}") from None


# --------------------------------------------------------------------------- any other model_type


# The layer count of a model_type without a hand reader: the first of these keys its config holds.
# An encoder-decoder family's ForCausalLM is its decoder alone, and its config names no
# num_hidden_layers: BART's and Whisper's decoder_layers, ProphetNet's num_decoder_layers.
GENERIC_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers",
                      "num_decoder_layers")


# Shape keys a config nests under a part's own dict (DBRX: its attention's KV heads, its MoE's width,
# experts and top-k), read as if at the top; only these (DBRX's ffn_config also holds a `hidden_size`
# of its class default, not the model's `d_model`).
NESTED_SHAPE_KEYS = {"attn_config": ("kv_n_heads",),
                     "ffn_config": ("ffn_hidden_size", "moe_num_experts", "moe_top_k", "ffn_act_fn")}


def _generic_shape(r: _Reader) -> dict[str, Any]:
    """The shape the keys most config classes share give (the first key present of each list),
    for a model_type without a hand reader. Only the plan's header, its MoE figures (experts,
    top-k) and the hand fallbacks read it: the parameter count and every block's requests come
    from the model card. A model without attention keys (a state-space model) reads as one
    head over the whole width."""
    hidden = r.int("hidden_size", "n_embd", "d_model", "model_dim", "emb_dim")  # emb_dim: XLM
    # an encoder-decoder family's ForCausalLM class is its decoder alone (Whisper's, BART's, TrOCR's)
    heads = r.int("num_attention_heads", "n_head", "n_heads", "num_heads", "decoder_attention_heads",
                  "num_decoder_attention_heads", default=1)
    layers = r.int(*GENERIC_LAYER_KEYS, default=None)
    # Nemotron-H's config class reads its depth from its block pattern (a list, or the letters of
    # the older `hybrid_override_pattern`, "M-M*-...": one block each)
    pattern = r.config.get("layers_block_type", r.config.get("hybrid_override_pattern"))
    if layers is None and isinstance(pattern, (list, str)) and 0 < len(pattern) <= 100_000 \
            and all(isinstance(k, str) for k in pattern):
        layers = len(pattern)
    spec: dict[str, Any] = dict(
        layers=r.int(*GENERIC_LAYER_KEYS) if layers is None else layers, hidden=hidden,
        heads=heads,
        kv_heads=r.int("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num", "kv_n_heads",
                       default=heads),
        ffn=r.widest("intermediate_size", "ffn_hidden_size", "n_inner", "d_ff", "decoder_ffn_dim", default=4 * hidden),
        vocab=r.int("vocab_size", "padded_vocab_size", "n_vocab"),
        tie_embeddings=r.bool("tie_word_embeddings", default=False), bias=False)
    act = r.config.get("hidden_act", r.config.get("activation_function"))
    if act is None and isinstance(r.config.get("ffn_config"), Mapping):
        # DBRX: ffn_config's ffn_act_fn, {"name": "silu"} where it names none (transformers 5.24
        # dbrx/configuration_dbrx.py DbrxFFNConfig's default; its experts are GLUs: w1, v1, w2)
        named = r.config.get("ffn_act_fn")
        act = named.get("name", "silu") if isinstance(named, Mapping) else "silu"
    spec["mlp"] = "swiglu" if act in ("silu", "swish", "swiglu") else "gelu"
    spec["norm"] = "layernorm" if any(k in r.config for k in ("layer_norm_eps", "layer_norm_epsilon")) \
        and "rms_norm_eps" not in r.config else "rmsnorm"
    head_dim = r.int("head_dim", default=None)
    if head_dim is not None and head_dim * heads != hidden:
        spec["head_size"] = head_dim
    elif hidden % heads:
        spec["head_size"] = max(1, hidden // heads)
    if spec["heads"] % spec["kv_heads"]:
        spec["kv_heads"] = heads
    experts = r.int("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts",
                    default=0, minimum=0)
    if r.config.get("is_moe") is False:  # Doge's defaults name 16,384 experts its dense model never builds
        experts = 0
    if experts:
        top_k = r.int("num_experts_per_tok", "moe_top_k", "num_selected_experts", default=min(2, experts))
        spec.update(experts=experts, top_k=min(top_k, experts),
                    expert_ffn=r.int("moe_intermediate_size", "expert_intermediate_size",
                                     default=spec["ffn"]),
                    shared_experts=r.int("n_shared_experts", "num_shared_experts", default=0, minimum=0))
        first_dense = r.int("first_k_dense_replace", default=0, minimum=0)
        mlp_only = {i for i in r.int_list("mlp_only_layers", default=[]) if 0 <= i < spec["layers"]}
        types = r.config.get("mlp_layer_types")  # beam's and axk's: "dense" or "sparse" per block
        if isinstance(types, list) and len(types) == spec["layers"]:
            mlp_only |= {i for i, kind in enumerate(types) if kind == "dense"}
        if "expert_layer_period" in r.config:  # Jamba's experts: every period-th block from the offset
            period = r.int("expert_layer_period")
            offset = r.int("expert_layer_offset", default=1, minimum=0)
            mlp_only |= {i for i in range(spec["layers"]) if i % period != offset}
        spec["dense_layers"] = tuple(sorted(mlp_only | set(range(min(first_dense, spec["layers"])))))
    return spec


def _generic(config: Mapping[str, Any], model_type: str, *, where: str, name: str | None,
             source: str | None, card: Any = None) -> ModelSpec:
    """A model_type without a hand reader: its shape from the common keys (a nested
    text_config's first: a multimodal model's language model), its exact parameter count from
    the model card (`extra_params`: the card's count less the shape's, of either sign)."""
    from zlayout import cards as card_store

    card = card if card is not None else card_store.find_card(config)
    if card is None:
        raise HfConfigError(f"{where}: {_learn_first(model_type, where)}")
    nested = config.get("text_config")
    keys = {**config, **nested} if isinstance(nested, Mapping) else dict(config)
    paths: dict[str, str] = {}
    for part, names in NESTED_SHAPE_KEYS.items():
        inner = keys.get(part)
        if isinstance(inner, Mapping):
            found = {key: inner[key] for key in names if key in inner and key not in keys}
            keys.update(found)
            paths.update({key: f"{part}.{key}" for key in found})
    spec = _generic_shape(_Reader(keys, where, model_type, paths))
    spec.update(name=name or _config_name(config) or model_type, hf_model_type=model_type, hf_config=source)
    shape = _validated(spec, where)
    card = _at_depth(card, shape.layers, where)
    return shape.model_copy(update={"extra_params": card.params - shape.params, "card": card})


def _at_depth(card, layers: int, where: str):
    """The card found for this config (cards.find_card: perhaps learned at another depth) at the
    model's depth; HfConfigError when it cannot be resized."""
    from zlayout.core.card import CardError

    try:
        return card.at_layers(layers)
    except CardError as exc:
        raise HfConfigError(f"{where}: {exc}") from None


def _learn_first(model_type: str, where: str) -> str:
    """What to do for a model_type zlayout reads only through its card, in one line: the
    `zlayout learn` command when torch and transformers are installed (found, not imported:
    the planner stays torch-free), else how to install them."""
    import importlib.util
    import shlex

    command = f"zlayout learn --hf-config {shlex.quote(where)}"
    said = f"model_type {model_type!r} is planned from its model card (zlayout has no hand reader for it)"
    if all(importlib.util.find_spec(module) is not None for module in ("torch", "transformers")):
        return f"{said}: learn it first with `{command}`, then plan again"
    from zlayout.install import pip_install_command

    return (f"{said}, which `{command}` learns from the transformers class; that needs torch and "
            f"transformers: {pip_install_command('learn')}")


# Multimodal model types whose AutoModelForCausalLM class, the one `zlayout learn` and verify build
# (causal LMs first), is the language model alone: no vision tower (transformers 5.24's
# MODEL_FOR_CAUSAL_LM_MAPPING_NAMES against MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES; a test
# keeps the two in step with the installed release).
LANGUAGE_MODEL_ONLY = {"dots3_note": "Dots3NoteForCausalLM", "emu3": "Emu3ForCausalLM",
                       "llama4": "Llama4ForCausalLM", "mllama": "MllamaForCausalLM",
                       "qwen3_5": "Qwen3_5ForCausalLM", "qwen3_5_moe": "Qwen3_5MoeForCausalLM",
                       "qwen4_exp": "Qwen4ExpForCausalLM"}


# the keys transformers' configs give the attention's dropout under (GPT-2 and its descendants, most
# decoders, BERT-style ones)
ATTENTION_DROPOUT_KEYS = ("attn_pdrop", "attention_dropout", "attention_probs_dropout_prob")


def attention_dropout(config: Mapping[str, Any]) -> float:
    """The attention dropout a config.json asks for (0.0: none), as a number; anything else is 0."""
    values = [config.get(key) for key in ATTENTION_DROPOUT_KEYS]
    return max((float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)
                and 0 < v < 1), default=0.0)


def language_model_only_note(config: Mapping[str, Any], where: str) -> str | None:
    """A line when the config.json is a multimodal model's (its architectures name another class)
    but the class zlayout plans and verifies is its language model alone; None otherwise."""
    built = LANGUAGE_MODEL_ONLY.get(config.get("model_type"))  # type: ignore[arg-type]
    named = config.get("architectures")
    named = [a for a in named if isinstance(a, str)] if isinstance(named, list) else []
    if built is None or not named or built in named:
        return None
    return (f"{where} names {named[0]}, with its vision tower; zlayout plans and verify trains {built}, "
            f"the language model transformers' AutoModelForCausalLM builds from it: a run that also "
            "trains the vision tower holds more than this plan")


# Multimodal types the image-text-to-text auto class builds, and the reader of their language
# model when its text_config names none (Qwen2.5-VL's files are flat: the text keys at the top)
MULTIMODAL_TEXT_TYPES = {"llava": "llama", "qwen2_vl": "qwen2", "qwen2_5_vl": "qwen2"}
_TEXT_TYPE_READERS = {"qwen2_vl_text": "qwen2", "qwen2_5_vl_text": "qwen2"}
MULTIMODAL_TEXT_DEFAULTS = {"llama": {"hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
                                      "num_hidden_layers": 32, "vocab_size": 32000}}


def _multimodal(config: Mapping[str, Any], model_type: str, *, where: str, name: str | None,
                source: str | None) -> ModelSpec:
    """The whole model the image-text-to-text class builds: its language model read as its
    type, plus the vision tower and projector, whose parameters only the model card counts
    (`extra_params`: the card's count less the language model's)."""
    nested = config.get("text_config")
    text = dict(nested) if isinstance(nested, Mapping) else {k: v for k, v in config.items() if k != "vision_config"}
    text_type = (text.get("model_type") if isinstance(nested, Mapping) else None) or MULTIMODAL_TEXT_TYPES[model_type]
    text_type = _TEXT_TYPE_READERS.get(text_type, text_type)
    if text_type not in READERS:
        raise HfConfigError(f"{where}: the language model of this {model_type} is {text_type!r}, "
                            f"which is not supported; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    if "tie_word_embeddings" in config:
        text["tie_word_embeddings"] = config["tie_word_embeddings"]
    # LLaVA's files leave the language model's shape to LlamaConfig's defaults (Vicuna-7B's)
    text = {**MULTIMODAL_TEXT_DEFAULTS.get(text_type, {}), **text} if isinstance(nested, Mapping) else text
    language = model_from_config({**text, "model_type": text_type}, where=where, name=name, source=source)
    from zlayout import cards as card_store

    card = card_store.find_card(config)
    if card is None:
        raise HfConfigError(f"{where}: {model_type} is multimodal and only its model card counts the vision "
                            f"tower: run zlayout learn --hf-config {where} first (its language model alone "
                            f"is {language.params:,} parameters)")
    card = _at_depth(card, language.layers, where)
    if card.params < language.params:
        raise HfConfigError(f"{where}: its model card ({card.source}) counts {card.params:,} parameters, fewer "
                            f"than its language model's {language.params:,}; learn it again with zlayout learn --force")
    return language.model_copy(update={"extra_params": card.params - language.params, "hf_model_type": model_type,
                                       "card": card})


def _config_name(config: Mapping[str, Any]) -> str | None:
    """`_name_or_path`'s last part ("meta-llama/Meta-Llama-3-8B" -> "Meta-Llama-3-8B"), as printable
    text on one line: a downloaded config.json is not trusted to keep escape codes and newlines
    out of a terminal, a launch script's comment or a log (each is replaced by a space)."""
    value = config.get("_name_or_path")
    if isinstance(value, str) and value.strip():
        last = value.strip().rstrip("/").split("/")[-1]
        return " ".join("".join(c if c.isprintable() else " " for c in last).split())[:100] or None
    return None


def _cache_repo_name(path: Path) -> str | None:
    """'ORG/NAME' for a config.json in the Hugging Face cache's layout,
    `.../models--ORG--NAME/snapshots/HASH/config.json` (a symlink into `../../blobs/`: its
    target is named by a hash, so the path is read as given, never resolved); else None."""
    parts = Path(os.path.abspath(path)).parts
    if len(parts) < 4 or parts[-3] != "snapshots" or not parts[-4].startswith("models--"):
        return None
    repo = parts[-4][len("models--"):].split("--")
    return "/".join(repo) if all(repo) else None


def model_name(path: Path, config: Any) -> str | None:
    """The name a config.json's model goes by: the Hugging Face cache's ORG/NAME, else
    `_name_or_path`'s last part, else the folder holding config.json (the file's stem for
    another name). The path is made absolute without following links."""
    cached = _cache_repo_name(path)
    if cached:
        return cached
    named = _config_name(config) if isinstance(config, Mapping) else None
    absolute = Path(os.path.abspath(path))
    return named or (absolute.parent.name if absolute.name == CONFIG_FILE else absolute.stem) or None


def config_path(path: str | os.PathLike[str]) -> Path:
    """The config.json a path means: the file itself, or DIR/config.json."""
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / CONFIG_FILE
        if not p.is_file():
            raise HfConfigError(f"{path}: a directory without a {CONFIG_FILE}; "
                                "give the model's config.json or the directory holding it")
    elif not p.exists():
        raise HfConfigError(f"{path}: no such file; give the model's config.json or the directory holding it")
    return p


def read_config(path: str | os.PathLike[str]) -> tuple[Any, Path]:
    """The parsed config.json a path means (the file, or DIR/config.json) and its path;
    HfConfigError (one line naming the file) when it is not one."""
    p = config_path(path)
    try:
        data = read_small_file(p, MAX_CONFIG_BYTES)
    except TooLarge:
        raise HfConfigError(f"{p}: larger than {MAX_CONFIG_BYTES // 2**20} MiB, not a config.json") from None
    except NotARegularFile:
        raise HfConfigError(f"{p}: not a file; give the model's config.json") from None
    except OSError as exc:
        raise HfConfigError(f"{p}: cannot read: {exc.strerror}") from None
    try:
        text = data.decode("utf-8")
        # json.loads recurses per level: 100,000 `[` is a RecursionError. The profiles' and
        # presets' guard refuses it first, with the same one line.
        tomlsafe.check_toml_limits(text, str(p), max_chars=None)
        config = json.loads(text)
    except UnicodeDecodeError:
        raise HfConfigError(f"{p}: not a text file; give the model's config.json") from None
    except tomlsafe.TomlLimitError as exc:
        raise HfConfigError(f"{exc}: not a model's config.json") from None
    except json.JSONDecodeError as exc:
        raise HfConfigError(f"{p}: not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}") from None
    except ValueError as exc:  # an integer of more than 4300 digits (Python's int-string limit)
        raise HfConfigError(f"{p}: not a model's config.json: a number in it is too long "
                            f"({str(exc).split(':')[0].lower()})") from None
    return config, p


def load(path: str | os.PathLike[str], cards: bool = True) -> ModelSpec:
    """Read a model's config.json (or a directory holding one) into a `ModelSpec`.

    The name is `model_name`'s (ORG/NAME in the Hugging Face cache, else `_name_or_path`'s
    last part, else the folder's name); the spec records the file as given, made absolute
    (`hf_config`), and its `model_type`, and carries the config's model card when one was
    learned (`cards`: look it up; a model_type without a hand reader takes its card either way,
    its only source of a parameter count). Raises `HfConfigError` (a ValueError) with one line
    naming the file and what is wrong.
    """
    config, p = read_config(path)
    # the path as given, made absolute: resolving a cache's symlink recorded blobs/HASH
    model = model_from_config(config, where=str(p), name=model_name(p, config), source=os.path.abspath(p))
    return with_card(model, config, str(p)) if cards else model


def with_card(model: ModelSpec, config: Mapping[str, Any], where: str) -> ModelSpec:
    """`model` with the model card learned from this config (`zlayout learn`; the cache,
    then presets/cards/), when there is one. A card whose parameter count is not the model's
    is not this model's (HfConfigError: the two must agree, exactly)."""
    from zlayout import cards as card_store

    try:
        card = card_store.find_card(config)
    except card_store.CardError as exc:
        raise HfConfigError(f"{where}: {exc}") from None
    if card is None:
        return model
    if card.key == card_store.config_key(config) and len(card.layer_kinds) != model.layers:
        # learned from this very config, yet another depth: transformers builds the model otherwise
        # than its keys read (Dory's config class halves a layer_types count that lists "mlp"
        # entries, and runs its middle blocks in loops; HRM cycles its stacks). Resizing would
        # plan another model (Dory's 3.98B parameters planned as 7.28B)
        raise HfConfigError(f"{where}: the config names {model.layers} layers, but transformers builds "
                            f"{len(card.layer_kinds)} blocks from it ({card.source}): its blocks are not one run "
                            "of numbered layers (blocks run more than once, or a config class that reads its own "
                            "keys otherwise), which zlayout cannot plan from its card")
    try:
        card = card.at_layers(model.layers)  # a card found for this config at another depth
    except card_store.CardError:
        return model
    if card.params != model.params:
        raise HfConfigError(f"{where}: its model card ({card.source}) counts {card.params:,} parameters, "
                            f"the config reads as {model.params:,}; learn it again with zlayout learn --force")
    tie, extra = model.tied_as_built(card)  # model_copy validates nothing: as ModelSpec's validator does
    return model.model_copy(update={"card": card, "tie_embeddings": tie, "extra_params": extra})


# --------------------------------------------------------------------------- spec -> config.json


def config_to_build(user_config: Mapping[str, Any], model: ModelSpec) -> dict[str, Any]:
    """The config.json verify's worker builds: the user's own, as the card was learned from it
    (activation function, dropouts, rope, softcapping, token ids: all that the plan's shape does
    not name). Where flags beside `--hf-config` changed the shape (`--layers`), the plan's shape
    (`to_hf_config`) is laid over it, so the model that trains is the model planned."""
    config = {k: v for k, v in user_config.items() if not k.startswith("_")}
    own = model_from_config(config, name=model.name, source=model.hf_config)
    # The padding id stays as given: XLM's forward reads it (`pad_index`, its alias, counts each row's
    # tokens). It once was dropped: transformers zeroed its embedding row by indexing a weight
    # zero.Init had partitioned to nothing (command-r's pad_token_id 0 at ZeRO-3, 2026-12-02); the
    # worker now builds under ZeRO-3 without transformers' initialiser and initialises the gathered
    # weights (worker.initialise_partitioned_hf_weights), the padding row included.
    if own.model_copy(update={"card": model.card}) == model:
        return config
    if model.card is not None and model.hf_model_type not in READERS:
        return _card_family_at_depth(config, model)
    was = _layer_count(config)
    shape = to_hf_config(model)
    config.update(shape)
    layers = shape.get("num_hidden_layers") or shape.get("n_layer")
    if layers:
        _layer_kinds_at_depth(config, layers, was)
    return config


def config_at_depth(config: Mapping[str, Any], layers: int) -> dict[str, Any] | None:
    """A copy of `config` at `layers` blocks: its layer count (at the top, or a multimodal model's
    text_config's) and its per-layer lists (`_layer_kinds_at_depth`); None where it names no count."""
    out = dict(config)
    inner = out.get("text_config") if _layer_count(out) is None else None
    target = dict(inner) if isinstance(inner, Mapping) else out
    key = next((k for k in GENERIC_LAYER_KEYS if isinstance(target.get(k), int)), None)
    if key is None:
        return None
    was, target[key] = target[key], layers
    _layer_kinds_at_depth(target, layers, was)
    if target is not out:
        out["text_config"] = target
    return out


def _layer_count(config: Mapping[str, Any]) -> int | None:
    key = next((k for k in GENERIC_LAYER_KEYS if isinstance(config.get(k), int)), None)
    return None if key is None else config[key]


def per_block_flags(value: Any, blocks: int) -> bool:
    """A list under a config key of the model's own, one entry a block, that tells blocks apart:
    names (GPT-Neo's `attention_layers`, global or local) or on/off flags (SmolLM3's and Llama-4's
    `no_rope_layers`: a block without rotary embeddings asks for less). Lists of block indices
    (Llama-4's `moe_layers`, LFM2's `full_attn_idxs`) are not flags: their entries run past 1.
    The learner makes such blocks kinds apart; verify's `--layers` cuts or repeats the list."""
    if not isinstance(value, (list, tuple)) or len(value) != blocks or len(set(map(repr, value))) < 2:
        return False
    return all(isinstance(v, str) for v in value) or all(v in (0, 1) and isinstance(v, int) for v in value)


def _layer_kinds_at_depth(config: dict[str, Any], layers: int, was: int | None = None) -> None:
    """The config's per-layer lists follow the layer count, so that transformers' config class
    accepts the depth (it checks their lengths) and builds the blocks the plan's card keeps
    (`Card.at_layers`: the first `layers`, or the pattern repeated): `layer_types` (Gemma-3's
    sliding/full pattern), and every list of one name, flag or number per layer of the `was`
    layers (`mlp_layer_types`, SmolLM3's `no_rope_layers`, Laguna's `num_attention_heads_per_layer`;
    a list of every layer's index, Llama-4's `moe_layers`, stays every index); GPT-Neo's
    `attention_types` (pairs of a pattern and its repeats, which its config class expands)."""
    def resized(pattern: list) -> list:
        if pattern == list(range(len(pattern))):
            return list(range(layers))
        return [pattern[i % len(pattern)] for i in range(layers)]

    pattern = config.get("layer_types")
    if isinstance(pattern, list) and pattern and len(pattern) != layers:
        config["layer_types"] = resized(pattern)
    if was is not None and was != layers:
        for key, value in list(config.items()):
            if key != "layer_types" and _per_layer_list(key, value, was):
                config[key] = resized(list(value))
    overrides = config.get("per_layer_config")
    if was is not None and was != layers and isinstance(overrides, dict) and overrides \
            and all(isinstance(k, str) and k.isdigit() for k in overrides):
        # Gemma-4's per-layer overrides, keyed by layer index ("02": its full-attention blocks' head
        # size): transformers refuses an index past the depth; a deeper model repeats them as the lists
        width = len(next(iter(overrides)))
        by_index = {int(k): v for k, v in overrides.items()}
        config["per_layer_config"] = {f"{i:0{width}d}": by_index[i % was] for i in range(layers)
                                      if i % was in by_index}
    pairs = config.get("attention_types") if config.get("model_type") == "gpt_neo" else None
    if isinstance(pairs, list) and all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], list)
                                       and isinstance(p[1], int) and not isinstance(p[1], bool) for p in pairs) \
            and sum(len(names) * repeats for names, repeats in pairs) == was != layers:
        # expanded only when it names the file's layers, which the reader has bounded (a hostile
        # repeat count would otherwise build a list of that many names)
        flat = [name for names, repeats in pairs for _ in range(repeats) for name in names]
        config["attention_types"] = [[resized(flat), 1]]


def _per_layer_list(key: str, value: Any, layers: int) -> bool:
    """A list of one name, flag or number for each of `layers` layers (token ids are not)."""
    return (isinstance(value, list) and len(value) == layers and not key.endswith(("token_id", "token_ids"))
            and key != "architectures" and all(isinstance(v, (str, int, float)) for v in value))


def _card_family_at_depth(config: dict[str, Any], model: ModelSpec) -> dict[str, Any]:
    """The user's config.json at the plan's depth, for a family read only through its card
    (no hand reader writes its shape): the layer count is the one shape flag a card answers
    for (`Card.at_layers`), so its key is the one laid over the config. The rebuilt model must
    count the plan's parameters, or the run would not be the layout planned."""
    key = next((k for k in GENERIC_LAYER_KEYS if k in config), None)
    was = _layer_count(config)
    if key is None:  # a multimodal config: its layers are its text_config's, its card the whole model's
        raise HfConfigError(f"{model.name}: {model.hf_model_type} is read through its model card and its "
                            "config.json names no layer count to change; verify it as that file gives it")
    config[key] = model.layers
    _layer_kinds_at_depth(config, model.layers, was)
    # the plan's card, resized: a depth shorter than the blocks' pattern (2 of Qwen3.5's 3 linear :
    # 1 full) lists kinds no by-depth key finds; `where`, the user's file, is what to learn again
    where = model.hf_config or model.name
    rebuilt = with_card(model_from_config(config, where=where, card=model.card), config, where)
    if rebuilt.layers != model.layers or rebuilt.params != model.params:
        raise HfConfigError(f"{model.name}: {model.hf_model_type} is read through its model card, which holds "
                            f"its config.json's shape and depth only; at {model.layers} layers that config "
                            f"builds {rebuilt.params:,} parameters, not the plan's {model.params:,}: verify "
                            "it as the file gives it, or with --layers alone")
    return config


def to_hf_config(model: ModelSpec) -> dict[str, Any]:
    """A config.json (as a dict) from which transformers builds `model` with exactly
    `model.params` parameters: for `--impl hf` verification of a preset or a hand-entered
    model (random weights, nothing downloaded).

    A model read from a config.json keeps its model_type; others become llama (SwiGLU,
    RMSNorm), qwen2 (q/k/v biases only), mixtral or qwen2_moe (MoE), gpt_neox or falcon
    (GELU, LayerNorm). Raises `HfConfigError` for a shape no supported class builds.
    """
    m = model
    qkv_bias, out_bias, mlp_bias = (m._biased(m.qkv_bias), m._biased(m.out_bias), m._biased(m.mlp_bias))
    model_type = m.hf_model_type or _hf_type_for(m, qkv_bias, out_bias, mlp_bias)
    # no padding id: a class's default one (Phi-3: 32000) may lie outside a small vocabulary
    base: dict[str, Any] = {"model_type": model_type, "vocab_size": m.vocab,
                            "tie_word_embeddings": m.tie_embeddings, "pad_token_id": None}
    llama_like = {"hidden_size": m.hidden, "num_hidden_layers": m.layers, "num_attention_heads": m.heads,
                  "num_key_value_heads": m.num_kv_heads, "intermediate_size": m.ffn_size,
                  "head_dim": m.head_dim}
    if model_type in ("llama", "mistral", "qwen2", "gemma", "gemma2", "phi3", "qwen3", "olmo2", "gemma3_text"):
        config = {**base, **llama_like, "attention_bias": qkv_bias, "mlp_bias": mlp_bias}
    elif model_type == "cohere":
        config = {**base, **llama_like, "attention_bias": qkv_bias, "use_qk_norm": m.qk_norm == "full"}
    elif model_type == "starcoder2":
        config = {**base, "hidden_size": m.hidden, "num_hidden_layers": m.layers, "num_attention_heads": m.heads,
                  "num_key_value_heads": m.num_kv_heads, "intermediate_size": m.ffn_size, "use_bias": m.bias}
    elif model_type == "gpt_bigcode":
        config = {**base, "n_embd": m.hidden, "n_layer": m.layers, "n_head": m.heads, "n_inner": m.ffn_size,
                  "n_positions": m.position_embeddings, "multi_query": m.num_kv_heads == 1}
    elif model_type == "phimoe":
        config = {**base, **llama_like, "intermediate_size": m.expert_ffn_size, "attention_bias": qkv_bias,
                  "num_local_experts": m.experts, "num_experts_per_tok": m.top_k, "lm_head_bias": m.head_bias}
    elif model_type == "qwen3_moe":
        config = {**base, **llama_like, "attention_bias": qkv_bias, "num_experts": m.experts,
                  "num_experts_per_tok": m.top_k, "moe_intermediate_size": m.expert_ffn_size,
                  "decoder_sparse_step": 1, "mlp_only_layers": list(m.dense_layers)}
    elif model_type == "gpt2":
        config = {**base, "n_embd": m.hidden, "n_layer": m.layers, "n_head": m.heads, "n_inner": m.ffn_size,
                  "n_positions": m.position_embeddings}
    elif model_type == "gpt_neox":
        config = {**base, "hidden_size": m.hidden, "num_hidden_layers": m.layers, "num_attention_heads": m.heads,
                  "intermediate_size": m.ffn_size, "attention_bias": qkv_bias}
    elif model_type == "falcon":
        config = {**base, "hidden_size": m.hidden, "num_hidden_layers": m.layers, "num_attention_heads": m.heads,
                  "num_kv_heads": m.num_kv_heads, "ffn_hidden_size": m.ffn_size, "bias": m.bias,
                  "new_decoder_architecture": True, "parallel_attn": True,
                  "num_ln_in_parallel_attn": m.norms_per_layer}
        if m.num_kv_heads == 1 and m.norms_per_layer == 1:  # the old multi-query layout (Falcon-7B)
            config.update(new_decoder_architecture=False, multi_query=True, num_ln_in_parallel_attn=None)
    elif model_type == "mixtral":
        config = {**base, **llama_like, "intermediate_size": m.expert_ffn_size,
                  "num_local_experts": m.experts, "num_experts_per_tok": m.top_k}
    elif model_type == "qwen2_moe":
        config = {**base, **llama_like, "qkv_bias": qkv_bias, "num_experts": m.experts,
                  "num_experts_per_tok": m.top_k, "moe_intermediate_size": m.expert_ffn_size,
                  "shared_expert_intermediate_size": m.shared_expert_ffn_size * m.shared_experts,
                  "decoder_sparse_step": 1, "mlp_only_layers": list(m.dense_layers)}
    elif model_type in ("deepseek_v2", "deepseek_v3") and m.mla is not None:
        a = m.mla
        config = {**base, "hidden_size": m.hidden, "num_hidden_layers": m.layers, "num_attention_heads": m.heads,
                  "num_key_value_heads": m.heads, "intermediate_size": m.ffn_size,
                  "attention_bias": qkv_bias, "q_lora_rank": a.q_lora_rank, "kv_lora_rank": a.kv_lora_rank,
                  "qk_nope_head_dim": a.qk_nope_head_dim, "qk_rope_head_dim": a.qk_rope_head_dim,
                  "v_head_dim": a.v_head_dim, "n_routed_experts": m.experts, "num_experts_per_tok": m.top_k,
                  "moe_intermediate_size": m.expert_ffn_size, "n_shared_experts": m.shared_experts,
                  "first_k_dense_replace": len(m.dense_layers)}
        if model_type == "deepseek_v2":
            config["mlp_bias"] = mlp_bias
    elif m.card is not None and model_type not in READERS:
        raise HfConfigError(f"{m.name}: {model_type} is read through its model card, which holds the shape of "
                            "its own config.json only: plan and verify it as that file gives it")
    else:
        raise HfConfigError(f"{m.name}: no transformers model class to build model_type {model_type!r} with")
    rebuilt = model_from_config(config, where=f"{m.name} as {model_type}")
    if rebuilt.params != m.params:
        raise HfConfigError(f"{m.name}: transformers' {model_type} would build {rebuilt.params:,} parameters, "
                            f"not {m.params:,}; plan it with the zlayout implementation instead")
    return config


def _hf_type_for(m: ModelSpec, qkv_bias: bool, out_bias: bool, mlp_bias: bool) -> str:
    """The transformers class that builds a hand-entered architecture."""
    if m.mla is not None:
        if (m.is_moe and m.mlp == "swiglu" and not m.shared_expert_gate and m.norms_per_layer == 2
                and m.shared_expert_ffn_size == m.expert_ffn_size
                and m.dense_layers == tuple(range(len(m.dense_layers)))):
            return "deepseek_v2"
        raise HfConfigError(f"{m.name}: latent attention is built by transformers only as DeepSeek's "
                            "MoE; give its config.json with --hf-config")
    if m.position_embeddings:
        raise HfConfigError(f"{m.name}: learned positions come only from a GPT-2 config.json; give --hf-config")
    if m.mlp == "swiglu" and m.norm == "rmsnorm" and m.norms_per_layer == 2:
        if m.is_moe:
            if (m.shared_experts == 0 and not m.dense_layers and not (qkv_bias or out_bias)
                    and m.expert_ffn_size == m.ffn_size):
                return "mixtral"
            if m.shared_experts == 1 and m.shared_expert_gate and not out_bias:
                return "qwen2_moe"
        elif qkv_bias and not out_bias and not mlp_bias:
            return "qwen2"
        elif qkv_bias == out_bias:
            return "llama"
    if m.mlp == "gelu" and m.norm == "layernorm" and not m.is_moe:
        if m.num_kv_heads == m.heads and qkv_bias == out_bias and mlp_bias and m.norms_per_layer == 2:
            return "gpt_neox"
        if qkv_bias == out_bias == mlp_bias and m.norms_per_layer in (1, 2):
            return "falcon"
    raise HfConfigError(f"{m.name}: no supported transformers class has this shape "
                        f"({m.mlp}, {m.norm}, biases q/k/v {qkv_bias} out {out_bias} MLP {mlp_bias}"
                        f"{', MoE' if m.is_moe else ''})")
