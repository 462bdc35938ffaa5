"""A deterministic replay of PyTorch's CUDA caching allocator over one layout's training steps.

Pure arithmetic, no torch.

* `CachingAllocator` (core/caching_allocator.py): the default allocator of
  c10/cuda/CUDACachingAllocator.cpp for the large pool of one stream, and `Device`, the card its
  pools share: segments are returned by an explicit `empty_cache` (ZeRO-3's defragment at
  initialize) and, where the card fills (`replay_at_capacity`), by the retry after a failed
  cudaMalloc; with room they never are, so peak reserved is the sum of every segment made.
  Requests of 1 MiB or less (the small pool: norms' statistics, flags, losses) are not
  replayed: they stay in 2 MiB segments of their own and are a constant. The model's tensor
  lists are core/tensors.py's.
* `allocation_sequence`: the tensors one GPU allocates and frees, in order, from
  `deepspeed.initialize` through `steps` training steps, built from the same terms as
  `memory.py` (weights per tensor then flattened, fp32 master and moments, each block's
  saved activations and its forward/backward transients, the loss's tokens x vocab tensors,
  per-tensor gradients or the stage 1/2 reduce buckets and partition, the optimizer step's
  fp32 casts and flatten). What decides reserved memory is which sizes arrive in which order:
  a tensor that no cached block holds gets a new segment, and the cached blocks that smaller
  tensors split are not whole again when a large request comes back. Written per phase
  (`_Training`: initialize, the forward's blocks, the head and loss forward, their backward,
  the blocks' backward, the reduce epilogue, the step) over the state they share
  (core/replay_state.py `Replay`); one block's requests are core/replay_blocks.py's (by hand,
  or from a learned model card), ZeRO-3's gathers core/replay_gathers.py's, the gradient
  hooks, buckets and optimizer step core/replay_grads.py's.
* Streams (`Pools`): a freed block is cached for the stream that allocated it. ZeRO-3
  gathers weights on its allgather stream and concatenates each reduced bucket on its reduce
  stream; those pools are replayed apart from the compute stream's, and peak reserved is
  their sum.
* ZeRO-3 (DeepSpeed 0.19.8 stage3.py / partition_parameters.py): zero.Init partitions each
  tensor as it is built; the partitions are moved to the host, the cache emptied, and flattened
  into one buffer; the fp32 master per sub-group, the flat gradient partition and the IPG
  bucket are allocated once at initialize; each weight gradient is copied into the bucket and
  dropped, a full bucket concatenated for its reduce-scatter; the step takes each gradient's
  float64 norm, then flattens and casts one sub-group at a time. Weights are gathered only
  when they are not whole on the GPU (more than one GPU, or parameter offload): per block
  before its forward and again before its backward, those within `stage3_max_reuse_distance`
  (the head and the last blocks) kept. On more than one GPU each weight is gathered and
  released once at initialize (its gradient hook's registration). From the second step the
  coordinator prefetches per module (`Prefetcher`: one all-gather call per
  `stage3_prefetch_bucket_size` elements; on more than one GPU a flat buffer with a copy per
  weight when the call has several, on one GPU with the weights on the host one copy per
  weight); checked against rank 0 of 2, 4 and 8 GPUs emulated on one H200
  (benchmarks/measurements/h200-2026-12-01f/emulated) and one-GPU offload traces with streams
  (h200-2026-12-02/traces/s-*).
* Gradient accumulation: stage 0 and stage 1 keep each weight's `.grad` from the first
  micro-step to the boundary (stage 1 reduces only there); stage 2 reduces every micro-step.
* Mixture of experts (`mixtral_replayed`: transformers' Mixtral, `--impl hf`, routed experts
  only): each block's MixtralSparseMoeBlock as transformers 5.24 runs it, its experts by
  `grouped_mm_experts_forward` (integrations/moe.py; the default experts implementation): the
  router's fp32 softmax and top-k, the tokens sorted by expert and gathered (tokens x top_k
  rows), two grouped matmuls over the 3D expert weights, the routing weights applied in fp32,
  un-permuted and summed; in backward each 3D weight's whole gradient made once, by its
  grouped matmul, and hooked; at ZeRO-3 DeepSpeed makes the block a leaf module, whose
  gradients are hooked together at its end (`LeafGradients`; with a card too). The order
  follows torch.profiler's CPU memory events of the block; one MoE allocator trace
  (Mixtral-8x22B-L2, ZeRO-3 with the optimizer on the CPU, h200-2026-12-03b): peak allocated
  26.90 GiB replayed (large pool) vs 26.76, reserved 37.17 vs 38.77. Any other MoE class with a learned card
  (qwen3_moe, phimoe, ...) is replayed with its blocks from the card (`CardBlocks`: the
  requests transformers' grouped experts really make, recorded by the learner) where ZeRO-3
  gathers no weights (`_carded_blocks_replayed`), and so is MLA attention (DeepSeek-V2/V3: the
  card records its compressed projections' requests); without a card, Qwen2-MoE and DeepSeek
  blocks (shared experts, grouped routing, MLA) and zlayout's GPT (no experts) are not replayed.
* Checked request by request against allocator traces recorded on an H200 (torch 2.11,
  DeepSpeed 0.19.8; benchmarks/allocator_trace_compare.py lines a replay up with one, phase by
  phase): the cuBLAS workspace each multiplying thread keeps, autograd's order (a Linear's
  weight gradient before its input's, hooked at once; residual gradients summed in place; a
  tied weight's two gradients summed once), the checkpoint recompute's early stop, flash
  attention's backward workspace, the loss's b x (s-1) tokens, DeepSpeed's float64 gradient
  norms, stage 0's all-reduce buckets, grads_in_partition on the reduction stream,
  transformers' decoder layer node by node, ZeRO-3's defragment and bucket copies. Every
  phase after zero.Init of 14 of the 15 traces replays to within 16 MiB of its segments, peak
  reserved within 20 MiB; z3-opt-param-cpu (ZeRO-3 with both offloads) is 0.44 GiB over.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass, field

from zlayout.core.caching_allocator import (  # noqa: F401 (the allocator's names, read here by tests)
    DEFAULT_STREAM, LARGE_BUFFER, MIN_LARGE_ALLOC, ROUND_LARGE, SMALL_SIZE, CachingAllocator, Device,
    OutOfMemory, Pools, _Block, allocation_size, replay, round_size)
from zlayout.core.replay_blocks import CardBlocks, HandBlocks  # noqa: F401
from zlayout.core.replay_gathers import Gathers
from zlayout.core.replay_grads import ALLREDUCE_BUCKET_ELEMENTS, NORM_PART_ELEMENTS, GradientReduction  # noqa: F401
from zlayout.core.replay_state import (  # noqa: F401 (read here by tests and benchmarks)
    ALLGATHER_STREAM, CUBLAS_WORKSPACE_HOPPER, CUBLAS_WORKSPACE_OTHER, REDUCE_STREAM, MiB, Replay, _Seq,
    cublas_workspace_bytes)
from zlayout.core.tensors import (  # noqa: F401 (the model's tensors, read here by steptime and tests)
    block_tensor_sizes, hf_layer_tensor_sizes, layer_tensor_sizes, mixtral_layer_tensor_sizes, mixtral_shaped,
    parameter_tensor_sizes, stage3_live_param_elements, stage3_sub_groups)

REPLAYED_MICRO_STEPS = 3  # first, a middle one, the boundary: see allocation_sequence
MAX_REPLAYED_LAYER_PASSES = 384  # layers x micro-steps x steps (Llama-3-405B: 126 x 1 x 2 = 252)


def mixtral_replayed(model, training) -> bool:
    """A MoE model whose requests the replay writes: transformers' Mixtral (`mixtral_shaped`,
    `--impl hf`). Qwen2-MoE's and DeepSeek's blocks (shared experts, their gate, grouped
    routing) and zlayout's own GPT (worker_model.Block has no experts) are left to the
    per-phase rule."""
    return training.impl == "hf" and mixtral_shaped(model)


# Whether the replay takes a carded model's blocks from its card (benchmarks/card_accuracy.py
# turns it off to print the hand-written blocks' figures beside the card's).
blocks_from_cards = True


def _replays_card(model, training) -> bool:
    return blocks_from_cards and model.card is not None and training.impl == "hf"


# Whether a replay that takes its blocks from the card takes the head and loss from it too
# (benchmarks/card_accuracy.py turns it off to print the hand-written head's figures beside).
heads_from_cards = True


def _carded_blocks_replayed(inp, layout) -> bool:
    """A model whose blocks the hand-written replay does not write (a MoE class other than
    Mixtral, MLA attention) replayed with its blocks from its card, where ZeRO-3 gathers no
    weights: a gather fetches a block's weights as the hand-written tensor list
    (`Replay.layer_sizes`), which is not this class's."""
    gathers = layout.stage == 3 and (inp.hardware.world > 1 or layout.offload_param != "gpu")
    return _replays_card(inp.model, inp.training) and not gathers


def replayed_allocated_counts(inp, layout) -> bool:
    """Whether the replay's allocated peak (`CapacityReplay.peak_allocated`) is the run's: a
    carded model's blocks, head and loss from its card, no ZeRO-3 gather (the hand-written
    tensor lists), nothing offloaded but stage 1/2's optimizer. Measured: the five GPU-resident
    Falcon-7B rows to 0.01 GiB where the per-phase sum was 0.7-3.6% under, the other 86 carded
    GPU-resident rows within 0.6% of it; the 22 carded stage 1/2 rows with the optimizer on the
    CPU within 0.2% but glm_moe_dsa's +1.7% (`offload_cast_replayed`). The hand-written blocks'
    requests are sized for what the allocator reserves, not what is held at once: on the hand
    model's GPU-resident rows their peak is 1-21% over the run (h200-2026-12-01), where the
    per-phase sum is exact. Not stage 3 with the optimizer on the CPU: there the replay's peak
    read over the per-phase sum by 2-11% on three carded MoE rows (jetmoe +8.8%)."""
    return (_carded_blocks_replayed(inp, layout) and heads_from_cards and layout.offload_param == "gpu"
            and (layout.offload_optimizer == "gpu" or offload_cast_replayed(inp, layout)))


def offload_cast_replayed(inp, layout) -> bool:
    """Stage 1/2 with the optimizer on the CPU, a carded model: the replay, which reduces the
    gradients bucket by bucket in backward's order and casts each partition where DeepSpeed does
    (replay_grads), places the offload cast's peak, where the per-phase rule can only bound it
    (`memory.stage12_offload_cast_phase`: a gradient that fits the bucket cast beside every
    activation). OLMo-2-7B-L8 at 1 x 4096 (h200-2026-12-31g, held out): the bound 19.39 GiB,
    5.8% over the run's 18.32; the replay 18.28."""
    return (_carded_blocks_replayed(inp, layout) and heads_from_cards and layout.stage in (1, 2)
            and layout.offload_optimizer == "cpu" and layout.offload_param == "gpu")


def replayed_peak_allocated(inp, layout) -> int | None:
    """The most the replayed requests hold at once where that is the run's
    (`replayed_allocated_counts`), whatever the allocator: tensors' bytes do not depend on where
    they are placed, so `--allocator expandable` takes it from the default allocator's unbounded
    replay (memoised with its reserve). None where it does not count."""
    if not replayed_allocated_counts(inp, layout):
        return None
    replayed = _replayed(inp, layout)
    return None if replayed is None else replayed[1]


def card_blocks(inp, s: _Seq, first_matmul, device, leaf: tuple[int, ...] = ()) -> CardBlocks | None:
    """The replay's blocks from the model's learned card, or None (the hand-written blocks);
    `leaf`: Replay.leaf_gradients."""
    model, t = inp.model, inp.training
    if not _replays_card(model, t):
        return None
    return CardBlocks(model.card, s, model.layers, t.micro_batch, t.seq, t.checkpointing == "full",
                      model.norm == "rmsnorm", first_matmul, device, leaf)


@dataclass
class MicroStep:
    """What one micro-step's phases hand each other (`_Training`)."""

    index: int
    boundary: bool  # the accumulation boundary: the optimizer steps after this backward
    # ZeRO-3's first forward and backward record the module trace
    # (partitioned_param_coordinator: reset_step at each forward's start moves INVALID ->
    # RECORD -> COMPLETE); until the trace is complete release_sub_module releases every
    # gathered weight after its module, whatever stage3_max_reuse_distance says (the
    # z3-opt-param-cpu trace: step 1's forward frees every block's and the head's
    # weights, step 2's keeps the last blocks')
    recording: bool
    keep_head: bool  # ZeRO-3: the head's gathered weights kept from forward to backward
    prefetch: tuple | None = None  # ZeRO-3 after the first step: the forward's Prefetcher, block starts
    backward_prefetch: tuple | None = None  # and the backward's, from the head's forward on
    head_prefetches: int = 0  # the head's fetches that prefetched: its forward's, its backward's
    saved: list[dict] = field(default_factory=list)  # per block: what its backward keeps
    inputs: list[int] = field(default_factory=list)  # per block its input, then the last output
    gathered: dict[int, list[int]] = field(default_factory=dict)  # ZeRO-3: weights kept for backward
    # ZeRO-3: gathered weights released after the forward whose storage autograd's saved views
    # keep until the block's backward (Gathers.held_by_autograd)
    held: dict[int, list[int]] = field(default_factory=dict)
    final_kept: list[int] = field(default_factory=list)  # what the final norm keeps for backward
    head_in: int | None = None  # the final norm's output, the head's input
    head_w: list[int] = field(default_factory=list)  # ZeRO-3: the head's gathered weight
    loss_kept: list = field(default_factory=list)  # what the head and loss keep for their backward
    preamble: list[int] = field(default_factory=list)  # the card's masks and tables, held to the forward's return
    g: int | None = None  # the gradient flowing back: the head's input's, then each block's
    head_grad: int | None = None  # the output head's weight gradient


class _Training:
    """The phases of one replay, in the order `allocation_sequence` runs them, over the state
    they share: `r` (the layout's terms and the sequence), `blocks` (one block's requests, by
    hand or from the card), `gathers` (ZeRO-3's) and `grads` (the hooks, buckets and step)."""

    def __init__(self, inp, r: Replay) -> None:
        self.r, self.s = r, r.s
        self.hand = HandBlocks(r)
        # The seam for a model's own per-block requests: one block's forward, its checkpoint
        # recompute and its backward, over `s.a` / `s.f`; from a learned model card
        # (core/card.py) where the model has one, the rest of the step unchanged.
        self.card = card_blocks(inp, r.s, r.first_matmul, r.device, r.leaf_gradients)
        self.blocks = self.hand if self.card is None else self.card
        # the final norm, the head and the loss from the card too (`card_head_forward`)
        self.card_head = self.card is not None and heads_from_cards
        self.gathers = Gathers(r)
        self.grads = GradientReduction(r)

    def release_input(self, name: int) -> None:
        """A block's input the step frees (the checkpoint's, `inputs_embeds`), unless the
        card's requests freed it already (a LayerNorm's saved input, dropped in its backward)."""
        if self.card is None or name not in self.card.freed_inputs:
            self.s.f(name)

    # --- deepspeed.initialize ---------------------------------------------------------

    def initialize(self) -> None:
        if self.r.stage == 3:
            self.initialize_stage3()
        else:
            self.initialize_engine()
        self.s.mark("initialize")

    def initialize_stage3(self) -> None:
        """zero.Init, the defragmented flat weights, the fp32 master per sub-group, the IPG
        bucket and the flat gradient partition, each weight's hook registration."""
        r, s = self.r, self.s
        w, n, zero, tensors, small = r.w, r.n, r.zero, r.tensors, r.small
        opt_on_gpu, param_on_gpu, p_shard, sub_groups, groups = (
            r.opt_on_gpu, r.param_on_gpu, r.p_shard, r.sub_groups, r.groups)
        # zero.Init: each tensor is made on the GPU and partitioned as it is built: its 1/n
        # slice copied out (to the host with parameter offload), the whole freed
        # The module is built in fp32 (the worker's default dtype) and Init casts each tensor
        # to bf16 as it is made (z3-opt-param-cpu trace: 500 then 250 MiB for the embedding,
        # 192 then 96 for a QKV, the fp32 freed first)
        weights = []
        for x in tensors:
            full = s.a(x * 4)
            whole = s.a(x * w)
            s.f(full)
            if param_on_gpu:
                weights.append(s.a(-(-x // n) * w))
            s.f(whole)
        s.mark("built")
        if param_on_gpu:
            # _create_fp16_partitions_with_defragmentation -> zero/utils.py defragment: each
            # partition copied to a host buffer and freed, gc.collect(), empty_cache() (the
            # segments zero.Init filled go back to the device: t-z3-L12-h3072 trace, 16
            # segments freed, 3336 MiB; on 2 GPUs too, w2-z3-L8-h4096 emulated trace, 9
            # segments), then the flat buffer copied back to the GPU; the partitions become
            # views of it
            s.f(*weights)
            s.empty_cache()
            s.a(p_shard * w)
        if opt_on_gpu:
            # _create_fp32_partitions, per sub-group: converted = flat.to(fp32), master =
            # converted.clone(); the local `converted` lives until the next sub-group's
            # replaces it, the last until the function returns (t-z3-hf-L6-h4096 trace)
            converted = None
            for size in sub_groups:
                made = s.a(size * 4)
                if converted is not None:
                    s.f(converted)
                s.a(size * 4)
                converted = made
            s.f(converted)
            # initialize_optimizer_states: one zero fp32 gradient as long as the largest
            # sub-group, summed over `fp16_partitioned_groups` (stage3.py: the params' ds_tensor,
            # whose ds_numel is this GPU's partition), dropped at its end (w2-z3-L8-h4096 trace:
            # 3572.8 MiB on 2 GPUs, the partition, not 7145.7 for the whole tensors)
            s.transient(4 * max(part for part, _ in groups))
        if zero.contiguous_gradients:
            s.a(zero.reduce_bucket_size * w)  # the IPG bucket, allocated once
        if opt_on_gpu:
            s.a(p_shard * w)  # grad_partitions_flat_buffer (made after the IPG bucket: same trace)
        # create_reduce_and_remove_grad_hooks: each trainable weight is param.all_gather()ed
        # (_all_gather_sequential: a buffer of ceil(numel / n) * n on the default stream), its
        # hook registered, then param.partition() frees it (w2-z3-L8-h4096 trace: 250, 96, 32,
        # 128, 128 MiB ..., each freed before the next), on one GPU too (t-z3-L12-h3072,
        # t-z3-hf-L6-h4096; Mixtral-8x7B's 1792 MiB experts made a segment the replay lacked:
        # h200-2026-12-24 trace-1). With the weights on the host the partition is first copied to
        # the GPU and freed before the buffer (s-z3-opt-param-L16-h3072, s-w2-z3-opt-param-L8-h4096:
        # 96, 48, -48, -96). Small ones are persistent.
        for x in tensors:
            if x > small:
                part = -(-x // n)
                if param_on_gpu:
                    s.transient(part * n * w)
                else:
                    gathered = s.a(part * n * w)
                    s.transient(part * w)
                    s.f(gathered)

    def initialize_engine(self) -> None:
        """Stages 0-2: the module moved to the GPU, flattened, the fp32 master (and at stage 0
        Adam's moments)."""
        r, s = self.r, self.s
        w, p, p_shard, tensors, offload12 = r.w, r.p, r.p_shard, r.tensors, r.offload12
        # engine: the module, cast to bf16 on the host, moves to the GPU tensor by tensor
        s.mark("built")
        weights = [s.a(x * w) for x in tensors]
        if r.stage == 0:
            # FP16_Optimizer (bf16, stage 0): flatten clones of every weight, point the weights
            # into the flat buffer; master = flat.clone().float(); initialize_optimizer_states:
            # a zero fp32 gradient and one optimizer.step() that creates both Adam moments.
            clones = [s.a(x * w) for x in tensors]
            s.a(p * w)
            s.f(*clones)
            s.f(*weights)
            clone = s.a(p * w)
            s.a(4 * p)
            s.f(clone)
            zero_grad = s.a(4 * p)
            s.a(4 * p)
            s.a(4 * p)
            s.f(zero_grad)
        else:
            # DeepSpeedZeroOptimizer: flatten_dense_tensors_aligned on the GPU, weights become
            # views of it; master = partition.clone().to(fp32); initialize_optimizer_states
            # allocates a zero fp32 gradient partition and drops it (moments come at step 1).
            s.a(p * w)
            s.f(*weights)
            clone = s.a(p_shard * w)
            if offload12:
                # weights_partition = partition.clone().to(device='cpu', dtype=fp32): the bf16
                # clone is copied out and freed, the fp32 cast is made on the host (a GPU to CPU
                # copy_ converts on the destination side); the zero fp32 gradient partition is
                # pinned host memory. temp_grad_buffer_for_gpu_offload: the largest weight's
                # numel in bf16 on the GPU, kept (measured after initialize: 3.733 GiB at L8
                # h4096 = the flat weights + one 32000 x 4096 bf16 buffer)
                s.f(clone)
                s.a(max(tensors) * w)
            else:
                s.a(4 * p_shard)
                s.f(clone)
                s.transient(4 * p_shard)

    # --- forward ----------------------------------------------------------------------

    def forward_blocks(self, m: MicroStep) -> None:
        """The embedding and every block's forward (ZeRO-3: each block's weights gathered
        first, released after it unless kept for the backward)."""
        r, s, gathers = self.r, self.s, self.gathers
        V, h, w, T = r.V, r.h, r.w, r.T
        pf = m.prefetch = gathers.forward_prefetcher(m.keep_head) if not m.recording else None
        emb_w = pf[0].fetch(0) if pf else gathers.fetch([V * h])
        x = self.preamble(m, T * h * w, emb_w)
        m.inputs = [x]
        for layer in range(r.model.layers):
            if pf:
                m.gathered[layer] = pf[0].fetch_block(pf[1][layer])
            else:
                m.gathered[layer] = gathers.fetch(r.layer_sizes)
            sv, x = self.blocks.forward(x, layer == 0)
            if m.recording or layer not in gathers.kept_layers:
                released = m.gathered.pop(layer)
                # a checkpointed forward saves nothing (the recompute saves its block's own)
                m.held[layer] = [] if r.ckpt else gathers.held_by_autograd(layer, released)
                s.f(*[b for b in released if b not in m.held[layer]])
            m.saved.append(sv)
            m.inputs.append(x)

    def preamble(self, m: MicroStep, hidden: int, embedding_weight: list[int]) -> int:
        """The model's forward before its first block: the embedding's output (the first block's
        input), then ZeRO-3's release of the embedding's gathered weight, then, from a card that
        recorded them (`Regime.head_preamble`), the attention masks and rotary tables the model
        makes there, held to its return (`card_head_forward` frees them). Falcon-7B's (1, 1, T, T)
        bool mask, which transformers materializes for it (`allow_is_causal_skip=False`): 16 MiB at
        4,096 tokens; Qwen3-8B's rotary tables, 2 MiB each at 2 x 4,096 (made once a step: the
        h200-2026-12-19 H100 traces and the h200-2026-12-12 ones, request for request)."""
        s, card = self.r.s, self.card
        x = s.a(hidden)
        s.f(*embedding_weight)
        if not self.card_head or card.regime.head_preamble is None:
            return x
        ops = card.ops(None, "preamble")
        live = card.run(None, "preamble", [], made_first=bool(ops) and ops[0] == (hidden, False))
        later = card.latest(live, hidden)  # a scaled embedding (Gemma's): the first block's input
        m.preamble = sorted(n for names in live.values() for n in names if n is not None)
        if later is not None:
            m.preamble.append(x)  # `inputs_embeds`, held to the forward's return
            x = later
        return x

    def head_forward(self, m: MicroStep) -> None:
        """The final norm, the output head's logits and the loss's forward; the logits the
        training loop keeps (--loop deepspeed) replace the previous micro-step's."""
        r, s, pf = self.r, self.s, m.prefetch
        t, V, h, w, T = r.t, r.V, r.h, r.w, r.T
        m.final_kept, m.head_in = self.hand.norm_forward()
        if not r.hf_norm:
            m.final_kept = [m.inputs[-1]]
        else:
            s.f(m.inputs[-1])  # rebound to the final norm's output
            if not r.ckpt:
                self.release_input(m.inputs[0])  # inputs_embeds, when the model's forward returns
        if pf:
            pf[0].fetch(len(pf[0].modules) - 2)  # the final norm: a prefetch
            m.head_w = pf[0].fetch(len(pf[0].modules) - 1)
            self.head_prefetch(m, 1)
        else:
            m.head_w = self.gathers.fetch([V * h])
        logits = s.a(T * V * w)
        if m.recording:
            s.f(*m.head_w)  # released after the head's forward, gathered again for its backward
        keeps_outputs = r.keeps_outputs
        if r.hf:
            # transformers' ForCausalLMLoss: logits.float() over every token (the labels are
            # shifted, not the logits), log_softmax keeps its output; the fp32 copy is freed
            # when the loss function returns, the bf16 logits with the model's output
            sliced = None
            f32 = s.a(T * V * 4)
            logp = s.a(T * V * 4)
            s.f(f32, *([] if keeps_outputs else [logits]))
            L = T
        else:
            # worker_model: cross_entropy(logits[:, :-1].flatten(0, 1).float(), ...): the
            # b x (s-1) tokens; flatten copies the slice when b > 1 (a temporary, freed once
            # cast), log_softmax keeps its output, the fp32 copy is freed when its consumer is
            # done and the logits when forward returns (z2-ckpt-L16-h3072 trace: 2004 and
            # 2003.5 MiB, 4007 fp32, the slice freed, 4007 more, then the fp32 and the logits)
            L = t.micro_batch * (t.seq - 1)
            sliced = s.a(L * V * w) if t.micro_batch > 1 else None
            f32 = s.a(L * V * 4)
            s.f(sliced)
            logp = s.a(L * V * 4)
            s.f(f32, *([] if keeps_outputs else [logits]))
        m.loss_kept = [logp, L, sliced]
        if keeps_outputs:
            # --loop deepspeed: `outputs = engine(...)` rebinds the loop's outputs once this
            # forward returns: the previous micro-step's logits die now, these live on
            s.f(r.held_logits)
            r.held_logits = logits

    # --- backward ---------------------------------------------------------------------

    def head_backward(self, m: MicroStep) -> None:
        """The loss's backward (its three fp32 tokens x vocab tensors), then the output
        head's: its weight's gradient and its input's (`m.g`)."""
        r, s = self.r, self.s
        V, h, w, T = r.V, r.h, r.w, r.T
        logp, L, sliced = m.loss_kept
        g_nll = s.a(L * V * 4)
        g_lsm = s.a(L * V * 4)
        s.f(g_nll, logp)
        g_bf = s.a(L * V * w)
        s.f(g_lsm)
        if sliced or not r.hf:
            # SliceBackward: slice_backward makes a zero tensor of the whole logits
            g_full = s.a(T * V * w)
            s.f(g_bf)
            g_bf = g_full
        self.grads.start_backward()
        if m.recording:
            m.head_w = self.gathers.fetch([V * h])
        self.head_prefetch(m, 2)
        if r.stage == 3:
            # ZeRO-3's LinearFunctionForZeroStage3 backward: the input's gradient first (its
            # matmul takes the thread's cuBLAS workspace), then the weight's (t-z3-L24-h2048
            # trace: +32 +32 +125 MiB; stages 0-2, b7-z0-L6-h3072: +187.5 +32 +48)
            m.g = s.a(T * h * w)
            r.first_matmul("backward")
            m.head_grad = s.a(V * h * w)
        else:
            m.head_grad = s.a(V * h * w)
            r.first_matmul("backward")
            m.g = s.a(T * h * w)
        s.f(g_bf, m.head_in)
        if not m.keep_head:
            s.f(*m.head_w)

    def head_prefetch(self, m: MicroStep, fetches: int) -> None:
        """ZeRO-3 once the trace is complete: the module trace is the whole step's, so the
        head's forward fetch (fetch_sub_module) prefetches past the forward's end, into the
        backward's first weights: the last block's last module's (falcon-40b-L3, h200-2026-12-10:
        its 0.5 GiB MLP weight through the loss's forward); its pre-backward hook, as the
        logits' gradient arrives, prefetches the next. `fetches`: 1 at the head's forward, 2 at
        its backward (the card's head calls it before its first weight gradient, and after)."""
        if m.prefetch and m.head_prefetches < fetches:
            m.head_prefetches += 1
            if m.backward_prefetch is None:
                m.backward_prefetch = self.gathers.backward_prefetcher(m.gathered)
            if m.backward_prefetch:
                m.backward_prefetch[0].fetch(0)

    def backward_blocks(self, m: MicroStep) -> None:
        """The head's gradient hooked, the final norm's backward, every block's (ZeRO-3: its
        weights gathered again unless kept; checkpointed: recomputed first), the embedding's,
        and a tied weight's two gradients summed."""
        r, s, gathers, hook = self.r, self.s, self.gathers, self.grads.hook
        V, h, w, T = r.V, r.h, r.w, r.T
        tied = r.model.tie_embeddings
        if not tied and not self.card_head:
            hook([m.head_grad])
        if m.keep_head:
            s.f(*m.head_w)
        # the card's head backward ends with the final norm's
        g = m.g if self.card_head else self.hand.norm_backward(m.g, m.final_kept, [], hook)
        gathered = m.gathered
        pb = m.backward_prefetch
        if pb:
            pb[0].fetch(1)  # the final norm
        for i in reversed(range(r.model.layers)):
            sv = m.saved[i]
            if pb:
                fetched = pb[0].fetch_block(pb[1][i])  # gathered from the forward: nothing new
                layer_w = gathered.pop(i) if i in gathered else fetched
            else:
                layer_w = gathered.pop(i) if i in gathered else gathers.fetch(r.layer_sizes)
            if r.ckpt:
                sv = self.blocks.recompute(m.inputs[i])
            gin = self.blocks.backward(sv, g, hook)
            s.f(*layer_w, *m.held.pop(i, []))
            if r.ckpt:
                self.release_input(m.inputs[i])
            g = gin
        emb_w = pb[0].fetch(len(pb[0].modules) - 1) if pb else gathers.fetch([V * h])
        emb_grad = s.a(V * h * w)
        # embedding_dense_backward's fp32 partial sums, a transient: (tokens + tokens /
        # NROWS_PER_THREAD (10)) rows of the hidden size (traces: 105.6 MiB at 8192 tokens x
        # 3072, b7-z0-L6-h3072; 61.6 MiB at 4096 x 3584, h8-z1-gas2-L6-h3584)
        s.transient((T + T // 10) * h * 4)
        s.f(g)
        if tied:
            # one weight used twice: autograd sums its two gradients in the AccumulateGrad
            # node's input buffer (the head's is held there from the start of backward; the
            # sum is a new tensor), and the weight's hook runs once, with the sum (z0-L16-h2048
            # trace: 501 MiB allocated after the embedding backward, the head's and the
            # embedding's 501 MiB freed)
            total = s.a(V * h * w)
            s.f(m.head_grad, emb_grad)
            emb_grad = total
        hook([emb_grad])
        s.f(*emb_w)

    # --- the head and loss from a learned card --------------------------------------

    def card_head_forward(self, m: MicroStep) -> None:
        """The card's final norm, head and loss forward (`Regime.head_forward`: from the last
        block's return to the loss, the model's outputs dropped as the trainer loop does; with
        --loop deepspeed the logits' last free is not made: the loop's `outputs` holds them).
        The card's window opens as the last block returns, so its first free of the hidden
        size is that block's input, which the card's block window freed already. The frees of
        tensors made before it go to those the hand-written head frees here: with
        transformers' RMSNorm, the last block's output (rebound to the norm's) and
        `inputs_embeds` (when the model's forward returns)."""
        r, s, card, pf = self.r, self.s, self.card, m.prefetch
        if pf:
            pf[0].fetch(len(pf[0].modules) - 2)  # the final norm: a prefetch
            m.head_w = pf[0].fetch(len(pf[0].modules) - 1)
            self.head_prefetch(m, 1)
        else:
            m.head_w = self.gathers.fetch([r.V * r.h])
        last_input = m.inputs[-2] if len(m.inputs) > 2 else None
        made = (s.sizes[last_input],) if last_input in card.freed_inputs else ()
        outside = list(m.preamble)
        if r.hf_norm:
            if not r.ckpt and m.inputs[0] not in card.freed_inputs:
                outside.append(m.inputs[0])
            outside.append(m.inputs[-1])
        # the last block's leftovers its window did not free die here, as the next block's would
        live = card.run_after_block(None, "checkpointed_forward" if r.ckpt else "forward", outside, made=made,
                                    hold=r.T * r.V * r.w if r.keeps_outputs else 0)
        if m.recording:
            s.f(*m.head_w)  # released after the head's forward, gathered again for its backward
        s.f(*outside)  # what the card left of them dies here, as in the hand-written head
        m.loss_kept = sorted(n for names in live.values() for n in names)
        if r.keeps_outputs and card.held is not None:
            s.f(r.held_logits)  # the previous micro-step's outputs, replaced
            r.held_logits = card.held

    def card_head_backward(self, m: MicroStep) -> None:
        """The card's loss, head and final norm backward (`Regime.head_backward`, up to the
        last block's output gradient, `m.g`): the head's weight gradient hooked when the card
        drops it (a tied weight's is held to the embedding's, `m.head_grad`), the final norm's
        input (a LayerNorm's saved one) among what its frees take."""
        r, s, card = self.r, self.s, self.card
        T, V, h, w = r.T, r.V, r.h, r.w
        self.grads.start_backward()
        if m.recording:
            m.head_w = self.gathers.fetch([V * h])
        tied = r.model.tie_embeddings
        last_output = [] if r.hf_norm else [m.inputs[-1]]
        outside = [*m.loss_kept, *last_output]

        def head_weight_gradient() -> None:
            self.head_prefetch(m, 2)
            r.first_matmul("backward")

        # ZeRO-3's linear backward makes the input's gradient first, as `head_backward`
        live = card.run(None, "checkpointed_backward" if r.ckpt else "backward", outside, self.grads.hook,
                        first_grad=head_weight_gradient, hook_left=not tied, input_grad_first=r.stage == 3)
        self.head_prefetch(m, 2)  # a card whose head makes no weight gradient: at its end
        r.first_matmul("backward")  # a card whose head makes no weight gradient still multiplies
        m.head_grad = card.latest(live, V * h * w) if tied else None
        m.g = card.latest(live, T * h * w)
        if m.g is None:
            m.g = s.a(T * h * w)
        if not m.keep_head:
            s.f(*m.head_w)
        # what the card's frees left (the final norm's input; a tensor whose free took another
        # of its size) dies here, as the hand-written head's tensors do: offered to the
        # blocks' frees it would take what the card's blocks mean to free
        s.f(*outside, *sorted(n for names in live.values() for n in names))

    # --- the step ---------------------------------------------------------------------

    def run(self, steps: int, settle_up_to: int = 0, settle_below: int | None = None) -> int:
        """`steps` optimizer steps of `r.ga` micro-steps each, after initialize; with
        `settle_up_to`, more until a step leaves the pools as an earlier step left them (at most
        that many steps in all): from there the steps repeat that cycle; no further once the
        reserve passes `settle_below` (a card it fills is replayed apart). Returns the steps run."""
        r, s, grads = self.r, self.s, self.grads
        self.initialize()
        index = done = 0
        seen: set[tuple] = set()
        while True:
            boundary = index % r.ga == r.ga - 1
            grads.start_micro_step(boundary)
            recording = index == 0
            m = MicroStep(index, boundary, recording, self.gathers.head_kept and not recording)
            self.forward_blocks(m)
            (self.card_head_forward if self.card_head else self.head_forward)(m)
            if boundary:
                s.mark(f"step{index // r.ga + 1}.forward")
            (self.card_head_backward if self.card_head else self.head_backward)(m)
            self.backward_blocks(m)
            grads.end_backward()
            if boundary:
                s.mark(f"step{index // r.ga + 1}.backward")
                grads.step()
                s.mark(f"step{index // r.ga + 1}.step")
                done += 1
                if settle_up_to and settle_below is not None and s.reserved > settle_below:
                    settle_up_to = 0  # past the card: replay_at_capacity replays it on the card
                if done >= max(steps, settle_up_to):
                    return done
                if settle_up_to:
                    state = s.pool_state()
                    if done >= steps and state in seen:
                        return done
                    seen.add(state)
            index += 1


def allocation_sequence(inp, layout, steps: int = 3, _seq: _Seq | None = None,
                        settle_up_to: int = 0, settle_below: int | None = None) -> list[tuple[str, object, int]] | None:
    """The large tensors one GPU allocates and frees, in order, for a dense model: ZeRO 0-2
    with the optimizer on the GPU or the CPU, ZeRO-3 with the optimizer and weights on the GPU
    or the CPU; gradient accumulation included; Mixtral's MoE blocks (`mixtral_replayed`) and
    a carded MoE or MLA model's (its blocks from the card; no ZeRO-3 gathers). None for what is
    not replayed: NVMe, other MoE blocks, MLA without a card, fp32 training."""
    model, t = inp.model, inp.training
    if "nvme" in (layout.offload_optimizer, layout.offload_param):
        return None
    if layout.stage < 3 and layout.offload_param != "gpu":
        return None
    carded = _carded_blocks_replayed(inp, layout)
    if (model.is_moe and not (mixtral_replayed(model, t) or carded)) or (model.mla and not carded) \
            or t.precision == "fp32":
        return None
    # Micro-steps between the first and the boundary repeat the same requests on the state the
    # one before left: the allocator's state is periodic after the first, so three of them
    # (first, one middle, boundary) reserve what any longer accumulation does.
    ga = min(max(1, t.grad_accum), REPLAYED_MICRO_STEPS)
    if model.layers * ga * steps > MAX_REPLAYED_LAYER_PASSES:
        return None  # too long to replay on a keystroke: the per-phase rule answers
    s = _seq if _seq is not None else _Seq()
    settle_up_to = min(settle_up_to, MAX_REPLAYED_LAYER_PASSES // (model.layers * ga))
    s.steps_run = _Training(inp, Replay(inp, layout, s, ga)).run(steps, settle_up_to, settle_below)
    return s.events


def replay_stage(inp, layout) -> int:
    """The stage whose replay answers `layout`: stages 1 and 2 ask the allocator for the same
    tensors in the same order unless gradients accumulate (stage 1 then keeps them per weight
    between boundaries), so one replay serves both."""
    return 2 if layout.stage == 1 and inp.training.grad_accum <= 1 else layout.stage


def _key(inp, layout) -> tuple:
    stage = replay_stage(inp, layout)
    key = (inp.model.model_dump_json(), inp.training.model_dump_json(), inp.zero.model_dump_json(),
           inp.hardware.world, stage, layout.offload_optimizer, layout.offload_param,
           cublas_workspace_bytes(inp.hardware.gpu.name))
    # the model's JSON names its card by key only: the replay takes the card's requests, so the
    # card's text (its digest) is part of what the answer depends on
    card = inp.model.card
    if not _replays_card(inp.model, inp.training):
        return key
    return (*key, "card", card.digest or card.source, "head" if heads_from_cards else "hand head")


_CACHE: dict[tuple, int | None] = {}
# A memo that outlives the process, lent by a command (zlayout/replaycache.py keeps one in the
# user's cache folder); the core reads and writes no file itself.
lasting_memo = None


# The planner's replays run at least two steps (the second repeats the first's requests with the
# Adam moments in place) and then on until a step leaves every pool's segments and free blocks as
# an earlier step left them (the steps then cycle), at most this many: the reserve a long run
# settles at (where the card holds every segment: on a card the cache fills, `replay_at_capacity`
# keeps two). Two steps were the rule until Qwen3-8B-L6 at ZeRO-1, 2 x 4096 (h200-2026-12-06,
# results-j line 1): its second step reserved nothing new but left the free blocks elsewhere, its
# third needed a 4748 MiB segment (71.96 GiB replayed over two steps, 76.60 from the third on, the
# run's 76.62 after four), and its pools cycle with period two from the fourth.
SETTLE_STEPS = 8


def replayed_peak_reserved(inp, layout, steps: int = 2, settle_below: int | None = None) -> int | None:
    """Peak reserved bytes (large pool) of at least `steps` training steps replayed through the
    default caching allocator, and on until the pools' state cycles (`SETTLE_STEPS`); None
    where the layout is not replayed. With `settle_below` (a card's capacity) the replay stops
    settling once its reserve passes it and answers some reserve past it: a layout whose reserve
    outgrows the card costs two replayed steps, not a cycle's (`replay_at_capacity` then replays
    it on the card). Memoised: planning asks for the same layout many times."""
    replayed = _replayed(inp, layout, steps, settle_below)
    return None if replayed is None else replayed[0]


def _replayed_pair(fields: list) -> tuple[int, int]:
    """A kept ("replayed", reserved, allocated) record (replaycache); ValueError for any other,
    which is then replayed again. Reserved at index 1, as in a `CapacityReplay` record."""
    if len(fields) != 3 or fields[0] != "replayed" or not all(type(v) is int for v in fields[1:]):
        raise ValueError(f"not a replay's record: {fields!r}")
    return fields[1], fields[2]


def _replayed(inp, layout, steps: int = 2, settle_below: int | None = None) -> tuple[int, int] | None:
    """(peak reserved, peak allocated) of `replayed_peak_reserved`'s replay."""
    key = _key(inp, layout)
    if key in _CACHE:
        return _CACHE[key]
    past = (key, "past", settle_below)
    if settle_below is not None and past in _CACHE:
        return _CACHE[past]

    def replay() -> tuple[int, int] | None:
        seq = _Seq(live=True)
        if allocation_sequence(inp, layout, steps, seq, SETTLE_STEPS, settle_below) is None:
            return None
        return seq.reserved, seq.peak_allocated

    memo_key = (key, steps) if settle_below is None else ("past", key, steps, settle_below)
    replayed = replay() if lasting_memo is None else lasting_memo.recall(
        memo_key, replay, encode=lambda pair: ("replayed", *pair), decode=_replayed_pair)
    settled = replayed is None or settle_below is None or replayed[0] <= settle_below
    _CACHE[key if settled else past] = replayed
    if len(_CACHE) > 4096:
        _CACHE.pop(next(iter(_CACHE)))
    return replayed


@dataclass(frozen=True)
class CapacityReplay:
    """Training steps replayed where cudaMalloc has only `capacity` bytes (Device)."""

    out_of_memory: bool
    peak_reserved: int  # never above the capacity
    needed: int  # the most a retry needed (0: none retried); past the capacity when out of memory
    retries: int  # over the replayed steps, initialize included (the run's num_alloc_retries)
    retries_per_step: int  # in the last step: what every later step repeats
    freed_per_step: int  # bytes the last step's retries gave back
    ran_out_in: str = ""  # out of memory: the phase that asked ("step 4's backward")
    ran_out_step: int = 0  # out of memory: the step it asked in (0: initialize)
    # the most the replayed tensors held at once (torch.cuda.max_memory_allocated): the requests
    # in their order, where the per-phase sum (memory.phase_peaks) holds each phase's apart
    peak_allocated: int = 0


_CAPACITY_CACHE: dict[tuple, CapacityReplay | None] = {}


def replay_at_capacity(inp, layout, capacity: int, steps: int = 2) -> CapacityReplay | None:
    """The default allocator's replay where cudaMalloc has only `capacity` bytes for the large
    pools (Device): whether the steps run, peak reserved, and the retries they make. None
    where the layout is not replayed. Memoised."""
    unbounded = _replayed(inp, layout, steps, settle_below=capacity)
    if unbounded is None or unbounded[0] <= capacity:
        # the card never fills: the same replay, no retry (and the lasting memo answers it)
        return None if unbounded is None else CapacityReplay(False, unbounded[0], 0, 0, 0, 0,
                                                             peak_allocated=unbounded[1])
    key = (_key(inp, layout), capacity, steps)
    if key in _CAPACITY_CACHE:
        return _CAPACITY_CACHE[key]

    def replay() -> CapacityReplay | None:
        device = Device(capacity)
        seq = _Seq(live=True, device=device)
        try:
            # on until the pools' state cycles, as the unbounded replay: each retry frees the
            # cache and leaves the pools elsewhere, so a later step can run out where the first
            # two did not (h200-2026-12-01 call 3's ZeRO-2 L18 h4096 s4096 b4: replayed, 4 retries
            # in two steps, 7 in three (the run's 7 and 136.40 GiB), out of memory in step 4's
            # backward; run for six steps (h200-2026-12-08), it ran out in step 4's backward)
            if allocation_sequence(inp, layout, steps, seq, SETTLE_STEPS) is None:
                return None
            return CapacityReplay(False, seq.reserved, device.needed, device.retries,
                                  *_last_step(seq, seq.steps_run), peak_allocated=seq.peak_allocated)
        except OutOfMemory as oom:
            return CapacityReplay(True, device.peak, oom.reserved + oom.request, device.retries, 0, 0,
                                  *_phase_after(list(seq.device_marks)), peak_allocated=seq.peak_allocated)

    result = replay() if lasting_memo is None else lasting_memo.recall(
        ("capacity", key), replay, encode=astuple, decode=lambda fields: CapacityReplay(*fields))
    _CAPACITY_CACHE[key] = result
    if len(_CAPACITY_CACHE) > 1024:
        _CAPACITY_CACHE.pop(next(iter(_CAPACITY_CACHE)))
    return result


def _phase_after(marks: list[str]) -> tuple[str, int]:
    """The phase that follows the last one marked, and its step ("step3.step" -> "step 4's
    forward", 4; before any step: initialize, 0)."""
    if not marks or not marks[-1].startswith("step"):
        return ("step 1's forward", 1) if marks and marks[-1] == "initialize" else ("initialize", 0)
    step, phase = marks[-1][4:].split(".")
    following = {"forward": (int(step), "backward"), "backward": (int(step), "optimizer step"),
                 "step": (int(step) + 1, "forward")}[phase]
    return f"step {following[0]}'s {following[1]}", following[0]


def _last_step(seq: _Seq, steps: int) -> tuple[int, int]:
    """Retries and bytes freed in the last replayed step (from the step before's end)."""
    end = seq.device_marks.get(f"step{steps}.step", (seq.device.retries, seq.device.freed))
    start = seq.device_marks.get(f"step{steps - 1}.step", (0, 0))
    return end[0] - start[0], end[1] - start[1]
