"""DeepSpeed's gradient reduction and optimizer step for the allocator replay
(core/allocator_sim.py): the hook each weight gradient goes to as it is made (`hook`: stage 0
and 1 keep them per weight between boundaries, stage 1/2 copy them into the IPG buckets and
grads_in_partition, stage 3 into its bucket, reduced on the reduce stream), the reduce epilogue
at the end of a backward (`end_backward`) and the optimizer step (`step`)."""

from __future__ import annotations

from zlayout.core.caching_allocator import DEFAULT_STREAM
from zlayout.core.replay_state import REDUCE_STREAM, Replay
from zlayout.core.tensors import NORM_PART_ELEMENTS

ALLREDUCE_BUCKET_ELEMENTS = 500_000_000  # DeepSpeed engine.py MEMORY_OPT_ALLREDUCE_SIZE


class GradientReduction:
    """The gradients' state across a replay's micro-steps. `boundary` and `accumulating` are
    the current micro-step's (`start_micro_step`); `filled`, `in_bucket` and `pending` the
    current backward's (`start_backward`)."""

    def __init__(self, r: Replay) -> None:
        self.s, self.w, self.zero, self.stage, self.n = r.s, r.w, r.zero, r.stage, r.n
        self.offload12, self.opt_on_gpu = r.offload12, r.opt_on_gpu
        self.p, self.p_shard, self.tensors, self.sub_groups = r.p, r.p_shard, r.tensors, r.sub_groups
        self.moments_made = r.stage == 0  # stage 0 makes Adam's moments at initialize
        self.partition: int | None = None  # stage 1/2's grads_in_partition
        self.retired: list[int] = []  # stage 2: last micro-step's partition, alive through this backward
        self.grads: list[int] = []  # stage 0, and stage 1 between accumulation boundaries: per weight
        # stage 1/2's IPG buckets (ipg_buffer), made by the first gradient hook of a backward
        self.buckets: list[int] = []
        # stage 1/2 with the optimizer on the host: the clones of gradients larger than the bucket,
        # held to the next hook's flush (reduce_independent_p_g_buckets_and_remove_grads)
        self.held_large: list[int] = []
        self.waiting: list[int] = []  # their blocks, dropped but in use on the reduction stream
        self.grad_stream = REDUCE_STREAM if r.zero.overlap_comm else DEFAULT_STREAM
        # stage 1/2 with the optimizer on the GPU, more than one GPU: the bucket is flattened
        self.flattens = r.n > 1 and r.stage in (1, 2) and r.opt_on_gpu
        self.boundary = self.accumulating = False
        self.start_backward()

    def start_micro_step(self, boundary: bool) -> None:
        self.boundary = boundary
        self.accumulating = bool(self.grads)

    def start_backward(self) -> None:
        self.filled = 0
        self.in_bucket: list[int] = []
        # stage 3: gradients larger than the bucket, held whole until their bucket is reduced
        self.held: list[int] = []
        self.reduced: list[int] = []  # held gradients reduced, freed at the next reduction (`flush`)
        # stage 1/2 with the optimizer on the GPU, more than one GPU: elements in the IPG bucket
        # (with the optimizer on the host, `in_bucket` holds them for offload_flush)
        self.pending = 0

    def flatten_reduced(self, elements: int) -> None:
        """stage_1_and_2.py reduce_ipg_grads -> average_tensor (reduce_scatter) ->
        allreduce_and_scatter -> allreduce_bucket: the bucket's gradient slices flattened
        (torch.cat, `self.flatten`) into one tensor on the reduction stream, reduced and
        copied back, freed. Only with peers: on one GPU there is nothing to reduce
        (emulated 2-GPU traces: a 922.2 MiB flat of the 483.5M elements that filled the
        bucket, w2-z1-L2-h4096). With the optimizer on the host the bucket is reduced the
        same way before its partition goes to the host (w2-z2-opt-L16-h3072: -4.0% -> 0.0%)."""
        s, w, n = self.s, self.w, self.n
        if n > 1 and elements:
            s.transient(elements * w, self.grad_stream)


    def offload_flush(self) -> None:
        """stage_1_and_2.py reduce_ipg_grads with cpu_offload: for each gradient of the
        bucket, under `stream(reduction_stream)` (overlap_comm), copy_grads_in_partition:
        at the boundary set_norm_for_param_grad_in_gpu (`.double().norm(2)`, 8 bytes an
        element, freed at once) and async_inplace_copy_grad_to_fp32_buffer_from_gpu
        (`.to(fp32)` then a non-blocking copy to the pinned partition, freed on return);
        between boundaries async_accumulate_grad_in_cpu_via_gpu only uses the
        preallocated temp_grad_buffer_for_gpu_offload. A held gradient larger than the bucket
        (extra_large_param_to_reduce, its clone) is dropped after its copy, its block kept to
        the epilogue: dots.llm1 L2's experts (h200-2026-12-31f: 47.69 GiB reserved in 30
        segments; 42.20 planned when the gradient was taken as copied into the bucket and freed
        at its hook, 47.68 with the clone held and its block waiting for the reduction stream)."""
        s = self.s
        self.flatten_reduced(sum(self.in_bucket))
        if self.boundary:
            for size in self.in_bucket:
                s.transient(size * 8, self.grad_stream)
                s.transient(size * 4, self.grad_stream)
        # a held gradient larger than the bucket is dropped once copied (clear_grad_attribute),
        # but async_inplace_copy_grad_to_fp32_buffer_from_gpu recorded it on the reduction
        # stream (`_record_gradient_stream`): its block waits for that stream, taken as the
        # reduce epilogue's synchronize (end_backward)
        if self.grad_stream == DEFAULT_STREAM:  # no reduction stream (overlap_comm off): freed
            s.f(*self.held_large)
        else:
            s.drop(*self.held_large)
            self.waiting.extend(self.held_large)
        self.held_large.clear()
        self.in_bucket.clear()
        self.filled = 0


    def flush(self) -> None:
        """stage3.py __reduce_and_partition_ipg_grads on reduce_and_partition_stream:
        reduce_scatter on by default, so __avg_scatter_grads -> reduce_scatter_coalesced
        torch.cat's the bucket's gradients, one GPU included, and the partitions are views
        of that copy until the bucket is done (t-z3-L12-h3072 trace: 925.5, 942.1 MiB
        blocks, the bucket's 485.3M and 493.9M elements, in segments of their own). A
        bucket of one tensor that splits evenly is reduced in place, no cat (a head larger
        than the bucket: t-z3-hf-L6-h4096, no 1002 MiB copy)."""
        if not self.in_bucket:
            return
        # partition_grads drops each reduced gradient (param.grad = None) after record_stream on
        # the reduce stream: a held gradient's block is the compute stream's again once the
        # reduce stream is past it, here taken as the next bucket's reduction (or the epilogue's
        # synchronize, `end_backward`)
        self.s.f(*self.reduced)
        self.reduced = self.held
        self.held = []
        # every request here is on the reduce stream and freed by the end: one episode
        self.s.episode(REDUCE_STREAM, (tuple(self.in_bucket), self.boundary), self.reduce_bucket)
        self.in_bucket.clear()
        self.filled = 0

    def reduce_bucket(self) -> None:
        """`flush`'s requests for the bucket `in_bucket`."""
        s, w, n, opt_on_gpu = self.s, self.w, self.n, self.opt_on_gpu
        alone = len(self.in_bucket) == 1 and self.in_bucket[0] % n == 0
        staged = None if alone else s.a(sum(self.in_bucket) * w, REDUCE_STREAM)
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
        for size in reversed(self.in_bucket) if not opt_on_gpu else ():
            part = -(-size // n)
            copy = s.a(part * w, REDUCE_STREAM)
            if self.boundary:
                # one float64 copy per part, each freed before the next (the last part the rest)
                for start in range(0, part, NORM_PART_ELEMENTS):
                    s.transient(min(NORM_PART_ELEMENTS, part - start) * 8, REDUCE_STREAM)
                s.transient(part * 4, REDUCE_STREAM)
            s.f(copy)
        s.f(staged)

    def hook(self, weight_grads: list[int], small: int = 0) -> None:
        """DeepSpeed's gradient hook, for `weight_grads` (names of large gradients) or
        for `small` elements of small ones (norms: no block of their own, but counted
        into the reduce bucket)."""
        s, w, zero, stage, offload12, p_shard = self.s, self.w, self.zero, self.stage, self.offload12, self.p_shard
        if self.flattens and (stage == 2 or self.boundary):
            # each gradient that would overflow the bucket has the bucket reduced first
            for size in [s.sizes[gr] // w for gr in weight_grads] + ([small] if small else []):
                if self.pending + size > zero.reduce_bucket_size:
                    self.flatten_reduced(self.pending)
                    self.pending = 0
                self.pending += size
        if stage == 3:
            # copied into the IPG bucket (reduce_and_partition_stream); a gradient that
            # would overflow it first has the bucket reduced there (`flush`). With the
            # optimizer on the host each gradient of a reduced bucket is cast to fp32
            # before its copy to the pinned partition (the allocator trace of ZeRO-3
            # offload: per-tensor 4-byte transients, in segments the compute stream never
            # reuses). A gradient larger than the bucket is not copied into it
            # (__add_grad_to_ipg_bucket copies only what fits): it stays whole as param.grad,
            # reduced alone at the next gradient's hook or the epilogue, freed a bucket later (`flush`)
            size_of, bucket = s.sizes, zero.reduce_bucket_size
            sizes = [size_of[gr] // w for gr in weight_grads]
            held = [gr for gr, size in zip(weight_grads, sizes) if size > bucket]
            s.f(*([gr for gr in weight_grads if gr not in held] if held else weight_grads))
            if small:
                sizes.append(small)
            total = sum(sizes)
            if self.filled + total > bucket:
                self.flush()
            self.held.extend(held)
            self.in_bucket.extend(sizes)
            self.filled += total
            return
        if not weight_grads:
            # a norm's gradient: reduced like the others (the first one ready makes the
            # buckets: t-z1-hf-v256000 trace, tied embeddings, the final norm's weight
            # before any block's), its elements counted into the bucket
            if stage == 0 or (stage == 1 and not self.boundary):
                return
            if not self.buckets:
                self.buckets = [s.a(zero.reduce_bucket_size * w) for _ in range(2 if zero.overlap_comm else 1)]
            if offload12:
                if self.filled + small > zero.reduce_bucket_size:
                    self.offload_flush()
                self.in_bucket.append(small)
            elif self.partition is None and self.filled + small > zero.reduce_bucket_size:
                self.partition = s.a(p_shard * w, REDUCE_STREAM if zero.overlap_comm else DEFAULT_STREAM)
            self.filled += small
            return
        if stage == 0 or (stage == 1 and not self.boundary):
            # accumulated in .grad: the first micro-step's gradients stay, later ones are
            # added in place and dropped (stage 1 reduces only at the boundary)
            if self.accumulating:
                s.f(*weight_grads)
            else:
                self.grads.extend(weight_grads)
            if stage == 0:
                return
        if not self.buckets:
            self.buckets = [s.a(zero.reduce_bucket_size * w) for _ in range(2 if zero.overlap_comm else 1)]
        if offload12:
            if stage == 2 or self.boundary:
                # reduce_independent_p_g_buckets_and_remove_grads: a gradient that would
                # overflow the bucket first has the bucket reduced, then is copied in
                for gr in weight_grads:
                    size = s.sizes[gr] // w
                    if self.filled + size > zero.reduce_bucket_size:
                        self.offload_flush()
                    if size > zero.reduce_bucket_size and zero.contiguous_gradients:
                        # extra_large_param_to_reduce: not copied into the bucket but held for
                        # the next hook's reduce_ipg_grads, cloned first (the offload's gradient
                        # safety: `grad_reduc.detach().clone()`, the original freed below)
                        self.held_large.append(s.a(size * w))
                    self.in_bucket.append(size)
                    self.filled += size
                s.f(*weight_grads)
                if stage == 1 and self.accumulating:
                    s.f(*self.grads[:len(weight_grads)])
                    del self.grads[:len(weight_grads)]
            return
        self.filled += sum(s.sizes[gr] for gr in weight_grads) // w
        if self.partition is None and self.filled > zero.reduce_bucket_size and (stage == 2 or self.boundary):
            # the first bucket reduced (stage 1 reduces at the boundary only:
            # h8-z1-gas2-L6-h3584 trace): grads_in_partition, made by copy_grads_in_partition
            # inside reduce_ipg_grads' `with stream(self.reduction_stream)` when
            # overlap_comm is on: cached for that stream, never reused by the compute
            # stream (z2-ckpt trace: a new 4576 MiB segment while a free 4576 and a free
            # 9152 MiB block sat in the compute stream's pool)
            self.partition = s.a(p_shard * w, REDUCE_STREAM if zero.overlap_comm else DEFAULT_STREAM)
        if stage == 2 or self.boundary:
            s.f(*weight_grads)  # copied into the bucket
            if stage == 1 and self.accumulating:
                # the accumulated .grad is copied into the bucket and dropped
                s.f(*self.grads[:len(weight_grads)])
                del self.grads[:len(weight_grads)]

    def end_backward(self) -> None:
        """The reduce epilogue once the embedding's gradient is hooked, and what the
        backward's end releases."""
        s, w, zero, stage, offload12, p_shard = self.s, self.w, self.zero, self.stage, self.offload12, self.p_shard
        if self.flattens and (stage == 2 or self.boundary):
            self.flatten_reduced(self.pending)  # the reduce epilogue's last, partly filled bucket
        if offload12 and (stage == 2 or self.boundary):
            self.offload_flush()  # the reduce epilogue's last bucket
            # ... and its synchronize (overlap_comm): the blocks recorded on the reduction stream
            s.f(*self.waiting)
            self.waiting.clear()
        elif stage in (1, 2) and (stage == 2 or self.boundary) and self.partition is None:
            # overlapping_partition_gradients_reduce_epilogue reduces the last, partly filled
            # bucket: copy_grads_in_partition makes grads_in_partition then if no full bucket
            # did before (a model under reduce_bucket_size elements)
            self.partition = s.a(p_shard * w, REDUCE_STREAM if zero.overlap_comm else DEFAULT_STREAM)
        if stage == 2 or self.boundary:
            # released by the reduce epilogue (stage 2: every backward); stage 1 between
            # boundaries runs no epilogue and keeps them to step()'s _release_ipg_buffers
            # (h8-z1-gas2-L6-h3584 trace: made in the first micro-step, freed in the step;
            # w2-z2-L6-h2560-gas4: made and freed in every micro-step)
            s.f(*self.buckets)
            self.buckets = []
        if stage == 0 and self.boundary:
            # engine.allreduce_gradients -> buffered_allreduce_fallback -> allreduce_no_retain:
            # the gradients in named_parameters order, flattened into buckets of just over
            # 500M elements (MEMORY_OPT_ALLREDUCE_SIZE), each all-reduced, copied back and
            # freed, also on one GPU (z0-L16-h2048 trace: 965, 1012 and 380 MiB transients)
            numel = 0
            for gr in reversed(self.grads):
                numel += s.sizes[gr] // w
                if numel > ALLREDUCE_BUCKET_ELEMENTS:
                    s.transient(numel * w)
                    numel = 0
            if numel:
                s.transient(numel * w)
        if stage == 3:
            self.flush()  # independent_gradient_partition_epilogue: the last, partly filled bucket
            self.s.f(*self.reduced)  # ... and reduce_and_partition_stream.synchronize()
            self.reduced.clear()
        s.f(*self.retired)
        self.retired.clear()
        if not self.boundary and stage == 2 and self.partition is not None:
            # _release_ipg_buffers drops grads_in_partition at the end of every backward;
            # the .grad views keep it alive until the next micro-step's hooks re-point
            # them into a new partition (copy_grads_in_partition)
            self.retired.append(self.partition)
            self.partition = None

    def step(self) -> None:
        """The optimizer step at an accumulation boundary."""
        s, n, stage, offload12, opt_on_gpu = self.s, self.n, self.stage, self.offload12, self.opt_on_gpu
        p, p_shard, tensors, sub_groups = self.p, self.p_shard, self.tensors, self.sub_groups
        if stage == 3:
            if opt_on_gpu:
                # _get_norm_groups -> get_grad_norm_direct, before any sub-group is stepped:
                # each gradient partition's g.to(float64).norm(2), in parameter order, the
                # float64 copy freed at once (t-z3-L12-h3072 trace: 750 MiB for the embedding,
                # then 120, 72, 384, 192 per block; t-z3-hf-L6-h4096: a 4008 MiB segment for
                # its 128256 x 4096 embedding)
                for x in tensors:
                    s.transient(-(-x // n) * 8)
                for size in sub_groups:  # per sub-group
                    s.f(self.fp32_gradients(size))
                self.moments_made = True
        elif stage == 0:
            # FP16_Optimizer.step: _flatten_dense_tensors([p.grad.to(fp32) for p in group]):
            # the casts in parameter order (grads holds them in backward order), then the flat
            casts = [s.a(s.sizes[gr] * 2) for gr in reversed(self.grads)]
            flat32 = s.a(4 * p)
            s.f(*casts)
            s.f(flat32, *self.grads)
            self.grads.clear()
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
                s.transient(min(x, left) * 8)
                left -= x
            s.f(self.fp32_gradients(p_shard, self.partition))
            self.moments_made = True
            self.partition = None  # released with the step's gradients (allocated peaks say so)

    def fp32_gradients(self, size: int, *release: int | None) -> int:
        """The step over one flat partition of `size` elements: its gradients flattened, cast to
        fp32 (the bf16 flat freed, then `release`), Adam's two moments made on the first step.
        Returns the fp32 gradients, which the caller frees once the step is done."""
        s, w = self.s, self.w
        flat16 = s.a(size * w)
        flat32 = s.a(size * 4)
        s.f(flat16, *release)
        if not self.moments_made:
            s.a(4 * size)
            s.a(4 * size)
        return flat32
