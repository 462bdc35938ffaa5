"""Validated inputs: the model, the hardware, the training setup, DeepSpeed's knobs, the layout.

Everything the planner computes is a pure function of a `PlanInput`. Every model here is
frozen, so a plan can be cached and compared, and every validator says what to type instead.
Sizes are bytes, bandwidths GB/s (1e9 bytes per second), rates FLOP/s.

Every number has a range users recognise (`BOUNDS`), checked here so the command line, the
app and preset files share it: inputs outside it would make the planner's searches run for
minutes or its figures overflow, and no real training run needs them. A bound's message
says the range and not the field, so each front end can put its own name in front.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import (BaseModel, ConfigDict, Field, ValidationInfo, field_serializer, field_validator,
                      model_serializer, model_validator)

from zlayout.messages import printable_name

Stage = Literal[0, 1, 2, 3]
Device = Literal["gpu", "cpu", "nvme"]
Precision = Literal["bf16", "fp16", "fp32"]
Checkpointing = Literal["none", "full"]
MlpKind = Literal["gelu", "swiglu"]
NormKind = Literal["layernorm", "rmsnorm"]
# Which training code runs the model: zlayout's own GPT (the verify worker's) or the Hugging
# Face `transformers` model class (AutoModelForCausalLM, sdpa attention, its own loss).
Implementation = Literal["zlayout", "hf"]
# PyTorch's CUDA caching allocator: the default (fixed segments) or expandable segments
# (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True).
AllocatorKind = Literal["default", "expandable"]
# The training loop around the engine: "deepspeed" keeps the model's outputs (the bf16 logits,
# tokens x vocab) until the next forward rebinds them, as DeepSpeed's examples write it
# (`outputs = engine(...); engine.backward(outputs.loss); engine.step()`); "trainer" drops them
# once the loss is taken, as HF Trainer's compute_loss does (what profiles verified before this
# field existed ran).
TrainingLoop = Literal["deepspeed", "trainer"]
# How the training script builds the model before deepspeed.initialize: "auto" is what the
# verify worker does (fp32 on the host; under deepspeed.zero.Init for ZeRO-3).
ModelInit = Literal["auto", "fp32-cpu", "bf16-gpu", "zero-init", "meta"]

GiB = 2**30


def gib_figure(n_bytes: int | float) -> str:
    """Bytes as a GiB figure, one rule for every surface (status line, table, detail, chart,
    what-if, the does-not-fit question, `zlayout show` and the runbook): three significant
    digits, whole GiB from 1000 (0.42, 9.87, 75.3, 1181). One layout's need read '1181.3' in
    one place and '1181' in another."""
    gib = n_bytes / GiB
    if abs(gib) < 10:
        return f"{gib:.2f}"
    if abs(gib) < 1000:
        return f"{gib:.1f}"
    return f"{gib:.0f}"
TiB = 2**40


class Bound:
    """An inclusive range [low, high]; `unit` and `scale` say how the message shows it.

    `fraction`: the value is a fraction of a whole (0.05 is 5%); a percentage typed in its
    place (5 for 5%) is refused with "did you mean 0.05 (5%)?" rather than a bare range."""

    def __init__(self, low: float, high: float, unit: str = "", scale: float = 1.0,
                 low_open: bool = False, fraction: bool = False) -> None:
        self.low, self.high, self.unit, self.scale, self.low_open = low, high, unit, scale, low_open
        self.fraction = fraction

    def _show(self, value: float) -> str:
        shown = value / self.scale
        text = f"{shown:,}" if float(shown).is_integer() else f"{shown:,.6g}"
        return text.removesuffix(".0") + (f" {self.unit}" if self.unit else "")

    def describe(self) -> str:
        low = f"more than {self._show(self.low)}" if self.low_open else self._show(self.low)
        return f"from {low} to {self._show(self.high)}"

    def check(self, value: Any) -> Any:
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"must be a finite number {self.describe()}")
        too_low = value <= self.low if self.low_open else value < self.low
        if too_low or value > self.high:
            raise ValueError(f"must be {self.describe()} (got {self._show(value)}){self.percent_hint(value)}")
        return value

    def percent_hint(self, value: float) -> str:
        """'; a fraction: did you mean 0.05 (5%)?' when `value` reads as a percentage of a
        fraction-valued range, else ''. A value below 1 is a fraction already (0.95 is 95%,
        never "did you mean 0.0095?"): it only says what it amounts to."""
        if not self.fraction or value <= self.high:
            return ""
        if value < 1:
            return f"; it is a fraction: {value:.6g} is {value * 100:.6g}%"
        as_fraction = value / 100
        low_ok = as_fraction > self.low if self.low_open else as_fraction >= self.low
        if not (low_ok and as_fraction <= self.high):
            return ""
        return f"; it is a fraction: did you mean {as_fraction:.6g} ({value:.6g}%)?"


# field name -> its range. Model shapes: beyond today's largest models by 10x or more.
BOUNDS: dict[str, Bound] = {
    # ModelSpec
    "layers": Bound(1, 1000),
    "hidden": Bound(1, 262_144),
    "heads": Bound(1, 4096),
    "kv_heads": Bound(1, 4096),
    "ffn": Bound(1, 1_048_576),
    "vocab": Bound(1, 10_000_000),
    "head_size": Bound(1, 65_536),
    "norms_per_layer": Bound(0, 8),
    "position_embeddings": Bound(0, 1_048_576),
    "experts": Bound(0, 65_536),
    "top_k": Bound(1, 65_536),
    "expert_ffn": Bound(1, 1_048_576),
    "shared_experts": Bound(0, 1024),
    "shared_expert_ffn": Bound(1, 1_048_576),
    # MlaSpec
    "q_lora_rank": Bound(1, 262_144),
    "kv_lora_rank": Bound(1, 262_144),
    "qk_nope_head_dim": Bound(1, 65_536),
    "qk_rope_head_dim": Bound(0, 65_536),
    "v_head_dim": Bound(1, 65_536),
    # TrainingSpec
    "seq": Bound(1, 1_048_576),
    "micro_batch": Bound(1, 4096),
    "grad_accum": Bound(1, 65_536),
    # HardwareSpec
    "gpus_per_node": Bound(1, 128),
    "nodes": Bound(1, 65_536),
    "host_ram_bytes": Bound(GiB, 1024 * TiB, "GiB", GiB),
    "host_mem_gbps": Bound(1, 100_000, "GB/s"),
    "nvme_bytes": Bound(0, 1024 * TiB, "GiB", GiB),
    "nvme_gbps": Bound(0.1, 1000, "GB/s"),
    "host_cores": Bound(1, 65_536),
    # GpuSpec
    "memory_bytes": Bound(GiB, 64 * TiB, "GiB", GiB),
    "peak_bf16_flops": Bound(1e9, 1e18, "FLOP/s"),
    "hbm_gbps": Bound(1, 1_000_000, "GB/s"),
    "pcie_gbps": Bound(0.1, 100_000, "GB/s"),
    "cuda_context_bytes": Bound(0, 64 * GiB, "GiB", GiB),
    "driver_reserved_bytes": Bound(0, 64 * GiB, "GiB", GiB),
    "host_cores_per_gpu": Bound(1, 4096),
    # LinkSpec
    "bandwidth_gbps": Bound(0.01, 1_000_000, "GB/s"),
    "latency_us": Bound(0, 1_000_000, "us"),
    "efficiency": Bound(0, 1, low_open=True, fraction=True),
    # ZeroKnobs (elements, as DeepSpeed counts them)
    "reduce_bucket_size": Bound(1, 10**12),
    "allgather_bucket_size": Bound(1, 10**12),
    "stage3_prefetch_bucket_size": Bound(0, 10**12),
    "stage3_max_live_parameters": Bound(0, 10**15),
    "stage3_max_reuse_distance": Bound(0, 10**15),
    "stage3_param_persistence_threshold": Bound(0, 10**15),
    "sub_group_size": Bound(1, 10**15),
    "gradient_clipping": Bound(0, 1e9),
    # PlanInput
    "headroom_fraction": Bound(0, 0.9, fraction=True),
    # StepTimeCalibration (zlayout calibrate keeps its factors within 0.2-5)
    "gpu_factor": Bound(0.01, 100),
    "overhead_factor": Bound(0.01, 100),
    "cpu_optimizer_factor": Bound(0.01, 100),
    "transfer_factor": Bound(0.01, 100),
}
# A model size given as a count (--params, the app's Size): the family tables span this.
PARAMS_BOUND = Bound(10**7, 2 * 10**13)


def check_model_size(params: float) -> float:
    """`params` if it is a model size zlayout can shape (10M to 20T), else ValueError."""
    if not math.isfinite(params) or not PARAMS_BOUND.low <= params <= PARAMS_BOUND.high:
        raise ValueError(f"a model size must be from 10M to 20T parameters (got {params:.3g})")
    return params


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    # on the fields BOUNDS names only: a no-op validator on every other field (half of them)
    # cost pydantic's model building and each validation a call for nothing
    @field_validator(*BOUNDS, mode="after", check_fields=False)
    @classmethod
    def _within_bounds(cls, value: Any, info: ValidationInfo) -> Any:
        bound = BOUNDS.get(info.field_name or "")
        return value if bound is None else bound.check(value)


class MlaSpec(Frozen):
    """DeepSeek's multi-head latent attention: queries and keys/values pass through low-rank
    projections (a latent, normed), and the keys carry a separate rotary part."""

    q_lora_rank: int | None = Field(default=None,
                                    description="query latent size; None: one full-rank q projection (V2-Lite)")
    kv_lora_rank: int = Field(description="key/value latent size")
    qk_nope_head_dim: int = Field(description="per-head query/key width without rotary")
    qk_rope_head_dim: int = Field(description="per-head rotary query/key width")
    v_head_dim: int = Field(description="per-head value width")

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


class ModelSpec(Frozen):
    """A decoder-only transformer, described by its architecture.

    Dense or mixture-of-experts: with `experts` > 0 every block but `dense_layers` replaces its
    MLP by a router and `experts` MLPs of `expert_ffn` (each token goes through `top_k` of
    them), plus `shared_experts` MLPs every token goes through. Parameter counts equal what
    Hugging Face transformers builds for the same config.json (tests/hf holds them).
    """

    name: str = "custom"
    family: str | None = None
    layers: int
    hidden: int
    heads: int
    kv_heads: int | None = Field(default=None, description="defaults to heads (no GQA)")
    head_size: int | None = Field(default=None, description="per-head width when it is not hidden/heads (Gemma: 256)")
    ffn: int | None = Field(default=None, description="MLP inner size; defaults to 4*hidden")
    vocab: int
    mlp: MlpKind = "gelu"
    norm: NormKind = "layernorm"
    bias: bool = True
    qkv_bias: bool | None = Field(default=None, description="bias on q/k/v only (Qwen2); defaults to bias")
    out_bias: bool | None = Field(default=None, description="bias on the attention output; defaults to bias")
    mlp_bias: bool | None = Field(default=None, description="bias on the dense MLP; defaults to bias")
    tie_embeddings: bool = False
    norms_per_layer: int = Field(default=2,
                                 description="norms in a block: 2 (before attention and MLP); "
                                             "Gemma 2: 4; Falcon-7B: 1")
    position_embeddings: int = Field(default=0,
                                     description="learned absolute positions (GPT-2: 1024); 0 with rotary")
    mla: MlaSpec | None = Field(default=None, description="multi-head latent attention (DeepSeek-V2/V3)")
    qk_norm: Literal["none", "head", "full"] = Field(
        default="none", description="norms on the queries and keys: per head (Qwen3, Gemma 3: head_dim "
                                    "weights each) or over their whole width (OLMo 2, Cohere)")
    head_bias: bool = Field(default=False, description="a bias on the output head (Phi-3.5-MoE)")
    extra_params: int = Field(default=0, description="parameters the shape does not count, from the model card: "
                                                     "a multimodal model's vision tower and projector; for "
                                                     "a model_type read by its common keys, the card's "
                                                     "exact count less the shape's (either sign)")
    # mixture of experts
    experts: int = Field(default=0, description="routed experts per MoE block; 0: a dense model")
    top_k: int | None = Field(default=None, description="experts each token is routed to")
    expert_ffn: int | None = Field(default=None, description="one expert's MLP inner size; defaults to ffn")
    shared_experts: int = Field(default=0, description="experts every token goes through")
    shared_expert_ffn: int | None = Field(default=None,
                                          description="one shared expert's inner size; defaults to expert_ffn")
    shared_expert_gate: bool = Field(default=False, description="a sigmoid gate on the shared experts (Qwen-MoE)")
    dense_layers: tuple[int, ...] = Field(default=(), description="blocks (from 0) of a MoE model that keep "
                                                                  "the dense MLP of size ffn")
    # where the architecture was read from (`--hf-config`)
    hf_model_type: str | None = Field(default=None, description="config.json's model_type")
    hf_config: str | None = Field(default=None, description="the config.json it was read from")
    # the model card learned from the transformers class (`zlayout learn`; zlayout.core.card):
    # with `impl = "hf"` the planner takes its activations. Written as its key (profiles, JSON),
    # read back from the cards folders by that key
    card: Any = Field(default=None, repr=False, description="the model card's key (zlayout learn)")

    @field_validator("name", "family")
    @classmethod
    def _name_is_printable(cls, value: str | None) -> str | None:
        # names come from files and folders (config.json, a preset, the folder's name) and are
        # printed in the plan's header, the app and the profile: no escape code or line break
        return value if value is None else printable_name(value)

    @field_validator("dense_layers", mode="before")
    @classmethod
    def _array_is_a_tuple(cls, value: Any) -> Any:
        # TOML and JSON have arrays, not tuples: a list is the same value (also when a preset
        # or a profile is read in strict mode, which takes only a tuple for a tuple field)
        return tuple(value) if isinstance(value, list) else value

    @field_validator("card", mode="before")
    @classmethod
    def _card_by_key(cls, value: Any) -> Any:
        if isinstance(value, str):
            from zlayout.cards import card_by_key  # reads the card's TOML: the catalog's layer

            return card_by_key(value)
        if value is not None and type(value).__name__ != "ModelCard":
            raise ValueError(f"card must be a model card's key, got {value!r}")
        return value

    @field_serializer("card")
    def _card_key(self, card: Any) -> str | None:
        return None if card is None else card.key

    @model_serializer(mode="wrap")
    def _omit_unused_extensions(self, handler):
        """Fields added for config.json models and MoE are written only when used, so a dense
        model's profile, JSON and TOML read as they always have."""
        data = handler(self)
        if isinstance(data, dict):
            for name in EXTENSION_FIELDS:
                if name in data and getattr(self, name) == type(self).model_fields[name].default:
                    del data[name]
        return data

    @model_validator(mode="after")
    def _shape_is_consistent(self) -> "ModelSpec":
        if self.head_size is None and self.mla is None and self.hidden % self.heads:
            flag, value = _likeliest_shape_fix(self.hidden, self.heads)
            raise ValueError(
                f"hidden ({self.hidden}) must be divisible by heads ({self.heads}); try --{flag} {value}"
            )
        if self.heads % self.num_kv_heads:
            raise ValueError(
                f"heads ({self.heads}) must be a multiple of kv-heads ({self.num_kv_heads}); "
                f"try --kv-heads {_nearest_divisor(self.heads, self.num_kv_heads)}"
            )
        if self.experts:
            if self.top_k is None:
                raise ValueError(f"a MoE model with {self.experts} experts needs top_k: add --top-k K")
            if self.top_k > self.experts:
                raise ValueError(f"top_k ({self.top_k}) must be at most experts ({self.experts})")
            outside = [i for i in self.dense_layers if i >= self.layers]
            if outside or len(set(self.dense_layers)) != len(self.dense_layers):
                raise ValueError(f"dense_layers must name distinct blocks 0..{self.layers - 1}, "
                                 f"got {list(self.dense_layers)}")
            if any(i < 0 for i in self.dense_layers):
                raise ValueError("dense_layers are block numbers from 0")
        else:
            moe_only = [name for name, value in (
                ("top_k", self.top_k), ("expert_ffn", self.expert_ffn),
                ("shared_experts", self.shared_experts or None),
                ("shared_expert_ffn", self.shared_expert_ffn),
                ("shared_expert_gate", self.shared_expert_gate or None),
                ("dense_layers", self.dense_layers or None)) if value is not None]
            if moe_only:
                raise ValueError(f"{moe_only[0]} describes a mixture of experts: add --experts N")
        if self.card is not None:
            card, extra = self._card_for_shape()
            if card is not self.card or extra != self.extra_params:
                object.__setattr__(self, "card", card)  # frozen: set once, while validating
                object.__setattr__(self, "extra_params", extra)
            tie, extra = self.tied_as_built(self.card)
            if tie != self.tie_embeddings:
                object.__setattr__(self, "tie_embeddings", tie)
                object.__setattr__(self, "extra_params", extra)
        # after the card's resizing: a shape read by common keys that overcounts a state-space
        # block (Mamba-2's) has a negative extra_params, which a shallower --layers scales down
        if self.params < 1:
            raise ValueError(f"extra_params ({self.extra_params:,}) leaves the model {self.params:,} parameters")
        return self

    def tied_as_built(self, card: Any) -> tuple[bool, int]:
        """(tie_embeddings, extra_params) as transformers built the model its card was learned from
        (`ModelCard.tied_embeddings`), where a config says it under a key of its own (LFM2's
        `tie_embedding`; the common keys read `tie_word_embeddings`): the count stays the card's,
        the head's tensor moving into extra_params. A tied head's fp32 weight is made before it is
        tied (the host's build: h200-2026-12-21, 5.69 GiB measured, 5.44 planned untied)."""
        tied = getattr(card, "tied_embeddings", None)
        if tied is None or tied == self.tie_embeddings:
            return self.tie_embeddings, self.extra_params
        flipped = self.model_copy(update={"tie_embeddings": tied})
        return tied, self.extra_params + self.params - flipped.params

    def _card_for_shape(self, layers: int | None = None) -> tuple[Any, int]:
        """(the card, extra_params) for this shape at `layers` (default: its own). A card
        describes one config: at another depth (`--layers`, the app's Layers, break-even) its
        blocks are the same and it is resized (`ModelCard.at_layers`); where the shape no longer
        matches its tensors (Hidden, Vocab or FFN changed) it describes another model and is
        dropped (None): the hand model plans it, as any custom shape."""
        card = self.card
        layers = self.layers if layers is None else layers
        shape = self.params - self.extra_params  # at self.layers
        if layers != self.layers:
            shape += self.model_copy(update={"layers": layers, "card": None, "extra_params": 0}).blocks_params() \
                - self.blocks_params()
        try:
            fitted = card.at_layers(layers)
        except ValueError:  # CardError: a card that cannot tell its blocks' tensors apart
            return None, self.extra_params
        if fitted.params == shape + self.extra_params:
            return fitted, self.extra_params  # at the card's own depth, or read back from a profile
        depth = len(card.layer_kinds)
        at_depth = self.model_copy(update={"layers": depth, "card": None, "extra_params": 0})
        if card.params == at_depth.params + self.extra_params:
            # only the depth changed: a model_type read by its common keys counts per block what
            # its shape misses (extra_params), which scales with the blocks
            return fitted, fitted.params - shape
        return None, self.extra_params

    def with_layers(self, layers: int) -> "ModelSpec":
        """The same model at another depth, its card resized with it (break-even's depth scan;
        a bare model_copy would keep the card's blocks)."""
        if self.card is None:
            return self.model_copy(update={"layers": layers})
        card, extra = self._card_for_shape(layers)
        return self.model_copy(update={"layers": layers, "card": card, "extra_params": extra})

    # ------------------------------------------------------------------ shape

    @property
    def num_kv_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden // self.heads

    @property
    def ffn_size(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def q_size(self) -> int:
        """Width of the queries (and of the attention output, except with MLA)."""
        return self.heads * (self.mla.qk_head_dim if self.mla else self.head_dim)

    @property
    def kv_size(self) -> int:
        """Width of the keys, and of the values (MLA: keys; values are `attn_out_size`)."""
        if self.mla:
            return self.heads * self.mla.qk_head_dim
        return self.num_kv_heads * self.head_dim

    @property
    def attn_out_size(self) -> int:
        """Width of the attention output the output projection reads."""
        return self.heads * self.mla.v_head_dim if self.mla else self.q_size

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def can_checkpoint(self) -> bool:
        """Whether its blocks can be checkpointed: a model card says no for a class transformers'
        gradient_checkpointing_enable refuses (CTRL, openai-gpt)."""
        return getattr(self.card, "checkpointing", True)

    @property
    def expert_ffn_size(self) -> int:
        return self.expert_ffn or self.ffn_size

    @property
    def shared_expert_ffn_size(self) -> int:
        return self.shared_expert_ffn or self.expert_ffn_size

    @property
    def moe_layer_count(self) -> int:
        return self.layers - self.dense_layer_count if self.is_moe else 0

    @property
    def dense_layer_count(self) -> int:
        if not self.is_moe:
            return self.layers
        return len({i for i in self.dense_layers if 0 <= i < self.layers})

    def _biased(self, flag: bool | None) -> bool:
        return self.bias if flag is None else flag

    # ------------------------------------------------------------------ parameters

    def norm_params(self) -> int:
        """One norm module: LayerNorm has a weight and a bias, RMSNorm a weight."""
        return 2 * self.hidden if self.norm == "layernorm" else self.hidden

    def attention_params(self) -> int:
        h, q, kv, out = self.hidden, self.q_size, self.kv_size, self.attn_out_size
        if self.mla:
            a = self.mla
            # transformers' DeepseekV2Attention: attention_bias (our qkv/out bias) on q_a, kv_a and o
            proj_bias = self._biased(self.qkv_bias)
            if a.q_lora_rank is None:
                query = h * q
            else:
                query = h * a.q_lora_rank + a.q_lora_rank * (1 + q) + proj_bias * a.q_lora_rank
            latent = a.kv_lora_rank + a.qk_rope_head_dim
            kv_part = h * latent + proj_bias * latent + a.kv_lora_rank  # + the latent's RMSNorm
            kv_part += a.kv_lora_rank * self.heads * (a.qk_nope_head_dim + a.v_head_dim)
            return query + kv_part + out * h + self._biased(self.out_bias) * h
        params = h * (q + 2 * kv) + out * h
        params += (q + 2 * kv) * self._biased(self.qkv_bias) + h * self._biased(self.out_bias)
        return params + self.qk_norm_params()

    def qk_norm_params(self) -> int:
        """The query and key norms' weights: one head's width each, or the whole width."""
        if self.qk_norm == "head":
            return 2 * self.head_dim
        return self.q_size + self.kv_size if self.qk_norm == "full" else 0

    def mlp_params(self, ffn: int | None = None, with_bias: bool | None = None) -> int:
        """One MLP: gate+up+down (SwiGLU and other gated MLPs) or up+down, biases per mlp_bias."""
        h, f = self.hidden, self.ffn_size if ffn is None else ffn
        gated = self.mlp == "swiglu"
        params = (3 if gated else 2) * h * f
        if self._biased(self.mlp_bias) if with_bias is None else with_bias:
            params += (2 if gated else 1) * f + h
        return params

    def router_params(self) -> int:
        return self.experts * self.hidden

    def moe_mlp_params(self, experts: int | None = None) -> int:
        """A MoE block's MLP: the router, `experts` expert MLPs (no biases), the shared experts."""
        routed = self.experts if experts is None else experts
        params = self.router_params() + routed * self.mlp_params(self.expert_ffn_size, with_bias=False)
        params += self.shared_experts * self.mlp_params(self.shared_expert_ffn_size, with_bias=False)
        return params + (self.hidden if self.shared_expert_gate else 0)

    def dense_layer_params(self) -> int:
        return self.attention_params() + self.mlp_params() + self.norms_per_layer * self.norm_params()

    def moe_layer_params(self) -> int:
        return self.attention_params() + self.moe_mlp_params() + self.norms_per_layer * self.norm_params()

    def layer_params(self) -> int:
        """Parameters of one transformer block (exact, counting biases and norms); of a MoE
        block in a MoE model (the blocks a deeper model adds)."""
        return self.moe_layer_params() if self.is_moe else self.dense_layer_params()

    def blocks_params(self) -> int:
        """Every block's parameters (a MoE model's dense blocks counted as dense)."""
        return self.dense_layer_count * self.dense_layer_params() + self.moe_layer_count * self.moe_layer_params()

    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    def position_embedding_params(self) -> int:
        return self.position_embeddings * self.hidden

    def head_params(self) -> int:
        return (0 if self.tie_embeddings else self.vocab * self.hidden) + (self.vocab if self.head_bias else 0)

    def final_norm_params(self) -> int:
        return self.norm_params()

    @property
    def params(self) -> int:
        return (self.blocks_params() + self.embedding_params() + self.position_embedding_params()
                + self.head_params() + self.final_norm_params() + self.extra_params)

    def active_blocks_params(self) -> int:
        """Block parameters one token goes through: a MoE block counts `top_k` experts."""
        if not self.is_moe:
            return self.blocks_params()
        active_moe = (self.attention_params() + self.moe_mlp_params(self.top_k)
                      + self.norms_per_layer * self.norm_params())
        return self.dense_layer_count * self.dense_layer_params() + self.moe_layer_count * active_moe

    @property
    def active_params(self) -> int:
        """Parameters one token's forward uses (what compute and MFU count); `params` for dense."""
        # a card-planned model's shape is read from common keys: where it counts more block parameters
        # than the card's exact total (beam's defaults), its active share is no figure to subtract
        # from that total, and every parameter counts (the step's FLOPs over, not under)
        active = self.params - self.blocks_params() + self.active_blocks_params()
        return active if 0 < active <= self.params else self.params


EXTENSION_FIELDS = ("head_size", "out_bias", "mlp_bias", "norms_per_layer", "position_embeddings", "mla",
                    "qk_norm", "head_bias", "extra_params", "card",
                    "experts", "top_k", "expert_ffn", "shared_experts", "shared_expert_ffn",
                    "shared_expert_gate", "dense_layers", "hf_model_type", "hf_config")


def _nearest_divisor(n: int, near: int) -> int:
    """The divisor of n closest to `near` (O(sqrt n): n may be any accepted hidden size)."""
    divisors = set()
    for d in range(1, math.isqrt(n) + 1):
        if n % d == 0:
            divisors.update((d, n // d))
    return min(divisors, key=lambda d: (abs(d - near), d))


# per-head widths of published models (GPT-2 64, Falcon 64, Phi-3 96, Llama 128, Gemma 256)
COMMON_HEAD_DIMS = frozenset({32, 48, 64, 80, 96, 112, 128, 160, 192, 256})


def _shape_plausibility(hidden: int, heads: int) -> int:
    """How much (hidden, heads) looks like a published model: a common head width, a hidden
    size in steps of 128, a head count in steps of 8 or a power of two."""
    score = 0
    if hidden % heads == 0 and hidden // heads in COMMON_HEAD_DIMS:
        score += 2
    if hidden % 128 == 0:
        score += 1
    if heads % 8 == 0 or heads & (heads - 1) == 0:
        score += 1
    return score


def _likeliest_shape_fix(hidden: int, heads: int) -> tuple[str, int]:
    """('hidden', 4096) or ('heads', 35): which of the two numbers was likelier mistyped, and
    the nearest value that divides. `--hidden 4095 --heads 32` is a typo in hidden (4096 has
    head width 128), not 35 heads of 117; on a tie, heads (the smaller number to retype)."""
    below = hidden - hidden % heads
    multiples = [m for m in (below, below + heads) if 1 <= m <= BOUNDS["hidden"].high]
    new_hidden = min(multiples, key=lambda m: (abs(m - hidden), m)) if multiples else hidden
    new_heads = _nearest_divisor(hidden, heads)
    if new_hidden != hidden and _shape_plausibility(new_hidden, heads) > _shape_plausibility(hidden, new_heads):
        return "hidden", new_hidden
    return "heads", new_heads


# nvidia-smi's memory.total on an H200 is 143771 MiB, cudaMemGetInfo's total (torch's "total capacity")
# 143155 MiB on every verify run (device_total_bytes, benchmarks/measurements/h200-2026-12-0*): the
# driver keeps 615 MiB (nvidia-smi -q's "Reserved"). Unmeasured cards are taken to keep as much.
DRIVER_RESERVED_H200 = 150754820096 - 150109880320


class GpuSpec(Frozen):
    name: str
    memory_bytes: int
    peak_bf16_flops: float = Field(description="dense bf16 tensor-core FLOP/s")
    hbm_gbps: float = 3350.0
    # The step-time model's HBM efficiencies (core.steptime HBM_EFFICIENCY, GPU_OPTIMIZER_HBM_EFFICIENCY)
    # were fitted on H200 runs (HBM3e, 4.8 TB/s nominal); another memory reaches another share of its
    # nominal. H100 (HBM3): 1.12, FITTED in-sample on its 21 runs (h200-2026-12-18..25: their step
    # times were +7.6% over on average, the optimizer's memory-bound step +11.9%): docs/tradeoffs.md.
    hbm_efficiency_factor: float = Field(default=1.0, gt=0.5, le=2.0,
                                         description="achieved share of nominal HBM bandwidth against the "
                                                     "H200's, on which the step-time model's HBM efficiencies "
                                                     "were fitted (H100: 1.12, fitted on its runs)")
    pcie_gbps: float = Field(default=55.0, description="host<->device copy bandwidth achieved")
    cuda_context_bytes: int = Field(default=int(1.29 * GiB),
                                    description="CUDA context + cuBLAS workspace outside the allocator "
                                                "(1.29 GiB measured on H200, torch 2.11)")
    driver_reserved_bytes: int = Field(default=DRIVER_RESERVED_H200,
                                       description="memory the driver keeps for itself: the card's total "
                                                   "(nvidia-smi) less cudaMemGetInfo's total, which no "
                                                   "process can allocate (615 MiB measured on H200; the "
                                                   "default for cards not measured)")
    host_cores_per_gpu: int = Field(default=14,
                                    description="CPU cores per GPU of the GPU's usual 8-GPU node "
                                                "(DGX H100/H200: 2 x 56 cores / 8 GPUs = 14)")
    # what a CUDA reduction's launch heuristics read (cudaDeviceProp): they size the scratch
    # buffer a norm's or a bias's weight gradient allocates (core.reductions); H100 / H200's default
    multiprocessors: int = Field(default=132, ge=1, le=4096, description="streaming multiprocessors (SMs)")
    max_threads_per_multiprocessor: int = Field(default=2048, ge=32, le=8192,
                                                description="resident threads an SM holds (2048 on sm80 / sm90 "
                                                            "/ sm100, 1536 on sm86 / sm89)")
    warp_size: int = Field(default=32, ge=32, le=64, description="32 on NVIDIA, 64 on AMD CDNA")


class LinkSpec(Frozen):
    name: str
    bandwidth_gbps: float = Field(description="per-GPU unidirectional bandwidth, GB/s")
    latency_us: float = 5.0
    efficiency: float = Field(default=0.8, description="achieved bus bandwidth / nominal")


class HardwareSpec(Frozen):
    gpu: GpuSpec
    gpus_per_node: int
    nodes: int = 1
    intra_link: LinkSpec
    inter_link: LinkSpec | None = None
    host_ram_bytes: int = Field(default=2048 * GiB, description="per node")
    host_mem_gbps: float = Field(default=500.0,
                                 description="host memory bandwidth per node (two-socket 8-GPU servers: ~500)")
    nvme_bytes: int = Field(default=0, description="per node")
    nvme_gbps: float = Field(default=6.0, description="per node, read/write")
    host_cores: int | None = Field(default=None,
                                   description="CPU cores per node its ranks share (what nproc shows); "
                                               "default: the GPU preset's cores per GPU x GPUs per node")

    @property
    def world(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def node_host_cores(self) -> int:
        """The node's CPU cores: as given, or the GPU preset's share per GPU times the GPUs."""
        return self.host_cores or self.gpu.host_cores_per_gpu * self.gpus_per_node

    @property
    def cpu_threads_per_rank(self) -> int:
        """What the launchers zlayout writes give each rank: OMP_NUM_THREADS = cores / ranks on the node."""
        return max(1, self.node_host_cores // self.gpus_per_node)

    @model_validator(mode="after")
    def _multi_node_needs_a_link(self) -> "HardwareSpec":
        if self.nodes > 1 and self.inter_link is None:
            raise ValueError("nodes > 1 needs an inter-node link: add --inter-link (e.g. ib-ndr)")
        return self


class TrainingSpec(Frozen):
    seq: int
    micro_batch: int = 1
    grad_accum: int = 1
    precision: Precision = "bf16"
    checkpointing: Checkpointing = "none"
    optimizer: Literal["adamw"] = "adamw"
    flash_attention: bool = True
    impl: Implementation = "zlayout"
    allocator: AllocatorKind = "default"
    init: ModelInit = "auto"
    loop: TrainingLoop = "deepspeed"


class ZeroKnobs(Frozen):
    """DeepSpeed's sizing knobs, at DeepSpeed 0.19.8's defaults (users change these)."""

    overlap_comm: bool = True
    contiguous_gradients: bool = True
    reduce_bucket_size: int = 500_000_000
    allgather_bucket_size: int = 500_000_000
    stage3_prefetch_bucket_size: int = 50_000_000
    stage3_max_live_parameters: int = 1_000_000_000
    stage3_max_reuse_distance: int = 1_000_000_000
    stage3_param_persistence_threshold: int = 100_000
    sub_group_size: int = 1_000_000_000
    pin_memory: bool = True
    gradient_clipping: float = 1.0


class Layout(Frozen):
    stage: Stage
    offload_optimizer: Device = "gpu"
    offload_param: Device = "gpu"

    @field_validator("stage", mode="before")
    @classmethod
    def _stage_is_a_whole_number(cls, value: object) -> object:
        # Literal[0, 1, 2, 3] compares by equality, so true and 1.0 passed as stage 1 (even
        # in strict mode): a profile's `stage = true` is refused, naming what to write
        if isinstance(value, (bool, float, str)):
            from zlayout.messages import toml_value

            fixed = str(value).strip() if isinstance(value, str) else repr(value).removesuffix(".0")
            hint = f": write stage = {fixed}" if fixed in ("0", "1", "2", "3") else ""
            raise ValueError(f"expected 0, 1, 2 or 3 (a whole number, without quotes), "
                             f"got {toml_value(value)}{hint}")
        return value

    @field_validator("offload_optimizer", "offload_param", mode="before")
    @classmethod
    def _none_means_gpu(cls, value: object) -> object:
        return "gpu" if value in (None, "none") else value

    @model_validator(mode="after")
    def _deepspeed_rules(self) -> "Layout":
        if self.offload_param != "gpu" and self.stage != 3:
            raise ValueError(f"parameter offload needs ZeRO stage 3 (got stage {self.stage}): "
                             "use --stage 3 or --offload-param none")
        if "nvme" in (self.offload_param, self.offload_optimizer) and self.stage != 3:
            raise ValueError(f"NVMe offload needs ZeRO stage 3 (got stage {self.stage}): use --stage 3")
        if self.offload_optimizer != "gpu" and self.stage == 0:
            raise ValueError("optimizer offload needs ZeRO stage 1 or higher: use --stage 1, 2 or 3")
        if self.offload_param == "nvme" and self.offload_optimizer == "gpu":
            raise ValueError("NVMe parameter offload needs the optimizer offloaded too: "
                             "add --offload-optimizer cpu or nvme")
        return self

    @property
    def label(self) -> str:
        parts = [f"ZeRO-{self.stage}"]
        if self.offload_optimizer != "gpu":
            parts.append(f"opt→{self.offload_optimizer}")
        if self.offload_param != "gpu":
            parts.append(f"param→{self.offload_param}")
        return " ".join(parts)

    @property
    def offloads(self) -> bool:
        """The optimizer or the weights live off the GPU (CPU or NVMe, staged through host memory)."""
        return self.offload_optimizer != "gpu" or self.offload_param != "gpu"

    @property
    def key(self) -> str:
        """A stable short id, e.g. 'z3-opt_cpu-param_cpu'."""
        return f"z{self.stage}-opt_{self.offload_optimizer}-param_{self.offload_param}"


# What ran where a stored record (a verify result, an exported profile) names no loop: the
# verify worker's wrapper returned only the loss until `training.loop` existed.
LOOP_OF_UNMARKED_RECORDS: TrainingLoop = "trainer"


def recorded_inputs(inputs: dict) -> dict:
    """A stored record's plan inputs (the dict a result or profile keeps), with the training
    loop it ran filled in where it predates the `loop` field (LOOP_OF_UNMARKED_RECORDS). New
    plans default to "deepspeed"; a record that says nothing ran the trainer-like loop. A record
    of a shipped GPU from before `GpuSpec.hbm_efficiency_factor` takes today's preset's factor,
    where its nominal figures are the preset's (it is that GPU, as the catalog then described it)."""
    training = inputs.get("training")
    if isinstance(training, dict) and "loop" not in training:
        inputs = {**inputs, "training": {**training, "loop": LOOP_OF_UNMARKED_RECORDS}}
    hardware = inputs.get("hardware")
    gpu = hardware.get("gpu") if isinstance(hardware, dict) else None
    if isinstance(gpu, dict) and "hbm_efficiency_factor" not in gpu:
        preset = _shipped_gpu(gpu.get("name"))
        if preset is not None and all(gpu.get(k) == getattr(preset, k)
                                      for k in ("memory_bytes", "peak_bf16_flops", "hbm_gbps")):
            gpu = {**gpu, "hbm_efficiency_factor": preset.hbm_efficiency_factor}
            inputs = {**inputs, "hardware": {**hardware, "gpu": gpu}}
    return inputs


def _shipped_gpu(name: Any) -> GpuSpec | None:
    from zlayout import catalog  # the catalog reads presets into this module's models

    try:
        return catalog.load_gpu(name) if isinstance(name, str) else None
    except (KeyError, ValueError, OSError):
        return None


# PyTorch's switch (c10/core/alloc_cpu.cpp, torch >= 2.3) for host tensors of 2 MiB or more
# aligned to 2 MiB and madvised MADV_HUGEPAGE: where the kernel's transparent hugepages are
# "madvise" (the common default), the rest are faulted in 4 KiB at a time. An offloaded step
# casts the fp32 master weights into a fresh pageable bf16 temporary every step, so every step
# faults it in anew: Mixtral-8x7B-L2 at ZeRO-3 with the optimizer on the CPU, one H200 node
# (h200-2026-12-08, benchmarks/measurements): 1.5 M page faults a step and its optimizer phase
# 2.93 s, with the switch 4.6 k and 2.32 s; the same layout's step took 3.13-4.46 s in three
# verify processes without it (the kernel's cost of the faults varies with the host's state) and
# 2.49-2.83 s in two with it (h200-2026-12-09). Verify
# sets it for offloaded layouts (the user's own value wins) and the launchers zlayout writes
# export it, so what is verified is what runs.
HOST_HUGEPAGES_ENV = "THP_MEM_ALLOC_ENABLE"


def offload_flag(device: Device) -> str:
    """A device as the command line and JSON outputs spell it: 'gpu' (nothing offloaded) is 'none'."""
    return "none" if device == "gpu" else device


def all_layouts() -> tuple[Layout, ...]:
    """Every layout DeepSpeed accepts, in a stable order."""
    layouts = [Layout(stage=0)]
    for stage in (1, 2):
        layouts += [Layout(stage=stage), Layout(stage=stage, offload_optimizer="cpu")]
    for opt in ("gpu", "cpu", "nvme"):
        for param in ("gpu", "cpu", "nvme"):
            try:
                layouts.append(Layout(stage=3, offload_optimizer=opt, offload_param=param))
            except ValueError:
                continue
    return tuple(layouts)


class StepTimeCalibration(Frozen):
    """Factors on the step-time model's parts, fitted by `zlayout calibrate` on a cluster's own runs.

    1.0 everywhere is the model as shipped (fitted on H200 measurements). `source` names the
    calibration file (and its SHA-256 prefix) so a profile records which one it used.
    """

    source: str | None = None
    gpu_factor: float = Field(default=1.0, description="GPU kernels: compute, loss, GPU optimizer")
    overhead_factor: float = Field(default=1.0,
                                   description="Python around the kernels: per-step and stage-3 hook overheads")
    cpu_optimizer_factor: float = Field(default=1.0, description="the CPU optimizer step")
    transfer_factor: float = Field(default=1.0, description="exposed network, PCIe and NVMe time")

    @property
    def is_default(self) -> bool:
        return (self.gpu_factor, self.overhead_factor, self.cpu_optimizer_factor,
                self.transfer_factor) == (1.0, 1.0, 1.0, 1.0)


class PlanInput(Frozen):
    """Everything a plan depends on."""

    model: ModelSpec
    hardware: HardwareSpec
    training: TrainingSpec
    zero: ZeroKnobs = ZeroKnobs()
    headroom_fraction: float = Field(default=0.05,
                                     description="fraction of the card the step's needs (allocated peak, "
                                                 "fragmentation, context) must leave when judging 'fits'; "
                                                 "the allocator's cache may still fill it")
    calibration: StepTimeCalibration = StepTimeCalibration()

    @model_validator(mode="after")
    def _training_within_limits(self) -> "PlanInput":
        for _field, what, hint in training_limits(self.model, self.training):
            raise ValueError(f"{what}; {hint}")
        return self


def training_limits(model: ModelSpec, training: TrainingSpec) -> list[tuple[str, str, str]]:
    """(field, what is wrong, the CLI flag that mends it) for each limit of the model a sequence,
    micro-batch or checkpointing passes: PlanInput's check, and the app's form, whose model_copy
    does not run it."""
    seq, micro_batch = training.seq, training.micro_batch
    out = []
    # learned absolute positions are a table of the model's (GPT-2's 1,024 rows): a longer
    # sequence indexes past it, which a GPU run stops on (an index assertion); rotary has no table
    positions = model.position_embeddings
    if positions and seq > positions:
        out.append(("seq", f"{model.name} has {positions:,} learned positions (n_positions): a sequence of "
                           f"{seq:,} tokens runs past them", f"use --seq {positions} or less"))
    # the limits a model card records (zlayout learn: core.card.ModelCard)
    card = model.card
    longest = getattr(card, "longest_sequence", None)
    if longest is not None and seq > longest and not (positions and seq > positions):
        out.append(("seq", f"{model.name} holds {longest:,} positions (its model card, learned from its "
                           f"config and code): a sequence of {seq:,} tokens runs past them",
                    f"use --seq {longest} or less"))
    shortest = getattr(card, "shortest_sequence", None)
    if shortest is not None and seq < shortest:
        out.append(("seq", f"{model.name}'s model card holds sequences of {shortest:,} tokens or more (its "
                           "memory steps with shorter ones: zlayout learn)", f"use --seq {shortest} or more"))
    quantum = getattr(card, "token_quantum", None)
    if quantum and seq % quantum:
        lower, upper = seq - seq % quantum, seq - seq % quantum + quantum
        fix = f"use --seq {upper}" + (f" or {lower}" if lower else "")
        out.append(("seq", f"{model.name}'s state-space blocks pad a sequence to a multiple of their scan's chunk "
                           f"({quantum} tokens: {seq:,} runs as {upper:,}), which its model card prices at "
                           "multiples only", fix))
    largest = getattr(card, "largest_micro_batch", None)
    if largest is not None and micro_batch > largest:
        out.append(("micro_batch", f"{model.name}'s memory grows faster than the micro-batch (its model card is "
                                   f"exact at {largest} sequences a step: zlayout learn)",
                    f"use --micro-batch {largest} or less and a larger --grad-accum"))
    if training.checkpointing != "none" and not model.can_checkpoint:
        out.append(("checkpointing", f"transformers' {card.model_type} class cannot checkpoint its blocks "
                                     "(gradient_checkpointing_enable refuses it)", "use --checkpointing none"))
    return out
