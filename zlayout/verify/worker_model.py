"""The planned model in plain PyTorch, built from a `ModelSpec` with random weights.

Imported only by the worker (it imports torch). The structure follows the reference GPT of
benchmarks/measurements/h200-2026-11-29-ds_probe.py (fused QKV, causal
`scaled_dot_product_attention`, MLP, final norm, loss on fp32 logits) and generalises it the way `ModelSpec` does: grouped-query attention
(`kv_heads`), SwiGLU with its own `ffn` size, RMSNorm, biases per `bias`/`qkv_bias`, tied
or untied head. Its parameter count equals `ModelSpec.params` exactly; the worker asserts it.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

from zlayout.core.card import STATE_SPACE_KERNELS, STATE_SPACE_TORCH, TORCH_LOOP_ACTIVATIONS
from zlayout.spec import ModelSpec


class Norm(nn.Module):
    """LayerNorm (weight and bias, always: `ModelSpec` counts 2*hidden) or RMSNorm (weight)."""

    def __init__(self, hidden: int, kind: str):
        super().__init__()
        self.kind = kind
        self.weight = nn.Parameter(torch.ones(hidden))
        self.bias = nn.Parameter(torch.zeros(hidden)) if kind == "layernorm" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "layernorm":
            return F.layer_norm(x, x.shape[-1:], self.weight, self.bias)
        return F.rms_norm(x, x.shape[-1:], self.weight)


class Block(nn.Module):
    def __init__(self, m: ModelSpec):
        super().__init__()
        h, kv, f = m.hidden, m.kv_size, m.ffn_size
        self.heads, self.kv_heads, self.head_dim = m.heads, m.num_kv_heads, m.head_dim
        qkv_bias = m.bias if m.qkv_bias is None else m.qkv_bias
        self.norm1, self.norm2 = Norm(h, m.norm), Norm(h, m.norm)
        self.qkv = nn.Linear(h, h + 2 * kv, bias=qkv_bias)
        self.proj = nn.Linear(h, h, bias=m.bias)
        self.swiglu = m.mlp == "swiglu"
        # SwiGLU's gate and up projections are one fused Linear (as in the accuracy benchmark).
        self.fc1 = nn.Linear(h, (2 if self.swiglu else 1) * f, bias=m.bias)
        self.fc2 = nn.Linear(f, h, bias=m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        kv = self.kv_heads * self.head_dim
        q, k, v = self.qkv(self.norm1(x)).split([h, kv, kv], -1)
        q = q.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                              enable_gqa=self.kv_heads != self.heads)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, h))
        up = self.fc1(self.norm2(x))
        if self.swiglu:
            gate, up = up.chunk(2, -1)
            up = F.silu(gate) * up
        else:
            up = F.gelu(up)
        return x + self.fc2(up)


class LMOutput(NamedTuple):
    """The forward's result in the deepspeed loop (`TrainingSpec.loop`): the loss and the
    bf16 logits it came from, which the caller holds until its next forward, as
    `outputs = engine(...); engine.backward(outputs.loss)` does."""

    loss: torch.Tensor
    logits: torch.Tensor


class GPT(nn.Module):
    def __init__(self, m: ModelSpec, checkpointing: bool, keep_outputs: bool = False):
        super().__init__()
        self.keep_outputs = keep_outputs
        self.emb = nn.Embedding(m.vocab, m.hidden)
        self.blocks = nn.ModuleList(Block(m) for _ in range(m.layers))
        self.norm = Norm(m.hidden, m.norm)
        self.head = nn.Linear(m.hidden, m.vocab, bias=False)
        if m.tie_embeddings:
            self.head.weight = self.emb.weight
        self.checkpointing = checkpointing

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        for block in self.blocks:
            if self.checkpointing:
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        logits = self.head(self.norm(x))
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
        return LMOutput(loss, logits) if self.keep_outputs else loss


def build_model(m: ModelSpec, checkpointing: bool) -> GPT:
    return GPT(m, checkpointing)


def count_parameters(model: nn.Module) -> int:
    """Distinct parameters (a tied head counts once); full sizes under ZeRO-3 partitioning."""
    return sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())


# --------------------------------------------------------------------- Hugging Face classes


class HFCausalLM(nn.Module):
    """A `transformers` causal LM whose forward returns the loss, as HF's Trainer computes it
    (`compute_loss` takes `outputs.loss` and drops the outputs: the logits are not kept)."""

    def __init__(self, model: nn.Module, keep_outputs: bool = False):
        super().__init__()
        self.model = model
        self.keep_outputs = keep_outputs  # the deepspeed loop: all of `outputs`, logits included

    def forward(self, ids: torch.Tensor):
        outputs = self.model(input_ids=ids, labels=ids)
        return outputs if self.keep_outputs else outputs.loss


def hf_builder(config_dict: dict, checkpointing: bool, keep_outputs: bool = False):
    """Resolve the config and import the model class now, return what builds it. Importing
    transformers' modules (which import torch._dynamo) inside `deepspeed.zero.Init` fails on
    torch 2.13: Init patches tensor construction that dynamo checks as it loads.

    The class is the one `zlayout learn` learns the card from: the causal LM, else (LLaVA,
    Qwen2.5-VL) the whole image-text-to-text model; with sdpa attention where the class
    supports it, else eager (Gemma-2's softcapping), as transformers trains it."""
    import torch._dynamo  # noqa: F401 - see above
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.models.auto.modeling_auto import (MODEL_FOR_CAUSAL_LM_MAPPING,
                                                        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING)

    cfg = {k: v for k, v in config_dict.items() if not k.startswith("_")}
    model_type = cfg.pop("model_type")
    cfg.pop("architectures", None)
    config = AutoConfig.for_model(model_type, **cfg)
    auto = AutoModelForCausalLM if type(config) in MODEL_FOR_CAUSAL_LM_MAPPING else AutoModelForImageTextToText
    model_class = (MODEL_FOR_CAUSAL_LM_MAPPING if auto is AutoModelForCausalLM
                   else MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING)[type(config)]  # import its module before Init
    attention = "sdpa" if getattr(model_class, "_supports_sdpa", False) else "eager"

    def build_hf() -> nn.Module:
        # Inside zero.Init (ZeRO-3) each module's weights are partitioned as it is built, and
        # transformers' initialiser would write whole tensors into empty partitions (Mamba-2's
        # `init.copy_(A_log, log(arange(heads)))` fails there): build without it, as transformers
        # does under ZeRO-3 itself (`no_init_weights`), and the worker initialises the gathered
        # weights afterwards (worker.initialise_partitioned_hf_weights). Memory is the same: the
        # initialisers write in place.
        from deepspeed.runtime.zero import partition_parameters
        from transformers.initialization import no_init_weights

        partitioned = partition_parameters.zero_init_context > 0
        with no_init_weights() if partitioned else contextlib.nullcontext():
            model = auto.from_config(config, attn_implementation=attention, dtype=torch.float32)
        if partitioned:
            model.tie_weights()  # init_weights ties them, and no_init_weights skipped it (as transformers does)
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return HFCausalLM(model, keep_outputs)

    build_hf.model_module = sys.modules.get(model_class.__module__)  # linear_attention_implementation reads it
    return build_hf


# ------------------------------------------------------- hybrid linear attention (Qwen3.5, Qwen3-Next, ...)
# Which kernels a GDN layer (Qwen3.5, Qwen3-Next, OLMo-Hybrid, Lara-Mini, Qwen4-Exp: learn/trace.py,
# LINEAR_ATTENTION_PACKAGES; each module names the globals alike) runs is fixed when transformers
# imports its modeling module: `use_kernel_func_from_hub_with_fallback`
# (transformers/integrations/hub_kernels.py, 5.24) binds the module globals below to the package's
# function where `import fla` / `import causal_conv1d` succeeds, else to the torch reference, and
# keeps the choice in its wrapper's closure (`is_new_implementation`). A card learned by zlayout
# prices the packages' kernels (core.card.LINEAR_ATTENTION_FLA); the torch loop keeps more
# (core.card.TORCH_LOOP_ACTIVATIONS).
# Mamba-2 and its hybrids (learn/trace.py, TORCH_SCAN_PACKAGES) bind their scan the same way, to
# mamba-ssm's; a card prices transformers' torch reference there (core.card.STATE_SPACE_TORCH).
# Jamba binds mamba-ssm's selective scan, Mamba and Falcon-Mamba its fused `mamba_inner_fn`; a card
# prices those kernels (core.card.STATE_SPACE_KERNELS).
LINEAR_ATTENTION_FUNCTIONS = {  # module global: (transformers' name for the op, the package that provides it)
    "torch_chunk_gated_delta_rule": ("chunk_gated_delta_rule", "flash-linear-attention"),
    "causal_conv1d_fn": ("causal_conv1d_fn", "causal-conv1d"),
    "mamba2_split_conv1d_scan_combined": ("mamba_split_conv1d_scan_combined", "mamba-ssm"),
    "mamba2_chunk_scan": ("mamba_chunk_scan_combined", "mamba-ssm"),
    "mamba_selective_scan": ("selective_scan_fn", "mamba-ssm"),  # Jamba (core.card.STATE_SPACE_KERNELS)
    "mamba_inner_fn": ("mamba_inner_fn", "mamba-ssm"),  # Mamba, Falcon-Mamba (core.card.STATE_SPACE_KERNELS)
}
TORCH_FALLBACK = "torch fallback"


def linear_attention_implementation(module: Any) -> dict[str, str] | None:
    """{op: the package whose kernel transformers resolved, TORCH_FALLBACK, or "unknown" (a wrapper
    of another shape: hub kernels, another release)} for a modeling module with linear attention;
    None for any other."""
    found = {}
    for name, (op, package) in LINEAR_ATTENTION_FUNCTIONS.items():
        wrapper = getattr(module, name, None)
        if wrapper is None:
            continue
        code, cells = getattr(wrapper, "__code__", None), getattr(wrapper, "__closure__", None) or ()
        closure = dict(zip(code.co_freevars, (cell.cell_contents for cell in cells))) if code else {}
        new = closure.get("is_new_implementation")
        found[op] = "unknown" if not isinstance(new, bool) else package if new else TORCH_FALLBACK
    return found or None


def linear_attention_refusal(assumed: str | None, resolved: dict[str, str] | None) -> str | None:
    """One line when the card priced the kernels (`assumed`) and transformers on this node resolved
    the torch fallback for any of them, or the card priced the torch reference (STATE_SPACE_TORCH)
    and it resolved a package's kernel; None when the run trains what was planned."""
    if assumed is None or not resolved:
        return None
    if assumed == STATE_SPACE_TORCH:
        kernels = sorted({package for name, (op, package) in LINEAR_ATTENTION_FUNCTIONS.items()
                          if resolved.get(op) == package})
        if not kernels:
            return None
        several = len(kernels) > 1
        return (f"the plan priced the state-space blocks as {assumed}, but transformers on this node resolved "
                f"{' and '.join(kernels)}'s kernel{'s' if several else ''}, which keep{'' if several else 's'} "
                "less than the plan: verify in an environment without mamba-ssm and causal-conv1d (the figures "
                "would not compare)")
    missing = list(dict.fromkeys(package for name, (op, package) in LINEAR_ATTENTION_FUNCTIONS.items()
                                 if resolved.get(op) == TORCH_FALLBACK))
    if not missing:
        return None
    what, loop = (("state-space blocks", "loops over every token and keeps far more than")
                  if assumed == STATE_SPACE_KERNELS else
                  ("linear attention", f"loops over 64-token chunks and keeps about {TORCH_LOOP_ACTIVATIONS:.1f}x "
                                       "the linear blocks' activations, not"))
    return (f"the plan priced {what} as {assumed}, but transformers on this node resolved its torch "
            f"fallback because {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed (or "
            f"did not import): install {' and '.join(missing)} in the environment verify runs in; the fallback "
            f"{loop} the plan's")


def class_default(config: dict, key: str):
    """What transformers' config class of `config`'s model type gives `key` where the file leaves it
    out (XLM's 512 positions, a learned table: raising it to the sequence would shrink the model)."""
    from transformers import AutoConfig

    try:
        return getattr(AutoConfig.for_model(config["model_type"]), key, None)
    except Exception:  # noqa: BLE001: hf_builder says what is wrong with the config
        return None


def builder(m: ModelSpec, checkpointing: bool, impl: str = "zlayout", seq: int = 2048,
            hf_config: dict | None = None, loop: str = "trainer"):
    """What builds zlayout's GPT, or (`--impl hf`) the transformers class of `m`'s
    config.json: the one the user gave, else the one `hfconfig.to_hf_config` writes (same
    parameter count). Called outside zero.Init; the builder it returns runs inside. `loop`
    "deepspeed": the forward returns the outputs (loss and logits) for the caller to hold."""
    keep_outputs = loop == "deepspeed"
    if impl == "hf":
        from zlayout.hfconfig import to_hf_config

        config = dict(hf_config or to_hf_config(m))
        # rotary caches must cover the planned sequence (learned positions are parameters:
        # their count is the model's, and the plan's sequence must fit them)
        if "n_positions" not in config:
            given = config.get("max_position_embeddings") or class_default(config, "max_position_embeddings")
            config["max_position_embeddings"] = max(int(given or 0), seq)
        config["use_cache"] = False
        return hf_builder(config, checkpointing, keep_outputs)
    return lambda: GPT(m, checkpointing, keep_outputs)
