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
  tensors split are not whole again when a large request comes back.
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
  grouped matmul, and hooked. No allocator trace of a MoE run yet: the order follows
  torch.profiler's CPU memory events of the block. Qwen2-MoE and DeepSeek blocks (shared
  experts, grouped routing) and zlayout's GPT (no experts) are not replayed.
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

import functools
from dataclasses import astuple, dataclass

from zlayout.core.caching_allocator import (  # noqa: F401 (the allocator's names, read here by tests)
    DEFAULT_STREAM, LARGE_BUFFER, MIN_LARGE_ALLOC, ROUND_LARGE, SMALL_SIZE, CachingAllocator, Device,
    OutOfMemory, Pools, _Block, allocation_size, replay, round_size)
from zlayout.core.tensors import (  # noqa: F401 (the model's tensors, read here by steptime and tests)
    block_tensor_sizes, hf_layer_tensor_sizes, layer_tensor_sizes, mixtral_layer_tensor_sizes, mixtral_shaped,
    parameter_tensor_sizes, stage3_live_param_elements, stage3_sub_groups)

MiB = 2**20
REPLAYED_MICRO_STEPS = 3  # first, a middle one, the boundary: see allocation_sequence
# A biased Linear's backward (AddmmBackward0, zlayout's GPT with biases) takes a transient of
# 132-136 MiB after the weight's gradient, freed before the node returns, whatever the shape
# (seven H200 traces: 132.0 at hidden 2048 for 2048 to 8192 outputs and 8192 or 16384 tokens;
# 132.5 and 135.0 at hidden 2560; 132.0 and 136.0 at hidden 4096). It never outlives the node,
# so only its peak matters.
BIAS_GRAD_TRANSIENT = 132 * MiB
# torch's cuBLAS workspace (CublasHandlePool.cpp getChosenWorkspaceSize): 4096 x 8 KiB on
# Hopper, 4096 x 2 KiB + 16 x 8 KiB elsewhere; one per (handle, stream), taken from the caching
# allocator at a thread's first matmul and kept. Two threads multiply: the forward's and
# autograd's device thread (every H200 trace: a 32 MiB block at the first forward matmul and
# one at the head's backward, never freed).
CUBLAS_WORKSPACE_HOPPER = 32 * MiB
CUBLAS_WORKSPACE_OTHER = 8 * MiB + 128 * 1024


def cublas_workspace_bytes(gpu_name: str) -> int:
    name = gpu_name.lower()
    return CUBLAS_WORKSPACE_HOPPER if any(x in name for x in ("h100", "h200", "h800", "gh200", "h20")) \
        else CUBLAS_WORKSPACE_OTHER


ALLREDUCE_BUCKET_ELEMENTS = 500_000_000
NORM_PART_ELEMENTS = 250_000_000  # stage3.py _constant_buffered_norm2(buffer_size)  # DeepSpeed engine.py MEMORY_OPT_ALLREDUCE_SIZE
MAX_REPLAYED_LAYER_PASSES = 384  # layers x micro-steps x steps (Llama-3-405B: 126 x 1 x 2 = 252)


# The streams DeepSpeed's stage 3 allocates on (partitioned_param_coordinator: gathers run
# `with get_accelerator().stream(self.__allgather_stream)`): gathered weights live in that
# stream's pool, which the compute stream's activations never reuse.
ALLGATHER_STREAM, REDUCE_STREAM = 1, 2  # DEFAULT_STREAM (0): caching_allocator


class _Seq:
    """The request sequence as it is written: recorded as events (`allocation_sequence`), or
    with `live=True` served at once by one `CachingAllocator` per stream, with no event list
    (`replayed_peak_reserved`: the same replay, without building and re-reading the list)."""

    def __init__(self, live: bool = False, device: Device | None = None) -> None:
        self.device = device  # live only: the card the pools share (replay_at_capacity)
        self.device_marks: dict[str, tuple[int, int]] = {}  # phase -> (retries, freed) at its end
        self.events: list[tuple[str, object, int]] = []
        self.sizes: list[int] = [0]
        self.live = live
        self.pools: dict[int, CachingAllocator] = {}
        self.blocks: list[tuple[CachingAllocator, _Block | None] | None] = [None]
        self.marks: list[tuple[str, int]] = []  # (phase, index of its first event): comparisons
        self.released_peak = 0

    def mark(self, phase: str) -> None:
        """The phase that ends here (the allocator trace's `phase_marks`), for comparing the
        sequence with a recorded trace; planning (live) keeps none."""
        if not self.live:
            self.marks.append((phase, len(self.events)))
        elif self.device is not None:
            self.device_marks[phase] = (self.device.retries, self.device.freed)

    def a(self, size: int, stream: int = DEFAULT_STREAM) -> int:
        size = int(size)
        name = len(self.sizes)
        self.sizes.append(size)
        if self.live:
            pool = self.pools.get(stream)
            if pool is None:
                pool = self.pools[stream] = CachingAllocator(device=self.device)
                if self.device is not None:
                    self.device.pools.append(pool)
            self.blocks.append((pool, pool.malloc(size)))
        else:
            self.events.append(("a", name, size) if stream == DEFAULT_STREAM else ("a", name, size, stream))
        return name

    def f(self, *names: int | None) -> None:
        for name in names:
            if name is not None:
                if self.live:
                    pool, block = self.blocks[name]
                    pool.free(block)
                else:
                    self.events.append(("f", name, 0))

    def empty_cache(self) -> None:
        """torch.cuda.empty_cache: the pools' unused segments go back to the device."""
        if self.live:
            self.released_peak = max(self.released_peak, self.reserved)
            for pool in self.pools.values():
                pool.empty_cache()
        else:
            self.events.append(("e", None, 0))

    @property
    def reserved(self) -> int:
        """Peak reserved bytes so far (live): the pools' segments, or what they held before an
        empty_cache returned some, whichever was more."""
        if self.device is not None:
            return max(self.released_peak, self.device.peak)
        return max(self.released_peak, sum(pool.reserved for pool in self.pools.values()))


def mixtral_replayed(model, training) -> bool:
    """A MoE model whose requests the replay writes: transformers' Mixtral (`mixtral_shaped`,
    `--impl hf`). Qwen2-MoE's and DeepSeek's blocks (shared experts, their gate, grouped
    routing) and zlayout's own GPT (worker_model.Block has no experts) are left to the
    per-phase rule."""
    return training.impl == "hf" and mixtral_shaped(model)


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


def allocation_sequence(inp, layout, steps: int = 3, _seq: _Seq | None = None) -> list[tuple[str, object, int]] | None:
    """The large tensors one GPU allocates and frees, in order, for a dense model: ZeRO 0-2
    with the optimizer on the GPU or the CPU, ZeRO-3 with the optimizer and weights on the GPU
    or the CPU; gradient accumulation included; Mixtral's MoE blocks (`mixtral_replayed`).
    None for what is not replayed: NVMe, other MoE blocks, MLA, fp32 training."""
    model, t, zero = inp.model, inp.training, inp.zero
    stage, n = layout.stage, inp.hardware.world
    if "nvme" in (layout.offload_optimizer, layout.offload_param):
        return None
    if stage < 3 and layout.offload_param != "gpu":
        return None
    moe = model.is_moe
    if (moe and not mixtral_replayed(model, t)) or model.mla or t.precision == "fp32":
        return None
    opt_on_gpu = layout.offload_optimizer == "gpu"
    # stage 1/2 with the optimizer on the host (stage_1_and_2.py, cpu_offload): no GPU fp32
    # master, moments or grads_in_partition; each reduced gradient is normed and cast to fp32
    # on the GPU for its copy to the pinned host partition (copy_grads_in_partition)
    offload12 = stage in (1, 2) and not opt_on_gpu
    param_on_gpu = layout.offload_param == "gpu"
    # Micro-steps between the first and the boundary repeat the same requests on the state the
    # one before left: the allocator's state is periodic after the first, so three of them
    # (first, one middle, boundary) reserve what any longer accumulation does.
    ga = min(max(1, t.grad_accum), REPLAYED_MICRO_STEPS)
    if model.layers * ga * steps > MAX_REPLAYED_LAYER_PASSES:
        return None  # too long to replay on a keystroke: the per-phase rule answers
    s = _seq if _seq is not None else _Seq()
    w = 2
    workspace = cublas_workspace_bytes(inp.hardware.gpu.name)
    workspaces: list[str] = []  # the threads whose cuBLAS workspace is allocated

    def first_matmul(thread: str) -> None:
        if thread not in workspaces:
            workspaces.append(thread)
            s.a(workspace)
    h, kv, f, V = model.hidden, model.kv_size, model.ffn_size, model.vocab
    T = t.micro_batch * t.seq
    swiglu = model.mlp == "swiglu"
    hf = t.impl == "hf"
    # zlayout's GPT's Linears with a bias (worker_model.Block: qkv per qkv_bias; proj, fc1 and
    # fc2 per bias); transformers' classes have their own backward below
    qkv_biased = not hf and model._biased(model.qkv_bias)
    gpt_biased = not hf and model.bias
    hf_norm = hf and model.norm == "rmsnorm"
    ckpt = t.checkpointing == "full"
    p = model.params
    p_shard = -(-p // (n if stage else 1))
    layer_sizes = block_tensor_sizes(model, t.impl)
    tensors = parameter_tensor_sizes(model, t.impl)

    # --- deepspeed.initialize ---------------------------------------------------------
    groups = stage3_sub_groups(tensors, n, zero.sub_group_size) if stage == 3 else []
    sub_groups = [part for part, _ in groups]
    # stage 3 gathers a weight before its module runs (on the allgather stream) when it is not
    # whole on this GPU: more than one GPU, or the weights on the host
    gather = stage == 3 and (n > 1 or not param_on_gpu)
    small = zero.stage3_param_persistence_threshold
    if stage == 3:
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
            s.f(s.a(4 * max(part for part, _ in groups)))
        if zero.contiguous_gradients:
            s.a(zero.reduce_bucket_size * w)  # the IPG bucket, allocated once
        if opt_on_gpu:
            s.a(p_shard * w)  # grad_partitions_flat_buffer (made after the IPG bucket: same trace)
        if n > 1:
            # _create_reduce_and_remove_grad_hooks: each trainable weight is param.all_gather()ed
            # (_all_gather_sequential: a buffer of ceil(numel / n) * n on the default stream),
            # its hook registered, then param.partition() frees it (w2-z3-L8-h4096 trace: 250,
            # 96, 32, 128, 128 MiB ..., each freed before the next). Small ones are persistent.
            for x in tensors:
                if x > small:
                    s.f(s.a(-(-x // n) * n * w))
        weights = []
    else:
        # engine: the module, cast to bf16 on the host, moves to the GPU tensor by tensor
        s.mark("built")
        weights = [s.a(x * w) for x in tensors]
    if stage == 3:
        pass
    elif stage == 0:
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
            s.f(s.a(4 * p_shard))
    s.mark("initialize")
    moments_made = stage == 0
    partition = None
    retired: list[int] = []  # stage 2: last micro-step's partition, alive through this backward
    # stage 3: the gathered weights kept from forward to backward (those whose next use is
    # within stage3_max_reuse_distance: the head and the last blocks), the rest released
    live = stage3_live_param_elements(model, zero, n, not param_on_gpu) if gather else 0
    big_layer = [x for x in layer_sizes if x > small]
    kept_layers: set[int] = set()
    budget = live - (V * h if not model.tie_embeddings else 0)
    for i in reversed(range(model.layers)):
        if budget < sum(big_layer):
            break
        kept_layers.add(i)
        budget -= sum(big_layer)
    head_kept = live >= V * h

    def fetch(sizes: list[int]) -> list[int]:
        return [s.a(x * w, ALLGATHER_STREAM) for x in sizes if x > small] if gather else []

    block_modules = block_fetch_modules(model, t.impl) if gather else None

    class Prefetcher:
        """ZeRO-3's gathers (n > 1 GPUs, or one with the weights on the host) once the module
        trace is complete (steps after the first), partitioned_param_coordinator.fetch_sub_module
        per module, in trace order:
        wait for the module's weights, then prefetch: pop the trace's next weights until
        stage3_prefetch_bucket_size elements are not available, and all-gather them in one
        call (__all_gather_params_ -> all_gather_coalesced, on the allgather stream).
        partition_parameters.py: one weight is gathered straight into its buffer of
        ceil(numel / n) * n elements (_all_gather_sequential); several into one flat buffer
        (_all_gather_dtype, the padded partitions times n), each weight copied out of it by
        torch.cat at the first wait (AllGatherCoalescedHandle.wait), the flat freed once
        every weight of the call has been waited for (the handle leaves
        __inflight_param_registry). w2-z3-L8-h4096 step 2: 160 MiB flats (proj + fc1,
        16.8M + 67.1M elements), 96 and 128 MiB buffers (qkv, fc2 alone). A prefetch takes at
        most stage3_max_live_parameters less the elements gathered and not yet released
        (__n_available_params: up by each gather, down by release_sub_module after each
        module's forward unless its weights are kept, `kept`); here the releases are counted
        at the module's end, the frees are the caller's (the end of its block). The backward
        prefetches the same way along the trace's backward half (`backward_prefetcher`)."""

        def __init__(self, modules: list[list[int]], kept: set[int], present: frozenset[int] = frozenset()) -> None:
            self.modules = modules
            self.kept = kept
            self.present = present  # modules whose weights are gathered already (kept by the forward)
            self.available = sum(x for mi in present for x in modules[mi] if x > small)
            self.queue = [(mi, j) for mi, mod in enumerate(modules) if mi not in present
                          for j, x in enumerate(mod) if x > small]
            self.qp = 0
            self.state: dict = {}  # (mi, j) -> [group]
            self.buf: dict = {}

        def gather(self, params: list) -> None:
            sizes = [self.modules[mi][j] for mi, j in params]
            alone = len(params) == 1 or n == 1
            group = {"params": params, "left": len(params), "flat": None, "copied": alone}
            self.available += sum(sizes)
            if alone:
                # one weight; or one GPU (weights on the host): NoGatherCoalescedHandle copies
                # each partition to the GPU on its own, no flat buffer
                for q, x in zip(params, sizes):
                    self.buf[q] = s.a(-(-x // n) * n * w, ALLGATHER_STREAM)
            else:
                group["flat"] = s.a(sum(-(-x // n) for x in sizes) * n * w, ALLGATHER_STREAM)
            for q in params:
                self.state[q] = group

        def fetch(self, mi: int) -> list[int]:
            if mi > 0 and mi - 1 not in self.kept:
                self.available -= sum(x for x in self.modules[mi - 1] if x > small)
            mine = [(mi, j) for j, x in enumerate(self.modules[mi]) if x > small and mi not in self.present]
            todo = [q for q in mine if q not in self.state]
            if todo:
                self.gather(todo)
            while self.qp < len(self.queue) and self.queue[self.qp][0] <= mi:
                self.qp += 1
            for q in mine:
                group = self.state[q]
                if not group["copied"]:
                    group["copied"] = True
                    for r in group["params"]:
                        self.buf[r] = s.a(self.modules[r[0]][r[1]] * w, ALLGATHER_STREAM)
                group["left"] -= 1
                if group["left"] == 0:
                    s.f(group["flat"])
            numel, batch = 0, []
            most = min(zero.stage3_max_live_parameters - self.available, zero.stage3_prefetch_bucket_size)
            while self.qp < len(self.queue) and numel < most:
                q = self.queue[self.qp]
                self.qp += 1
                if q not in self.state:
                    batch.append(q)
                    numel += self.modules[q[0]][q[1]]
            if batch:
                self.gather(batch)
            return [self.buf.pop(q) for q in mine]

        def fetch_block(self, first: int) -> list[int]:
            """A block's modules, from module `first`, each fetched in turn: their buffers."""
            return [b for mi in range(first, first + len(block_modules)) for b in self.fetch(mi)]

    def forward_prefetcher(keep_head: bool) -> tuple[Prefetcher, list[int]] | None:
        """The forward's module sequence (embedding, each block's modules, final norm, head)
        and the index of each block's first module."""
        if block_modules is None:
            return None
        modules, starts, kept = [[V * h]], [], set()
        for layer in range(model.layers):
            starts.append(len(modules))
            if layer in kept_layers:
                kept.update(range(len(modules), len(modules) + len(block_modules)))
            modules += [list(m) for m in block_modules]
        modules += [[], [V * h]]
        if keep_head:
            kept.add(len(modules) - 1)
        return Prefetcher(modules, kept), starts

    def backward_prefetcher(gathered: dict[int, list[int]]) -> tuple[Prefetcher, dict[int, int]] | None:
        """The backward's module sequence (the head, the final norm, the blocks last first:
        each block's modules in reverse, or in forward order when checkpointed, the recompute
        fetching them; the embedding), with the blocks still gathered from the forward and the
        head present, and the index of each block's first module."""
        if block_modules is None:
            return None
        modules, starts, present = [[V * h], []], {}, {0}
        order = block_modules if ckpt else block_modules[::-1]
        for layer in reversed(range(model.layers)):
            starts[layer] = len(modules)
            if layer in gathered:
                present.update(range(len(modules), len(modules) + len(order)))
            modules += [list(m) for m in order]
        modules.append([V * h])
        return Prefetcher(modules, set(), frozenset(present)), starts

    def norm_forward() -> tuple[list[int], int]:
        """A norm: (tensors its backward keeps, its output)."""
        if hf_norm:
            # transformers' RMSNorm: x.float() (kept), pow (transient), x * rsqrt (fp32,
            # transient), .to(bf16) (kept by the weight multiply), weight * that (output)
            # (the fp32 product stays bound to the local `hidden_states` until the function
            # returns: freed after the output is made; traces t-z1-hf-v32001, t-z2-hf-ckpt-s8192:
            # 64, 64, -64, 64, 32, 32, -64 MiB at b2 s4096 h2048)
            x32 = s.a(T * h * 4)
            s.f(s.a(T * h * 4))
            n32 = s.a(T * h * 4)
            nb = s.a(T * h * w)
            out = s.a(T * h * w)
            s.f(n32)
            return [x32, nb], out
        return [], s.a(T * h * w)

    E, top_k = model.experts, model.top_k or 0
    S = T * top_k  # (token, expert) pairs

    def moe_forward(sv: dict, recompute: bool) -> int | None:
        """MixtralSparseMoeBlock.forward on the post-attention norm's output (modeling_mixtral.py,
        transformers 5.24; experts by `grouped_mm_experts_forward`, integrations/moe.py, the
        default: PreTrainedModel.get_correct_experts_implementation resolves None to
        "grouped_mm" for a class decorated @use_experts_implementation), then the residual
        add. Saved for backward: the fp32 router probabilities, the top-k indices and sums,
        the sort permutation, the gathered input (S x hidden), the sorted routing weights,
        the gate/up output (S x 2 ffn), SiLU's output, the product, the down output (S x
        hidden), the inverse permutation. With `recompute` the checkpoint stops after the
        inverse permutation, the last tensor saved (IndexBackward0 saves its indices before
        it runs): no un-permuted copy, sum or output. Request order checked against
        torch.profiler's CPU memory events of the block (torch 2.13, bf16)."""
        # MixtralTopKRouter: F.linear (bf16 logits), .float(), softmax (kept), topk (values,
        # int64 indices), values /= values.sum(-1) (the sum kept by DivBackward)
        logits = s.a(T * E * w)
        l32 = s.a(T * E * 4)
        probs = s.a(T * E * 4)
        s.f(l32)
        top_v, top_i, top_sum = s.a(T * top_k * 4), s.a(T * top_k * 8), s.a(T * 4)
        # grouped_mm_experts_forward: sort the S expert ids (sorted ids, permutation),
        # perm // top_k (IndexBackward0's index, kept), hidden_states[...] (S x hidden,
        # kept by the grouped mm), sample_weights[perm] (fp32, kept), histc's int32 input
        ids_g, perm = s.a(S * 8), s.a(S * 8)
        pk = s.a(S * 8)
        sel = s.a(S * h * w)
        sw = s.a(S * 4)
        s.f(s.a(S * 4))
        proj = s.a(S * 2 * f * w)  # gate/up grouped mm
        act = s.a(S * f * w)  # _default_apply_gate: act_fn(gate) * up
        prod = s.a(S * f * w)
        down = s.a(S * h * w)  # down grouped mm
        weighted = s.a(S * h * 4)  # proj_out * sample_weights_g: bf16 x fp32 -> fp32
        inv = s.a(S * 8)  # inv_perm = empty_like(perm); inv_perm[perm] = arange
        s.f(s.a(S * 8))
        sv["moe_router"] = [probs, top_i, top_sum, perm, sw]
        sv["moe_pk"], sv["moe_sel"], sv["moe_proj"] = [pk], [sel], [proj]
        sv["act"], sv["prod"], sv["fc1"] = [act], [prod], []
        sv["moe_down"], sv["moe_inv"] = [down], [inv]
        if recompute:
            s.f(weighted, logits, top_v, ids_g)
            return None
        unperm = s.a(S * h * 4)  # weighted_out[inv_perm]
        s.f(weighted)
        sum32 = s.a(T * h * 4)  # .view(tokens, top_k, hidden).sum(1)
        moe_out = s.a(T * h * w)  # .to(bf16)
        s.f(unperm, sum32, logits, top_v, ids_g)
        out = s.a(T * h * w)  # residual + hidden_states
        s.f(moe_out)
        return out

    def moe_backward(sv: dict, g: int, hook) -> int:
        """The MoE block's backward from g (its output's gradient, also the residual's), as
        autograd runs it (engine order: highest sequence number first; each node's inputs
        and saved tensors freed before the next node, AccumulateGrad (DeepSpeed's hook)
        right after the node that made the weight's gradient). Returns the gradient of the
        norm's output (the router's input gradient added in place into the experts')."""
        g32 = s.a(T * h * 4)  # ToCopyBackward0
        gs = s.a(S * h * 4)  # SumBackward1's expand, reshaped by ViewBackward0 (a copy)
        s.f(g32)
        gi = s.a(S * h * 4)  # IndexBackward0: zeros, index_put_ (accumulate)
        s.f(gs, *sv["moe_inv"])
        # MulBackward0: d(down) = g * weights (fp32, cast to bf16), d(weights) = g * down
        # (fp32, summed to S x 1)
        gd32, gw32 = s.a(S * h * 4), s.a(S * h * 4)
        gd = s.a(S * h * w)
        s.f(gd32, gw32, gi, *sv["moe_down"])
        # GroupedMmBackward0 (down): the 3D weight's gradient, then the input's
        wg = s.a(E * f * h * w)
        gp = s.a(S * f * w)
        s.f(gd, *sv["prod"])
        hook([wg])
        ga, gu = s.a(S * f * w), s.a(S * f * w)  # MulBackward0: d(act), d(up)
        s.f(gp, *sv["act"])
        gg = s.a(S * f * w)  # SiluBackward0
        s.f(ga, *sv["moe_proj"])
        gcat = s.a(S * 2 * f * w)  # SplitBackward0 (chunk): cat
        s.f(gg, gu)
        wg = s.a(E * 2 * f * h * w)  # GroupedMmBackward0 (gate/up)
        gsel = s.a(S * h * w)
        s.f(gcat, *sv["moe_sel"])
        hook([wg])
        gx = s.a(T * h * w)  # IndexBackward0 (hidden_states[perm // top_k]): zeros, index_put_
        s.f(gsel, *sv["moe_pk"])
        # the router: routing weights' gathers, DivBackward0, TopkBackward0 (zeros T x
        # experts fp32), SoftmaxBackward0, ToCopyBackward0 (bf16), the router's Linear
        gt = s.a(T * E * 4)
        gsm = s.a(T * E * 4)
        s.f(gt, *sv["moe_router"])
        gl = s.a(T * E * w)
        s.f(gsm)
        gr = linear_backward(E * h, T * h * w, hook)
        s.f(gl)
        s.f(gr)  # added into the experts' input gradient in place
        return gx

    def rotary(size: int) -> int:
        """apply_rotary_pos_emb on one of q, k (`size` bytes): x * cos, rotate_half(x) =
        cat(-x2, x1) (the negated half, then the cat), that * sin, the sum."""
        xc = s.a(size)
        neg = s.a(size // 2)
        cat = s.a(size)
        s.f(neg)
        xs = s.a(size)
        s.f(cat)
        out = s.a(size)
        s.f(xc, xs)
        return out

    def hf_rotated_qkv() -> tuple[int, int, int]:
        """A transformers attention's q, k and v projections and apply_rotary_pos_emb(q, k):
        autograd keeps only cos and sin, so each rotary's intermediates (the negated half and the
        cat included) die inside it; q and k stay bound to the attention's locals until both are
        rotated (t-z1-hf-v256000 trace: 18, 9, 18, -9, 18, -18, 18, -18, -18 MiB for q at b2
        s2048 h2304). Returns the rotated q and k, and v."""
        q = s.a(T * h * w)
        first_matmul("forward")
        k, v = s.a(T * kv * w), s.a(T * kv * w)
        qr = rotary(T * h * w)
        kr = rotary(T * kv * w)
        s.f(q, k)
        return qr, kr, v

    def hf_norm_no_saves(x: int) -> int:
        """transformers' RMSNorm when autograd saves nothing: the fp32 copy dies when the
        local is rebound to its product with rsqrt, that product when the function returns."""
        x32 = s.a(T * h * 4)
        s.f(s.a(T * h * 4))  # pow
        n32 = s.a(T * h * 4)
        s.f(x32)
        nb = s.a(T * h * w)
        out = s.a(T * h * w)
        s.f(nb, n32)
        return out

    def hf_block_forward_checkpointed(x: int) -> int:
        """A transformers decoder layer's forward inside torch.utils.checkpoint (non-reentrant):
        nothing is saved, so every intermediate dies at its last use, when the Python local
        holding it is rebound or its function returns; only the layer's input is kept, by the
        checkpoint. Order from the t-z2-hf-ckpt-s8192 trace (per layer, MiB at s8192 h2048 kv
        1024 ffn 5632: norm 64 64 -64 64 -64 32 32 -32 -64; q 32, k 16, v 16; the two rotaries;
        -32 -16 the unrotated q and k; sdpa 32, o_proj 32, -32 -32 -16 -16 the attention's
        locals, -32 the norm's output, 32 the residual add, -32; the MLP: gate 88, silu 88,
        -88, up 88, product 88, -88 -88, down 32, -88, -32, 32 the residual add, -32 -32)."""
        n1 = hf_norm_no_saves(x)
        qr, kr, v = hf_rotated_qkv()
        attn = s.a(T * h * w)
        proj = s.a(T * h * w)
        s.f(attn, qr, kr, v, n1)
        xm = s.a(T * h * w)
        s.f(proj)
        n2 = hf_norm_no_saves(xm)
        gate = s.a(T * f * w)
        act = s.a(T * f * w)
        s.f(gate)
        up = s.a(T * f * w)
        prod = s.a(T * f * w)
        s.f(act, up)
        down = s.a(T * h * w)
        s.f(prod, n2)
        out = s.a(T * h * w)
        s.f(down, xm)
        return out

    def block_forward(x: int, keep: bool, recompute: bool = False, input_dies: bool = True) -> tuple[dict, int | None]:
        """One block's forward from its input x: (what its backward keeps, its output).
        `recompute`: a checkpoint's recomputation in backward, which stops once the last
        tensor backward needs is made (torch.utils.checkpoint, non-reentrant, early stop on
        by default): fc2 and the residual add are not run again, no output (z2-ckpt trace:
        no 48 MiB fc2 output or sum between a layer's recomputed product and fc2's gradients)."""
        sv: dict[str, list[int]] = {}
        sv["norm1"], n1 = norm_forward()
        sv["n1"] = [n1]
        if hf:
            sv["qkv"] = list(hf_rotated_qkv())
        else:
            sv["qkv"] = [s.a(T * (h + 2 * kv) * w)]
            first_matmul("forward")
        sv["attn"] = [s.a(T * h * w)]
        proj = s.a(T * h * w)
        xm = s.a(T * h * w)
        s.f(proj)
        if ckpt:
            sv["x"] = []  # the checkpoint keeps the block's input
        elif hf_norm:
            sv["x"] = []  # the norm keeps its fp32 copy, not the block's input
        else:
            sv["x"] = [x]
        sv["norm2"], n2 = norm_forward()
        sv["n2"] = [n2]
        if moe:
            out = moe_forward(sv, recompute)
        else:
            if hf and swiglu:
                # down_proj(act_fn(gate_proj(x)) * up_proj(x)): gate, its SiLU, up
                gate = s.a(T * f * w)
                act = s.a(T * f * w)
                up = s.a(T * f * w)
                sv["fc1"] = [gate, up]
            else:
                fc1 = s.a(T * (2 if swiglu else 1) * f * w)
                act = s.a(T * f * w)
                sv["fc1"] = [fc1]
            sv["act"] = [act]
            if swiglu:
                sv["prod"] = [s.a(T * f * w)]
            else:
                sv["prod"] = []
            if recompute:
                out = None
            else:
                fc2 = s.a(T * h * w)
                out = s.a(T * h * w)
                s.f(fc2)
        if hf_norm:
            s.f(xm)
            if not ckpt and input_dies:
                # the block's input stays bound to the model loop's `hidden_states` until the
                # layer returns (t-z1-hf-v256000 trace: the down output, the residual, then the
                # input freed after each block's second residual add)
                s.f(x)
            sv["xm"] = []
        else:
            sv["xm"] = [xm]
        if not keep:
            for names in sv.values():
                s.f(*names)
            sv = {}
        return sv, out

    heads = model.heads
    seq_rounded = 128 * -(-t.seq // 128)
    # flash attention's backward workspace, freed when it returns: the fp32 dq accumulator
    # (b, s, heads, head_dim) and the (b, heads, s) softmax sums, and with fewer key/value
    # heads than query heads the bf16 dk/dv expanded to every query head before they are
    # summed per group (flash_api.cpp mha_bwd: dk_expanded, dv_expanded when num_heads_k !=
    # num_heads). Traces: 129.0 MiB at b2 s4096 h2048 32 heads / 8 kv heads, 192.8 MiB at
    # h3072 24/8, 64.5 MiB at b2 s2048 h4096 32/32 (z3-opt-param-cpu)
    gqa = model.num_kv_heads != heads
    flash_bwd = t.micro_batch * seq_rounded * ((8 if gqa else 4) * model.q_size + 4 * heads)

    def linear_backward(weight: int, d_input: int, hook, biased: bool = False, dies: tuple = ()) -> int:
        """A Linear's backward. Without a bias (MmBackward): the weight's gradient, then the
        input's; the weight's gradient goes at once to its AccumulateGrad node, whose hook
        (DeepSpeed's reduce hook) runs before the next node (traces: 48 then 128 MiB at fc2,
        96 then 48 at fc1, the 48 freed into the reduce bucket before the activation gradients
        follow), then `dies` is freed. With one (AddmmBackward0): the input's
        gradient, then the weight's, the bias's transient, then `dies` (the incoming gradient and
        the saved input, in that order) before the weight's hook (w2-z0-L6-h2560 trace: +160
        +50 +132.5 -132.5 -160 at fc2; +40 +50 +135 -135, the 160 MiB incoming and the 40 MiB
        norm output freed at fc1)."""
        if biased:
            gin = s.a(d_input)
            wgrad = s.a(weight * w)
            s.f(s.a(BIAS_GRAD_TRANSIENT))
            s.f(*dies)
            hook([wgrad])
        else:
            wgrad = s.a(weight * w)
            gin = s.a(d_input)
            hook([wgrad])
            s.f(*dies)
        return gin

    def block_backward(sv: dict, g: int, hook) -> int:
        """One block's backward, as autograd runs it: each node frees what it kept when it
        is done, each weight gradient is handed to `hook` as it is made. g: the gradient of
        the block's output, which is also the residual stream's: the gradients of the two
        norms' branches are added into it in place (autograd's InputBuffer accumulates into a
        buffer it owns; the traces free the branch's gradient and keep g)."""
        if moe:
            gn = moe_backward(sv, g, hook)
            s.f(*sv["n2"])
            gxm = norm_backward(gn, sv["norm2"], sv["xm"], hook)
            s.f(gxm)  # added into g in place
            return attention_backward(sv, g, hook)
        if gpt_biased:
            # fc2 (its node frees its saved input, the activation's output, GELU's too)
            g1 = linear_backward(f * h, T * f * w, hook, True, tuple(sv["prod"] or sv["act"]))
        else:
            wg_fc2 = s.a(f * h * w)  # fc2: d(weight), then d(input)
            g1 = s.a(T * f * w)
            s.f(*(sv["prod"] or sv["act"][:0]))
            hook([wg_fc2])
        if hf and swiglu:
            # transformers' MLP (t-z1-hf-v256000 trace): MulBackward0 (up's gradient, then
            # act's; up and act freed with it); up_proj's MmBackward runs before the SiLU's
            # (made later in forward); gate_proj's input gradient is summed with up_proj's
            # (both views of a matmul: a new tensor) before its weight's hook, and the norm's
            # output, which both projections kept, dies with gate_proj's node
            gate, up = sv["fc1"]
            g_up, g_act = s.a(T * f * w), s.a(T * f * w)
            s.f(g1, up, *sv["act"])
            w_up = s.a(f * h * w)
            gx = s.a(T * h * w)
            s.f(g_up)
            hook([w_up])
            gs = s.a(T * f * w)  # SiluBackward0
            s.f(g_act, gate)
            w_gate = s.a(f * h * w)
            gx2 = s.a(T * h * w)
            s.f(gs, *sv["n2"])
            gn = s.a(T * h * w)
            s.f(gx, gx2)
            hook([w_gate])
            gxm = norm_backward(gn, sv["norm2"], sv["xm"], hook)
            s.f(gxm)  # added into g in place
            return attention_backward(sv, g, hook)
        if swiglu:
            # silu(gate) * up: MulBackward0 makes up's gradient, then silu's (as transformers'
            # MLP above; b7-z0-L6-h3072 trace: the second is freed by the silu's backward)
            gb, ga = s.a(T * f * w), s.a(T * f * w)
            s.f(g1, *sv["act"])
            gs = s.a(T * f * w)  # silu backward
            s.f(ga)
            s.f(*sv["fc1"])  # the fused gate/up output: its last use was the silu
            gcat = s.a(T * 2 * f * w)  # chunk backward: cat
            s.f(gs, gb)
        else:
            gcat = s.a(T * f * w)  # gelu backward: its input (fc1's output) freed
            s.f(g1, *([] if gpt_biased else sv["act"]), *sv["fc1"])
        gn = linear_backward((2 if swiglu else 1) * f * h, T * h * w, hook, gpt_biased,
                             (gcat, *sv["n2"]))  # fc1
        gxm = norm_backward(gn, sv["norm2"], sv["xm"], hook)
        s.f(gxm)  # added into g in place
        return attention_backward(sv, g, hook)

    def attention_backward(sv: dict, g: int, hook) -> int:
        """The attention half of a block's backward, from g (the residual's gradient)."""
        gattn = linear_backward(h * h, T * h * w, hook, gpt_biased)  # proj
        # sdpa backward: dq, dk, dv, flash's workspace
        dq, dk, dv = s.a(T * h * w), s.a(T * kv * w), s.a(T * kv * w)
        s.f(s.a(flash_bwd))
        if hf:
            # transformers' attention (t-z1-hf-v256000 trace): the sdpa node frees its
            # incoming gradient, then the rotated k and q, v and its output; k's rotary runs
            # back before q's (made later), then v_proj, k_proj, q_proj (reverse order of
            # creation). k's and q's gradients come out of the rotary transposed and are
            # made contiguous for their projection's view; v_proj's and k_proj's input
            # gradients are summed into a new tensor (both views), q_proj's added into it in
            # place; each projection's weight hook runs once its input gradient is placed
            qr, kr, v = sv["qkv"]
            s.f(gattn, kr, qr, v, *sv["attn"])
            dk = rotary_backward(dk, T * kv * w)
            dq = rotary_backward(dq, T * h * w)
            w_v = s.a(h * kv * w)
            gv = s.a(T * h * w)
            s.f(dv)
            hook([w_v])
            kc = s.a(T * kv * w)
            s.f(dk)
            w_k = s.a(h * kv * w)
            gk = s.a(T * h * w)
            s.f(kc)
            gn = s.a(T * h * w)
            s.f(gv, gk)
            hook([w_k])
            qc = s.a(T * h * w)
            s.f(dq)
            w_q = s.a(h * h * w)
            gq = s.a(T * h * w)
            s.f(qc, *sv["n1"], gq)
            hook([w_q])
            gx = norm_backward(gn, sv["norm1"], sv["x"], hook)
            s.f(gx)  # added into g in place
            return g
        s.f(*sv["attn"], *sv["qkv"], gattn)
        gqkv = s.a(T * (h + 2 * kv) * w)  # split backward: cat
        s.f(dq, dk, dv)
        gn = linear_backward(h * (h + 2 * kv), T * h * w, hook, qkv_biased,
                             (gqkv, *sv["n1"]) if qkv_biased else (*sv["n1"], gqkv))
        gx = norm_backward(gn, sv["norm1"], sv["x"], hook)
        s.f(gx)  # added into g in place
        return g

    def rotary_backward(g: int, size: int) -> int:
        """apply_rotary_pos_emb's backward for one of q, k (`size` bytes) from its output's
        gradient g: rotate_half(x) * sin's product, the negated half, the two slices'
        zero-padded gradients (the second added into the first in place), x * cos's product
        added too (t-z1-hf-v256000 trace: 18, 9, 18, -9, 18, -18, -18, 18, -18, -18 MiB)."""
        a1 = s.a(size)
        neg = s.a(size // 2)
        s2 = s.a(size)
        s.f(neg)
        s1 = s.a(size)
        s.f(a1, s1)
        y = s.a(size)
        s.f(g, y)
        return s2

    def norm_backward(g: int, kept: list[int], x: list[int], hook) -> int:
        if hf_norm:
            # transformers' RMSNorm as autograd runs it back (traces t-z1-hf-v256000,
            # t-z1-hf-v32001: 18, 18, 72, then 36 x 7 and 18 MiB at b2 s2048 h2304).
            # MulBackward0 (weight * hb): hb's gradient, then the weight's product, which the
            # engine sums to the weight's shape (validate_outputs -> sum_to; the reduction
            # takes a transient of 8 bytes an element); g, the product and hb freed, then the
            # weight's AccumulateGrad and hook
            x32, nb = kept
            g_hb = s.a(T * h * w)
            gw = s.a(T * h * w)
            s.f(s.a(T * h * 8))
            s.f(gw, g, nb)
            hook([], model.norm_params())
            g32 = s.a(T * h * 4)  # ToCopyBackward0: to fp32
            s.f(g_hb)
            # MulBackward0 (x32 * rsqrt): rsqrt's product (summed over h, freed), then x32's
            gr = s.a(T * h * 4)
            gx32 = s.a(T * h * 4)
            s.f(gr, g32)
            # MeanBackward0 (expand / h), PowBackward0 (x32.pow(1), * 2, * grad): x32 freed
            # with the pow's node, its product added into x32's gradient in place
            gm = s.a(T * h * 4)
            p1, p2, gp = s.a(T * h * 4), s.a(T * h * 4), s.a(T * h * 4)
            s.f(p2, p1, gm, x32, gp)
            gx = s.a(T * h * w)  # ToCopyBackward0: to bf16
            s.f(gx32)
            return gx
        # the norm's weight (and bias) gradient: too small for the large pool, but ZeRO-3
        # counts its elements into the reduce bucket
        hook([], model.norm_params())
        gx = s.a(T * h * w)
        # what the norm kept for its backward (the final norm's input, `fin_kept`) dies with it
        s.f(g, *x, *kept)
        return gx

    def fp32_gradients(size: int, moments_made: bool, *release: int | None) -> int:
        """The step over one flat partition of `size` elements: its gradients flattened, cast to
        fp32 (the bf16 flat freed, then `release`), Adam's two moments made on the first step.
        Returns the fp32 gradients, which the caller frees once the step is done."""
        flat16 = s.a(size * w)
        flat32 = s.a(size * 4)
        s.f(flat16, *release)
        if not moments_made:
            s.a(4 * size)
            s.a(4 * size)
        return flat32

    def hand_forward(x: int, first: bool) -> tuple[dict, int | None]:
        """One block's forward as written above: (what its backward keeps, its output)."""
        if ckpt and hf_norm and swiglu and not moe:
            return {}, hf_block_forward_checkpointed(x)
        # the first block's input is the model's `inputs_embeds`, alive to its return
        return block_forward(x, keep=not ckpt, input_dies=not first)

    def hand_recompute(x: int) -> dict:
        """A checkpointed block's recompute in backward: what its backward keeps."""
        return block_forward(x, keep=True, recompute=True)[0]

    # The seam for a model's own per-block requests: one block's forward, its checkpoint
    # recompute and its backward (hook: DeepSpeed's gradient hook, called with each weight
    # gradient as it is made), over `s.a` / `s.f`. These are the hand-written ones; a learned
    # model card (core/card.py) would supply the three from its recorded requests, the rest of
    # the step (initialize, ZeRO-3's gathers, the head and loss, the buckets, the step) unchanged.
    forward_pass, recompute_pass, backward_pass = hand_forward, hand_recompute, block_backward

    # --loop deepspeed: the bf16 logits the training loop's `outputs` holds (held_outputs_bytes)
    keeps_outputs = t.loop == "deepspeed"
    held_logits = None
    grads: list[int] = []  # stage 0, and stage 1 between accumulation boundaries: per weight
    # stage 1/2's IPG buckets (ipg_buffer), made by the first gradient hook of a backward
    buckets: list[int] = []

    for step_index in range(steps * ga):
        boundary = step_index % ga == ga - 1
        accumulating = bool(grads)
        # ZeRO-3's first forward and backward record the module trace
        # (partitioned_param_coordinator: reset_step at each forward's start moves INVALID ->
        # RECORD -> COMPLETE); until the trace is complete release_sub_module releases every
        # gathered weight after its module, whatever stage3_max_reuse_distance says (the
        # z3-opt-param-cpu trace: step 1's forward frees every block's and the head's
        # weights, step 2's keeps the last blocks')
        recording = step_index == 0
        keep_head = head_kept and not recording
        # --- forward
        pf = forward_prefetcher(keep_head) if not recording else None
        emb_w = pf[0].fetch(0) if pf else fetch([V * h])
        x = s.a(T * h * w)  # embedding
        s.f(*emb_w)
        saved: list[dict] = []
        inputs = [x]
        gathered: dict[int, list[int]] = {}
        for layer in range(model.layers):
            if pf:
                gathered[layer] = pf[0].fetch_block(pf[1][layer])
            else:
                gathered[layer] = fetch(layer_sizes)
            sv, x = forward_pass(x, layer == 0)
            if recording or layer not in kept_layers:
                s.f(*gathered.pop(layer))
            saved.append(sv)
            inputs.append(x)
        fin_kept, head_in = norm_forward()
        if not hf_norm:
            fin_kept = [inputs[-1]]
        else:
            s.f(inputs[-1])  # rebound to the final norm's output
            if not ckpt:
                s.f(inputs[0])  # inputs_embeds, when the model's forward returns
        if pf:
            pf[0].fetch(len(pf[0].modules) - 2)  # the final norm: a prefetch
            head_w = pf[0].fetch(len(pf[0].modules) - 1)
        else:
            head_w = fetch([V * h])
        logits = s.a(T * V * w)
        if recording:
            s.f(*head_w)  # released after the head's forward, gathered again for its backward
        if hf:
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
        if keeps_outputs:
            # --loop deepspeed: `outputs = engine(...)` rebinds the loop's outputs once this
            # forward returns: the previous micro-step's logits die now, these live on
            s.f(held_logits)
            held_logits = logits
        if boundary:
            s.mark(f"step{step_index // ga + 1}.forward")
        # --- backward: the loss, its three fp32 tokens x vocab tensors
        g_nll = s.a(L * V * 4)
        g_lsm = s.a(L * V * 4)
        s.f(g_nll, logp)
        g_bf = s.a(L * V * w)
        s.f(g_lsm)
        if sliced or not hf:
            # SliceBackward: slice_backward makes a zero tensor of the whole logits
            g_full = s.a(T * V * w)
            s.f(g_bf)
            g_bf = g_full
        filled = 0
        in_bucket: list[int] = []
        grad_stream = REDUCE_STREAM if zero.overlap_comm else DEFAULT_STREAM
        # stage 1/2 with the optimizer on the GPU, more than one GPU: elements in the IPG bucket
        # (with the optimizer on the host, `in_bucket` holds them for offload_flush)
        pending = 0
        flattens = n > 1 and stage in (1, 2) and opt_on_gpu

        def flatten_reduced(elements: int) -> None:
            """stage_1_and_2.py reduce_ipg_grads -> average_tensor (reduce_scatter) ->
            allreduce_and_scatter -> allreduce_bucket: the bucket's gradient slices flattened
            (torch.cat, `self.flatten`) into one tensor on the reduction stream, reduced and
            copied back, freed. Only with peers: on one GPU there is nothing to reduce
            (emulated 2-GPU traces: a 922.2 MiB flat of the 483.5M elements that filled the
            bucket, w2-z1-L2-h4096). With the optimizer on the host the bucket is reduced the
            same way before its partition goes to the host (w2-z2-opt-L16-h3072: -4.0% -> 0.0%)."""
            if n > 1 and elements:
                s.f(s.a(elements * w, grad_stream))

        def offload_flush() -> None:
            """stage_1_and_2.py reduce_ipg_grads with cpu_offload: for each gradient of the
            bucket, under `stream(reduction_stream)` (overlap_comm), copy_grads_in_partition:
            at the boundary set_norm_for_param_grad_in_gpu (`.double().norm(2)`, 8 bytes an
            element, freed at once) and async_inplace_copy_grad_to_fp32_buffer_from_gpu
            (`.to(fp32)` then a non-blocking copy to the pinned partition, freed on return);
            between boundaries async_accumulate_grad_in_cpu_via_gpu only uses the
            preallocated temp_grad_buffer_for_gpu_offload."""
            nonlocal filled
            flatten_reduced(sum(in_bucket))
            if boundary:
                for size in in_bucket:
                    s.f(s.a(size * 8, grad_stream))
                    s.f(s.a(size * 4, grad_stream))
            in_bucket.clear()
            filled = 0

        def flush() -> None:
            """stage3.py __reduce_and_partition_ipg_grads on reduce_and_partition_stream:
            reduce_scatter on by default, so __avg_scatter_grads -> reduce_scatter_coalesced
            torch.cat's the bucket's gradients, one GPU included, and the partitions are views
            of that copy until the bucket is done (t-z3-L12-h3072 trace: 925.5, 942.1 MiB
            blocks, the bucket's 485.3M and 493.9M elements, in segments of their own). A
            bucket of one tensor that splits evenly is reduced in place, no cat (a head larger
            than the bucket: t-z3-hf-L6-h4096, no 1002 MiB copy)."""
            nonlocal filled
            if not in_bucket:
                return
            alone = len(in_bucket) == 1 and in_bucket[0] % n == 0
            staged = None if alone else s.a(sum(in_bucket) * w, REDUCE_STREAM)
            # with the optimizer on the host, partition_grads per gradient, in ds_id order (the
            # bucket's parameters are sorted by it: the order they were made, the reverse of
            # the hooks'): grad_buffer.to(device), a bf16 copy that the next gradient's
            # narrow() of the host buffer replaces (`buffers` keeps the host views); at the
            # boundary _offload_grad_partition_at_boundary takes its norm
            # (_constant_buffered_norm2: .double() of parts of at most 250M elements) and casts
            # it to fp32 for the copy to the host, both freed at once (z3-opt-param-cpu trace:
            # +128 +512 -512 +256 -256 -128 per fc weight, the head's 250 last; the same on two
            # GPUs, w2-z3-opt-L8-h4096). On the GPU the partition is copied or added into
            # grad_partitions_flat_buffer in place.
            # Each is this GPU's partition of the reduced gradient (reduce_scatter_coalesced's
            # output: ceil(numel / n) elements on rank 0), not the whole gradient.
            for size in reversed(in_bucket) if not opt_on_gpu else ():
                part = -(-size // n)
                copy = s.a(part * w, REDUCE_STREAM)
                if boundary:
                    s.f(s.a(min(part, NORM_PART_ELEMENTS) * 8, REDUCE_STREAM))
                    s.f(s.a(part * 4, REDUCE_STREAM))
                s.f(copy)
            s.f(staged)
            in_bucket.clear()
            filled = 0

        if recording:
            head_w = fetch([V * h])
        if stage == 3:
            # ZeRO-3's LinearFunctionForZeroStage3 backward: the input's gradient first (its
            # matmul takes the thread's cuBLAS workspace), then the weight's (t-z3-L24-h2048
            # trace: +32 +32 +125 MiB; stages 0-2, b7-z0-L6-h3072: +187.5 +32 +48)
            g = s.a(T * h * w)
            first_matmul("backward")
            head_grad = s.a(V * h * w)
        else:
            head_grad = s.a(V * h * w)
            first_matmul("backward")
            g = s.a(T * h * w)
        s.f(g_bf, head_in)
        if not keep_head:
            s.f(*head_w)

        def hook(weight_grads: list[int], small: int = 0) -> None:
            """DeepSpeed's gradient hook, for `weight_grads` (names of large gradients) or
            for `small` elements of small ones (norms: no block of their own, but counted
            into the reduce bucket)."""
            nonlocal partition, buckets, filled, pending
            if flattens and (stage == 2 or boundary):
                # each gradient that would overflow the bucket has the bucket reduced first
                for size in [s.sizes[gr] // w for gr in weight_grads] + ([small] if small else []):
                    if pending + size > zero.reduce_bucket_size:
                        flatten_reduced(pending)
                        pending = 0
                    pending += size
            if stage == 3:
                # copied into the IPG bucket (reduce_and_partition_stream); a gradient that
                # would overflow it first has the bucket reduced there (`flush`). With the
                # optimizer on the host each gradient of a reduced bucket is cast to fp32
                # before its copy to the pinned partition (the allocator trace of ZeRO-3
                # offload: per-tensor 4-byte transients, in segments the compute stream never
                # reuses)
                sizes = [s.sizes[gr] // w for gr in weight_grads] + ([small] if small else [])
                s.f(*weight_grads)
                if filled + sum(sizes) > zero.reduce_bucket_size:
                    flush()
                in_bucket.extend(sizes)
                filled += sum(sizes)
                return
            if not weight_grads:
                # a norm's gradient: reduced like the others (the first one ready makes the
                # buckets: t-z1-hf-v256000 trace, tied embeddings, the final norm's weight
                # before any block's), its elements counted into the bucket
                if stage == 0 or (stage == 1 and not boundary):
                    return
                if not buckets:
                    buckets = [s.a(zero.reduce_bucket_size * w) for _ in range(2 if zero.overlap_comm else 1)]
                if offload12:
                    if filled + small > zero.reduce_bucket_size:
                        offload_flush()
                    in_bucket.append(small)
                elif partition is None and filled + small > zero.reduce_bucket_size:
                    partition = s.a(p_shard * w, REDUCE_STREAM if zero.overlap_comm else DEFAULT_STREAM)
                filled += small
                return
            if stage == 0 or (stage == 1 and not boundary):
                # accumulated in .grad: the first micro-step's gradients stay, later ones are
                # added in place and dropped (stage 1 reduces only at the boundary)
                if accumulating:
                    s.f(*weight_grads)
                else:
                    grads.extend(weight_grads)
                if stage == 0:
                    return
            if not buckets:
                buckets = [s.a(zero.reduce_bucket_size * w) for _ in range(2 if zero.overlap_comm else 1)]
            if offload12:
                if stage == 2 or boundary:
                    # reduce_independent_p_g_buckets_and_remove_grads: a gradient that would
                    # overflow the bucket first has the bucket reduced, then is copied in
                    for gr in weight_grads:
                        size = s.sizes[gr] // w
                        if filled + size > zero.reduce_bucket_size:
                            offload_flush()
                        in_bucket.append(size)
                        filled += size
                    s.f(*weight_grads)
                    if stage == 1 and accumulating:
                        s.f(*grads[:len(weight_grads)])
                        del grads[:len(weight_grads)]
                return
            filled += sum(s.sizes[gr] for gr in weight_grads) // w
            if partition is None and filled > zero.reduce_bucket_size and (stage == 2 or boundary):
                # the first bucket reduced (stage 1 reduces at the boundary only:
                # h8-z1-gas2-L6-h3584 trace): grads_in_partition, made by copy_grads_in_partition
                # inside reduce_ipg_grads' `with stream(self.reduction_stream)` when
                # overlap_comm is on: cached for that stream, never reused by the compute
                # stream (z2-ckpt trace: a new 4576 MiB segment while a free 4576 and a free
                # 9152 MiB block sat in the compute stream's pool)
                partition = s.a(p_shard * w, REDUCE_STREAM if zero.overlap_comm else DEFAULT_STREAM)
            if stage == 2 or boundary:
                s.f(*weight_grads)  # copied into the bucket
                if stage == 1 and accumulating:
                    # the accumulated .grad is copied into the bucket and dropped
                    s.f(*grads[:len(weight_grads)])
                    del grads[:len(weight_grads)]

        tied = model.tie_embeddings
        if not tied:
            hook([head_grad])
        if keep_head:
            s.f(*head_w)
        g = norm_backward(g, fin_kept, [], hook)
        pb = backward_prefetcher(gathered) if pf else None
        if pb:
            pb[0].fetch(1)  # the final norm
        for i in reversed(range(model.layers)):
            sv = saved[i]
            if pb:
                fetched = pb[0].fetch_block(pb[1][i])  # gathered from the forward: nothing new
                layer_w = gathered.pop(i) if i in gathered else fetched
            else:
                layer_w = gathered.pop(i) if i in gathered else fetch(layer_sizes)
            if ckpt:
                sv = recompute_pass(inputs[i])
            gin = backward_pass(sv, g, hook)
            s.f(*layer_w)
            if ckpt:
                s.f(inputs[i])
            g = gin
        emb_w = pb[0].fetch(len(pb[0].modules) - 1) if pb else fetch([V * h])
        emb_grad = s.a(V * h * w)
        # embedding_dense_backward's fp32 partial sums, a transient: (tokens + tokens /
        # NROWS_PER_THREAD (10)) rows of the hidden size (traces: 105.6 MiB at 8192 tokens x
        # 3072, b7-z0-L6-h3072; 61.6 MiB at 4096 x 3584, h8-z1-gas2-L6-h3584)
        s.f(s.a((T + T // 10) * h * 4))
        s.f(g)
        if tied:
            # one weight used twice: autograd sums its two gradients in the AccumulateGrad
            # node's input buffer (the head's is held there from the start of backward; the
            # sum is a new tensor), and the weight's hook runs once, with the sum (z0-L16-h2048
            # trace: 501 MiB allocated after the embedding backward, the head's and the
            # embedding's 501 MiB freed)
            total = s.a(V * h * w)
            s.f(head_grad, emb_grad)
            emb_grad = total
        hook([emb_grad])
        s.f(*emb_w)
        if flattens and (stage == 2 or boundary):
            flatten_reduced(pending)  # the reduce epilogue's last, partly filled bucket
        if offload12 and (stage == 2 or boundary):
            offload_flush()  # the reduce epilogue's last bucket
        elif stage in (1, 2) and (stage == 2 or boundary) and partition is None:
            # overlapping_partition_gradients_reduce_epilogue reduces the last, partly filled
            # bucket: copy_grads_in_partition makes grads_in_partition then if no full bucket
            # did before (a model under reduce_bucket_size elements)
            partition = s.a(p_shard * w, REDUCE_STREAM if zero.overlap_comm else DEFAULT_STREAM)
        if stage == 2 or boundary:
            # released by the reduce epilogue (stage 2: every backward); stage 1 between
            # boundaries runs no epilogue and keeps them to step()'s _release_ipg_buffers
            # (h8-z1-gas2-L6-h3584 trace: made in the first micro-step, freed in the step;
            # w2-z2-L6-h2560-gas4: made and freed in every micro-step)
            s.f(*buckets)
            buckets = []
        if stage == 0 and boundary:
            # engine.allreduce_gradients -> buffered_allreduce_fallback -> allreduce_no_retain:
            # the gradients in named_parameters order, flattened into buckets of just over
            # 500M elements (MEMORY_OPT_ALLREDUCE_SIZE), each all-reduced, copied back and
            # freed, also on one GPU (z0-L16-h2048 trace: 965, 1012 and 380 MiB transients)
            numel = 0
            for gr in reversed(grads):
                numel += s.sizes[gr] // w
                if numel > ALLREDUCE_BUCKET_ELEMENTS:
                    s.f(s.a(numel * w))
                    numel = 0
            if numel:
                s.f(s.a(numel * w))
        if stage == 3:
            flush()  # independent_gradient_partition_epilogue: the last, partly filled bucket
        s.f(*retired)
        retired.clear()
        if boundary:
            s.mark(f"step{step_index // ga + 1}.backward")
        if not boundary:
            if stage == 2 and partition is not None:
                # _release_ipg_buffers drops grads_in_partition at the end of every backward;
                # the .grad views keep it alive until the next micro-step's hooks re-point
                # them into a new partition (copy_grads_in_partition)
                retired.append(partition)
                partition = None
            continue
        # --- optimizer step
        if stage == 3:
            if opt_on_gpu:
                # _get_norm_groups -> get_grad_norm_direct, before any sub-group is stepped:
                # each gradient partition's g.to(float64).norm(2), in parameter order, the
                # float64 copy freed at once (t-z3-L12-h3072 trace: 750 MiB for the embedding,
                # then 120, 72, 384, 192 per block; t-z3-hf-L6-h4096: a 4008 MiB segment for
                # its 128256 x 4096 embedding)
                for x in tensors:
                    s.f(s.a(-(-x // n) * 8))
                for size in sub_groups:  # per sub-group
                    s.f(fp32_gradients(size, moments_made))
                moments_made = True
        elif stage == 0:
            # FP16_Optimizer.step: _flatten_dense_tensors([p.grad.to(fp32) for p in group]):
            # the casts in parameter order (grads holds them in backward order), then the flat
            casts = [s.a(s.sizes[gr] * 2) for gr in reversed(grads)]
            flat32 = s.a(4 * p)
            s.f(*casts)
            s.f(flat32, *grads)
            grads.clear()
        elif offload12:
            # the step runs on the host: the norms were taken in backward, the fp32 gradients
            # are pinned host memory, the updated bf16 partition is copied into the flat
            # weights in place
            pass
        else:
            # scaled_global_norm -> get_grad_norm_direct: vector_norm(g.double()) of each
            # gradient of the partition, in parameter order, each freed at once (z2-ckpt
            # trace: 3006, then 120, 72, 384, 192 MiB per block, 8 bytes an element)
            left = p_shard
            for x in tensors:
                if left <= 0:
                    break
                s.f(s.a(min(x, left) * 8))
                left -= x
            s.f(fp32_gradients(p_shard, moments_made, partition))
            moments_made = True
            partition = None  # released with the step's gradients (allocated peaks say so)
        s.mark(f"step{step_index // ga + 1}.step")
    return s.events


def _key(inp, layout) -> tuple:
    # stages 1 and 2 ask the allocator for the same tensors in the same order unless gradients
    # accumulate (stage 1 then keeps them per weight between boundaries): one replay for both
    stage = 2 if layout.stage == 1 and inp.training.grad_accum <= 1 else layout.stage
    return (inp.model.model_dump_json(), inp.training.model_dump_json(), inp.zero.model_dump_json(),
            inp.hardware.world, stage, layout.offload_optimizer, layout.offload_param,
            cublas_workspace_bytes(inp.hardware.gpu.name))


_CACHE: dict[tuple, int | None] = {}
# A memo that outlives the process, lent by a command (zlayout/replaycache.py keeps one in the
# user's cache folder); the core reads and writes no file itself.
lasting_memo = None


def replayed_peak_reserved(inp, layout, steps: int = 2) -> int | None:
    """Peak reserved bytes (large pool) of `steps` training steps replayed through the
    default caching allocator; None where the layout is not replayed. Two steps: the second
    repeats the first's requests with the Adam moments in place, and a third reserved nothing
    more on any of the 22 measured layouts replayed. Memoised: planning
    asks for the same layout many times."""
    key = _key(inp, layout)
    if key not in _CACHE:
        def replay() -> int | None:
            seq = _Seq(live=True)
            return None if allocation_sequence(inp, layout, steps, seq) is None else seq.reserved

        _CACHE[key] = replay() if lasting_memo is None else lasting_memo.recall((key, steps), replay)
        if len(_CACHE) > 4096:
            _CACHE.pop(next(iter(_CACHE)))
    return _CACHE[key]


@dataclass(frozen=True)
class CapacityReplay:
    """Training steps replayed where cudaMalloc has only `capacity` bytes (Device)."""

    out_of_memory: bool
    peak_reserved: int  # never above the capacity
    needed: int  # the most a retry needed (0: none retried); past the capacity when out of memory
    retries: int  # over the replayed steps, initialize included (the run's num_alloc_retries)
    retries_per_step: int  # in the last step: what every later step repeats
    freed_per_step: int  # bytes the last step's retries gave back


_CAPACITY_CACHE: dict[tuple, CapacityReplay | None] = {}


def replay_at_capacity(inp, layout, capacity: int, steps: int = 2) -> CapacityReplay | None:
    """The default allocator's replay where cudaMalloc has only `capacity` bytes for the large
    pools (Device): whether the steps run, peak reserved, and the retries they make. None
    where the layout is not replayed. Memoised."""
    unbounded = replayed_peak_reserved(inp, layout, steps)
    if unbounded is None or unbounded <= capacity:
        # the card never fills: the same replay, no retry (and the lasting memo answers it)
        return None if unbounded is None else CapacityReplay(False, unbounded, 0, 0, 0, 0)
    key = (_key(inp, layout), capacity, steps)
    if key in _CAPACITY_CACHE:
        return _CAPACITY_CACHE[key]

    def replay() -> CapacityReplay | None:
        device = Device(capacity)
        seq = _Seq(live=True, device=device)
        try:
            return None if allocation_sequence(inp, layout, steps, seq) is None else CapacityReplay(
                False, seq.reserved, device.needed, device.retries, *_last_step(seq, steps))
        except OutOfMemory as oom:
            return CapacityReplay(True, device.peak, oom.reserved + oom.request, device.retries, 0, 0)

    result = replay() if lasting_memo is None else lasting_memo.recall(
        ("capacity", key), replay, encode=astuple, decode=lambda fields: CapacityReplay(*fields))
    _CAPACITY_CACHE[key] = result
    if len(_CAPACITY_CACHE) > 1024:
        _CAPACITY_CACHE.pop(next(iter(_CAPACITY_CACHE)))
    return result


def _last_step(seq: _Seq, steps: int) -> tuple[int, int]:
    """Retries and bytes freed in the last replayed step (from the step before's end)."""
    end = seq.device_marks.get(f"step{steps}.step", (seq.device.retries, seq.device.freed))
    start = seq.device_marks.get(f"step{steps - 1}.step", (0, 0))
    return end[0] - start[0], end[1] - start[1]
