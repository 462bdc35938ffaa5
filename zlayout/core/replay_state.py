"""The state one allocator replay shares between its phases (core/allocator_sim.py).

* `_Seq`: the request sequence as the phases write it (`a`: allocate, `f`: free), recorded as
  events or served at once by the caching allocator's pools, one per stream.
* `Replay`: one layout's replay: the model's, the training's and ZeRO's terms every phase reads
  (tokens, sizes, which stage, what is offloaded), the sequence, and the cuBLAS workspaces.
"""

from __future__ import annotations

from typing import Callable

from zlayout.core.caching_allocator import DEFAULT_STREAM, CachingAllocator, Device, _Block
from zlayout.core.reductions import device_of
from zlayout.core.tensors import (block_tensor_sizes, parameter_tensor_sizes, stage3_sub_groups,
                                  zero3_leaf_moe_tensor_sizes)

MiB = 2**20
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
        self.steps_run = 0  # the training steps `allocation_sequence` replayed
        self.pools: dict[int, CachingAllocator] = {}
        self.blocks: list[_Block | None] = [None]  # live: each name's block (None: small)
        self.marks: list[tuple[str, int]] = []  # (phase, index of its first event): comparisons
        self.released_peak = 0
        # live: the bytes the replayed tensors hold (every request, small ones too, as
        # torch.cuda.max_memory_allocated counts them) and their peak; `held[name]`: not freed yet
        self.allocated = 0
        self.peak_allocated = 0
        self.held: list[bool] = [False]
        # live: (stream, key, cached blocks) -> the names' sizes (`episode`)
        self.episodes: dict[tuple, list[int]] = {}

    def mark(self, phase: str) -> None:
        """The phase that ends here (the allocator trace's `phase_marks`), for comparing the
        sequence with a recorded trace; planning (live) keeps none."""
        if not self.live:
            self.marks.append((phase, len(self.events)))
        elif self.device is not None:
            self.device_marks[phase] = (self.device.retries, self.device.freed)

    def a(self, size: int, stream: int = DEFAULT_STREAM) -> int:
        size = int(size)
        sizes = self.sizes
        name = len(sizes)
        sizes.append(size)
        if self.live:
            self.held.append(True)
            self.allocated += size
            if self.allocated > self.peak_allocated:
                self.peak_allocated = self.allocated
            # the block knows its pool (`_Block.pool`): `f` frees it there; None: not replayed
            try:
                self.blocks.append(self.pools[stream].malloc(size))
            except KeyError:
                self.blocks.append(self._new_pool(stream).malloc(size))
        else:
            self.events.append(("a", name, size) if stream == DEFAULT_STREAM else ("a", name, size, stream))
        return name

    def _new_pool(self, stream: int) -> CachingAllocator:
        pool = self.pools[stream] = CachingAllocator(device=self.device)
        if self.device is not None:
            self.device.pools.append(pool)
        return pool

    def f(self, *names: int | None) -> None:
        if self.live:
            blocks, held = self.blocks, self.held
            for name in names:
                if name is not None:
                    if held[name]:
                        held[name] = False
                        self.allocated -= self.sizes[name]
                    block = blocks[name]
                    if block is not None:
                        # forgotten once freed: a free block may be merged into a neighbour,
                        # and a handle kept here would keep it alive for the cyclic collector
                        blocks[name] = None
                        block.pool.free(block)
        else:
            self.events.extend(("f", name, 0) for name in names if name is not None)

    def drop(self, *names: int) -> None:
        """A tensor freed whose block the allocator cannot hand out yet: `record_stream` put it in
        use on another stream, and the allocator waits for that stream's event (polled at each
        malloc) before reusing it. Counted as freed now (torch.cuda.memory_allocated drops at the
        free), its block held until `f` (where the replay takes the other stream to be done)."""
        if self.live:
            for name in names:
                if self.held[name]:
                    self.held[name] = False
                    self.allocated -= self.sizes[name]
        else:
            self.events.extend(("d", name, 0) for name in names)

    def transient(self, size: int, stream: int = DEFAULT_STREAM) -> None:
        """`f(a(size, stream))`: a tensor freed before the next request (a cast, a norm's
        partial sums); live, served without a block of its own (`CachingAllocator.transient`)."""
        if not self.live:
            self.f(self.a(size, stream))
            return
        size = int(size)
        self.sizes.append(size)
        self.blocks.append(None)
        self.held.append(False)
        self.peak_allocated = max(self.peak_allocated, self.allocated + size)
        try:
            pool = self.pools[stream]
        except KeyError:
            pool = self._new_pool(stream)
        pool.transient(size)

    def episode(self, stream: int, key: tuple, run: Callable[[], None]) -> None:
        """`run()`: requests on `stream` alone that free, by its end, everything they allocate
        (a reduced bucket's copies on the reduce stream), decided by `key`. Live, on a pool
        with nothing allocated, the allocator is deterministic: the same requests from the same
        cached blocks (`free_index`) leave them as they were whenever the first such run made
        no segment, so a repeat is skipped; its names are still taken."""
        if not self.live:
            run()
            return
        pool = self.pools.get(stream) or self._new_pool(stream)
        if pool.allocated:
            run()
            return
        cached = tuple(pool.free_index)
        seen = self.episodes.get((stream, key, cached))
        if seen is not None:  # its names, and the most it held at once above what was held before it
            sizes, above = seen
            self.sizes.extend(sizes)
            self.blocks.extend([None] * len(sizes))
            self.held.extend([False] * len(sizes))
            self.peak_allocated = max(self.peak_allocated, self.allocated + above)
            return
        first, segments = len(self.sizes), len(pool.segment_sizes)
        before, outer_peak = self.allocated, self.peak_allocated
        self.peak_allocated = before
        run()
        above = self.peak_allocated - before
        self.peak_allocated = max(outer_peak, self.peak_allocated)
        if not pool.allocated and len(pool.segment_sizes) == segments and tuple(pool.free_index) == cached:
            self.episodes[(stream, key, cached)] = (self.sizes[first:], above)

    def empty_cache(self) -> None:
        """torch.cuda.empty_cache: the pools' unused segments go back to the device."""
        if self.live:
            self.released_peak = max(self.released_peak, self.reserved)
            for pool in self.pools.values():
                pool.empty_cache()
        else:
            self.events.append(("e", None, 0))

    def pool_state(self) -> tuple:
        """Every pool's segments and free blocks (live): two equal states serve the same requests
        the same way from there on."""
        return tuple((stream, tuple(pool.segment_sizes), tuple(pool.free_index))
                     for stream, pool in sorted(self.pools.items()))

    @property
    def reserved(self) -> int:
        """Peak reserved bytes so far (live): the pools' segments, or what they held before an
        empty_cache returned some, whichever was more."""
        if self.device is not None:
            return max(self.released_peak, self.device.peak)
        return max(self.released_peak, sum(pool.reserved for pool in self.pools.values()))



class Replay:
    """One layout's replay: the terms every phase reads, the sequence `s` the phases write,
    and the cuBLAS workspaces taken so far. `ga`: the micro-steps replayed per step."""

    def __init__(self, inp, layout, s: _Seq, ga: int) -> None:
        model, t, zero = inp.model, inp.training, inp.zero
        self.model, self.t, self.zero, self.s, self.ga = model, t, zero, s, ga
        self.stage, self.n = layout.stage, inp.hardware.world
        self.opt_on_gpu = layout.offload_optimizer == "gpu"
        # stage 1/2 with the optimizer on the host (stage_1_and_2.py, cpu_offload): no GPU fp32
        # master, moments or grads_in_partition; each reduced gradient is normed and cast to fp32
        # on the GPU for its copy to the pinned host partition (copy_grads_in_partition)
        self.offload12 = self.stage in (1, 2) and not self.opt_on_gpu
        self.param_on_gpu = layout.offload_param == "gpu"
        self.w = 2
        self.h, self.kv, self.f, self.V = model.hidden, model.kv_size, model.ffn_size, model.vocab
        self.T = t.micro_batch * t.seq
        self.hf = t.impl == "hf"
        self.hf_norm = self.hf and model.norm == "rmsnorm"
        self.ckpt = t.checkpointing == "full"
        self.p = model.params
        self.p_shard = -(-self.p // (self.n if self.stage else 1))
        self.layer_sizes = block_tensor_sizes(model, t.impl)
        self.tensors = parameter_tensor_sizes(model, t.impl)
        self.groups = stage3_sub_groups(self.tensors, self.n, zero.sub_group_size) if self.stage == 3 else []
        self.sub_groups = [part for part, _ in self.groups]
        # stage 3 gathers a weight before its module runs (on the allgather stream) when it is
        # not whole on this GPU: more than one GPU, or the weights on the host
        self.gather = self.stage == 3 and (self.n > 1 or not self.param_on_gpu)
        self.small = zero.stage3_param_persistence_threshold  # stage 3: weights never partitioned
        # stage 3: a leaf MoE block's gradients (bytes, parameter order), handed over together
        # at the block's end (replay_blocks.LeafGradients)
        self.leaf_gradients = tuple(x * self.w for x in zero3_leaf_moe_tensor_sizes(model, t.impl)) \
            if self.stage == 3 else ()
        self.workspace = cublas_workspace_bytes(inp.hardware.gpu.name)
        self.device = device_of(inp.hardware.gpu)  # what CUDA's reduction kernels size their scratch by
        self.workspaces: list[str] = []  # the threads whose cuBLAS workspace is allocated
        # --loop deepspeed: the bf16 logits the training loop's `outputs` holds (held_outputs_bytes)
        self.keeps_outputs = t.loop == "deepspeed"
        self.held_logits: int | None = None

    def first_matmul(self, thread: str) -> None:
        if thread not in self.workspaces:
            self.workspaces.append(thread)
            self.s.a(self.workspace)
