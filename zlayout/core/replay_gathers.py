"""ZeRO-3's weight gathers for the allocator replay (core/allocator_sim.py): which gathered
weights the forward keeps for the backward, one gather per module (`fetch`) in the first step,
the coordinator's prefetches (`Prefetcher`) once the module trace is complete."""

from __future__ import annotations

from zlayout.core.replay_state import ALLGATHER_STREAM, Replay
from zlayout.core.tensors import block_fetch_modules, stage3_live_param_elements


class Gathers:
    """ZeRO-3's gathers of one replay: none unless `r.gather` (more than one GPU, or the
    weights on the host)."""

    def __init__(self, r: Replay) -> None:
        model, zero, n = r.model, r.zero, r.n
        self.s, self.n, self.w, self.small, self.zero, self.ckpt = r.s, n, r.w, r.small, zero, r.ckpt
        self.model, self.V, self.h = model, r.V, r.h
        self.on = r.gather
        # the gathered weights kept from forward to backward (those whose next use is within
        # stage3_max_reuse_distance: the head and the last blocks), the rest released
        live = stage3_live_param_elements(model, zero, n, not r.param_on_gpu) if r.gather else 0
        big_layer = [x for x in r.layer_sizes if x > r.small]
        self.kept_layers: set[int] = set()
        budget = live - (r.V * r.h if not model.tie_embeddings else 0)
        for i in reversed(range(model.layers)):
            if budget < sum(big_layer):
                break
            self.kept_layers.add(i)
            budget -= sum(big_layer)
        self.head_kept = live >= r.V * r.h
        self.block_modules = block_fetch_modules(model, r.t.impl) if r.gather else None
        # the card of the transformers class (memory.card_of): --impl zlayout's model saves no views
        self.zero3_held = model.card.zero3_held if model.card is not None and r.hf else None
        # the prefetchers' module traces (`Trace`), the same every micro-step: made once
        self.traces: dict[tuple, tuple[Trace, list[int] | dict[int, int]]] = {}

    def held_by_autograd(self, layer: int, released: list[int]) -> list[int]:
        """Of a block's gathered weights (`released`, the buffers ZeRO-3 releases after its
        forward), those whose storage autograd keeps until the block's backward: the card's
        weights saved as views (`BlockCard.zero3_held`: FalconLinear's `input @ self.weight.T`),
        matched by size."""
        if self.zero3_held is None or not released:
            return []
        wanted = [x * self.w for x in self.zero3_held(layer) if x > self.small]
        held = []
        for buffer in released:
            size = self.s.sizes[buffer]
            match = next((x for x in wanted if x <= size < x + self.n * self.w), None)
            if match is not None:
                wanted.remove(match)
                held.append(buffer)
        return held

    def fetch(self, sizes: list[int]) -> list[int]:
        """One module's weights gathered on their own (the first step's, or no prefetcher)."""
        return [self.s.a(x * self.w, ALLGATHER_STREAM) for x in sizes if x > self.small] if self.on else []

    def forward_prefetcher(self, keep_head: bool) -> tuple[Prefetcher, list[int]] | None:
        """The forward's module sequence (embedding, each block's modules, final norm, head)
        and the index of each block's first module."""
        if self.block_modules is None:
            return None
        key = ("forward", keep_head)
        if key not in self.traces:
            modules, starts, kept = [[self.V * self.h]], [], set()
            for layer in range(self.model.layers):
                starts.append(len(modules))
                if layer in self.kept_layers:
                    kept.update(range(len(modules), len(modules) + len(self.block_modules)))
                modules += [list(m) for m in self.block_modules]
            modules += [[], [self.V * self.h]]
            if keep_head:
                kept.add(len(modules) - 1)
            self.traces[key] = (Trace(self.small, modules, kept), starts)
        trace, starts = self.traces[key]
        return Prefetcher(self, trace), starts

    def backward_prefetcher(self, gathered: dict[int, list[int]]) -> tuple[Prefetcher, dict[int, int]] | None:
        """The backward's module sequence (the head, the final norm, the blocks last first:
        each block's modules in reverse, or in forward order when checkpointed, the recompute
        fetching them; the embedding), with the blocks still gathered from the forward and the
        head present, and the index of each block's first module."""
        if self.block_modules is None:
            return None
        key = ("backward", frozenset(gathered))
        if key not in self.traces:
            modules, starts, present = [[self.V * self.h], []], {}, {0}
            order = self.block_modules if self.ckpt else self.block_modules[::-1]
            for layer in reversed(range(self.model.layers)):
                starts[layer] = len(modules)
                if layer in gathered:
                    present.update(range(len(modules), len(modules) + len(order)))
                modules += [list(m) for m in order]
            modules.append([self.V * self.h])
            self.traces[key] = (Trace(self.small, modules, set(), frozenset(present)), starts)
        trace, starts = self.traces[key]
        return Prefetcher(self, trace), starts


class Trace:
    """A prefetcher's module trace and what its fetches read of it, worked out once: the weights
    to gather (over the persistence threshold, of the modules not `present`) numbered in trace
    order, the queue the prefetches pop, with each one's elements (`numel`) and module; per module
    its weights (`mine`) and the elements released after it; the elements gathered already."""

    def __init__(self, small: int, modules: list[list[int]], kept: set[int],
                 present: frozenset[int] = frozenset()) -> None:
        self.modules = modules
        self.kept = kept  # modules whose weights the forward keeps for the backward
        self.available = sum(x for mi in present for x in modules[mi] if x > small)
        self.numel: list[int] = []
        self.module_of: list[int] = []
        self.mine: list[range] = []
        self.released: list[int] = []
        for mi, mod in enumerate(modules):
            big = [x for x in mod if x > small]
            self.released.append(sum(big))
            first = len(self.numel)
            if mi not in present:  # gathered already (kept by the forward)
                self.numel += big
                self.module_of += [mi] * len(big)
            self.mine.append(range(first, len(self.numel)))


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

    def __init__(self, g: Gathers, trace: Trace) -> None:
        self.s, self.n, self.w = g.s, g.n, g.w
        self.max_live, self.bucket = g.zero.stage3_max_live_parameters, g.zero.stage3_prefetch_bucket_size
        self.block_length = len(g.block_modules)
        self.modules, self.kept = trace.modules, trace.kept
        self.numel, self.module_of, self.mine, self.released = trace.numel, trace.module_of, trace.mine, trace.released
        self.available = trace.available
        self.qp = 0  # the next weight of the queue (`Trace.numel`'s order) a prefetch pops
        self.state: list[dict | None] = [None] * len(self.numel)  # weight -> its all-gather call
        self.buf: dict[int, int] = {}

    def gather(self, params: list[int]) -> None:
        s, n, w = self.s, self.n, self.w
        sizes = [self.numel[p] for p in params]
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
        s, w, state, numel = self.s, self.w, self.state, self.numel
        if mi > 0 and mi - 1 not in self.kept:
            self.available -= self.released[mi - 1]
        mine = self.mine[mi]
        todo = [q for q in mine if state[q] is None]
        if todo:
            self.gather(todo)
        qp, module_of, queued = self.qp, self.module_of, len(numel)
        while qp < queued and module_of[qp] <= mi:
            qp += 1
        for q in mine:
            group = state[q]
            if not group["copied"]:
                group["copied"] = True
                for r in group["params"]:
                    self.buf[r] = s.a(numel[r] * w, ALLGATHER_STREAM)
            group["left"] -= 1
            if group["left"] == 0:
                s.f(group["flat"])
        elements, batch = 0, []
        most = min(self.max_live - self.available, self.bucket)
        while qp < queued and elements < most:
            if state[qp] is None:
                batch.append(qp)
                elements += numel[qp]
            qp += 1
        self.qp = qp
        if batch:
            self.gather(batch)
        return [self.buf.pop(q) for q in mine]

    def fetch_block(self, first: int) -> list[int]:
        """A block's modules, from module `first`, each fetched in turn: their buffers."""
        return [b for mi in range(first, first + self.block_length) for b in self.fetch(mi)]
