"""A model's parameter tensors as the training code lays them out: what the memory terms, the
allocator replay and the step time all count (element counts, in `parameters()` order where it
matters). Pure arithmetic over a `ModelSpec`; imports nothing else of the core, so
`memory` and `allocator_sim` both read it and neither imports the other back.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

from zlayout.spec import Layout, ModelSpec, PlanInput, TrainingSpec, ZeroKnobs

NORM_PART_ELEMENTS = 250_000_000  # stage3.py _constant_buffered_norm2(buffer_size): float64 parts


def weight_bytes_per_param(training: TrainingSpec) -> int:
    return 4 if training.precision == "fp32" else 2


def stage3_live_param_elements(model: ModelSpec, zero: ZeroKnobs, world: int, param_offload: bool) -> int:
    """Full (gathered) weights ZeRO-3 keeps on the GPU between the forward and the backward:
    those whose next use is within `stage3_max_reuse_distance` elements stay gathered (the
    last blocks and the head), capped by `stage3_max_live_parameters`. On one GPU with the
    weights on the GPU a 'gather' is a view of the partition and costs nothing."""
    if world == 1 and not param_offload:
        return 0
    # (The largest module and the prefetch bucket are not extra: measured on H200, adding
    # them over-predicted one-GPU parameter offload by exactly their size, 0.33-0.79 GiB.)
    return min(zero.stage3_max_reuse_distance, zero.stage3_max_live_parameters, model.params)


def stage3_gathered_at_loss(trace: list[list[tuple[int, int]]], loss_after: int, zero: ZeroKnobs) -> int:
    """Elements ZeRO-3 holds gathered when the loss runs (after module `loss_after` of the trace,
    the head's forward, and its release), a steady step replayed module by module as DeepSpeed
    0.19.8's partitioned_param_coordinator runs it (the trace complete: from the second step).
    `trace`: the step's modules in the order their hooks fetch them, forward then backward, each
    as its weights' (id, elements); a weight two modules share (a tied head) has one id.
    - fetch_sub_module gathers the module's own weights whatever the cap, pops them off the trace's
      queue, then prefetches while the elements taken are under min(stage3_max_live_parameters -
      available, stage3_prefetch_bucket_size), checked before each weight: the last one taken may
      overshoot the cap by its whole size (Phi-3's fused gate_up, 183.5M elements);
    - release_sub_module keeps a module's weights whose later use a prefetch skipped, and those
      found in the modules that follow within stage3_max_reuse_distance elements, counted module by
      module (the module that crosses the distance is still looked at)."""
    sizes = {ident: numel for module in trace for ident, numel in module}
    modules = [[ident for ident, _ in module] for module in trace]
    queue = [(ident, i) for i, ids in enumerate(modules) for ident in ids]
    at, available, n, recent = 0, set(), 0, {}
    for i, ids in enumerate(modules):
        for ident in ids:
            if ident not in available:
                available.add(ident)
                n += sizes[ident]
        need = {ident for ident in ids if recent.get(ident, -1) < i}
        popped = 0
        while at < len(queue) and popped < len(need):
            ident, used = queue[at]
            at += 1
            recent[ident] = used
            popped += 1
        most, taken, prefetch = min(zero.stage3_max_live_parameters - n, zero.stage3_prefetch_bucket_size), 0, set()
        while at < len(queue) and taken < most:
            ident, used = queue[at]
            at += 1
            recent[ident] = max(recent.get(ident, -1), used)
            if ident not in available and ident not in prefetch:
                prefetch.add(ident)
                taken += sizes[ident]
        available |= prefetch
        n += taken
        release = {ident for ident in ids if recent.get(ident, -1) <= i}
        seen = 0
        for later in modules[i + 1:]:
            if seen >= zero.stage3_max_reuse_distance or not release:
                break
            for ident in later:
                release.discard(ident)
                seen += sizes[ident]
        for ident in release & available:
            available.discard(ident)
            n -= sizes[ident]
        if i == loss_after:
            return n
    return n


def stage3_card_trace(numels: tuple[int, ...], layers: tuple[int, ...], blocks: int, tied: bool,
                      small: int, checkpointing: bool, reach: int = 0) -> tuple[list[list[tuple[int, int]]], int]:
    """A card's step as ZeRO-3's hooks fetch it, for `stage3_gathered_at_loss`, and the index of
    the head's forward in it: each parameter tensor above the persistence threshold its own module,
    in parameters() order (the order most decoder blocks run their projections in), the embedding
    first, the blocks, the head (tied: the embedding's weight again); then the head's backward and
    each block's in reverse (checkpointed: its recompute first, in forward order), the embedding's
    last. Each module: [(id, elements)]. `reach` > 0: only the last blocks holding at least twice
    that many elements (and not the embedding's forward): what the forward gathered before them is
    released before they run, since no weight there is used again within the reuse distance, and
    the prefetch runs no further ahead than the live cap (`reach`: their larger)."""
    embedding: list[list[tuple[int, int]]] = []
    head: list[list[tuple[int, int]]] = []
    block: list[list[list[tuple[int, int]]]] = [[] for _ in range(blocks)]
    for i, (numel, layer) in enumerate(zip(numels, layers)):
        if numel > small:
            (embedding if layer == -1 else head if layer == -2 else block[layer]).append([(i, numel)])
    if tied and embedding:
        head = [embedding[0]]
    start = 0
    if reach:
        tail = 0
        for start in reversed(range(blocks)):
            tail += sum(numel for m in block[start] for _, numel in m)
            if tail >= 2 * reach:
                break
        else:
            start = 0
    block = block[start:]
    forward = (embedding if start == 0 else []) + [m for b in block for m in b] + head
    backward = head[::-1]
    for b in reversed(block):
        backward += (b if checkpointing else []) + b[::-1]
    return forward + backward + embedding[::-1], len(forward) - 1


def block_fetch_modules(model, impl: str) -> list[list[int]] | None:
    """One dense block's modules in the order their forward runs (the order ZeRO-3's trace
    fetches them), each as the element counts of its weights (a module without one: a norm,
    whose small weights stay gathered). None for the blocks whose order is not written here
    (MoE, MLA)."""
    if model.is_moe or model.mla:
        return None
    h, q, kv, f = model.hidden, model.q_size, model.kv_size, model.ffn_size
    if impl == "hf" and model.norm == "rmsnorm" and model.mlp == "swiglu":
        # LlamaDecoderLayer: input_layernorm, q/k/v/o_proj, post_attention_layernorm,
        # LlamaMLP: down_proj(act(gate_proj(x)) * up_proj(x))
        return [[], [h * q], [h * kv], [h * kv], [model.attn_out_size * h], [], [f * h], [f * h], [f * h]]
    # worker_model.Block: norm1, qkv, proj, norm2, fc1, fc2
    gate_up = 2 if model.mlp == "swiglu" else 1
    return [[], [h * (q + 2 * kv)], [model.attn_out_size * h], [], [gate_up * f * h], [f * h]]


class Regathered(NamedTuple):
    """Gathered weights ZeRO-3 holds at once from the head's forward through the backward,
    beside what the forward left (elements): `loss` through the loss's forward and backward,
    `head` during the head's backward, `block` in a block's backward."""

    loss: int
    head: int
    block: int


def stage3_regathered_elements(model: ModelSpec, zero: ZeroKnobs, impl: str,
                               checkpointing: bool) -> Regathered | None:
    """partitioned_param_coordinator.fetch_sub_module, the trace complete: each module's fetch
    waits for its weights, then prefetches the trace's next ones until stage3_prefetch_bucket_size
    elements (at least one weight, however large); release_sub_module frees a module's after it.
    The trace is the whole step's, so the head's forward fetch prefetches past the forward's end
    into the backward's first weights (the last block's, in backward order), and its backward
    fetch the next. A fetch prefetches only while __n_available_params (the weights gathered and
    not released, the head's until its backward ends) is under stage3_max_live_parameters.
    None where the block's module order is not written (`block_fetch_modules`)."""
    modules = block_fetch_modules(model, impl)
    if modules is None:
        return None
    order = modules if checkpointing else modules[::-1]  # a recompute fetches in forward order
    small = zero.stage3_param_persistence_threshold
    head = model.vocab * model.hidden
    # the trace from the head's forward: the head (forward), the head (backward), the final
    # norm, then three blocks' modules (a norm's fetch prefetches too, so the prefetches run
    # ahead of the weights used until __n_available_params reaches stage3_max_live_parameters)
    trace = [[], [], []] + [[x for x in m if x > small] for m in order] * 3
    queue = [(i, j) for i, m in enumerate(trace) for j, _ in enumerate(m)]
    gathered: dict[tuple[int, int], int] = {}
    at, windows = 0, []
    for i, mine in enumerate(trace):
        for key in [k for k in gathered if k[0] < i]:  # released after their module
            del gathered[key]
        for j, x in enumerate(mine):
            gathered.setdefault((i, j), x)
        while at < len(queue) and queue[at][0] <= i:
            at += 1
        available = sum(gathered.values()) + head * (i < 2)  # the head's weight until its backward ends
        most, numel = min(zero.stage3_prefetch_bucket_size, zero.stage3_max_live_parameters - available), 0
        while at < len(queue) and numel < most:
            key = queue[at]
            at += 1
            if key not in gathered:
                gathered[key] = trace[key[0]][key[1]]
                numel += gathered[key]
        windows.append(sum(gathered.values()))
    return Regathered(head + windows[0], head + windows[1], max(windows[2:]))


def layer_tensor_sizes(model: ModelSpec, moe: bool | None = None) -> list[int]:
    """Element counts of one block's parameter tensors, as the reference GPT lays them out
    (MLA's projections and a MoE block's router, fused experts and shared experts as
    transformers lays them out). `moe`: which block of a MoE model (default: a MoE block)."""
    moe = model.is_moe if moe is None else moe
    h, kv, f, q = model.hidden, model.kv_size, model.ffn_size, model.q_size
    norm = [h, h] if model.norm == "layernorm" else [h]
    if model.mla:
        a = model.mla
        sizes = [h * q] if a.q_lora_rank is None else [h * a.q_lora_rank, a.q_lora_rank, a.q_lora_rank * q]
        sizes += [h * (a.kv_lora_rank + a.qk_rope_head_dim), a.kv_lora_rank,
                  a.kv_lora_rank * model.heads * (a.qk_nope_head_dim + a.v_head_dim), model.attn_out_size * h]
    else:
        sizes = [h * (q + 2 * kv), model.attn_out_size * h]
    if model.qk_norm != "none":
        sizes += [model.head_dim] * 2 if model.qk_norm == "head" else [q, kv]
    sizes += norm * model.norms_per_layer
    if model.bias if model.qkv_bias is None else model.qkv_bias:
        sizes.append(q + 2 * kv)
    if model.bias if model.out_bias is None else model.out_bias:
        sizes.append(h)
    gate_up = 2 if model.mlp == "swiglu" else 1
    if moe:
        ef, sf = model.expert_ffn_size, model.shared_expert_ffn_size * model.shared_experts
        sizes += [model.experts * h, model.experts * gate_up * ef * h, model.experts * ef * h]
        if sf:
            sizes += [gate_up * sf * h, sf * h]
        if model.shared_expert_gate:
            sizes.append(h)
        return sizes
    sizes += [gate_up * f * h, f * h]
    if model.bias if model.mlp_bias is None else model.mlp_bias:
        sizes += [gate_up * f, h]
    return sizes


# DeepSpeed 0.19.8 runtime/zero/leaf_module_config.py DEFAULT_LEAF_MODULE_CLASSES: the sparse
# MoE blocks engine._configure_distributed_model flags as ZeRO-3 leaf modules
# (apply_zero_leaf_module_config; zero_optimization.leaf_module defaults to these classes, and
# zlayout's DeepSpeed config does not set it)
ZERO3_LEAF_MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe")


def zero3_leaf_moe_tensor_sizes(model: ModelSpec, impl: str) -> tuple[int, ...]:
    """The weights of one sparse MoE block that ZeRO-3 treats as a leaf module, in registration
    order (element counts), or () where it treats none so: transformers' Mixtral, Qwen2-MoE and
    Qwen3-MoE blocks (a config of that model_type, or a hand-entered MoE of Mixtral's shape,
    which the worker builds as Mixtral): the router (experts x hidden) and the fused experts
    (gate/up, then down: 3D tensors), Qwen3-MoE's experts before its router; Qwen2-MoE's shared
    expert (gate_proj, up_proj, down_proj) and its gate after them (transformers 5.24).
    stage3.py create_reduce_and_remove_grad_hooks registers no gradient hook on these: one full
    backward hook on the block (reduce_leaf_module_grads) hands each of their gradients to
    reduce_ready_partitions_and_remove_grads once the block's input gradient is made, in this
    order, so all of them are alive when the first is reduced."""
    if impl != "hf" or not model.is_moe:
        return ()
    if model.hf_model_type not in ZERO3_LEAF_MOE_TYPES and not (model.hf_model_type is None and mixtral_shaped(model)):
        return ()
    h, ef, sf = model.hidden, model.expert_ffn_size, model.shared_expert_ffn_size * model.shared_experts
    experts = [model.experts * 2 * ef * h, model.experts * ef * h]
    router = [model.experts * h]
    sizes = experts + router if model.hf_model_type == "qwen3_moe" else router + experts
    if sf:
        sizes += [sf * h] * 3
    if model.shared_expert_gate:
        sizes.append(h)
    return tuple(sizes)


def hf_layer_tensor_sizes(model) -> list[int]:
    """One decoder layer's parameter tensors in the order transformers registers them
    (modeling_llama.py / modeling_qwen2.py / modeling_mistral.py: LlamaDecoderLayer's
    self_attn (q_proj, k_proj, v_proj, o_proj: each a Linear, weight then bias), mlp
    (gate_proj, up_proj, down_proj), input_layernorm, post_attention_layernorm): separate
    q/k/v and gate/up weights, not the reference GPT's fused ones. The same element count."""
    h, q, kv, f = model.hidden, model.q_size, model.kv_size, model.ffn_size
    qb, ob, mb = model._biased(model.qkv_bias), model._biased(model.out_bias), model._biased(model.mlp_bias)
    sizes = [h * q] + ([q] if qb else []) + [h * kv] + ([kv] if qb else []) + [h * kv] + ([kv] if qb else [])
    sizes += [model.attn_out_size * h] + ([h] if ob else [])
    sizes += [f * h] + ([f] if mb else []) + [f * h] + ([f] if mb else []) + [f * h] + ([h] if mb else [])
    return sizes + [h] * model.norms_per_layer


def mixtral_shaped(model) -> bool:
    """A MoE model of Mixtral's shape (what hfconfig.to_hf_config writes for routed experts
    alone): every block a MixtralSparseMoeBlock (router, experts as two 3D tensors, SwiGLU),
    no shared experts, no dense blocks, no biases."""
    return (model.is_moe and model.mla is None and model.shared_experts == 0
            and model.dense_layer_count == 0 and model.mlp == "swiglu" and model.norm == "rmsnorm"
            and model.hf_model_type in (None, "mixtral") and not model.shared_expert_gate
            and not any(model._biased(b) for b in (model.qkv_bias, model.out_bias, model.mlp_bias))
            and model.expert_ffn_size == model.ffn_size)


def mixtral_layer_tensor_sizes(model) -> list[int]:
    """One MixtralDecoderLayer's parameter tensors in registration order (modeling_mixtral.py:
    self_attn's q/k/v/o, mlp.gate (MixtralTopKRouter.weight, experts x hidden),
    mlp.experts (MixtralExperts.gate_up_proj (experts, 2 ffn, hidden), down_proj (experts,
    hidden, ffn)), input_layernorm, post_attention_layernorm)."""
    h, q, kv, f, E = model.hidden, model.q_size, model.kv_size, model.expert_ffn_size, model.experts
    return [h * q, h * kv, h * kv, model.attn_out_size * h, E * h, E * 2 * f * h, E * f * h] + [h] * model.norms_per_layer


def block_tensor_sizes(model, impl: str) -> list[int]:
    """Elements of each weight tensor of one block, in the worker's module order: a dense
    model's block or a Mixtral-shaped one's (`mixtral_shaped`; the replay's MoE blocks)."""
    if model.is_moe:
        return mixtral_layer_tensor_sizes(model)
    if impl == "hf" and model.norm == "rmsnorm" and model.mlp == "swiglu":
        return hf_layer_tensor_sizes(model)
    return layer_tensor_sizes(model, moe=False)


@functools.lru_cache(maxsize=256)
def parameter_tensor_sizes(model, impl: str) -> tuple[int, ...]:
    """Elements of each weight tensor in `model.parameters()` order (the order DeepSpeed
    flattens and groups them): the embedding, each block's tensors, the final norm, the head.
    Other MoE models than Mixtral's shape (shared experts, their gate, dense blocks first, MLA)
    by memory.layer_tensor_sizes, block kind by block kind. Memoized (a tuple): one estimate
    reads it for the step time's per-tensor terms, ZeRO-3's sub-groups and the host's cast, and
    break-even runs hundreds of estimates a keystroke."""
    if model.card is not None and impl == "hf":  # a learned card lists the class's tensors exactly
        return model.card.parameter_numels
    if (model.is_moe and not mixtral_shaped(model)) or model.qk_norm != "none":
        blocks = (layer_tensor_sizes(model, moe=False) * model.dense_layer_count
                  + layer_tensor_sizes(model, moe=True) * model.moe_layer_count)
    else:
        blocks = block_tensor_sizes(model, impl) * model.layers
    tensors = [model.vocab * model.hidden] + blocks
    tensors.append(model.final_norm_params())
    if not model.tie_embeddings:
        tensors.append(model.vocab * model.hidden)
    if model.head_bias:
        tensors.append(model.vocab)
    return tuple(tensors)


def stage3_sub_groups(tensors: list[int] | tuple[int, ...], world: int, sub_group_size: int) -> list[tuple[int, int]]:
    """ZeRO-3's optimizer sub-groups as (elements of this GPU's partition, elements of the whole
    tensors). stage3.py _create_fp16_sub_groups: whole tensors are added in order and a
    sub-group closes once its partitions reach sub_group_size, so a sub-group holds at least
    sub_group_size elements (a 2.36B model at the default 1e9: 1003.5M and 1355.9M, not 1e9,
    1e9 and 0.36e9; the t-z3-hf-L6-h4096 trace's fp32 buffers are 3828 and 5172 MiB)."""
    parts = [-(-x // world) for x in tensors]
    if not parts or sub_group_size >= sum(parts):
        return [(sum(parts), sum(tensors))]
    groups, part, whole = [], 0, 0
    for i, (x, px) in enumerate(zip(tensors, parts)):
        part, whole = part + px, whole + x
        if part >= sub_group_size or i == len(parts) - 1:
            groups.append((part, whole))
            part, whole = 0, 0
    return groups


# A weight's data pointer on a 16-byte boundary: tensor cores' 16-byte loads. torch's grouped GEMM
# (`_grouped_mm`, transformers' experts) refuses one off it ("expected data_ptr to be aligned to 16
# bytes": h200-2026-12-31c, zaya at ZeRO-2); cuBLAS runs a dense GEMM on one off it with CUTLASS's
# 2- or 4-element kernels (h200-2026-12-31c, apertus1p5_text at ZeRO-3 on one GPU: `..._align2`).
WEIGHT_ALIGNMENT_BYTES = 16


def packs_unpadded(inp: PlanInput, layout: Layout) -> bool:
    """Whether this layout, as zlayout's ds_config runs it, makes every weight a view into one flat
    buffer packed tensor after tensor with nothing between them: ZeRO-0 (bf16 without ZeRO is
    DeepSpeed's FP16_Optimizer: `_flatten_dense_tensors` of the weights' clones, each weight pointed
    at its slice; fused_optimizer.py, no switch pads it) and ZeRO-3 on one GPU with its weights there
    (stage3.py `defragment`: NoGatherHandle points each parameter at its partition). ZeRO-1 and -2
    pack alike (stage_1_and_2.py), but zlayout's ds_config pads them (`parameter_alignment`) wherever
    a weight would land off a boundary (`misaligned_weights`); ZeRO-3 over several GPUs, or with its
    weights on the host, gathers or copies each weight into an allocation of its own."""
    return layout.stage == 0 or (layout.stage == 3 and inp.hardware.world == 1 and layout.offload_param == "gpu")


def packed_alignments(inp: PlanInput) -> tuple[int, ...]:
    """Each parameter tensor's alignment (elements its start is a multiple of, at most 8: on a
    16-byte boundary) when DeepSpeed packs them in parameters() order with no padding. One tensor of
    an odd size (zaya's 2-element `qk_norm.temp`, xIELU's scalar alphas) shifts every one after it."""
    return _packed_alignments(inp.model, inp.training.impl, weight_bytes_per_param(inp.training))


@functools.lru_cache(maxsize=256)
def _packed_alignments(model: ModelSpec, impl: str, element_bytes: int) -> tuple[int, ...]:
    offset, out = 0, []
    for numel in parameter_tensor_sizes(model, impl):
        start = offset * element_bytes % WEIGHT_ALIGNMENT_BYTES
        out.append(8 if start == 0 else math.gcd(start, WEIGHT_ALIGNMENT_BYTES) // element_bytes or 1)
        offset += numel
    return tuple(out)


def misaligned_weights(inp: PlanInput) -> tuple[int, ...]:
    """The matrices (parameter tensors of two or more dimensions, parameters() order) that packing
    without padding would put off a 16-byte boundary; () where the card does not record shapes (or
    there is no card: the hand models' tensors are all multiples of 8). Memoized, as
    `parameter_tensor_sizes`: every layout of a plan, and break-even's estimates, ask."""
    return _misaligned_weights(inp.model, inp.training.impl, weight_bytes_per_param(inp.training))


@functools.lru_cache(maxsize=256)
def _misaligned_weights(model: ModelSpec, impl: str, element_bytes: int) -> tuple[int, ...]:
    card = model.card if impl == "hf" else None
    if card is None or not card.parameter_ranks:
        return ()
    aligns = _packed_alignments(model, impl, element_bytes)
    return tuple(i for i, (rank, align) in enumerate(zip(card.parameter_ranks, aligns)) if rank >= 2 and align < 8)


def grouped_gemm_misaligned(inp: PlanInput, layout: Layout) -> int | None:
    """The first weight torch's grouped GEMM reads (index, parameters() order) that DeepSpeed would put
    off a 16-byte boundary in this layout without padding, or None: ZeRO-1 and -2 (which zlayout's
    ds_config then pads) and the layouts that pack with no way to pad (`packs_unpadded`)."""
    if not (layout.stage in (1, 2) or packs_unpadded(inp, layout)):
        return None
    misaligned = misaligned_weights(inp)  # () without a card that records shapes
    weights = set(inp.model.card.grouped_gemm_weights) if misaligned else set()
    return next((i for i in misaligned if i in weights), None)


def gemm_weight_alignment(inp: PlanInput, layout: Layout) -> tuple[dict[int, float], int] | None:
    """Where a layout packs the weights with no padding (`packs_unpadded`): the share of the blocks'
    matrix elements at each alignment below 8 (a linear layer's FLOPs are tokens x its elements, so
    this is the share of the blocks' GEMM FLOPs cuBLAS runs on the slower kernels), and the alignment
    of the weight the head's GEMM reads (the embedding where tied). None where every weight is aligned."""
    misaligned = misaligned_weights(inp) if packs_unpadded(inp, layout) else ()
    if not misaligned:
        return None
    card, aligns = inp.model.card, packed_alignments(inp)
    layers = card.parameter_layers or (0,) * len(card.parameter_numels)
    blocks = [(n, a) for n, r, a, at in zip(card.parameter_numels, card.parameter_ranks, aligns, layers)
              if r == 2 and at >= 0]
    total = sum(n for n, _ in blocks) or 1
    shares: dict[int, float] = {}
    for numel, align in blocks:
        if align < 8:
            shares[align] = shares.get(align, 0.0) + numel / total
    head_numel = inp.model.vocab * inp.model.hidden
    heads = [i for i, (n, at) in enumerate(zip(card.parameter_numels, layers)) if n == head_numel and at < 0]
    head = (heads[0] if card.tied_embeddings else heads[-1]) if heads else None
    return shares, (aligns[head] if head is not None else 8)


def grouped_gemm_refusal(inp: PlanInput, layout: Layout) -> str | None:
    """One line where a layout cannot run because DeepSpeed puts a grouped-experts weight off a
    16-byte boundary and has no switch to pad it (`packs_unpadded`: ZeRO-0, ZeRO-3 on one GPU with
    its weights there; ZeRO-1/2 pad with `parameter_alignment`, which zlayout's ds_config sets).
    None where it runs."""
    if not packs_unpadded(inp, layout):
        return None
    index = grouped_gemm_misaligned(inp, layout)
    if index is None:
        return None
    where = ("ZeRO-0 will not run this model: DeepSpeed's FP16_Optimizer packs its weights into one buffer "
             "without padding (fused_optimizer.py)" if layout.stage == 0 else
             "ZeRO-3 on one GPU will not run this model: DeepSpeed packs its weights into one buffer "
             "without padding (stage3.py defragment)")
    return (f"{where}, which puts parameter tensor #{index} (a 3-D weight "
            f"of a model whose experts run a grouped GEMM) off a 16-byte boundary, and torch's grouped GEMM refuses it "
            f"(\"expected data_ptr to be aligned to 16 bytes\"); train it with ZeRO-1 or -2 (zlayout's "
            f"ds_config pads each weight there), or ZeRO-3 over more than one GPU")
