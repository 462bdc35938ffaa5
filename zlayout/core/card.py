"""A model card as the planner reads it: data in, bytes out, no torch and no I/O.

A card (written by `zlayout learn`, read from TOML by `zlayout.cards`) records, for each kind
of block and for the head and loss, the requests each phase makes of the allocator in order:
+bytes for an allocation, -bytes for a free, each a function of one sequence's token count
`q*T^2 + a*T + c` (q is not 0 only where something grows with T^2: eager attention's
probabilities, attention's FLOPs). At micro-batch `b` a request is `b*(q*T^2 + a*T) + c`: what
grows with tokens grows with the batch, a weight's gradient does not.

From the requests: what a phase leaves allocated (their sum) and the most it holds at once
above what it started with (the largest running sum).

A card may also record each phase's work (`work`; cards learned before it have none, and the
step time then takes the hand-counted model): per op its FLOPs, the bytes it moves, its kernel
launches and the ops that launched them (a sort is one op of a dozen kernels; cards learned before
the ops were recorded have three polynomials, and there each launch is an op), the same
polynomials (a weight read or a kernel count is the constant: it does not grow with the batch).
`WorkPhase.totals` sorts the ops for the step-time model: GEMMs, batched GEMMs (eager attention's
T^2 matmuls), the fused attention kernels, and the memory-bound rest.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from dataclasses import dataclass, replace
from typing import Any, Mapping, NamedTuple

from zlayout.core.reductions import REDUCTION_EVENTS, Device, Reduction, scratch_bytes

Poly = tuple[float, float, float]


# ------------------------------------------------------------- hybrid linear attention
# Qwen3.5 / Qwen3-Next (and OLMo-Hybrid, Lara-Mini, Qwen4-Exp) interleave full-attention blocks with
# gated-delta-rule blocks. transformers (models/qwen3_5/modeling_qwen3_5.py and the others':
# `torch_chunk_gated_delta_rule`, `causal_conv1d_fn`) runs flash-linear-attention's and
# causal-conv1d's CUDA kernels when those packages import, else a Python loop over 64-token chunks
# and F.conv1d (integrations/hub_kernels.py, `use_kernel_func_from_hub_with_fallback`). zlayout
# learn prices the kernels, which transformers' warning and Qwen's model cards tell users to
# install; the card says so, and its key differs from the same config's without the assumption
# (zlayout.cards.config_key), so no other card is served.
LINEAR_ATTENTION_FLA = "flash-linear-attention + causal-conv1d"
# config.json model types whose modeling module has those two functions (transformers 5.24), called
# with the same arguments (learn/trace.py, LINEAR_ATTENTION_PACKAGES): Qwen3.5, Qwen3-Next, OLMo-Hybrid,
# Lara-Mini and Qwen4-Exp (qwen4_exp_vision, its vision tower's config, has none)
LINEAR_ATTENTION_MODEL_TYPES = frozenset({"qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text",
                                          "qwen3_next", "olmo_hybrid", "lara_mini", "qwen4_exp",
                                          "qwen4_exp_text"})
# What transformers' torch loop saves for backward over what the kernels save, one linear block of the
# default qwen3_5_text config and 4,096 tokens, bf16, traced on meta: 2,117 MiB against 1,139
# (docs/memory-model.md, "Hybrid linear attention"). Every message that warns of the loop quotes it.
TORCH_LOOP_ACTIVATIONS = 2117 / 1139
LINEAR_ATTENTION_NOTE = (
    "linear attention priced as flash-linear-attention's chunked kernels with causal-conv1d (not yet measured "
    f"on a GPU); without them transformers runs a Python loop over 64-token chunks that holds about "
    f"{TORCH_LOOP_ACTIVATIONS:.1f}x the activations (not priced); on Hopper GPUs fla's gated backward needs "
    "tilelang or Triton 3.7.1 or later (fla issue #640)")


# ------------------------------------------------------------- Mamba-2 state-space blocks
# Mamba-2 and the hybrids built on its mixer (transformers 5.24: mamba2, bamba, granitemoehybrid,
# nemotron_h, falcon_h1) bind mamba-ssm's fused scan and causal-conv1d's kernel where those import,
# else transformers' torch reference: a chunked scan written as einsums over (chunk, position) with
# no Python loop in training (`mamba2_chunk_scan`, `torch_forward`), so its requests are fixed in
# number at every token count and a card holds them. The learner prices that reference, which is
# what a node without the packages trains and what verify can measure there; mamba-ssm's kernels
# keep less (their Triton scan saves its inputs, not the (chunk, 256, 256) decay and score tensors)
# and step faster, neither priced. Mamba-1's reference loops over the tokens: Jamba, Mamba and
# Falcon-Mamba are priced with mamba-ssm's kernels (STATE_SPACE_KERNELS below), zamba stays refused
# (hfconfig.RECURRENT_TYPES); zamba2 shares one block's weights
# between layers whose backward asks for different memory, which a card cannot hold.
STATE_SPACE_TORCH = "transformers' torch reference (no mamba-ssm, no causal-conv1d)"
STATE_SPACE_MODEL_TYPES = frozenset({"mamba2", "bamba", "granitemoehybrid", "nemotron_h", "falcon_h1"})
STATE_SPACE_NOTE = (
    "state-space (Mamba-2) blocks priced as transformers' torch reference scan, what a node without mamba-ssm "
    "and causal-conv1d trains; with them installed the run keeps less and steps faster (not priced: "
    "zlayout verify stops there rather than compare)")


# ------------------------------------------------------------- Mamba-1 state-space blocks (kernels)
# Mamba-1 mixers bind mamba-ssm's kernels and causal-conv1d's where those import, else transformers'
# reference, which loops over the tokens in training (a request count growing with the sequence, and
# a speed no one trains at): Jamba calls the selective scan (`selective_scan_fn`) and the convolution,
# Mamba and Falcon-Mamba the fused `mamba_inner_fn`. The learner prices the kernels, read from their
# source (learn/trace.py `_SelectiveScan`, `_MambaInner`, `_CausalConv1d`), as it prices fla's: not
# yet measured on a GPU, and verify stops where the node resolves the torch loop. Zamba calls the
# same two as Jamba, but shares one attention block's weights between layers, which the card's
# per-block tensors and verify are not checked against (it stays refused).
STATE_SPACE_KERNELS = "mamba-ssm + causal-conv1d"
MAMBA_KERNEL_MODEL_TYPES = frozenset({"jamba", "mamba", "falcon_mamba"})
STATE_SPACE_KERNELS_NOTE = (
    "state-space (Mamba-1) blocks priced as mamba-ssm's kernels with causal-conv1d (not yet measured "
    "on a GPU); without them transformers loops over every token, which keeps far more and is not priced "
    "(zlayout verify stops there rather than compare)")


def linear_attention_assumed(config: Mapping[str, Any]) -> str | None:
    """How zlayout prices a config.json's linear-attention or state-space blocks (a multimodal one by
    its text_config): LINEAR_ATTENTION_FLA, STATE_SPACE_TORCH, STATE_SPACE_KERNELS, or None for a
    model without them."""
    text = config.get("text_config")
    types = {config.get("model_type"), text.get("model_type") if isinstance(text, Mapping) else None}
    if types & LINEAR_ATTENTION_MODEL_TYPES:
        return LINEAR_ATTENTION_FLA
    if types & MAMBA_KERNEL_MODEL_TYPES:
        return STATE_SPACE_KERNELS
    return STATE_SPACE_TORCH if types & STATE_SPACE_MODEL_TYPES else None


# `Phase.frees`' allocation index for a tensor made before the phase (the forward's saved log-softmax
# that the loss's backward frees)
FREED_OUTSIDE = -1


class CardError(ValueError):
    """A card that is not one this planner reads: one line naming what is wrong."""


def bytes_at(poly: Poly, micro_batch: int, seq: int) -> float:
    q, a, c = poly
    return micro_batch * (q * seq * seq + a * seq) + c


@dataclass(frozen=True, slots=True)
class Phase:
    """One phase's requests, in order. A reduction kernel's scratch (core.reductions) is
    REDUCTION_EVENTS placeholder requests of 0 bytes at the index `reductions` gives it: its size
    depends on the GPU, which the card does not know, so `sizes` and `net_and_peak` take one."""

    requests: tuple[Poly, ...]
    reductions: tuple[tuple[int, Reduction], ...] = ()
    # requests made once a step whatever the micro-batch (a preamble's (1, 1, T, T) mask, its rotary
    # tables over (1, T) positions): their bytes are not multiplied by it (`_sizes`)
    per_step: frozenset[int] = frozenset()
    # (free's index, allocation's index) where a free takes another of its phase's tensors than the
    # latest live one of its size (the replay's rule; zlayout.learn.trace.exceptional_frees), or
    # (free's index, FREED_OUTSIDE) where it takes one made before the phase though one of its own lives
    frees: tuple[tuple[int, int], ...] = ()

    def net_and_peak(self, micro_batch: int, seq: int, device: Device) -> tuple[int, int]:
        if not self.reductions and not self.per_step:
            return _net_and_peak(self.requests, micro_batch, seq)
        return _net_and_peak_sizes(_sizes(self, micro_batch, seq, device))

    def net(self, micro_batch: int, seq: int) -> int:
        """What the phase leaves allocated: any GPU's (a scratch is freed where it is made)."""
        if self.per_step:  # a reduction's scratch is freed where it is made: the requests alone
            return sum(_request_sizes(self, micro_batch, seq))
        return _net_and_peak(self.requests, micro_batch, seq)[0]

    def sizes(self, micro_batch: int, seq: int, device: Device) -> list[int]:
        """The requests' sizes (positive: allocate, negative: free), for an allocator replay."""
        return list(_sizes(self, micro_batch, seq, device))


@functools.lru_cache(maxsize=4096)
def _net_and_peak(requests: tuple[Poly, ...], micro_batch: int, seq: int) -> tuple[int, int]:
    """Memoized: break-even and the 13 layouts ask for the same phases at the same shape."""
    live = peak = 0.0
    for poly in requests:
        live += bytes_at(poly, micro_batch, seq)
        peak = max(peak, live)
    return int(round(live)), int(round(peak))


@functools.lru_cache(maxsize=4096)
def _net_and_peak_sizes(sizes: tuple[int, ...]) -> tuple[int, int]:
    live = peak = 0
    for size in sizes:
        live += size
        peak = max(peak, live)
    return live, peak


def _request_sizes(phase: Phase, micro_batch: int, seq: int) -> list[int]:
    """Each request's bytes at this shape, a reduction's placeholders 0 (`_sizes` fills them in)."""
    per_step = phase.per_step
    return [int(round(bytes_at(poly, 1 if i in per_step else micro_batch, seq))) for i, poly in enumerate(phase.requests)]


@functools.lru_cache(maxsize=4096)
def _sizes(phase: Phase, micro_batch: int, seq: int, device: Device) -> tuple[int, ...]:
    sizes = _request_sizes(phase, micro_batch, seq)
    for at, reduction in phase.reductions:
        outputs = int(round(bytes_at(reduction.outputs, micro_batch, seq)))
        inputs = int(round(bytes_at(reduction.inputs, micro_batch, seq)))
        buffer, semaphores = scratch_bytes(reduction, outputs, inputs, device)
        sizes[at:at + REDUCTION_EVENTS] = [buffer, semaphores, -semaphores, -buffer]
    return tuple(sizes)


# How the step-time model prices an op's work (core.steptime): the fused attention kernels
# (`zlayout.learn.trace.fused_attention` records them under these names) at attention's efficiency,
# batched matmuls at a GEMM's efficiency for a head's width, the grouped experts' GEMMs (transformers'
# MoE blocks, `zlayout.learn.trace.grouped_mm_flops`) as GEMMs with their backward's measured
# slowdown, any other op with FLOPs as a GEMM, and every op without FLOPs by the bytes it moves;
# ops on misaligned tensors (`UNALIGNED_SUFFIX`) at the slower kernels' rates, GEMMs and memory apart.
ATTENTION_OPS = frozenset({"attention_forward", "attention_backward"})
# the same kernels given an explicit attn_mask (a sliding window past its width): the full square, no
# tile skipped, at the masked kernels' lower rate (zlayout.learn.trace._FusedAttention)
MASKED_ATTENTION_OPS = frozenset({"masked_attention_forward", "masked_attention_backward"})
# the scores a fused attention call with dropout draws a random number for (its forward, and its
# backward, which draws them again): a count in the op's FLOPs field, no kernel of its own
# (zlayout.learn.trace._dropout_scores): which calls run the dropout kernels (core.steptime
# ATTENTION_DROPOUT_KERNEL_EFFICIENCY)
ATTENTION_DROPOUT_FORWARD = "attention_dropout_forward"
ATTENTION_DROPOUT_BACKWARD = "attention_dropout_backward"
BATCHED_GEMM_OPS = frozenset({"bmm", "baddbmm"})
UNALIGNED_SUFFIX = "_unaligned"  # an op on a tensor 16-byte loads cannot walk (zlayout.learn.trace._vector_aligned)
# a pointwise op over a broadcast or strided operand (not zlayout.learn.trace._one_walk): PyTorch's
# TensorIterator runs it on the offset-computing `elementwise_kernel`, not the vectorized one
STRIDED_SUFFIX = "_strided"
# an accumulating index_put (the backward of a gather by index: a MoE block's tokens sorted by
# expert): PyTorch sorts the indices and adds each destination row's sources in turn
# (`indexing_backward_kernel`), not at the bandwidth of an elementwise op
SCATTER_SUFFIX = "_scatter"
WIDE_BATCHED_GEMM = "bmm_wide"  # a batched matmul no side of which is head-narrow: priced as a GEMM
GROUPED_GEMM_OPS = frozenset({"_grouped_mm"})
FP32_GEMM_SUFFIX = "_fp32"  # a matmul on float32 inputs (the learner's ledger names them so): the math attention's
WORK_PHASES = ("forward", "backward", "checkpointed_forward", "checkpointed_backward")


@dataclass(frozen=True, slots=True)
class OpWork:
    name: str
    flops: Poly
    bytes: Poly
    calls: Poly  # kernel launches
    ops: Poly | None = None  # the ops that launched them (None: a card learned before they were recorded, one a launch)


@dataclass(frozen=True, slots=True)
class WorkTotals:
    """A phase's work at one shape, by how the step-time model prices it."""

    gemm_flops: float = 0.0
    batched_gemm_flops: float = 0.0
    attention_flops: float = 0.0
    memory_bytes: float = 0.0  # the ops without FLOPs: elementwise, norms, copies, reductions, the loss
    kernels: float = 0.0  # kernel launches
    grouped_gemm_flops: float = 0.0  # a MoE block's experts (not in gemm_flops)
    fp32_gemm_flops: float = 0.0  # matmuls on float32 inputs, without tensor cores (not in gemm_flops)
    masked_attention_flops: float = 0.0  # fused attention given an attn_mask (not in attention_flops)
    unaligned_gemm_flops: float = 0.0  # matmuls on misaligned operands (`UNALIGNED_SUFFIX`; not in gemm_flops)
    unaligned_memory_bytes: float = 0.0  # memory-bound ops on misaligned tensors (not in memory_bytes)
    strided_memory_bytes: float = 0.0  # pointwise ops over broadcast or strided operands (not in memory_bytes)
    scatter_memory_bytes: float = 0.0  # accumulating index_puts (`SCATTER_SUFFIX`; not in memory_bytes)
    ops: float = 0.0  # the ops that launched `kernels` (the host issues an op once, its kernels each)
    dropout_forward_scores: float = 0.0  # scores fused attention drew dropout for, forward (ATTENTION_DROPOUT_FORWARD)
    dropout_backward_scores: float = 0.0  # and in its backward
    attention_backward_flops: float = 0.0  # of attention_flops, the backward kernels' (the rest: forward)

    def __add__(self, other: "WorkTotals") -> "WorkTotals":
        return WorkTotals(*(a + b for a, b in zip(self.astuple(), other.astuple())))

    def scaled(self, factor: float) -> "WorkTotals":
        return WorkTotals(*(a * factor for a in self.astuple()))

    def astuple(self) -> tuple[float, ...]:
        return (self.gemm_flops, self.batched_gemm_flops, self.attention_flops, self.memory_bytes, self.kernels,
                self.grouped_gemm_flops, self.fp32_gemm_flops, self.masked_attention_flops,
                self.unaligned_gemm_flops, self.unaligned_memory_bytes, self.strided_memory_bytes,
                self.scatter_memory_bytes, self.ops, self.dropout_forward_scores, self.dropout_backward_scores,
                self.attention_backward_flops)


@dataclass(frozen=True, slots=True)
class WorkPhase:
    ops: tuple[OpWork, ...]

    def totals(self, micro_batch: int, seq: int) -> WorkTotals:
        gemm = batched = attention = attention_backward = masked = memory = kernels = grouped = fp32 = ops = 0.0
        unaligned_gemm = unaligned_memory = strided_memory = scatter_memory = 0.0
        dropout = {ATTENTION_DROPOUT_FORWARD: 0.0, ATTENTION_DROPOUT_BACKWARD: 0.0}
        for op in self.ops:
            flops = bytes_at(op.flops, micro_batch, seq)
            launches = bytes_at(op.calls, micro_batch, seq)
            kernels += launches
            ops += launches if op.ops is None else bytes_at(op.ops, micro_batch, seq)
            if flops > 0 and op.name.endswith(FP32_GEMM_SUFFIX):
                fp32 += flops
            elif op.name.endswith(UNALIGNED_SUFFIX):
                if flops > 0:
                    unaligned_gemm += flops
                else:
                    unaligned_memory += bytes_at(op.bytes, micro_batch, seq)
            elif flops == 0 and op.name.endswith(STRIDED_SUFFIX):
                strided_memory += bytes_at(op.bytes, micro_batch, seq)
            elif flops == 0 and op.name.endswith(SCATTER_SUFFIX):
                scatter_memory += bytes_at(op.bytes, micro_batch, seq)
            elif op.name in dropout:
                dropout[op.name] += flops
            elif op.name in ATTENTION_OPS:
                attention += flops
                attention_backward += flops if op.name == "attention_backward" else 0.0
            elif op.name in MASKED_ATTENTION_OPS:
                masked += flops
            elif op.name in BATCHED_GEMM_OPS:
                batched += flops
            elif op.name in GROUPED_GEMM_OPS:
                grouped += flops
            elif flops > 0:
                gemm += flops
            else:
                memory += bytes_at(op.bytes, micro_batch, seq)
        return WorkTotals(gemm, batched, attention, memory, kernels, grouped, fp32, masked, unaligned_gemm,
                          unaligned_memory, strided_memory, scatter_memory, ops,
                          dropout[ATTENTION_DROPOUT_FORWARD], dropout[ATTENTION_DROPOUT_BACKWARD], attention_backward)


class BlockWeightGradient(NamedTuple):
    """A block's largest weight gradient (bytes) and what the block's backward holds above its
    start, that gradient not counted, at its own hook and at the next weight gradient's hook."""

    bytes: int
    live_at_hook: int
    live_at_next_hook: int


@dataclass(frozen=True, slots=True)
class BlockCard:
    kind: int
    forward: Phase
    backward: Phase
    checkpointed_forward: Phase
    checkpointed_backward: Phase
    work: dict[str, WorkPhase] | None = None  # by WORK_PHASES; None: a card learned before work was recorded
    # element counts of the block's weights autograd saves as views (`input @ self.weight.T`, not
    # F.linear): ZeRO-3's release swaps the parameter's data, the saved view keeps the gathered
    # storage until the block's backward (learner.weights_saved_as_views)
    zero3_held: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Regime:
    """The requests for sequences up to `max_tokens` (None: any length). A model with a
    sliding window takes another path past the window (a mask it builds only then). `min_tokens`
    (the first regime's only): the shortest sequence the card holds, where the model's memory is
    no polynomial of shorter ones (learner._learn_regimes)."""

    max_tokens: int | None
    blocks: tuple[BlockCard, ...]
    head_forward: Phase
    head_backward: Phase
    head_checkpointed_forward: Phase
    head_checkpointed_backward: Phase
    head_work: dict[str, WorkPhase] | None = None
    min_tokens: int | None = None
    # the largest micro-batch the requests hold (None: any): a model whose memory grows faster
    # than the micro-batch is exact at the sequences it was traced with (learner._linear_in_sequences)
    max_micro_batch: int | None = None
    # the positions the model holds where fewer than the learner's token counts: it was traced within them
    max_positions: int | None = None
    # a card learned from two sequences a step (its blocks ask for other requests with one: DeepSeek-V3.2's
    # indexer masks (B, S, T) scores with a (B, B, S, T) tensor) holds what one sequence asks for apart:
    # the requests and work a micro-batch of 1 plans with (ModelCard.regime); None: the same path
    single_sequence: "Regime | None" = None
    # the model's forward before its first block (the embedding's output, the attention masks, the
    # rotary tables: made once a step, held to the forward's return); None: a card learned before
    head_preamble: Phase | None = None

    def block(self, kind: int) -> BlockCard:
        return next(b for b in self.blocks if b.kind == kind)


@dataclass(frozen=True, eq=False)
class ModelCard:
    key: str
    model_type: str
    attention: str
    params: int
    parameter_numels: tuple[int, ...]  # in parameters() order: what DeepSpeed flattens
    layer_kinds: tuple[int, ...]
    regimes: tuple[Regime, ...]  # by max_tokens, the unbounded one last
    source: str = ""
    digest: str = ""  # of the card's text: a card learned again under the same key is another card
    # parameter tensors a text-only step gives no gradient (a vision tower's); None: not recorded
    untrained_tensors: int | None = None
    untrained_params: int | None = None  # their elements
    tied_embeddings: bool | None = None  # the output head is the input embedding (None: not recorded)
    # the model's buffers as built, before any cast: outside the blocks (rotary tables), and one
    # block's of each kind (GPT-Neo's causal masks: 4 MiB a block); host memory while the training
    # script builds the model on the host (`built_buffer_bytes`; 0 and (): none, or not recorded)
    buffer_bytes: int = 0
    block_buffer_bytes: tuple[int, ...] = ()
    # the kernels sdpa runs on CUDA ("flash", "efficient", "math"); () for eager attention or an older card
    attention_kernels: tuple[str, ...] = ()
    # whether the learner counted attention dropout's scores (ATTENTION_DROPOUT_*): False for a card
    # learned before, which prices a model with attention dropout without them
    attention_dropout_counted: bool = False
    transformers: str | None = None  # the release whose model code the card was learned from
    # "bfloat16": the model runs only with its buffers cast beside its weights, which DeepSpeed does
    # only when data_types.buffer_dtype says so (learn.learner.buffer_cast_needed); None: as built
    buffer_dtype: str | None = None
    # each parameter tensor's decoder block (parameters() order), -1 before the blocks (the
    # embedding, a vision tower), -2 after (the final norm, the head); None: the card names no
    # tensors, or its blocks are not one run of numbered modules (`at_layers` then refuses)
    parameter_layers: tuple[int, ...] | None = None
    learned_layers: int | None = None  # resized (`at_layers`): the depth it was learned at
    # module forwards a step calls per block of each kind (by kind) and outside the blocks: what
    # ZeRO-3's hooks run on (`stage3_modules`); None: a card learned before they were counted
    module_calls: tuple[int, ...] | None = None
    module_calls_outside: int | None = None
    # how its linear-attention or state-space blocks were priced (LINEAR_ATTENTION_FLA or
    # STATE_SPACE_TORCH); None: none
    # (no such blocks, or a card learned before they were learnable)
    linear_attention: str | None = None
    # the tokens a sequence is padded to a multiple of inside the blocks (Mamba-2's torch reference
    # scan: its chunk); the card's requests, fitted at multiples, hold there only. None: any length
    token_quantum: int | None = None
    # whether transformers' gradient_checkpointing_enable accepts the class (CTRL, openai-gpt: no)
    checkpointing: bool = True
    # each parameter tensor's dimensions (parameters() order): a grouped-experts block's weights are
    # the 3-D ones (`grouped_gemm_weights`); () where the card was built without its shapes
    parameter_ranks: tuple[int, ...] = ()
    # elements each parameter tensor gains per block (parameters() order; () where none grows):
    # tensors outside the blocks that grow with the depth, Gemma-3n's per-layer embeddings
    # (zlayout.learn.learner.outside_growth); `at_layers` resizes them with the blocks
    parameter_growth: tuple[int, ...] = ()
    # False: the learner found the card resized one block shallower counts other parameters than the
    # class builds there (`learn.learner.resizes_exactly`): `at_layers` refuses another depth
    resizable: bool = True

    @functools.cached_property
    def grouped_gemm_weights(self) -> tuple[int, ...]:
        """The parameter tensors (indices, parameters() order) torch's grouped GEMM reads: the 3-D
        weights of a card whose blocks run `_grouped_mm` (transformers' experts, `[experts, out,
        in]`). A 3-D convolution weight beside them is counted too: DeepSpeed's alignment is one
        switch for every tensor, so naming one too many costs nothing."""
        grouped = any(op.name in GROUPED_GEMM_OPS for regime in self.regimes for block in regime.blocks
                      for phase in (block.work or {}).values() for op in phase.ops)
        return tuple(i for i, rank in enumerate(self.parameter_ranks) if rank == 3) if grouped else ()

    # A card rides in the ModelSpec, which the planner hashes and compares for its caches:
    # by its key, file and text's digest, not by walking thousands of requests each time.
    def __eq__(self, other: object) -> bool:
        return isinstance(other, ModelCard) and (self.key, self.source, self.digest) == (
            other.key, other.source, other.digest)

    def __hash__(self) -> int:
        return hash((self.key, self.source, self.digest))

    def zero3_held(self, layer: int) -> tuple[int, ...]:
        """Element counts of block `layer`'s weights whose gathered storage ZeRO-3 cannot free
        before the block's backward (BlockCard.zero3_held); a deeper model repeats the last kind."""
        kind = self.layer_kinds[min(layer, len(self.layer_kinds) - 1)]
        return self.regimes[-1].block(kind).zero3_held

    def regime(self, seq: int, micro_batch: int) -> Regime:
        """The requests for sequences of `seq` tokens, `micro_batch` a step (one sequence: its own
        requests where the card holds them apart, Regime.single_sequence)."""
        regime = next(r for r in self.regimes if r.max_tokens is None or seq <= r.max_tokens)
        return regime.single_sequence if micro_batch == 1 and regime.single_sequence is not None else regime

    @property
    def shortest_sequence(self) -> int | None:
        """The fewest tokens a sequence may have for this card to hold it (None: any)."""
        return self.regimes[0].min_tokens

    @property
    def longest_sequence(self) -> int | None:
        """The most tokens a sequence may have: the model's positions, where it was learned within them."""
        return self.regimes[-1].max_positions

    @property
    def largest_micro_batch(self) -> int | None:
        """The largest micro-batch this card holds (None: any)."""
        limits = [r.max_micro_batch for r in self.regimes if r.max_micro_batch is not None]
        return min(limits) if limits else None

    # ---------------------------------------------------------- the planner's terms

    def has_work(self) -> bool:
        """Whether every block and the head record their work (cards learned before: no)."""
        return all(r.head_work is not None and all(b.work is not None for b in r.blocks) for r in self.regimes)

    def block_matmul_flops(self, micro_batch: int, seq: int) -> float:
        """The blocks' forward FLOPs in matmuls of every kind (GEMMs, batched, grouped, fp32)."""
        fwd = self.pass_work(micro_batch, seq, checkpointing=False)[0]
        return (fwd.gemm_flops + fwd.batched_gemm_flops + fwd.grouped_gemm_flops + fwd.fp32_gemm_flops
                + fwd.unaligned_gemm_flops)

    def pass_work(self, micro_batch: int, seq: int, checkpointing: bool) -> tuple[WorkTotals, WorkTotals,
                                                                                 WorkTotals, WorkTotals]:
        """One micro-step's work: the blocks' forward and backward (with checkpointing: the backward
        holds the recompute, as far as backward needs it), then the head's (the embedding, the
        final norm, the head and the loss: never recomputed) forward and backward."""
        regime = self.regime(seq, micro_batch)
        forward, backward = ("checkpointed_forward", "checkpointed_backward") if checkpointing else (
            "forward", "backward")
        blocks = [WorkTotals(), WorkTotals()]
        for kind, count in _counts(self.layer_kinds):
            block = regime.block(kind)
            for i, phase in enumerate((forward, backward)):
                blocks[i] = blocks[i] + block.work[phase].totals(micro_batch, seq).scaled(count)
        return (blocks[0], blocks[1], regime.head_work[forward].totals(micro_batch, seq),
                regime.head_work[backward].totals(micro_batch, seq))

    def saved_bytes(self, micro_batch: int, seq: int, checkpointing: bool) -> int:
        """Every block's saved activations at the end of the forward pass."""
        regime = self.regime(seq, micro_batch)
        total = 0
        for kind in self.layer_kinds:
            block = regime.block(kind)
            phase = block.checkpointed_forward if checkpointing else block.forward
            total += phase.net(micro_batch, seq)
        return total

    def blocks_at(self, seq: int, micro_batch: int) -> list[BlockCard]:
        """The regime's blocks of the kinds this depth has: DeepSeek-V3.2 cut to its 3 dense blocks
        has no MoE block, whose 14 GiB expert gradients set its block bounds before (h200-2026-12-31c:
        peak allocated +39.6% over the run's)."""
        kinds = set(self.layer_kinds)
        return [b for b in self.regime(seq, micro_batch).blocks if b.kind in kinds]

    def largest_block_transient(self, micro_batch: int, seq: int, checkpointing: bool, device: Device) -> int:
        """The most a block's backward holds above what it started with (with checkpointing:
        its recompute and backward), over the kinds of block."""
        return max((b.checkpointed_backward if checkpointing else b.backward).net_and_peak(micro_batch, seq,
                                                                                          device)[1]
                   for b in self.blocks_at(seq, micro_batch))

    def largest_block_request(self, micro_batch: int, seq: int, checkpointing: bool, device: Device) -> int:
        """The largest single request of a block's backward (with checkpointing: with its recompute)."""
        return max(max((b.checkpointed_backward if checkpointing else b.backward).sizes(micro_batch, seq, device),
                       default=0) for b in self.blocks_at(seq, micro_batch))

    def largest_forward_transient(self, micro_batch: int, seq: int, checkpointing: bool, device: Device) -> int:
        """The most a block's forward holds above what it keeps."""
        worst = 0
        for b in self.blocks_at(seq, micro_batch):
            net, peak = (b.checkpointed_forward if checkpointing else b.forward).net_and_peak(micro_batch, seq, device)
            worst = max(worst, peak - net)
        return worst

    @functools.lru_cache(maxsize=1024)  # noqa: B019 (cards live as long as the process; break-even asks often)
    def largest_weight_gradient(self, micro_batch: int, seq: int, checkpointing: bool,
                                weight_bytes: int) -> BlockWeightGradient | None:
        """The largest weight gradient a block's backward makes (a request of a constant size
        that one of the card's parameters has at `weight_bytes` an element, freed later: the
        free is its AccumulateGrad hook, DeepSpeed's reduce hook), over the kinds of block, with
        what the block's backward holds above its start (the gradient not counted) at that
        hook and at the next weight gradient's hook, where ZeRO-3 reduces a gradient larger
        than its IPG bucket (stage3.py reduce_independent_p_g_buckets_and_remove_grads)."""
        sizes = {numel * weight_bytes for numel in self.parameter_numels}
        best = None
        for block in self.blocks_at(seq, micro_batch):
            requests = (block.checkpointed_backward if checkpointing else block.backward).requests
            made = [(i, int(poly[2])) for i, poly in enumerate(requests)
                    if poly[0] == 0 and poly[1] == 0 and int(poly[2]) in sizes]
            if not made:
                continue
            first, grad = max(made, key=lambda item: item[1])
            held = _held_at_hooks(requests, first, grad, sizes, micro_batch, seq)
            if held is None:
                continue
            if best is None or grad > best.bytes:
                best = BlockWeightGradient(grad, held[0] - grad, held[1])
        return best

    def head_saved_bytes(self, micro_batch: int, seq: int, checkpointing: bool) -> int:
        """What the final norm, the head and the loss keep at the end of the forward pass
        (the model's outputs dropped, the loss kept)."""
        regime = self.regime(seq, micro_batch)
        phase = regime.head_checkpointed_forward if checkpointing else regime.head_forward
        return phase.net(micro_batch, seq)

    def head_held_at_next_hook(self, micro_batch: int, seq: int, checkpointing: bool, weight_bytes: int,
                               head_numel: int) -> int | None:
        """What the final norm, the head and the loss hold when the weight gradient after the
        head's reaches its hook (the final norm's, where ZeRO-3 reduces a head gradient larger
        than its IPG bucket): the forward's saved tensors plus the head's backward up to that
        hook, the head's gradient not counted (its hook comes first). None where the card's head
        backward makes no gradient of the head's size."""
        regime = self.regime(seq, micro_batch)
        forward = regime.head_checkpointed_forward if checkpointing else regime.head_forward
        backward = regime.head_checkpointed_backward if checkpointing else regime.head_backward
        head, sizes = head_numel * weight_bytes, {numel * weight_bytes for numel in self.parameter_numels}
        made = next((i for i, poly in enumerate(backward.requests)
                     if poly[0] == 0 and poly[1] == 0 and int(poly[2]) == head), None)
        held = None if made is None else _held_at_hooks(backward.requests, made, head, sizes, micro_batch, seq)
        return None if held is None else max(0, forward.net(micro_batch, seq) + held[1])

    def head_backward_peak_bytes(self, micro_batch: int, seq: int, checkpointing: bool, device: Device) -> int:
        """The most the loss's and head's backward hold above what the forward left."""
        regime = self.regime(seq, micro_batch)
        phase = regime.head_checkpointed_backward if checkpointing else regime.head_backward
        return phase.net_and_peak(micro_batch, seq, device)[1]


    def stage3_modules(self) -> int | None:
        """The module forwards one forward pass calls at this card's depth (ZeRO-3 fetches each:
        `steptime.stage3_hooked_modules`), or None for a card that does not count them."""
        if self.module_calls is None or self.module_calls_outside is None:
            return None
        return sum(self.module_calls[kind] for kind in self.layer_kinds) + self.module_calls_outside

    def at_layers(self, layers: int) -> "ModelCard":
        """This card for the same config at another depth (`--layers`, the app's Layers,
        break-even's depth scan): the blocks' requests are per block and do not depend on how many
        there are, so only the block sequence and the parameter tensors change. A shallower model
        keeps the first `layers` blocks; a deeper one continues the blocks' repeating pattern
        (`_extend_kinds`), each new block with the tensors of the card's last block of its kind.
        CardError where the card cannot tell its blocks' tensors apart."""
        if layers == len(self.layer_kinds):
            return self
        return _at_layers(self, layers)

    def depth_refusal(self, layers: int) -> str | None:
        """Why this card cannot be planned at `layers` blocks, where it says it does not resize (the
        learner found it counts other parameters than transformers builds at fewer blocks: Gemma-3n's
        kv-shared blocks move with the depth); None at its own depth or where it resizes. `at_layers`
        raises it; `plan --layers` and the app's Layers field refuse with it rather than fall back to
        the hand model."""
        if self.resizable or layers == len(self.layer_kinds):
            return None
        return (f"{self.source or self.key}: this model's blocks change with its depth beyond what its card "
                f"records (learned at {len(self.layer_kinds)} blocks; resized to fewer, it did not count what "
                f"transformers builds there), so it cannot be planned at {layers}: learn a copy of "
                f"the config.json with that many layers (zlayout learn --hf-config COPY) and plan that")

    def built_buffer_bytes(self) -> int:
        """The model's buffers as the training script builds it, at this card's depth."""
        per_kind = self.block_buffer_bytes
        return self.buffer_bytes + (sum(per_kind[kind] for kind in self.layer_kinds) if per_kind else 0)

    def linear_attention_note(self) -> str | None:
        """The plan's line on how the card priced linear attention; None where it did not."""
        return {LINEAR_ATTENTION_FLA: LINEAR_ATTENTION_NOTE, STATE_SPACE_TORCH: STATE_SPACE_NOTE,
                STATE_SPACE_KERNELS: STATE_SPACE_KERNELS_NOTE}.get(self.linear_attention or "")

    def depth_note(self) -> str | None:
        """A line for a card resized from the depth it was learned at; None for one learned at this."""
        if self.learned_layers is None:
            return None
        return (f"the model card {self.source} was learned from the same model at {self.learned_layers} "
                f"layers; its blocks are planned at {len(self.layer_kinds)}")


def _held_at_hooks(requests, made: int, grad: int, sizes: set[int], micro_batch: int,
                   seq: int) -> tuple[int, int] | None:
    """A phase's bytes held (from its start) when the gradient of `grad` bytes made at request
    `made` reaches its hook (its free: AccumulateGrad hands it to DeepSpeed), and when the next
    weight gradient (a constant free of one of `sizes`) reaches its own (the phase's end where
    none follows). None where the gradient is never handed to a hook in this phase."""
    hooks = [i for i, poly in enumerate(requests) if poly[0] == 0 and poly[1] == 0 and -int(poly[2]) in sizes]
    own = next((i for i in hooks if i > made and -int(requests[i][2]) == grad), None)
    if own is None:
        return None
    after = next((i for i in hooks if i > own), len(requests))
    held = list(itertools.accumulate((bytes_at(poly, micro_batch, seq) for poly in requests), initial=0.0))
    return int(round(held[own])), int(round(held[after]))


@functools.lru_cache(maxsize=256)
def _at_layers(card: ModelCard, layers: int) -> ModelCard:
    if (why := card.depth_refusal(layers)) is not None:
        raise CardError(why)
    if card.parameter_layers is None:
        raise CardError(f"{card.source or card.key}: the card holds {len(card.layer_kinds)} blocks, not the {layers} "
                        "layers the config names, and names no block tensors to resize by: learn this config again "
                        "(zlayout learn --force); a model whose blocks are not one run of numbered layers (HRM's "
                        "cycled stacks) cannot be planned by its card")
    kinds = _extend_kinds(card.layer_kinds, layers)
    per_layer: list[list[tuple[int, int]]] = [[] for _ in card.layer_kinds]
    before, after = [], []
    ranks = card.parameter_ranks or (0,) * len(card.parameter_numels)
    growth = card.parameter_growth or (0,) * len(card.parameter_numels)
    added = layers - len(card.layer_kinds)  # blocks more (or fewer) than the card holds
    for numel, rank, layer, grows in zip(card.parameter_numels, ranks, card.parameter_layers, growth):
        # a tensor outside the blocks that grows with them (Gemma-3n's per-layer embeddings)
        numel += grows * added if layer < 0 else 0
        (before if layer == -1 else after if layer == -2 else per_layer[layer]).append((numel, rank, grows))
    last_of_kind = {kind: i for i, kind in enumerate(card.layer_kinds)}
    tensors, layer_of = list(before), [-1] * len(before)
    for i, kind in enumerate(kinds):
        block = per_layer[i if i < len(card.layer_kinds) and card.layer_kinds[i] == kind else last_of_kind[kind]]
        tensors += block
        layer_of += [i] * len(block)
    tensors += after
    layer_of += [-2] * len(after)
    numels = [numel for numel, _, _ in tensors]
    # another card, not equal to the one learned (the planner's caches tell them apart by digest)
    return replace(card, params=sum(numels), parameter_numels=tuple(numels), layer_kinds=kinds,
                   parameter_growth=tuple(grows for _, _, grows in tensors) if card.parameter_growth else (),
                   parameter_ranks=tuple(rank for _, rank, _ in tensors) if card.parameter_ranks else (),
                   digest=f"{card.digest}@L{layers}", parameter_layers=tuple(layer_of),
                   learned_layers=card.learned_layers or len(card.layer_kinds))


FINAL_KIND_MIN_BLOCKS = 12  # twice the longest period of block kinds seen (Gemma 3's 6)


def _extend_kinds(kinds: tuple[int, ...], layers: int) -> tuple[int, ...]:
    """The kinds of the first `layers` blocks of the model whose first blocks are `kinds`: the
    shortest period p with which the blocks repeat from some block on, seen at least twice
    (every block alike: 1; Gemma 3's five sliding-window blocks and a global one: 6; DeepSeek's
    dense first block, then MoE blocks: 1 from block 1), continued; else the last kind repeated.
    A kind only the last block has stays the last block's at any depth (GPT-NeoX-Japanese's
    attention bias, on its last block alone: cut to fewer blocks, the card had dropped it and its
    count was one bias short of the class's). Only from FINAL_KIND_MIN_BLOCKS blocks on: a shorter
    card may hold one period of a pattern (Gemma 3's six, Qwen3.5's four) whose last kind repeats."""
    if len(kinds) >= FINAL_KIND_MIN_BLOCKS and kinds.count(kinds[-1]) == 1 and layers >= 2:
        return _extend_kinds(kinds[:-1], layers - 1) + kinds[-1:]
    if layers <= len(kinds):
        return kinds[:layers]
    n = len(kinds)
    # the longest repeating run wins (Gemma 3's 26 blocks: period 6 from block 0, not its last
    # two sliding blocks read as period 1), then the shortest period
    found = [(start, period) for period in range(1, n // 2 + 1) for start in range(n - 2 * period + 1)
             if all(kinds[i] == kinds[i - period] for i in range(start + period, n))]
    if not found:
        return kinds + (kinds[-1],) * (layers - n)
    period = min(found)[1]
    out = list(kinds)
    while len(out) < layers:
        out.append(out[-period])
    return tuple(out)


def parameter_layers(names: list[str], layers: int) -> tuple[int, ...] | None:
    """Each tensor's decoder block from its name (`model.layers.3.mlp.up_proj.weight`: 3), -1
    before the blocks, -2 after; None unless exactly one numbered module list holds blocks
    0..layers-1 in order, one run (a vision tower's own numbered layers are outside it)."""
    numbered: dict[str, set[int]] = {}
    found = []
    for name in names:
        m = _NUMBERED.match(name)
        found.append(m)
        if m:
            numbered.setdefault(m.group(1), set()).add(int(m.group(2)))
    decoders = [prefix for prefix, seen in numbered.items() if seen == set(range(layers))]
    if len(decoders) != 1:
        return None
    out, at = [], -1
    for m in found:
        if m and m.group(1) == decoders[0]:
            layer = int(m.group(2))
            if layer < at or at == -2:
                return None
            at = layer
            out.append(layer)
        else:
            out.append(-1 if at == -1 else -2)
            at = -1 if at == -1 else -2
    return tuple(out)


_NUMBERED = re.compile(r"^(.*?)\.(\d+)\.")


def _counts(kinds: tuple[int, ...]) -> list[tuple[int, int]]:
    return [(kind, kinds.count(kind)) for kind in sorted(set(kinds))]


# --------------------------------------------------------------------------- parsing


def _work(data: Any, where: str) -> dict[str, WorkPhase] | None:
    """A block's or the head's work: per phase, op -> "flops, bytes, calls, ops" (each "q a c"; the
    kernel launches, then the ops that launched them; a card learned before the ops were recorded
    has "flops, bytes, calls", an op a launch)."""
    if data is None:
        return None
    if not isinstance(data, dict) or set(data) != set(WORK_PHASES):
        raise CardError(f"{where}: work holds the phases {', '.join(WORK_PHASES)}")
    phases = {}
    for phase, ops in data.items():
        if not isinstance(ops, dict):
            raise CardError(f"{where}.{phase}: a phase's work is a table of ops")
        parsed = []
        for name, text in sorted(ops.items()):
            polys = _phase(text, f"{where}.{phase}.{name}").requests
            if len(polys) not in (3, 4):
                raise CardError(f"{where}.{phase}.{name}: an op's work is \"flops, bytes, calls, ops\", each \"q a c\"")
            parsed.append(OpWork(name, *polys))
        phases[phase] = WorkPhase(tuple(parsed))
    return phases



def _phase(data: Any, where: str, reductions: Any = None, frees: Any = None) -> Phase:
    """A phase's requests, "q a c, q a c, ..." (zlayout.cards writes them so) or [[q, a, c], ...],
    and its reductions' scratch (`_reductions`)."""
    if isinstance(data, str):
        # map and zip rather than a generator a number: a plan reads every request of its card
        rows = [row for row in map(str.split, data.split(",")) if row]
        try:
            numbers = list(map(float, itertools.chain.from_iterable(rows)))
        except ValueError:
            raise CardError(f"{where}: a request is three numbers \"q a c\"") from None
        if (rows and set(map(len, rows)) != {3}) or not all(map(math.isfinite, numbers)):
            raise CardError(f"{where}: a request is three finite numbers \"q a c\"")
        triples = iter(numbers)
        requests = tuple(zip(triples, triples, triples))
    elif data == []:
        requests = ()
    elif not isinstance(data, list) or not all(
            isinstance(r, list) and len(r) == 3 and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                        for x in r) for r in data):
        raise CardError(f"{where}: a phase is a list of [q, a, c] requests")
    else:
        requests = tuple(tuple(float(x) for x in r) for r in data)
    return Phase(requests, _reductions(reductions, requests, f"{where}_reductions"),
                 frees=_frees(frees, len(requests), f"{where}_frees"))


def _frees(data: Any, requests: int, where: str) -> tuple[tuple[int, int], ...]:
    """A phase's exceptional frees: "i j, ..." (zlayout.cards writes them so) or [[i, j], ...], each a
    free's index and the earlier allocation's it takes (FREED_OUTSIDE: one made before the phase)."""
    if data is None or data == "" or data == []:
        return ()
    if isinstance(data, str):
        pairs = [row.split() for row in data.split(",")]
        try:
            pairs = [[int(x) for x in row] for row in pairs]
        except ValueError:
            raise CardError(f"{where}: a free is two indices \"i j\"") from None
    else:
        pairs = data
    if not isinstance(pairs, list) or not all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in p)
            and FREED_OUTSIDE <= p[1] < p[0] < requests for p in pairs):
        raise CardError(f"{where}: pairs of a free's index and an earlier allocation's, within the phase "
                        f"({FREED_OUTSIDE}: before it)")
    return tuple((i, j) for i, j in pairs)


# a reduction's scratch in a card: "index, outputs (q a c), inputs (q a c)" and Reduction's flags
REDUCTION_FIELDS = 14


def _reductions(data: Any, requests: tuple[Poly, ...], where: str) -> tuple[tuple[int, Reduction], ...]:
    """Each reduction kernel's scratch: "at oq oa oc iq ia ic fastest contiguous reduce_dims ndim
    output_vec acc_bytes max_threads, ..." (zlayout.learn.learner `reduction_rows`), at placeholder
    requests of 0 bytes."""
    if data is None or data == "" or data == []:
        return ()
    if isinstance(data, str):  # as zlayout.cards writes them
        rows = [row.split() for row in data.split(",")]
    elif isinstance(data, list) and all(isinstance(row, list) for row in data):  # as the learner returns them
        rows = data
    else:
        raise CardError(f"{where}: reductions are a string of numbers")
    out = []
    for row in rows:
        try:
            numbers = [float(x) for x in row if not isinstance(x, bool)]
        except (TypeError, ValueError):
            raise CardError(f"{where}: a reduction is {REDUCTION_FIELDS} numbers") from None
        if len(numbers) != REDUCTION_FIELDS or not all(map(math.isfinite, numbers)):
            raise CardError(f"{where}: a reduction is {REDUCTION_FIELDS} finite numbers")
        at = int(numbers[0])
        flags = numbers[7:]
        if at != numbers[0] or any(f != int(f) or f < 0 for f in flags) or not (
                0 <= at <= len(requests) - REDUCTION_EVENTS) or any(
                requests[i] != (0.0, 0.0, 0.0) for i in range(at, at + REDUCTION_EVENTS)):
            raise CardError(f"{where}: a reduction's index must name {REDUCTION_EVENTS} empty requests")
        fastest, contiguous, reduce_dims, ndim, output_vec, acc_bytes, max_threads = (int(f) for f in flags)
        if output_vec not in (1, 2, 4) or acc_bytes not in (1, 2, 4, 8) or max_threads not in (256, 512):
            raise CardError(f"{where}: a reduction's vector size, accumulator or threads are not Reduce.cuh's")
        out.append((at, Reduction(tuple(numbers[1:4]), tuple(numbers[4:7]), bool(fastest), bool(contiguous),
                                  reduce_dims, ndim, output_vec, acc_bytes, max_threads)))
    return tuple(out)


def _get(data: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    value = data.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise CardError(f"{where}: {key!r} is missing or not a {kind.__name__}")
    return value


def _resizable(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise CardError(f"{where}: layers.resizable must be true or false")
    return value


def _parameter_growth(per_block: Any, names: Any, numels: list[int], where: str) -> tuple[int, ...]:
    """`parameters.per_block` ({name: elements a block adds}) as one entry per tensor; () for none."""
    if not per_block:
        return ()
    index = {n: i for i, n in enumerate(names)} if isinstance(names, list) and len(names) == len(numels) else {}
    if not isinstance(per_block, dict) or any(n not in index or not isinstance(v, int) or isinstance(v, bool)
                                              or not 0 < v <= numels[index[n]] for n, v in per_block.items()):
        raise CardError(f"{where}: parameters.per_block must give, for tensors in parameters.names, the "
                        "elements one block adds (at most the tensor's own)")
    growth = [0] * len(numels)
    for name, elements in per_block.items():
        growth[index[name]] = elements
    return tuple(growth)


def card_from_dict(data: Mapping[str, Any], key: str, source: str = "", digest: str = "") -> ModelCard:
    """The card a parsed TOML holds (`zlayout learn`'s format 1); CardError names what is wrong."""
    where = source or key
    if data.get("format") != 1:
        raise CardError(f"{where}: card format {data.get('format')!r}, this zlayout reads format 1")
    params = _get(data, "parameters", dict, where)
    shapes = params.get("shapes")
    if isinstance(shapes, str):  # "d d, d d, ..." as zlayout.cards writes them; cards before: [[d, d], ...]
        shapes = [shape.split() for shape in shapes.split(",")] if shapes else []
    if not isinstance(shapes, list):
        raise CardError(f"{where}: 'shapes' is missing or not a list")
    numels, ranks = [], tuple(len(shape) if isinstance(shape, list) else 0 for shape in shapes)
    for shape in shapes:
        n = 1
        for dim in shape:
            try:
                n *= int(dim)
            except (TypeError, ValueError):
                raise CardError(f"{where}: a parameter's shape is whole numbers") from None
        numels.append(n)
    count = _get(params, "count", int, where)
    if sum(numels) != count:
        raise CardError(f"{where}: the parameter shapes add up to {sum(numels):,}, not the count {count:,}")
    layers = _get(data, "layers", dict, where)
    kinds = tuple(int(k) for k in _get(layers, "kinds", list, where))
    module_calls, outside = layers.get("module_calls"), layers.get("module_calls_outside")
    if module_calls is not None or outside is not None:
        whole = lambda x: isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= 10**6  # noqa: E731
        if not (isinstance(module_calls, list) and len(module_calls) == len(set(kinds))
                and set(kinds) == set(range(len(module_calls)))
                and all(whole(n) for n in module_calls) and whole(outside)):
            raise CardError(f"{where}: layers.module_calls must give a count of module calls for each of the "
                            f"{len(set(kinds))} kinds of block, and module_calls_outside one count")
        module_calls = tuple(module_calls)
    regimes = []
    for r, regime in enumerate(_get(data, "regimes", list, where)):
        at = f"{where} regimes[{r}]"
        max_tokens, min_tokens = regime.get("max_tokens"), regime.get("min_tokens")
        max_micro_batch, max_positions = regime.get("max_micro_batch"), regime.get("max_positions")
        for name, value, unit in (("max_tokens", max_tokens, "tokens"), ("min_tokens", min_tokens, "tokens"),
                                  ("max_micro_batch", max_micro_batch, "sequences"),
                                  ("max_positions", max_positions, "tokens")):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise CardError(f"{at}: {name} must be a whole number of {unit}")
        if min_tokens is not None and r > 0:
            raise CardError(f"{at}: only the first regime may set min_tokens")
        single = regime.get("single_sequence")
        if single is not None and not isinstance(single, dict):
            raise CardError(f"{at}: single_sequence must be a table of blocks and a head")
        limits = {"max_tokens": max_tokens, "min_tokens": min_tokens, "max_micro_batch": max_micro_batch,
                  "max_positions": max_positions}
        regimes.append(_regime(regime, kinds, at, **limits, single_sequence=None if single is None else _regime(
            single, kinds, f"{at}.single_sequence", **limits)))
    if not regimes or regimes[-1].max_tokens is not None:
        raise CardError(f"{where}: the last regime must hold any sequence length (no max_tokens)")
    names = params.get("names")
    if isinstance(names, str):  # "a, b, ..." as zlayout.cards writes them; cards before: a list
        names = [name.strip() for name in names.split(",")] if names else []
    untrained = params.get("untrained")  # cards learned before it was recorded: None
    untrained_params = None
    if untrained is not None:
        index = {n: i for i, n in enumerate(names)} if isinstance(names, list) and len(names) == len(numels) else {}
        if not isinstance(untrained, list) or any(n not in index for n in untrained):
            raise CardError(f"{where}: parameters.untrained must list names from parameters.names")
        untrained_params = sum(numels[index[n]] for n in untrained)
    growth = _parameter_growth(params.get("per_block", {}), names, numels, where)
    return ModelCard(
        key=key, model_type=str(data.get("model_type")), attention=str(data.get("attention")),
        params=count, parameter_numels=tuple(numels), layer_kinds=kinds, regimes=tuple(regimes),
        module_calls=module_calls, module_calls_outside=outside,
        source=source, digest=digest, untrained_tensors=None if untrained is None else len(untrained),
        untrained_params=untrained_params, tied_embeddings=_tied_embeddings(params.get("tied_embeddings"), where),
        buffer_bytes=_buffer_bytes(params.get("buffer_bytes", 0), where),
        block_buffer_bytes=_block_buffer_bytes(params.get("block_buffer_bytes", []), kinds, where),
        attention_kernels=tuple(str(k) for k in data.get("attention_kernels") or ()),
        attention_dropout_counted=data.get("attention_dropout_counted") is True,
        transformers=_release(data.get("transformers"), where),
        buffer_dtype=_buffer_dtype(data.get("buffer_dtype"), where),
        linear_attention=_linear_attention(data.get("linear_attention"), where),
        token_quantum=_token_quantum(data.get("token_quantum"), where),
        checkpointing=_checkpointing(data.get("checkpointing", True), where),
        parameter_ranks=ranks, parameter_growth=growth, resizable=_resizable(layers.get("resizable", True), where),
        parameter_layers=parameter_layers(names, len(kinds))
        if isinstance(names, list) and len(names) == len(numels)
        and all(isinstance(n, str) for n in names) else None)


def _regime(regime: dict, kinds: tuple[int, ...], at: str, **fields: Any) -> Regime:
    """A regime's blocks (one entry a kind) and head, as a card holds them (a regime's own, or the
    one sequence's apart: Regime.single_sequence)."""
    blocks = []
    for i, block in enumerate(_get(regime, "blocks", list, at)):
        held = block.get("zero3_held", [])
        if not isinstance(held, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0
                                                for x in held):
            raise CardError(f"{at}.blocks[{i}]: zero3_held must be a list of element counts")
        blocks.append(BlockCard(kind=_get(block, "kind", int, f"{at}.blocks[{i}]"),
                                work=_work(block.get("work"), f"{at}.blocks[{i}].work"), zero3_held=tuple(held),
                                **{name: _phase(block.get(name), f"{at}.blocks[{i}].{name}",
                                                block.get(f"{name}_reductions"), block.get(f"{name}_frees"))
                                   for name in (
                                    "forward", "backward", "checkpointed_forward", "checkpointed_backward")}))
    missing = set(kinds) - {b.kind for b in blocks}
    if missing:
        raise CardError(f"{at}: layer kinds {sorted(missing)} have no block entry")
    head = _get(regime, "head", dict, at)
    preamble = head.get("preamble")
    return Regime(blocks=tuple(blocks), head_work=_work(head.get("work"), f"{at}.head.work"), **fields, **{
        f"head_{name}": _phase(head.get(name), f"{at}.head.{name}", head.get(f"{name}_reductions"),
                               head.get(f"{name}_frees"))
        for name in ("forward", "backward", "checkpointed_forward", "checkpointed_backward")},
        head_preamble=None if preamble is None else _preamble(head, f"{at}.head"))


def _preamble(head: dict, at: str) -> Phase:
    """The head's preamble phase and which of its requests are made once a step (`preamble_per_step`)."""
    phase = _phase(head["preamble"], f"{at}.preamble", head.get("preamble_reductions"), head.get("preamble_frees"))
    per_step = head.get("preamble_per_step", [])
    if not isinstance(per_step, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < len(phase.requests) for i in per_step):
        raise CardError(f"{at}.preamble_per_step: indices of the preamble's requests")
    return replace(phase, per_step=frozenset(per_step)) if per_step else phase


def _whole_bytes(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**50


def _buffer_bytes(value: Any, where: str) -> int:
    if not _whole_bytes(value):
        raise CardError(f"{where}: parameters.buffer_bytes must be a whole number of bytes")
    return value


def _block_buffer_bytes(value: Any, kinds: tuple[int, ...], where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or (value and len(value) != max(kinds, default=-1) + 1) \
            or not all(map(_whole_bytes, value)):
        raise CardError(f"{where}: parameters.block_buffer_bytes must list one block's bytes for each kind")
    return tuple(value)


def _tied_embeddings(value: Any, where: str) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise CardError(f"{where}: parameters.tied_embeddings must be true or false")
    return value


def _token_quantum(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65536:
        raise CardError(f"{where}: token_quantum must be a whole number of tokens from 1 to 65536, not {value!r}")
    return value


def _linear_attention(value: Any, where: str) -> str | None:
    """The implementation a card's linear attention was priced as (cards without: None)."""
    if value is None:
        return None
    if value not in (LINEAR_ATTENTION_FLA, STATE_SPACE_TORCH, STATE_SPACE_KERNELS):
        raise CardError(f"{where}: linear_attention must be {LINEAR_ATTENTION_FLA!r}, {STATE_SPACE_TORCH!r} or "
                        f"{STATE_SPACE_KERNELS!r}, not {value!r}")
    return value


def _buffer_dtype(value: Any, where: str) -> str | None:
    if value is not None and value != "bfloat16":
        raise CardError(f"{where}: buffer_dtype must be \"bfloat16\" or absent, not {value!r}")
    return value


def _checkpointing(value: Any, where: str) -> bool:
    """Whether the card's class can checkpoint its blocks (cards learned before it was recorded: yes)."""
    if not isinstance(value, bool):
        raise CardError(f"{where}: checkpointing must be true or false, not {value!r}")
    return value


def _release(value: Any, where: str) -> str | None:
    """The card's transformers release, which plan prints: a version string or nothing."""
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not re.fullmatch(r"[0-9A-Za-z.+\-]{1,40}", value):
        raise CardError(f"{where}: transformers must be a release's version, like 5.24.0")
    return value
