"""Memory per GPU, per host and on NVMe for one layout, as named terms.

Pure arithmetic over a `PlanInput`: no I/O, no torch. Each term is one allocation (or one
family of allocations) that DeepSpeed 0.19.8 and PyTorch make, with a line a user can read.

The peak is not the sum of every term: DeepSpeed allocates in phases, and the peak is the
largest phase. `torch.cuda.max_memory_allocated()` sees

* after `deepspeed.initialize`: the resident states (weights, fp32 master, DeepSpeed's
  persistent buffers);
* forward/backward: resident + Adam moments (created lazily by the first `step()`, so from
  step 2 on) + saved activations + the loss's logits + gradient buffers;
* the optimizer step: resident + Adam moments + the gradients flattened and cast to fp32.

Sources for each size are the DeepSpeed 0.19.8 code paths named in each function's docstring;
the activation sizes follow the reference GPT's forward (benchmarks/measurements/h200-2026-11-29-ds_probe.py).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal, NamedTuple

from zlayout.core.card import STATE_SPACE_KERNELS, STATE_SPACE_TORCH, TORCH_LOOP_ACTIVATIONS
from zlayout.core.fit import flush_cost_s
from zlayout.core.reductions import Device, device_of
from zlayout.core.tensors import (  # noqa: F401 (read from here by tests and benchmarks)
    NORM_PART_ELEMENTS, layer_tensor_sizes, parameter_tensor_sizes, stage3_live_param_elements,
    Regathered, stage3_card_trace, stage3_gathered_at_loss, stage3_regathered_elements, stage3_sub_groups,
    weight_bytes_per_param,
    zero3_leaf_moe_tensor_sizes)
from zlayout.spec import GiB, Layout, ModelSpec, PlanInput, TrainingSpec, ZeroKnobs, gib_figure

Where = Literal["gpu", "host", "nvme"]
Category = Literal["model_states", "activations", "deepspeed_buffers", "overhead"]

FP32_BYTES = 4
ADAM_MOMENTS = 2  # exp_avg and exp_avg_sq, fp32 each

# Small tensors every step allocates besides the big terms (loss, norms, overflow flags,
# clip coefficients): about 70 MiB on every measured layout.
MISC_GPU_BYTES = 70 * 2**20

# PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp). With the default
# (fixed) segments, the largest request of a phase was served in the previous step by a
# segment of its own size; between steps best-fit hands parts of that cached segment to
# smaller requests (activations, per-tensor casts), so at the phase's peak the request needs a
# new segment while the old one stays reserved by the small blocks it now carries. When
# cudaMalloc fails the allocator frees every fully free segment and retries; the free parts
# of split segments cannot be freed. Measured on H200 at the out-of-memory of ZeRO-0, 28
# layers of Llama-3-8B's shape: 18.54 GiB reserved but unallocated after that retry, against
# a 20.56 GiB request: 0.90 of it.
TRAPPED_FRACTION = 0.90
# Expandable segments map 2 MiB pages into one growing range per stream and unmap free ones
# under pressure: what stays is page rounding. Measured on H200: reserved 0.39 GiB above the
# allocated peak when the card was full (ZeRO-0, 32 layers of Llama-3-8B's shape).
EXPANDABLE_SLACK_BYTES = int(0.39 * GiB)

# NCCL's communicator buffers (outside PyTorch's allocator) once a process group has peers:
# device-used minus reserved grows from 1.29 GiB (one GPU) to 1.77 GiB (two) on the H200s.
NCCL_BUFFER_BYTES = int(0.48 * GiB)
# A one-rank NCCL communicator, which DeepSpeed opens on one GPU too and which the one-GPU
# device-used figure (`cuda_context_bytes`, 1.29 GiB on H200) includes: a run on a fake process
# group (verify --emulate) opens none, and its device used minus reserved was 0.817 GiB on all
# three emulated H200 runs (ranks 0 of 2, 8 and 64).
NCCL_ONE_RANK_BYTES = int(0.47 * GiB)

# Host memory of one rank besides what it builds, off the verify workers' ru_maxrss on the H200
# runs (benchmarks/host_accuracy.py). The peak of a GPU-resident run is a transient while the
# model is set up (host_init_transients); on top of it every rank holds 0.68 GiB before CUDA
# is up (Python, torch, DeepSpeed: each untied ZeRO 0-2 zlayout row is 0.677-0.678 GiB above its
# cast peak), 0.15 GiB more with transformers imported (--impl hf: 0.828-0.830) and 0.52 GiB more
# once the CUDA context exists (ZeRO-3 rows sit 1.348-1.359 GiB, hf, above their defragment
# buffer; zlayout 1.158-1.161: 0.04 GiB to spare; two processes sat higher, 1.393 and 1.432 GiB:
# gpt-oss-20b-L6, and Llama-3.2-1B in h200-2026-12-15, 2.2% above its plan).
HOST_BASE_EARLY_BYTES = int(0.68 * GiB)
HOST_TRANSFORMERS_BYTES = int(0.15 * GiB)
HOST_CUDA_CONTEXT_BYTES = int(0.52 * GiB)
# What a rank holds once training runs besides its host model states. Kept as an upper bound:
# one-GPU GPU-resident runs end at 1.6-2.2 GiB RSS (host_rss_end_bytes), but ZeRO-3 parameter
# offload rows sit 1.9-4.3 GiB above their modelled buffers, and with 8 peers NCCL's host side
# is unmeasured.
HOST_BASE_BYTES = int(3.0 * GiB)

# ZeRO-3 with the weights on the host: device used measured above the replay on every one-GPU
# full-offload H200 row (ten shapes, zlayout's GPT and transformers, 2026-11-30 to 2026-12-02c):
# 0.10-0.47 GiB, never below; reserved too (0.11-0.40 GiB). Taken as blocks whose frees wait on the
# host copies of that layout (not modelled request by request) and bounded by the largest shortfall,
# counted like memory outside the allocator (device used and "fits" include it). Issue 28's
# -12.6% row (13.68 GiB planned, 15.66 measured) is not among the stored runs and is not covered.
OFFLOAD_COPY_MARGIN_BYTES = int(0.48 * GiB)

# DeepSpeed's NVMe swapper (aio) defaults: pinned host buffers it streams through.
AIO_OPTIMIZER_BUFFER_COUNT = 4
AIO_PARAM_BUFFER_COUNT = 5
AIO_PARAM_BUFFER_ELEMENTS = 100_000_000


@dataclass(frozen=True, slots=True)
class MemoryTerm:
    name: str
    where: Where
    bytes: int
    category: Category
    explanation: str


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    layout: Layout
    terms: tuple[MemoryTerm, ...]
    gpu_peak_allocated_bytes: int
    gpu_peak_reserved_bytes: int
    gpu_device_used_bytes: int  # reserved + CUDA context: what nvidia-smi shows
    gpu_needed_bytes: int  # the least device memory the peak runs in (decides "fits")
    host_peak_bytes: int  # per node
    nvme_bytes: int  # per node
    gpu_capacity_bytes: int
    host_capacity_bytes: int
    nvme_capacity_bytes: int
    gpu_usable_bytes: int  # capacity minus the requested headroom, at most what the driver hands out
    peak_phase: str  # "forward", "backward" or "optimizer step"
    after_init_bytes: int  # torch.cuda.memory_allocated() right after deepspeed.initialize

    gpu_flushes_per_step: int | None = None  # cudaMalloc retries a step (the cache freed); None: not replayed
    gpu_flush_cost_s: float = 0.0  # what they add to the step
    gpu_driver_reserved_bytes: int = 0  # the card's memory the driver keeps (GpuSpec.driver_reserved_bytes)

    @property
    def gpu_fit(self):
        """The one fit rule and headroom (core.fit.GpuFit): every surface reads these."""
        from zlayout.core.fit import gpu_fit

        return gpu_fit(self)

    @property
    def gpu_headroom_bytes(self) -> int:
        """The card's memory minus device used at the peak (0 when the cache fills the card)."""
        return self.gpu_fit.headroom_bytes

    @property
    def gpu_headroom_fraction(self) -> float:
        return self.gpu_fit.headroom_fraction

    @property
    def fits_gpu(self) -> bool:
        return self.gpu_fit.fits

    @property
    def fits_host(self) -> bool:
        return self.host_peak_bytes <= self.host_capacity_bytes

    @property
    def fits_nvme(self) -> bool:
        return self.nvme_bytes <= self.nvme_capacity_bytes

    @property
    def fits(self) -> bool:
        return self.fits_gpu and self.fits_host and self.fits_nvme

    @property
    def shortfall(self) -> str:
        """What the first resource that does not fit needs against what there is (the
        figures the verdict compares)."""
        if not self.fits_gpu:
            return self.gpu_fit.summary().removeprefix("does not fit: ")
        if not self.fits_host:
            return (f"needs {gib_figure(self.host_peak_bytes)} GiB of host RAM per node; "
                    f"the node has {gib_figure(self.host_capacity_bytes)} GiB")
        return (f"needs {gib_figure(self.nvme_bytes)} GiB of NVMe per node; "
                f"the node has {gib_figure(self.nvme_capacity_bytes)} GiB")

    @property
    def limited_by(self) -> str | None:
        """The first resource that does not fit, or None."""
        for name, ok in (("gpu", self.fits_gpu), ("host", self.fits_host), ("nvme", self.fits_nvme)):
            if not ok:
                return name
        return None

    def gpu_terms(self) -> tuple[MemoryTerm, ...]:
        return tuple(t for t in self.terms if t.where == "gpu")


# --------------------------------------------------------------------------- sizes


def tokens_per_micro_batch(training: TrainingSpec) -> int:
    return training.micro_batch * training.seq


def attention_activation_elements(model: ModelSpec) -> int:
    """Per token: the q/k/v that scaled_dot_product_attention keeps and the attention output
    (with MLA also the latents: compressed k/v with its rotary part, its norm, the k/v it
    expands to, and the query latent and its norm)."""
    qkv = model.q_size + model.kv_size + (model.attn_out_size if model.mla else model.kv_size)
    elements = qkv + model.attn_out_size
    if model.mla:
        a = model.mla
        elements += (a.kv_lora_rank + a.qk_rope_head_dim) + a.kv_lora_rank
        elements += model.heads * (a.qk_nope_head_dim + a.v_head_dim)
        elements += 2 * a.q_lora_rank if a.q_lora_rank else 0
    return elements


def moe_mlp_activation_bytes_per_token(model: ModelSpec, training: TrainingSpec) -> int:
    """One MoE block's MLP, per token, kept for backward (transformers' MoE blocks):

    * routed: each token goes through `top_k` experts; per (token, expert) the gathered input
      (hidden), the expert's gate/up output, SiLU's output and the product (4 x expert ffn,
      GELU experts 2x), and the expert's output, kept to scale it by the routing weight (hidden);
    * router: the fp32 softmax over experts (tokens x experts x 4 bytes) and the top-k weights
      (fp32) and indices (int64);
    * shared experts: a dense MLP every token goes through (4 x their ffn), and with a gate its
      sigmoid input's product (hidden).
    """
    elem = weight_bytes_per_param(training)
    h, k = model.hidden, model.top_k or 0
    expert_mlp = (4 if model.mlp == "swiglu" else 2) * model.expert_ffn_size
    routed = k * (2 * h + expert_mlp) * elem
    router = FP32_BYTES * model.experts + k * (FP32_BYTES + 8)
    shared_mlp = (4 if model.mlp == "swiglu" else 2) * model.shared_expert_ffn_size * model.shared_experts
    shared = (shared_mlp + (h if model.shared_expert_gate else 0)) * elem
    return routed + router + shared


def has_moe_blocks(model: ModelSpec) -> bool:
    """Whether any of the model's blocks at this depth is a MoE block: a MoE model cut to fewer
    blocks than its dense ones (DeepSeek-V3.2 at 3 of its first 3 dense blocks) trains as a dense
    model, and its terms and phases are a dense model's (h200-2026-12-31c: its expert phases put
    deepseek_v32's peak allocated +39.6% over the run's)."""
    return model.moe_layer_count > 0


def moe_dispatch_bytes(model: ModelSpec, training: TrainingSpec, device: Device) -> int:
    """Token dispatch of one MoE block's forward: the one-hot expert mask transformers builds
    (tokens x top_k x (experts + 1), int64) and the block's zeroed output (tokens x hidden).
    Transient: freed when the block's forward ends (with checkpointing: its recompute)."""
    card = card_of(model, training)
    if card is not None:  # the card's largest forward transient of a block, MoE dispatch or not
        return card.largest_forward_transient(training.micro_batch, training.seq,
                                              training.checkpointing == "full", device) if has_moe_blocks(model) else 0
    if not has_moe_blocks(model):
        return 0
    tokens = tokens_per_micro_batch(training)
    return tokens * ((model.top_k or 0) * (model.experts + 1) * 8 + model.hidden * weight_bytes_per_param(training))


def moe_expert_gradient_bytes(model: ModelSpec, training: TrainingSpec, device: Device) -> int:
    """transformers (v5) stores a block's experts as two fused tensors and indexes them per
    expert; autograd's index backward makes a full-size gradient for each expert used and
    accumulates them: while a MoE block runs backward, both fused tensors' accumulating
    gradients and one fresh full-size gradient are alive (not yet measured on a GPU)."""
    card = card_of(model, training)
    if card is not None:  # the card's block backward transient (checkpointing: with its recompute)
        return card.largest_block_transient(training.micro_batch, training.seq,
                                            training.checkpointing == "full", device) if has_moe_blocks(model) else 0
    if not has_moe_blocks(model):
        return 0
    gate_up = model.experts * (2 if model.mlp == "swiglu" else 1) * model.expert_ffn_size * model.hidden
    down = model.experts * model.expert_ffn_size * model.hidden
    return (gate_up + down + gate_up) * weight_bytes_per_param(training)


def card_of(model: ModelSpec, training: TrainingSpec):
    """The model card the activation terms come from: a card learned from the transformers
    class (`zlayout learn`) prices the transformers implementation, so only with impl "hf"."""
    return model.card if model.card is not None and training.impl == "hf" else None


def layer_activation_bytes(model: ModelSpec, training: TrainingSpec, moe: bool = False) -> int:
    """Tensors one transformer block keeps for backward, one micro-batch, no checkpointing.

    Per token, at the activation dtype: each norm's input and output (4h), the fused QKV
    output that scaled_dot_product_attention keeps as q/k/v (h + 2*kv), the attention output,
    which the output projection reads in place (h: flash attention returns it in the layout
    the projection needs, so no copy is made); the MLP: GELU keeps its input and output
    (2*ffn), SwiGLU the gate/up projection, SiLU's output and the product (4*ffn); a MoE
    block's MLP: `moe_mlp_activation_bytes_per_token`. Flash attention stores no seq x seq
    matrix, only a float32 log-sum-exp per head; norms keep float32 statistics per token.
    """
    h, f = model.hidden, model.ffn_size
    elem = weight_bytes_per_param(training)
    mlp = 0 if moe else (4 if model.mlp == "swiglu" else 2) * f
    per_token = elem * (4 * h + attention_activation_elements(model) + mlp)
    per_token += FP32_BYTES * ((2 if model.norm == "layernorm" else 1) * model.norms_per_layer + model.heads)
    if moe:
        per_token += moe_mlp_activation_bytes_per_token(model, training)
    if not training.flash_attention:
        per_token += elem * model.heads * training.seq  # the math kernel keeps the probabilities
    per_token += model.norms_per_layer * hf_norm_extra_bytes_per_token(model, training)
    return tokens_per_micro_batch(training) * per_token


def hf_norm_extra_bytes_per_token(model: ModelSpec, training: TrainingSpec) -> int:
    """transformers' RMSNorm (Llama, Mistral, Qwen2, Mixtral) is not fused: it casts its input
    to float32, which `pow` and the multiply by rsqrt keep for backward (4 bytes x hidden),
    and the weight multiply keeps the normalised tensor (2 x hidden in bf16), beside the
    output the next projection keeps (2 x hidden): 8 x hidden bytes per token where a fused
    norm keeps its input and output (4 x hidden), 4 x hidden more per norm. Measured on H200 (transformers 5.24, sdpa): 8.13-8.23 x hidden
    bytes per token per block more than zlayout's GPT (two norms), on two shapes."""
    if training.impl != "hf" or model.norm != "rmsnorm":
        return 0
    return FP32_BYTES * model.hidden


# ModelCard.saved_bytes by card (the object itself: a resized card compares equal to the one it
# was made from) and shape: the same for every layout, 0.2 ms a call on a 26-block card
_SAVED_BYTES: dict[tuple[int, int, int, bool], tuple[object, int]] = {}


def saved_activation_bytes(model: ModelSpec, training: TrainingSpec) -> int:
    """Activations alive at the end of the forward pass, every block."""
    card = card_of(model, training)
    if card is not None:
        key = (id(card), training.micro_batch, training.seq, training.checkpointing == "full")
        kept = _SAVED_BYTES.get(key)
        if kept is None or kept[0] is not card:
            if len(_SAVED_BYTES) > 256:
                _SAVED_BYTES.clear()
            kept = _SAVED_BYTES[key] = (card, card.saved_bytes(*key[1:]))
        return kept[1]
    if training.checkpointing == "full":
        # Non-reentrant checkpointing keeps only each block's input.
        return model.layers * tokens_per_micro_batch(training) * model.hidden * weight_bytes_per_param(training)
    return (model.dense_layer_count * layer_activation_bytes(model, training)
            + model.moe_layer_count * layer_activation_bytes(model, training, moe=True))


def recompute_bytes(model: ModelSpec, training: TrainingSpec, device: Device) -> int:
    """With checkpointing, one block's activations are rebuilt during its backward (a MoE
    block's with its token dispatch)."""
    if training.checkpointing != "full":
        return 0
    card = card_of(model, training)
    if card is not None:  # the largest of a block's recompute and backward, from the card
        return card.largest_block_transient(training.micro_batch, training.seq, True, device)
    if has_moe_blocks(model):
        return layer_activation_bytes(model, training, moe=True) + moe_dispatch_bytes(model, training, device)
    return layer_activation_bytes(model, training)


def block_backward_bytes(model: ModelSpec, training: TrainingSpec, device: Device) -> int:
    """Without checkpointing, the most one block's backward holds above its saved activations,
    from the card (a dense model's: a MoE block's is `moe_expert_gradient_bytes`; with
    checkpointing it is `recompute_bytes`). Small where attention is fused; the math attention's
    float32 T x T gradients make it several GiB (Falcon's multi-query attention)."""
    card = card_of(model, training)
    if card is None or has_moe_blocks(model) or training.checkpointing == "full":
        return 0
    return card.largest_block_transient(training.micro_batch, training.seq, False, device)


def head_input_bytes(model: ModelSpec, training: TrainingSpec) -> int:
    """The final norm's input and the output head's input, kept for backward (from a card:
    what the final norm, the head and the loss keep, the outputs dropped)."""
    card = card_of(model, training)
    if card is not None:
        return card.head_saved_bytes(training.micro_batch, training.seq, training.checkpointing == "full")
    return tokens_per_micro_batch(training) * (
        2 * model.hidden * weight_bytes_per_param(training) + hf_norm_extra_bytes_per_token(model, training))


def loss_peak_bytes(model: ModelSpec, training: TrainingSpec, device: Device) -> int:
    """Cross-entropy on fp32 logits: at the start of backward three float32 (tokens x vocab)
    tensors are alive at once: the saved log-softmax, the gradient nll_loss hands back, and
    log-softmax's input gradient. (Forward holds less: the bf16 logits, their fp32 cast and the
    log-softmax.) This is often the largest single activation term of a model with a big
    vocabulary. From a card: the most the loss's and the head's backward hold."""
    card = card_of(model, training)
    if card is not None:
        return card.head_backward_peak_bytes(training.micro_batch, training.seq, training.checkpointing == "full",
                                             device)
    return 3 * FP32_BYTES * tokens_per_micro_batch(training) * model.vocab


def held_outputs_bytes(model: ModelSpec, training: TrainingSpec) -> int:
    """The model's outputs the training loop keeps (`--loop deepspeed`): `outputs =
    engine(...); engine.backward(outputs.loss); engine.step()` holds the bf16 logits (tokens x
    vocab) through backward and the step, until the next forward's outputs replace them.
    Measured on six Llama/Qwen2-class H200 layouts (issue 27): 1.0-10.2% above the
    trainer-loop plan, exactly tokens x vocab x 2 bytes. `--loop trainer` (HF Trainer's
    compute_loss, the verify worker's wrapper) drops them once the loss is taken: 0."""
    if training.loop != "deepspeed":
        return 0
    return tokens_per_micro_batch(training) * model.vocab * weight_bytes_per_param(training)


# ------------------------------------------------------------------ DeepSpeed's buffers


def ipg_bucket_bytes(zero: ZeroKnobs, stage: int, training: TrainingSpec) -> int:
    """Stage 1/2: `setup_buckets` allocates `reduce_bucket_size` elements at the gradient dtype
    at the first gradient hook of each backward, and a second one when `overlap_comm`
    double-buffers. Stage 3: one flat IPG bucket, allocated once at initialization."""
    elem = weight_bytes_per_param(training)
    if stage in (1, 2) and zero.contiguous_gradients:
        return zero.reduce_bucket_size * elem * (2 if zero.overlap_comm else 1)
    if stage == 3 and zero.contiguous_gradients:
        return zero.reduce_bucket_size * elem
    return 0


def stage3_kept_elements(model: ModelSpec, zero: ZeroKnobs, world: int, param_offload: bool) -> int:
    """The gathered weights ZeRO-3 keeps from the forward to the backward
    (`stage3_live_param_elements`), never fewer than the output head's: after the head's forward
    the next module of the trace is the head's own backward, so partitioned_param_coordinator
    .__params_to_release keeps its weight at any positive stage3_max_reuse_distance, and a
    module's own gather is not held back by stage3_max_live_parameters (command-r, 256000 x
    8192 tied: 4.19 GB gathered through the loss's backward, above the 2 GB cap)."""
    live = stage3_live_param_elements(model, zero, world, param_offload)
    if live and zero.stage3_max_reuse_distance > 0:
        live = max(live, model.vocab * model.hidden)
    return live


def stage3_kept_from_card(model: ModelSpec, training: TrainingSpec, zero: ZeroKnobs, kept: int) -> int:
    """The gathered weights at the loss from a card's own tensors (`tensors.stage3_gathered_at_loss`:
    the coordinator's fetches, prefetches and releases replayed over the step's trace), where that
    is more than `kept` (the cap's count): the prefetch overshoots stage3_max_live_parameters by
    the last weight it takes, and the reuse distance keeps whole modules. Phi-3-medium-L6 with its
    weights on the host (h200-2026-12-31g): 1,121M elements against the cap's 1,000M; the run held
    0.35 GiB more than the plan's cap, 0.23 GiB of it this (in-sample). Not for a MoE block (ZeRO-3
    fetches it as one leaf module) or a card that names no tensors' blocks."""
    card = card_of(model, training)
    if not kept or card is None or card.parameter_layers is None or has_moe_blocks(model) \
            or len(card.parameter_layers) != len(card.parameter_numels) \
            or not all(-2 <= layer < model.layers for layer in card.parameter_layers):
        return kept
    tied = model.tie_embeddings if card.tied_embeddings is None else card.tied_embeddings
    return max(kept, _card_gathered_at_loss(card.parameter_numels, card.parameter_layers, model.layers, tied,
                                            training.checkpointing == "full", zero))


@functools.lru_cache(maxsize=256)
def _card_gathered_at_loss(numels: tuple[int, ...], layers: tuple[int, ...], blocks: int, tied: bool,
                           checkpointing: bool, zero: ZeroKnobs) -> int:
    # memoised: break-even's searches plan one card at one depth many times (7 ms a 70B card)
    reach = max(zero.stage3_max_reuse_distance, zero.stage3_max_live_parameters) + max(numels)
    trace, head = stage3_card_trace(numels, layers, blocks, tied, zero.stage3_param_persistence_threshold,
                                    checkpointing, reach)
    return stage3_gathered_at_loss(trace, head, zero)


class Held(NamedTuple):
    """ZeRO-3's gathered weights held by autograd's views (`stage3_held_elements`), elements:
    `live` through the loss, `head` more during the head's backward, `block` more in the last
    block's backward (each phase its own: the trace's gathers differ from phase to phase)."""

    live: int
    head: int
    block: int


def stage3_held_elements(model: ModelSpec, training: TrainingSpec, zero: ZeroKnobs, world: int,
                         param_offload: bool) -> Held:
    """Gathered weights ZeRO-3 releases but cannot free: the card's weights autograd saves as
    views (`BlockCard.zero3_held`, FalconLinear's `input @ self.weight.T`) stay until their
    block's backward, beside what the trace gathers at once from the head's forward on
    (`stage3_regathered_elements`). Without checkpointing every block's forward saves them; with
    it the forward saves nothing and each block's recompute saves its own, held through that
    block's backward only. Zero without such weights, or where a gather is a view of the
    partition. h200-2026-12-09's falcon-7b-L8 trace held 19, 10 and 9 copies of its three
    largest weights at the peak; h200-2026-12-10's falcon-40b-L3 every block's four, the head's
    and one MLP weight more (the head's forward prefetch); h200-2026-12-11's checkpointed
    falcon-40b-L4 none of the blocks' through the loss (+22% when every block's were); its
    falcon-180b-L2 trace, three MLP weights beside the head's in the block's backward."""
    card = card_of(model, training)  # the worker's own model (--impl zlayout) saves no views
    if card is None or (world == 1 and not param_offload):
        return Held(0, 0, 0)
    small = zero.stage3_param_persistence_threshold
    per_layer = [sum(x for x in card.zero3_held(layer) if x > small) for layer in range(model.layers)]
    if not any(per_layer):
        return Held(0, 0, 0)
    ckpt = training.checkpointing == "full"
    regathered = stage3_regathered_elements(model, zero, training.impl, ckpt)
    if regathered is None:  # the block's module order unknown: a whole block beside the head
        head = model.vocab * model.hidden
        regathered = Regathered(head + max(per_layer), head + max(per_layer), 2 * max(per_layer))
    if ckpt:
        live = regathered.loss
        return Held(live, max(0, regathered.head - live), max(0, max(per_layer) + regathered.block - live))
    live = sum(per_layer) + regathered.loss
    return Held(live, regathered.head - regathered.loss, max(0, regathered.block - regathered.loss))


def stage3_offload_reduce_bytes(numel: int, zero: ZeroKnobs, world: int, w: int, elements: int) -> int:
    """ZeRO-3 with the optimizer on the host: what reducing one weight gradient of `numel`
    elements adds on the GPU (stage3.py __reduce_and_partition_ipg_grads -> partition_grads ->
    _offload_grad_partition_at_boundary), `elements`: the model's, which bound a bucket:
    - a gradient larger than reduce_bucket_size is not copied into the IPG bucket
      (__add_grad_to_ipg_bucket): it stays whole in `.grad` until the next gradient's hook
      (or the epilogue) reduces its bucket, where it is alone;
    - reduce_scatter_coalesced concatenates the bucket (torch.cat; partitions are views of it)
      unless it is one tensor that splits evenly over the GPUs; a bucket of several holds at
      most reduce_bucket_size elements;
    - this GPU's partition goes to the pinned host buffer and back (`grad_buffer.to(device)`);
    - _constant_buffered_norm2 casts parts of at most NORM_PART_ELEMENTS to float64, one at a
      time, then the partition is cast to fp32 for its copy to the host; both freed at once."""
    part = -(-numel // world)
    if numel > zero.reduce_bucket_size:
        held, staged = numel * w, 0 if numel % world == 0 else part * world * w
    else:
        held, staged = 0, min(zero.reduce_bucket_size, elements) * w
    return held + staged + part * w + max(part * FP32_BYTES, min(part, NORM_PART_ELEMENTS) * 8)


def persistent_small_param_elements(model: ModelSpec, zero: ZeroKnobs) -> int:
    """ZeRO-3 keeps tensors under `stage3_param_persistence_threshold` elements (norm weights,
    biases, small routers) whole on every GPU instead of gathering them."""
    threshold = zero.stage3_param_persistence_threshold

    def small(sizes: list[int]) -> int:
        return sum(n for n in sizes if n < threshold)

    total = model.dense_layer_count * small(layer_tensor_sizes(model, moe=False))
    total += model.moe_layer_count * small(layer_tensor_sizes(model, moe=True))
    if model.final_norm_params() < threshold:
        total += model.final_norm_params()
    return total


def layers_before_first_reduce(model: ModelSpec, zero: ZeroKnobs) -> int:
    """Blocks whose gradients fill the first reduce bucket (after the head's): their
    activations are freed by the time stage 1/2 allocates the gradient partition."""
    remaining = max(0, zero.reduce_bucket_size - model.vocab * model.hidden)
    return min(model.layers, -(-remaining // model.layer_params()))


def model_init(init: str, stage: int) -> str:
    """How the model is built, with "auto" resolved to the verify worker's way: under
    deepspeed.zero.Init for ZeRO-3, in fp32 on the host otherwise. zero.Init partitions only
    for ZeRO-3; with stages 0-2 the model is built in fp32 on the host as usual."""
    if init == "auto":
        return "zero-init" if stage == 3 else "fp32-cpu"
    if init == "zero-init" and stage < 3:
        return "fp32-cpu"
    return init


def host_init_transients(inp: PlanInput, layout: Layout, init: str) -> tuple[int, int, int]:
    """Host bytes of one rank while the model is set up, beside its libraries: (the model built
    in fp32 and cast, the ZeRO-3 defragment buffer, the libraries' bytes then). Transients: a
    GPU-resident run ends at 1.6-2.2 GiB RSS, its peak is one of these.

    - fp32-cpu: the model is built in fp32 (a tied head's own weight is allocated before it is
      tied: 4 bytes more per V*h, the tied hf and zlayout rows), then DeepSpeed casts it one tensor
      at a time on the host (engine._cast_module_mixed_precision, before module.to(device)): the
      first tensors are cast while the fp32 rest is still there (the embedding: 4P + 2Vh).
    - ZeRO-3 with the weights on the GPU: zero/utils.py defragment() copies this GPU's partition
      into a host buffer (torch.empty(..., device="cpu")) and back: w bytes per element of it.
    CUDA's context is up by then for ZeRO-3 (zero.Init allocates on the GPU) and, with peers,
    before the model is built (DeepSpeed's init_process_group binds device_id when world > 1)."""
    model, hw, t = inp.model, inp.hardware, inp.training
    early = HOST_BASE_EARLY_BYTES + (HOST_TRANSFORMERS_BYTES if t.impl == "hf" else 0)
    build = 0
    if init == "fp32-cpu":
        built = FP32_BYTES * (model.params + (model.vocab * model.hidden if model.tie_embeddings else 0))
        build = max(built, FP32_BYTES * model.params + _host_cast_excess(model, t.impl, weight_bytes_per_param(t)))
        # and the model's buffers, built beside its weights (GPT-Neo's causal masks, 96 MiB at
        # 24 blocks: h200-2026-12-29, 6.30 GiB measured where the weights alone gave 6.11)
        build += model.card.built_buffer_bytes() if model.card is not None else 0
    staging = 0
    if layout.stage == 3 and layout.offload_param == "gpu":
        staging = weight_bytes_per_param(t) * -(-model.params // hw.world)
    if layout.stage == 3 or hw.world > 1:
        early += HOST_CUDA_CONTEXT_BYTES
    return build, staging, early


@functools.lru_cache(maxsize=256)
def _host_cast_excess(model: ModelSpec, impl: str, w: int) -> int:
    """The most the tensor-by-tensor cast to `w` bytes holds above the fp32 model: a tensor's
    copy while the fp32 tensors cast before it are freed (host_init_transients). Memoized: it
    walks every tensor (1137 for Llama-3-405B), on each of break-even's estimates."""
    cast, done = 0, 0
    if w < FP32_BYTES:
        for numel in parameter_tensor_sizes(model, impl):
            cast = max(cast, w * numel - (FP32_BYTES - w) * done)
            done += numel
    return cast


def pinned_bytes(nbytes: int) -> int:
    """PyTorch's pinned-memory allocator rounds every block up to a power of two, and the
    pages are all resident: a 4.8 GB pinned buffer costs 8 GiB of host RAM."""
    return 0 if nbytes <= 0 else 1 << (int(nbytes) - 1).bit_length()


# ------------------------------------------------------------------ the estimate


class _Layout:
    """What every term of one layout reads: the input's parts and the sizes derived from the layout."""

    def __init__(self, inp: PlanInput, layout: Layout) -> None:
        self.model, self.training, self.hw, self.zero = inp.model, inp.training, inp.hardware, inp.zero
        self.device = device_of(self.hw.gpu)  # what a card's reduction scratch is sized for
        self.p, self.n, self.stage, self.ranks = self.model.params, self.hw.world, layout.stage, self.hw.gpus_per_node
        self.w = weight_bytes_per_param(self.training)
        self.opt_on_gpu = layout.offload_optimizer == "gpu"
        self.param_on_gpu = layout.offload_param == "gpu"
        self.p_shard = -(-self.p // (self.n if self.stage >= 1 else 1))
        # fp32 training keeps no separate master copy: the weights are the master.
        self.master_per_param = 0 if self.training.precision == "fp32" else FP32_BYTES
        self.pin = pinned_bytes if self.zero.pin_memory else int
        # ZeRO-3's optimizer sub-groups, this GPU's partition of each (whole tensors until
        # sub_group_size is reached: tensors.stage3_sub_groups): the step, the host's pinned
        # gradient buffers and the NVMe swap buffers are sized by them
        tensors = parameter_tensor_sizes(self.model, self.training.impl)
        self.sub_groups: list[int] = []
        if self.stage == 3:
            self.sub_groups = [part for part, _ in stage3_sub_groups(tensors, self.n, self.zero.sub_group_size)]
        # the largest parameter DeepSpeed flattens (the card's where the class is transformers':
        # Phi-3's fused gate/up above its embedding): ZeRO-1/2's offload staging, the largest request
        self.largest_tensor = max(tensors)
        self.init = model_init(self.training.init, self.stage)
        place: dict[str, Where] = {"gpu": "gpu", "cpu": "host", "nvme": "nvme"}
        self.opt_where, self.param_where = place[layout.offload_optimizer], place[layout.offload_param]
        self.per = f", 1/{self.n} per GPU" if self.n > 1 else ""


class _Terms:
    """The named terms of one estimate, in the order they are added (the plan lists them so)."""

    def __init__(self, ranks: int) -> None:
        self.ranks = ranks
        self.gpu: list[MemoryTerm] = []
        self.host: list[MemoryTerm] = []
        self.nvme: list[MemoryTerm] = []

    def add(self, where: Where, name: str, nbytes: int, category: Category, why: str) -> int:
        """GPU terms are per GPU; host and NVMe terms per node (every rank's share). Returns the
        bytes per rank (0 for a term that is not there)."""
        per_rank = int(nbytes)
        if per_rank <= 0:
            return 0
        if where != "gpu" and self.ranks > 1:
            why += f" (x{self.ranks} ranks)"
        total = per_rank * (self.ranks if where != "gpu" else 1)
        {"gpu": self.gpu, "host": self.host, "nvme": self.nvme}[where].append(
            MemoryTerm(name, where, total, category, why))
        return per_rank


class ModelStates(NamedTuple):
    params: int
    master: int
    moments: int
    grads: int  # on the GPU
    host_grads: int  # ZeRO-3 with the optimizer on the host: the pinned flat partition


class Buffers(NamedTuple):
    ipg: int
    staging: int
    live: int
    persistent: int
    step_fp32: int
    # ZeRO-3 with weights saved as views (`Held`): bytes beyond `live` in the head's backward
    # and in the last block's
    held_head: int
    held_block: int
    # stages 1-2: zeros for the gradients a step gives none (a vision tower's), to step()
    untrained_zeros: int = 0


class Activations(NamedTuple):
    saved: int
    recompute: int
    dispatch: int
    expert_grads: int
    head_in: int
    loss: int
    held: int
    misc: int
    block_backward: int = 0


def model_state_terms(c: _Layout, terms: _Terms) -> ModelStates:
    """Weights, fp32 master, Adam moments and gradients, where the layout puts them."""
    model, t, hw, zero, w, p, p_shard, n, stage = c.model, c.training, c.hw, c.zero, c.w, c.p, c.p_shard, c.n, c.stage
    training = t
    opt_on_gpu, pin, per = c.opt_on_gpu, c.pin, c.per
    master_per_param, opt_where, param_where = c.master_per_param, c.opt_where, c.param_where
    host_grads = 0  # only stage 3 keeps a gradient partition on the host
    params = terms.add(param_where, "parameters", w * (p_shard if stage == 3 else p), "model_states",
                 f"{training.precision} weights" + (per if stage == 3 else ", a full copy on every GPU"))
    master = terms.add(opt_where, "master_weights", master_per_param * p_shard, "model_states",
                 "fp32 master copy of the weights that the optimizer updates" + (per if stage else ""))
    moments = terms.add(opt_where, "adam_moments", ADAM_MOMENTS * FP32_BYTES * p_shard, "model_states",
                  "AdamW exp_avg and exp_avg_sq in fp32" + (per if stage else "")
                  + ("; created at initialization" if stage == 0 else "; created lazily by the first step()"))
    if stage == 0:
        grads = terms.add("gpu", "gradients", w * p, "model_states",
                    f"{training.precision} .grad of every weight, alive from backward to step()")
    elif stage in (1, 2):
        grads = terms.add("gpu", "gradients", w * p_shard if opt_on_gpu else 0, "model_states",
                    f"{training.precision} gradient partition (contiguous_gradients){per}, "
                    "from the first bucket reduced to step()")
    else:
        # with the optimizer offloaded the flat partition is pinned host memory (power-of-two block)
        placed = terms.add("gpu" if opt_on_gpu else "host", "gradients",
                     w * p_shard if opt_on_gpu else pin(w * p_shard), "model_states",
                     f"flat {training.precision} gradient partition allocated at initialization{per}")
        grads, host_grads = (placed, 0) if opt_on_gpu else (0, placed)

    return ModelStates(params, master, moments, grads, host_grads)


def deepspeed_buffer_terms(c: _Layout, terms: _Terms) -> Buffers:
    """DeepSpeed's own GPU buffers: reduce buckets, offload staging, ZeRO-3's gathered and
    persistent weights, the optimizer step's fp32 gradients."""
    model, t, hw, zero, w, p, p_shard, n, stage = c.model, c.training, c.hw, c.zero, c.w, c.p, c.p_shard, c.n, c.stage
    training = t
    opt_on_gpu, param_on_gpu, sub_groups = c.opt_on_gpu, c.param_on_gpu, c.sub_groups
    ipg = terms.add("gpu", "reduce_buckets", ipg_bucket_bytes(zero, stage, training), "deepspeed_buffers",
              f"reduce_bucket_size = {zero.reduce_bucket_size:.0e} elements"
              + (" x2: overlap_comm double-buffers" if zero.overlap_comm and stage in (1, 2) else "")
              + ("; allocated at initialization" if stage == 3 else "; during backward"))
    staging = terms.add("gpu", "offload_staging", c.largest_tensor * w if stage in (1, 2) and not opt_on_gpu
                  else 0, "deepspeed_buffers",
                  "GPU buffer that stages gradients for the host optimizer (the largest tensor)")
    live = persistent = held_head = held_block = 0
    if stage == 3:
        kept = stage3_kept_from_card(model, t, zero, stage3_kept_elements(model, zero, n, not param_on_gpu))
        views = stage3_held_elements(model, training, zero, n, not param_on_gpu)
        held = views.live
        top = max(kept, held)
        held_head, held_block = (w * max(0, held + more - top) for more in (views.head, views.block))
        live = terms.add("gpu", "stage3_live_parameters", w * max(kept, held), "deepspeed_buffers",
                   f"gathered weights kept between forward and backward (stage3_max_reuse_distance and "
                   f"max_live_parameters = {zero.stage3_max_live_parameters:.0e} elements; at least the "
                   f"output head's weight, whole)" if held <= kept else
                   "the output head's weight and the backward's first weights, prefetched from the head's "
                   "forward on (the blocks' own views: from each block's recompute, in its backward)"
                   if t.checkpointing == "full" else
                   "gathered weights every block holds until its backward: the model saves them as views "
                   "(not through F.linear), which ZeRO-3's release cannot free; beside them the output "
                   "head's and the backward's next weights, prefetched from the head's forward on")
        persistent = terms.add("gpu", "stage3_persistent_parameters", w * persistent_small_param_elements(model, zero),
                         "deepspeed_buffers",
                         f"tensors under stage3_param_persistence_threshold = "
                         f"{zero.stage3_param_persistence_threshold:.0e} elements stay whole on every GPU")
    if stage == 0 and training.precision != "fp32":
        # step() casts each gradient to fp32 (a list of copies), then flattens the list.
        step_fp32 = 2 * FP32_BYTES * p
    elif stage in (1, 2) and opt_on_gpu:
        step_fp32 = (w + FP32_BYTES) * p_shard  # flatten(partition) then .to(fp32)
    elif stage == 3 and opt_on_gpu:
        step_fp32 = (w + FP32_BYTES) * max(sub_groups)  # per sub-group, the largest
    else:
        step_fp32 = 0
    step_fp32 = terms.add("gpu", "step_fp32_gradients", step_fp32, "deepspeed_buffers",
                    "gradients flattened and cast to fp32 inside step(), freed after the update")
    card = card_of(model, training)
    untrained = 0
    if stage in (1, 2) and opt_on_gpu and card is not None and card.untrained_params:
        # the end of backward (stage_1_and_2.py ipg epilogue, get_all_grad_tensors) zero-fills the
        # gradient of every parameter in the rank's partition the step gave none, in the training
        # dtype, and keeps the zeros to step(): a whole tensor each, on the rank whose partition
        # holds it (Qwen2.5-VL-3B's vision tower: 1.25 GiB, h200-2026-12-16 call 2 was 1.24 under)
        untrained = w * min(card.untrained_params, p_shard)
    untrained = terms.add("gpu", "untrained_zero_gradients", untrained, "deepspeed_buffers",
                          "zeros DeepSpeed makes at the end of backward for the gradients a text step gives "
                          "none (the vision tower's), kept to step()")

    return Buffers(ipg, staging, live, persistent, step_fp32, held_head, held_block, untrained)


def attention_note(model: ModelSpec, training: TrainingSpec) -> str:
    """How the blocks' attention runs, as the activations term explains it."""
    card = card_of(model, training)
    if card is None:
        return "flash attention" if training.flash_attention else "math attention: the T x T probabilities"
    if card.attention == "eager":
        return "eager attention: the T x T probabilities"
    if "math" in card.attention_kernels:
        return "math attention, no fused kernel takes it: float32 T x T probabilities"
    if card.attention_kernels:
        return " and ".join({"flash": "flash", "efficient": "memory-efficient"}.get(k, k)
                            for k in card.attention_kernels) + " attention"
    return "fused attention"


def linear_attention_note(model: ModelSpec, training: TrainingSpec) -> str:
    """Which kernels a hybrid model's linear-attention or state-space blocks were priced as (the
    card's assumption, core.card.LINEAR_ATTENTION_FLA, STATE_SPACE_TORCH or STATE_SPACE_KERNELS), so every surface that
    shows the activations term says it."""
    card = card_of(model, training)
    if card is None or card.linear_attention_note() is None:
        return ""
    if card.linear_attention == STATE_SPACE_TORCH:
        return "; state-space blocks as transformers' torch reference scan (mamba-ssm's kernels keep less)"
    if card.linear_attention == STATE_SPACE_KERNELS:
        return "; state-space blocks as mamba-ssm's kernels (transformers' per-token loop keeps far more)"
    return (f"; linear-attention blocks as {card.linear_attention} kernels (transformers' torch fallback "
            f"keeps about {TORCH_LOOP_ACTIVATIONS:.1f}x theirs)")


def activation_terms(c: _Layout, terms: _Terms) -> Activations:
    """What the forward keeps for the backward, the loss's and the loop's tensors, small ones."""
    model, t, hw, zero, w, p, p_shard, n, stage = c.model, c.training, c.hw, c.zero, c.w, c.p, c.p_shard, c.n, c.stage
    training = t
    device = c.device
    moe_note = ""
    if has_moe_blocks(model) and t.checkpointing != "full":
        moe_note = (f"; {model.moe_layer_count} MoE blocks keep each token's top-{model.top_k} experts' "
                    f"tensors and fp32 router probabilities over {model.experts} experts")
    saved = terms.add("gpu", "activations", saved_activation_bytes(model, t), "activations",
                f"{model.layers} blocks, micro-batch {t.micro_batch} x seq {t.seq}: "
                + ("only block inputs (checkpointing)" if t.checkpointing == "full"
                   else f"every block's saved tensors ({attention_note(model, t)})") + moe_note
                + linear_attention_note(model, t))
    recompute = terms.add("gpu", "recompute", recompute_bytes(model, t, device), "activations",
                    "one block's activations rebuilt during its backward (checkpointing)"
                    + (", with its token dispatch" if has_moe_blocks(model) else ""))
    dispatch = terms.add("gpu", "moe_dispatch", moe_dispatch_bytes(model, t, device), "activations",
                   "one MoE block's token dispatch in its forward: one-hot expert mask (int64) "
                   "and the zeroed output; transient")
    expert_grads = terms.add("gpu", "moe_expert_gradients", moe_expert_gradient_bytes(model, t, device), "activations",
                       "one MoE block's backward: the fused expert tensors' gradients accumulated "
                       "expert by expert, plus one full-size fresh one (transformers' per-expert indexing)")
    head_in = terms.add("gpu", "head_activations", head_input_bytes(model, t), "activations",
                  "inputs of the final norm and of the output head")
    loss = terms.add("gpu", "loss_logits", loss_peak_bytes(model, t, device), "activations",
               "fp32 log-softmax and its gradients over tokens x vocab when backward starts")
    held = terms.add("gpu", "loop_held_logits", held_outputs_bytes(model, t), "activations",
               "the training loop keeps the model's outputs (bf16 logits, tokens x vocab) until the "
               "next forward replaces them (--loop deepspeed; --loop trainer drops them)")
    misc = terms.add("gpu", "misc", MISC_GPU_BYTES, "overhead", "loss, norms, flags, small NCCL buffers")
    block_backward = terms.add("gpu", "block_backward", block_backward_bytes(model, t, device), "activations",
                               "what one block's backward holds above the activations (from the model card): "
                               "the gradients it makes, alive until it has used or reduced them")

    return Activations(saved, recompute, dispatch, expert_grads, head_in, loss, held, misc, block_backward)


OFFLOAD_CAST = "backward (offload cast)"  # stage 1/2's, the optimizer on the host


def phase_peaks(c: _Layout, states_: ModelStates, buffers: Buffers,
                acts: Activations) -> tuple[dict[str, tuple[int, int]], int]:
    """Each phase's (allocated bytes at its peak, largest single request), and the bytes
    allocated right after deepspeed.initialize."""
    model, t, hw, zero, w, p, p_shard, n, stage = c.model, c.training, c.hw, c.zero, c.w, c.p, c.p_shard, c.n, c.stage
    training = t
    opt_on_gpu, param_where, init = c.opt_on_gpu, c.param_where, c.init
    params, master, moments, grads, _ = states_
    ipg, staging, live, persistent, step_fp32, held_head, held_block, untrained = buffers
    saved, recompute, dispatch, expert_grads, head_in, loss, held, _, block_backward = acts
    resident = params * (param_where == "gpu") + master * opt_on_gpu + staging + persistent
    if stage == 3:
        resident += ipg + grads
    lazy_moments = moments * opt_on_gpu
    if stage == 0:
        resident, lazy_moments = resident + moments, 0  # built eagerly by the fp16/bf16 wrapper
    after_init = resident
    states = resident + lazy_moments
    # Gradients carried between micro-steps of one accumulation window (the untrained ones' zeros
    # too: made at the first micro-step's end, summed into at each later one)
    carried = grads + untrained if t.grad_accum > 1 and stage < 3 else 0
    activations = saved + head_in
    head_grad = model.vocab * model.hidden * w
    tokens = tokens_per_micro_batch(t)
    # Each phase: the bytes allocated at its peak, and the largest single request made there
    # (what the caching allocator must find one free block for).
    loss_request = FP32_BYTES * tokens * model.vocab
    phases = {
        # backward starts: the loss's fp32 tensors on top of every saved activation
        # (stage 1 accumulating: the first micro-step's reduce buckets stay to step(); no
        # reduce epilogue runs between boundaries)
        "backward (loss)": (states + carried + live + activations + loss
                            + ipg * (stage == 1 and t.grad_accum > 1), loss_request),
        # the head's gradient fires the first hook: stage 1/2 buckets appear
        "backward (head)": (states + carried + live + activations + ipg * (stage in (1, 2))
                            + head_grad + tokens * model.vocab * w + held_head,
                            max(head_grad, tokens * model.vocab * w)),
        "optimizer step": (states + (grads if stage < 3 else 0) + untrained + step_fp32,
                           step_fp32 - step_fp32 * w // (w + FP32_BYTES) if stage else step_fp32 // 2),
    }
    if stage in (1, 2) and opt_on_gpu:
        # the first bucket is reduced: the gradient partition is allocated while most
        # activations (all but the blocks that filled the bucket) are still alive
        done = layers_before_first_reduce(model, zero)
        remaining = saved * (model.layers - done) // model.layers
        transient = model.layer_params() * w + 2 * tokens * model.hidden * w
        phases["backward (first reduce)"] = (states + grads + ipg + remaining + recompute + transient, grads)
    if stage in (1, 2) and not opt_on_gpu:
        phases[OFFLOAD_CAST] = stage12_offload_cast_phase(c, states, saved, head_in, recompute, ipg)
    if stage == 3 and c.opt_where == "host":
        phases.update(stage3_offload_reduce_phases(c, states, live, saved, recompute, head_in))
    card = card_of(model, t)
    if card is not None and not has_moe_blocks(model):
        # the first block's backward (the last block): every block's activations, the head's freed,
        # and what the block's backward holds above them (with checkpointing its recompute, the
        # `recompute` term). The head's phases dominate where attention is fused; not where a
        # block's backward is large: the math attention's float32 T x T gradients (Falcon's
        # multi-query attention, which no fused kernel takes)
        ckpt = t.checkpointing == "full"
        phases["backward (last block)"] = (states + carried + live + saved + recompute + block_backward
                                           + ipg * (stage in (1, 2)) + held_block
                                           + head_grad * (stage == 0),
                                           card.largest_block_request(t.micro_batch, t.seq, ckpt, c.device))
    if stage == 3 and init == "bf16-gpu":
        # the whole model on every GPU before deepspeed.initialize partitions it
        phases["model build"] = (w * p, c.largest_tensor * w)
    if stage == 0:
        phases["backward (end)"] = (states + grads + recompute, c.largest_tensor * w)
    if has_moe_blocks(model):
        gate_up_numel = model.experts * (2 if model.mlp == "swiglu" else 1) * model.expert_ffn_size * model.hidden
        mask_bytes = tokens * (model.top_k or 0) * (model.experts + 1) * 8
        # the last MoE block's forward: every earlier block's activations and its dispatch
        phases["forward (MoE dispatch)"] = (states + carried + live + saved + dispatch,
                                            max(mask_bytes, tokens * model.hidden * w))
        # the last MoE block's backward: its expert gradients built while most activations live
        phases["backward (experts)"] = (states + carried + live + activations + recompute
                                        + ipg * (stage in (1, 2)) + expert_grads, gate_up_numel * w)
    if held:
        # alive in every phase of a training step from the second on (the model build excepted)
        phases = {name: (allocated + held * (name != "model build"), request)
                  for name, (allocated, request) in phases.items()}
    return phases, after_init


def largest_block_tensor_numel(model: ModelSpec) -> int:
    """The largest weight of any kind of block (dense, MoE), as transformers lays it out."""
    kinds = [False] * (model.dense_layer_count > 0) + [True] * (model.moe_layer_count > 0)
    return max(max(layer_tensor_sizes(model, moe=moe)) for moe in kinds or [False])


def block_gradient_at_next_hook(c: _Layout, recompute: int) -> tuple[int, int]:
    """The largest weight gradient a block's backward makes (elements), and what that backward
    holds above its start at the next weight gradient's hook, where a gradient larger than the
    reduce bucket is reduced: from a card (`ModelCard.largest_weight_gradient`); by hand the
    largest block tensor, with the whole block's recompute."""
    t, w = c.training, c.w
    card = card_of(c.model, t)
    found = card.largest_weight_gradient(t.micro_batch, t.seq, t.checkpointing == "full", w) if card else None
    if found is None:
        return largest_block_tensor_numel(c.model), recompute
    return found.bytes // w, found.live_at_next_hook


def stage12_offload_cast_phase(c: _Layout, states: int, saved: int, head_in: int, recompute: int,
                               ipg: int) -> tuple[int, int]:
    """Stage 1/2 with the optimizer on the host (stage_1_and_2.py copy_grads_in_partition, at the
    boundary): each reduced gradient's partition gets `set_norm_for_param_grad_in_gpu`, a float64
    copy of the whole partition (`.to(float64).norm(2)`: 8 bytes an element, not in parts as
    stage 3's _constant_buffered_norm2), freed before `async_inplace_copy_grad_to_fp32_buffer_
    from_gpu` casts it to fp32 (4 bytes) for the pinned host partition.
    - A gradient larger than reduce_bucket_size is held whole in `.grad` (extra_large_param_to_
      reduce; cloned first where the offload's gradient safety is on, the original freed) and
      reduced alone at the next gradient's hook, or by the reduce epilogue if it is the last. An
      untied head's: at the final norm's hook, the loss's tensors and the head's inputs freed, no
      block recomputed yet (Llama-3-8B's 525M-element head with checkpointing, deepseek_v3's 927M:
      the peak of both H200 rows). A tied embedding's (the sum of the head's and the embedding's
      gradients, hooked once) is the last gradient of the backward: reduced by the epilogue, every
      activation freed (gemma-2-9b-L8's 917.5M, whose backward peaked at the loss instead: bounded
      with every activation it was planned 5.3% over). A block's: the head's and the loss's
      tensors freed long before, every block's saved activations and what this block's backward
      holds at the next weight gradient's hook (a card's `largest_weight_gradient`; by hand the
      recompute). Counted with the head's inputs and the whole block, the fused experts of
      dots.llm1 L2 (gate_up 1.48e9 elements, reduced at the router's hook) were planned 11.4% over
      and granitemoeshared's 7.9% (h200-2026-12-31f, 12-31c).
    - One that fits the bucket is copied into it; kept as it was, the bf16 gradient and its fp32
      cast with every activation (a bound: the bucket is flushed once later gradients fill it).
    The largest tensor's (a tied embedding above the bucket: the larger of its and the blocks'
    largest): (allocated bytes, the largest request)."""
    model, zero, w = c.model, c.zero, c.w
    every = saved + head_in + recompute

    def cast(numel: int, alive: int) -> tuple[int, int]:
        if numel <= zero.reduce_bucket_size:
            return states + every + ipg + numel * (w + FP32_BYTES), numel * FP32_BYTES
        part = min(numel, c.p_shard)  # this GPU's share of it (grad_position's num_elements)
        return states + alive + ipg + numel * w + part * 8, part * 8

    largest, vocab = c.largest_tensor, model.vocab * model.hidden
    if largest != vocab and largest > zero.reduce_bucket_size:  # a block's, at the next gradient's hook
        numel, held = block_gradient_at_next_hook(c, recompute)
        return cast(largest, saved + (held if numel == largest else recompute))
    if largest <= zero.reduce_bucket_size:
        return cast(largest, every)
    if not model.tie_embeddings:
        return cast(vocab, saved)  # the head's
    return max(cast(vocab, 0), cast(largest_block_tensor_numel(model), every))


def stage3_offload_reduce_phases(c: _Layout, states: int, live: int, saved: int, recompute: int,
                                 head_in: int) -> dict[str, tuple[int, int]]:
    """ZeRO-3 with the optimizer on the host: the largest gradients' reductions
    (stage3_offload_reduce_bytes), each with what is alive while it runs:
    - the embedding's (the first weight; tied, the sum of the head's and the embedding's
      gradients) is the last gradient made, reduced by the backward's epilogue
      (engine._backward_epilogue -> allreduce_gradients -> independent_gradient_partition_epilogue)
      once every activation is freed, with its weight still gathered: input ids need no
      gradient, so the embedding's post-backward release never fires, and
      release_backward_leftovers (optimizer.backward_epilogue) runs after the reduction;
    - a gradient larger than reduce_bucket_size is reduced alone, at the next gradient's hook:
      an untied head's at the final norm's, every block's activations and the head's inputs
      alive, the head's weight released (its next use is beyond any reuse distance); a block's
      largest in the backward of the last block (the first to run), the blocks below still
      holding theirs, and from a card what that block holds at the next weight gradient's hook
      (by hand all of it, with its recompute when checkpointed); in a sparse MoE block that
      ZeRO-3 treats as a leaf module (tensors.zero3_leaf_moe_tensor_sizes: Mixtral, Qwen2-MoE,
      Qwen3-MoE) with the block's gradients that come after it in parameter order (Mixtral's
      down projection's, behind its gate/up: Mixtral-8x22B-L2, -5.2% without them). One that
      fits the bucket is reduced once later gradients fill it, activations freed meanwhile: the
      other phases hold more (every measured ZeRO-3 offload row).
    Each: (allocated bytes, the largest request: the fp32 cast of the partition, or the whole
    gradient)."""
    model, t, zero, w, n = c.model, c.training, c.zero, c.w, c.n
    gather = n > 1 or not c.param_on_gpu

    def reduce(numel: int) -> int:
        return stage3_offload_reduce_bytes(numel, zero, n, w, model.params)

    def request(numel: int) -> int:
        return max(-(-numel // n) * FP32_BYTES, numel * w * (numel > zero.reduce_bucket_size))

    embedding = parameter_tensor_sizes(model, t.impl)[0]
    phases = {"backward (embedding reduce)": (states + (-(-embedding // n) * n * w if gather else 0)
                                              + reduce(embedding), request(embedding))}
    head = model.vocab * model.hidden
    card = card_of(model, t)
    if not model.tie_embeddings and head > zero.reduce_bucket_size:
        # from a card, what the head's phase still holds at the final norm's hook: the loss's
        # tensors are freed by then (cwm at 4 blocks, h200-2026-12-31: the forward's 2.0 GiB
        # counted whole put this phase 1.86 GiB over the traced peak)
        held_head = card.head_held_at_next_hook(t.micro_batch, t.seq, t.checkpointing == "full", w, head) \
            if card is not None else None
        phases["backward (head reduce)"] = (states + max(0, live - head * w) + saved
                                            + (head_in if held_head is None else held_head) + reduce(head),
                                            request(head))
    numel, held = block_gradient_at_next_hook(c, recompute)
    leaf = zero3_leaf_moe_tensor_sizes(model, t.impl)
    if numel in leaf:
        # a leaf MoE block's gradients are handed over together at the block's end: those
        # after this one in parameter order are still alive while it is reduced
        held += w * sum(leaf[leaf.index(numel) + 1:])
    if numel > zero.reduce_bucket_size:
        phases["backward (block reduce)"] = (states + live + saved + held + reduce(numel), request(numel))
    return phases


def outside_allocator_terms(c: _Layout, terms: _Terms) -> int:
    """Device memory PyTorch's allocator does not see: the CUDA context, NCCL's buffers, the
    offload margin."""
    hw, n, param_on_gpu = c.hw, c.n, c.param_on_gpu
    context = terms.add("gpu", "cuda_context", hw.gpu.cuda_context_bytes, "overhead",
                  "CUDA context and cuBLAS workspace, outside PyTorch's allocator")
    context += terms.add("gpu", "nccl_buffers", NCCL_BUFFER_BYTES if n > 1 else 0, "overhead",
                   "NCCL communicator buffers, outside PyTorch's allocator")
    context += terms.add("gpu", "offload_copy_margin", OFFLOAD_COPY_MARGIN_BYTES if not param_on_gpu else 0, "overhead",
                   "margin for blocks whose frees wait on host copies (weights on the host), not modelled: "
                   "the largest device-used shortfall measured on one-GPU full-offload runs")
    return context


def host_terms(c: _Layout, terms: _Terms, inp: PlanInput, layout: Layout, states_: ModelStates) -> int:
    """Host memory per node: offloaded states, pinned buffers, libraries, the set-up transients."""
    model, t, hw, zero, w, p, p_shard, n, stage = c.model, c.training, c.hw, c.zero, c.w, c.p, c.p_shard, c.n, c.stage
    training = t
    pin, sub_groups, opt_where, param_where, init, ranks = c.pin, c.sub_groups, c.opt_where, c.param_where, c.init, c.ranks
    params, master, moments, _, host_grads = states_
    host_states = host_grads
    if opt_where == "host":
        host_states += master + moments
        if stage in (1, 2):
            host_states += terms.add("host", "offload_pinned_buffers",
                               pin(FP32_BYTES * p_shard) + pin(w * p_shard) + pin(master) - master,
                               "deepspeed_buffers",
                               "pinned fp32 gradient partition and bf16 upload buffer; pinned blocks "
                               "round up to a power of two")
            # stage_1_and_2.py: temp_grad_buffer_for_cpu_offload, the host side of the GPU's
            # offload_staging, pinned at initialization
            host_states += terms.add("host", "offload_gradient_staging", pin(w * c.largest_tensor),
                               "deepspeed_buffers",
                               "pinned buffer that receives the largest tensor's gradient from the GPU")
        else:
            host_states += terms.add("host", "offload_pinned_buffers",
                               sum(pin(FP32_BYTES * part) for part in sub_groups),
                               "deepspeed_buffers",
                               "pinned fp32 sub-group gradient buffers (power-of-two blocks)")
    # stage3.py _reassign_or_swap_out_partitioned_parameters copies each updated fp32 sub-group
    # into the GPU's bf16 partition with a blocking copy_, and PyTorch converts a CPU->GPU copy
    # of another dtype on the CPU first: a bf16 temporary of the sub-group beside every state
    # (h200-2026-12-30 MiniMax-M2: 4.7 GiB under without it; its largest sub-group 3.08e9 elements)
    host_states += terms.add("host", "step_upload_cast",
                             w * max(sub_groups) if stage == 3 and opt_where != "gpu" and param_where == "gpu"
                             and w != FP32_BYTES else 0, "deepspeed_buffers",
                             "the largest sub-group's updated weights cast to the training dtype on the host "
                             "before they go to the GPU, inside step()")
    if param_where == "host":
        # zero.Init pins each tensor's partition as it builds it (partition_parameters.py
        # _partition_param); the flat buffer takes them over (stage3.py _move_to_flat_buffer) and
        # PyTorch's pinned allocator caches the freed blocks, each rounded to a power of two
        # (h200 results-l, Falcon-7B L8: 2.4 GiB under when they were counted at their size)
        copies = sum(pin(w * -(-x // n)) for x in parameter_tensor_sizes(model, t.impl))
        host_states += params + terms.add("host", "param_offload_buffers", pin(w * p_shard) - params + copies,
                                    "deepspeed_buffers",
                                    "pinned flat weight buffer and the per-tensor pinned partitions zero.Init "
                                    "makes before flattening, which the pinned allocator keeps cached "
                                    "(power-of-two blocks)")
    if opt_where == "nvme":
        host_states += terms.add("host", "nvme_swap_buffers",
                           AIO_OPTIMIZER_BUFFER_COUNT * pin(FP32_BYTES * max(sub_groups)),
                           "deepspeed_buffers", "pinned buffers the optimizer state is swapped through")
    if param_where == "nvme":
        host_states += terms.add("host", "nvme_param_buffers", AIO_PARAM_BUFFER_COUNT * AIO_PARAM_BUFFER_ELEMENTS * w,
                           "deepspeed_buffers", "pinned buffers weights are read from NVMe into")
    terms.add("host", "process_baseline", HOST_BASE_BYTES, "overhead",
        "Python, torch, CUDA, NCCL and DeepSpeed's libraries")
    build, staging, early = host_init_transients(inp, layout, init)
    terms.add("host", "model_construction", build, "model_states",
        "the training script builds the model in fp32 on the host, every rank, and DeepSpeed casts it "
        "there before moving it (--init: zero-init, bf16-gpu or meta avoid it)")
    terms.add("host", "defragment_staging", staging, "deepspeed_buffers",
        "ZeRO-3 copies the GPU's weight partition to a host buffer while it defragments them")
    host_rank = max(early + build, early + staging, HOST_BASE_BYTES + host_states)
    host_peak = host_rank * ranks

    return host_peak


REQUEST_ORDER = ("what the replayed requests hold at once above the per-phase peak: tensors of two phases "
                 "alive together")


def estimate_memory(inp: PlanInput, layout: Layout, replay: bool = True) -> MemoryEstimate:
    """Peak GPU (allocated and reserved), host and NVMe bytes for one layout: the terms by kind
    (model_state_terms, deepspeed_buffer_terms, activation_terms, outside_allocator_terms,
    host_terms), the phases they peak in (phase_peaks), then the caching allocator's reserve.

    `replay=False` skips the allocator replay (`allocator_sim`): peak reserved and device used
    then come from the per-phase rule, and the default allocator's verdict from that rule
    too (break-even's searches pass it, then check their boundary with the replay)."""
    c = _Layout(inp, layout)
    hw, t, n = c.hw, c.training, c.n
    terms = _Terms(c.ranks)
    states_ = model_state_terms(c, terms)
    buffers = deepspeed_buffer_terms(c, terms)
    acts = activation_terms(c, terms)
    misc = acts.misc
    phases, after_init = phase_peaks(c, states_, buffers, acts)
    peak_phase = max(phases, key=lambda name: phases[name][0])
    peak = int(phases[peak_phase][0]) + misc
    context = outside_allocator_terms(c, terms)
    if replay and t.allocator == "expandable":
        # the requests in their order hold what they hold whatever the allocator places them in
        from zlayout.core.allocator_sim import replayed_peak_allocated

        ordered = replayed_peak_allocated(inp, layout)
        if ordered is not None:
            bound = peak
            peak_phase, peak = _replay_places_offload_cast(inp, layout, phases, peak_phase, peak, ordered)
            misc += peak - bound  # expandable segments reserve the replayed peak, not the bound
        if ordered is not None and ordered > peak:
            terms.add("gpu", "request_order", ordered - peak, "overhead", REQUEST_ORDER)
            misc += ordered - peak  # expandable segments reserve the peak: every phase's share of it
            peak = ordered
    allocator = caching_allocator(phases, misc, t.allocator)
    replayed, flushes = None, None
    # cudaMalloc hands out the card less what the driver keeps (cudaMemGetInfo's total)
    allocatable = hw.gpu.memory_bytes - hw.gpu.driver_reserved_bytes
    usable = min(int(hw.gpu.memory_bytes * (1 - inp.headroom_fraction)), allocatable)
    if replay and t.allocator == "default" and peak + context < allocatable:
        # only a layout whose allocated peak fits the card is replayed, on the card
        from zlayout.core.allocator_sim import replay_at_capacity, replayed_allocated_counts

        small = small_pool_bytes(c.model, t)
        flushes = replay_at_capacity(inp, layout, allocatable - context - small)
        within = None
        if flushes is not None and not flushes.out_of_memory and flushes.peak_reserved > usable - context - small:
            # the headroom holds for where best fit puts the blocks too: the step must also run
            # on the card less the headroom (see allocator_on_the_card)
            within = replay_at_capacity(inp, layout, usable - context - small)
        if flushes is not None and replayed_allocated_counts(inp, layout):
            if not flushes.out_of_memory:
                peak_phase, peak = _replay_places_offload_cast(inp, layout, phases, peak_phase, peak,
                                                               flushes.peak_allocated)
            if flushes.peak_allocated > peak:
                # the card's requests in their order hold more at once than the per-phase sum
                # (Falcon-7B, h200-2026-12-18): the run's max_memory_allocated is the replay's
                terms.add("gpu", "request_order", flushes.peak_allocated - peak, "overhead", REQUEST_ORDER)
                peak = flushes.peak_allocated
        if flushes is not None:
            replayed, allocator = allocator_on_the_card(flushes, phases, misc, peak, usable - context, small,
                                                        within, inp.headroom_fraction)
    # On a card that cannot hold every cached segment the allocator frees them and retries:
    # what it reserves then is bounded by the card, never below what the peak needs.
    reserved = max(peak if replayed else allocator.needed_bytes,
                   min(allocator.reserved_bytes, allocatable - context))
    terms.add("gpu", "allocator_reserve", reserved - peak, "overhead", allocator.explanation)

    host_peak = host_terms(c, terms, inp, layout, states_)
    gpu, host, nvme = terms.gpu, terms.host, terms.nvme

    cap = hw.gpu.memory_bytes
    retries = flushes.retries_per_step if flushes is not None and replayed else None
    return MemoryEstimate(
        layout=layout, terms=tuple(gpu + host + nvme),
        gpu_peak_allocated_bytes=peak, gpu_peak_reserved_bytes=reserved,
        gpu_device_used_bytes=reserved + context, gpu_needed_bytes=allocator.needed_bytes + context,
        host_peak_bytes=host_peak, nvme_bytes=sum(term.bytes for term in nvme),
        gpu_capacity_bytes=cap, host_capacity_bytes=hw.host_ram_bytes, nvme_capacity_bytes=hw.nvme_bytes,
        gpu_usable_bytes=usable,
        peak_phase=peak_phase, after_init_bytes=after_init,
        gpu_flushes_per_step=retries,
        gpu_flush_cost_s=flush_cost_s(retries, flushes.freed_per_step) if retries else 0.0,  # type: ignore[union-attr]
        gpu_driver_reserved_bytes=hw.gpu.driver_reserved_bytes,
    )


def _replay_places_offload_cast(inp: PlanInput, layout: Layout, phases: dict[str, tuple[int, int]],
                                peak_phase: str, peak: int, replayed_peak: int) -> tuple[str, int]:
    """Stage 1/2 with the optimizer on the host, a carded model (`allocator_sim.offload_cast_
    replayed`): the replay's peak allocated is the run's, below the per-phase rule where that
    bounds what it cannot order (the offload cast of a gradient that fits the bucket, beside
    every activation; the head's gradient beside both reduce buckets); above it, `request_order`
    adds the difference. The peak's phase: the highest but the cast's bound."""
    from zlayout.core.allocator_sim import offload_cast_replayed

    if not offload_cast_replayed(inp, layout) or replayed_peak >= peak:
        return peak_phase, peak
    rest = [name for name in phases if name != OFFLOAD_CAST]
    return max(rest, key=lambda name: phases[name][0]), replayed_peak


@dataclass(frozen=True, slots=True)
class AllocatorEstimate:
    needed_bytes: int  # the least reserved memory the peak can run in (decides "fits")
    reserved_bytes: int  # max_memory_reserved when nothing presses the allocator
    explanation: str


# Requests of 1 MiB or less live in the small pool's 2 MiB segments (kSmallSize, kSmallBuffer),
# which the large-pool replay does not see: the loss, flags, and what each block saves that is
# that small. `reserved_bytes.small_pool.peak` read 0.01-0.02 GiB on most H200 runs (the floor);
# at the card's edge it is what each block keeps: flash attention's fp32 logsumexp (b x heads x s)
# and the norms' fp32 per-token statistics (LayerNorm: mean and rstd; RMSNorm: rstd), live from
# the forward to the block's backward. Measured (edge sweeps, h200-2026-12-02c/heldout): 74 MiB at
# 64 and 65 layers of shape D (1 MiB + 2 x 64 KiB a block: 72 MiB + one segment), 154 and 156 MiB at
# 101 and 102 of shape E (1 MiB + 4 x 128 KiB: 152 and 154 MiB + one). Such a segment holds a live
# tensor at the peak, so a retry cannot free it.
SMALL_POOL_BYTES = 20 * 2**20
SMALL_REQUEST_BYTES = 2**20  # kSmallSize
SMALL_SEGMENT_BYTES = 2 * 2**20  # kSmallBuffer


def small_pool_bytes(model: ModelSpec, training: TrainingSpec) -> int:
    """Peak reserved bytes of the small pool: the floor, or each block's small saved tensors
    packed into 2 MiB segments plus one segment for the rest (loss, flags). A checkpointed
    block keeps only its input (large), its statistics are made again in backward."""
    if training.checkpointing != "none":
        return SMALL_POOL_BYTES
    tokens = training.micro_batch * training.seq
    saved = [4 * tokens] * (2 if model.norm == "rmsnorm" else 4)  # two norms a block
    if training.flash_attention:
        saved.append(4 * training.micro_batch * model.heads * training.seq)  # logsumexp
    per_block = sum(x for x in saved if x <= SMALL_REQUEST_BYTES)
    segments = -(-per_block * model.layers // SMALL_SEGMENT_BYTES) + 1
    return max(SMALL_POOL_BYTES, segments * SMALL_SEGMENT_BYTES)


def replayed_reserved_bytes(inp: PlanInput, layout: Layout) -> int | None:
    """Peak reserved bytes of the default allocator replayed over two training steps
    (`allocator_sim`: ZeRO 0-2 with the optimizer on the GPU or the CPU, ZeRO-3 with or without CPU
    offload, dense bf16 models and Mixtral's MoE blocks), or None for a layout it does not replay."""
    if inp.training.allocator != "default":
        return None
    from zlayout.core.allocator_sim import replayed_peak_reserved

    peak = replayed_peak_reserved(inp, layout)
    return None if peak is None else peak + small_pool_bytes(inp.model, inp.training)


def allocator_on_the_card(at_card, phases: dict[str, tuple[int, int]], misc: int, peak: int,
                          usable: int, small: int = SMALL_POOL_BYTES, within=None,
                          headroom: float = 0.0) -> tuple[int | None, AllocatorEstimate]:
    """The default allocator's figures from its replay on the card (`allocator_sim.replay_at_capacity`,
    which frees the cache and retries where cudaMalloc fails, as PyTorch does): (peak reserved,
    or None where the replay ran out of memory; the estimate). What the step needs: where a
    retry was made, what the tightest one needed (reserved after freeing the cache + its
    segment), at least the allocated peak; where none was, the per-phase rule's figure, or the
    replay's peak reserved where that is less (the run never pressed the card). `usable`: the
    card less the headroom and the context, which the verdict compares; `small`: the small pool
    (small_pool_bytes), beside the replayed large pools.

    `within`: the same steps replayed on the card less the `headroom` fraction, where the whole
    card's reserve reaches into it. Near the edge best fit is chaotic in the card's size: Qwen3-8B
    at ZeRO-1, 2 x 4096, one H200, runs out of memory at 22 layers on the whole card but runs on
    one 2-8 GiB smaller, and 23 layers runs on the whole card but not on one 6 GiB smaller
    (`benchmarks/edge_bands.py`). A headroom that covered the allocated bytes and not where they
    land would call 23 layers a fit and 22 not; so the step that fits runs on both cards, and one
    that runs out on the smaller card needs more than it (what that replay's failing request
    needed)."""
    rule = caching_allocator(phases, misc, "default")
    if at_card.out_of_memory:
        later = at_card.ran_out_step > 1
        return None, AllocatorEstimate(max(rule.needed_bytes, at_card.needed + small), rule.reserved_bytes,
                                       "caching allocator on the card: a request no freed cache makes room for"
                                       + (f", in {at_card.ran_out_in} (the steps before it run: a shorter "
                                          "run passes)" if later else ""))
    replayed = at_card.peak_reserved + small
    estimate = caching_allocator(phases, misc, "default", replayed)
    if at_card.retries:
        every = at_card.retries_per_step
        why = ("caching allocator, replayed on the card until its steps repeat: it fills the card and frees its cache "
               + (f"about {every} time{'s' if every != 1 else ''} a step" if every
                  else f"{at_card.retries} time{'s' if at_card.retries != 1 else ''} while the first step grows it")
               + " (cudaMalloc retries); segments split by smaller tensors stay reserved")
        estimate = AllocatorEstimate(max(at_card.needed + small, peak), estimate.reserved_bytes, why)
    elif rule.needed_bytes > usable:
        # never below the allocated peak: the replay's requests are the hand model's, and a
        # model card's activations (zlayout learn) can be above them
        estimate = AllocatorEstimate(min(rule.needed_bytes, max(replayed, peak)),
                                     estimate.reserved_bytes, estimate.explanation)
    if within is None:
        return replayed, estimate
    if within.out_of_memory:
        where = f", in {within.ran_out_in}" if within.ran_out_step else ""
        return replayed, AllocatorEstimate(
            max(estimate.needed_bytes, within.needed + small), estimate.reserved_bytes,
            f"caching allocator: the steps run on the whole card, but on a card {headroom:.0%} smaller "
            f"(the headroom asked for) a request finds no room even after freeing the cache{where}: at this edge "
            "where best fit places the blocks decides, so the headroom must cover it too")
    # it ran on the smaller card too: it needs at least what the tightest retry there needed
    return replayed, AllocatorEstimate(max(estimate.needed_bytes, within.needed + small), estimate.reserved_bytes,
                                       estimate.explanation)


def caching_allocator(phases: dict[str, tuple[int, int]], misc: int, kind: str,
                      replayed: int | None = None) -> AllocatorEstimate:
    """Reserved memory from the phases' (allocated, largest request) pairs.

    `replayed`: peak reserved from replaying the layout's allocations through the caching
    allocator (`allocator_sim`); where there is one it is what a card with room reserves.

    The default allocator needs, in each phase, its allocated bytes, and at the optimizer step
    also the part of the step transient's old segment that smaller blocks keep reserved
    (TRAPPED_FRACTION); the worst phase decides. On a card with room it frees nothing, so every phase's trapped
    segment is still cached at the peak: reserved is the peak plus the largest trapped part of
    any phase. Expandable segments need only the peak plus page rounding.
    """
    peak = max(allocated for allocated, _ in phases.values()) + misc
    cached_trapped = max(int(TRAPPED_FRACTION * request) for _, request in phases.values())
    # Under pressure only the optimizer step's transient finds its old segment split (the
    # whole next forward and backward allocate into the cache before it is asked for again);
    # backward's loss tensors get their own cached segments back: shape B (ZeRO-2, peak at the
    # loss) ran at 134.84 GiB allocated on a 139.8 GiB card, 7.05 GiB less than 0.90 x its
    # 7.83 GiB loss request would have needed.
    default_needed = max(allocated + misc + (int(TRAPPED_FRACTION * request) if name == "optimizer step" else 0)
                         for name, (allocated, request) in phases.items())
    cached = peak + cached_trapped
    if kind == "expandable":
        return AllocatorEstimate(peak + EXPANDABLE_SLACK_BYTES, max(cached, peak + EXPANDABLE_SLACK_BYTES),
                                 "expandable segments: 2 MiB pages mapped as needed; free pages "
                                 "stay cached until memory runs short")
    if replayed is not None:
        return AllocatorEstimate(default_needed, max(replayed, peak),
                                 "caching allocator, replayed until its steps repeat: a tensor no cached "
                                 "block of its stream holds gets a new segment; segments split by "
                                 "smaller tensors stay reserved")
    return AllocatorEstimate(default_needed, max(cached, default_needed),
                             "caching allocator: segments of the largest transients (fp32 "
                             "gradients, loss) stay reserved by smaller blocks carved from them")
