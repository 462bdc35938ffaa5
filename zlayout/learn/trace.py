"""Record what a model's forward and backward ask of the allocator, on the meta device.

`StorageLedger` is a TorchDispatchMode: every op's outputs are looked at, and each storage
seen for the first time is an allocation of its `nbytes`; a weakref finalizer on the storage
is its free (storages keep their Python object while C++ holds them, so the finalizer runs
when the storage really dies). Nothing has data on the meta device, so the bytes are what a
CUDA run of the same code requests, op by op, before the caching allocator's rounding.

Phases are windows opened and closed by hooks on the traced blocks and their hidden states:
a block's forward runs from its forward pre-hook to the next block's (its input is freed only
once it has returned; the last block's to its forward hook), its recompute (checkpointing) from
its first sub-module's call in backward, its backward from the gradient of its output to the
gradient of its input.

A dispatch mode changes what autograd does: it sums gradients, and some backward formulas fill
their zeros, out of place, as for a tensor subclass. The ledger puts those back in place where a run
without a mode does (`StorageLedger.run_backward`).

Each op's work is recorded too, per window: its FLOPs (torch's flop counter: the matmuls, the
attention kernels; `grouped_mm_flops` for transformers' grouped experts, which the flop counter
does not count), the bytes it moves (its inputs and outputs), its kernel launches (one, or as
many as PyTorch's CUDA code launches for it at those shapes: zlayout.learn.launches, a sort, topk,
histc, cumsum, an accumulating index_put, a grouped GEMM) and the op itself (the host issues an op
once, its kernels each: core.steptime `host_floor_s`). Ops that launch no kernel (views, `empty`)
are not work.
"""

from __future__ import annotations

import contextlib
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

from zlayout.core.card import (BATCHED_GEMM_OPS, FP32_GEMM_SUFFIX, FREED_OUTSIDE, MAMBA_KERNEL_MODEL_TYPES,
                               SCATTER_SUFFIX, STATE_SPACE_MODEL_TYPES, STRIDED_SUFFIX, UNALIGNED_SUFFIX, WIDE_BATCHED_GEMM)
from zlayout.core.reductions import REDUCTION_EVENTS
from zlayout.learn.launches import kernel_launches


@dataclass
class Window:
    """One phase of one block: the live bytes when it opened and closed, its peak, and the
    requests made inside it (`events`: +n for an allocation, -n for a free, in order)."""

    phase: str
    block: int
    start: int
    peak: int
    end: int | None = None
    events: list[int] = field(default_factory=list)
    saved_by_dtype: Counter = field(default_factory=Counter)
    saved_storages: set = field(default_factory=set)
    flops: Counter = field(default_factory=Counter)
    moved: Counter = field(default_factory=Counter)
    calls: Counter = field(default_factory=Counter)  # kernel launches
    ops: Counter = field(default_factory=Counter)  # the ops that launched them (the host dispatches an op once)
    # reduction kernels' scratch: the index in `events` of its placeholders, and the reduction's
    # shape at this token count (`reduction_shape`); the planner sizes it for its GPU
    reductions: dict[int, dict[str, int]] = field(default_factory=dict)
    # which allocation each free takes: {free's index: allocation's index} in `events`, or
    # FREED_OUTSIDE for a tensor made before the window opened (a card records sizes; the replay's
    # rule, the latest live tensor of the size, is not always the tensor that died: `exceptional_frees`)
    frees: dict[int, int] = field(default_factory=dict)
    made_at: dict[int, int] = field(default_factory=dict)  # storage -> its allocation's index, while live


def exceptional_frees(events: list[int], frees: dict[int, int]) -> list[list[int]]:
    """The frees that do not take the latest live tensor of their size among the window's own: [free's
    index, allocation's index] pairs, what the card records for the replay (`core.card.Phase.frees`),
    the index FREED_OUTSIDE for a tensor made before the window while one of its own of that size lives.
    A math attention's `attn = softmax(attn)` frees the scores, made before the softmax's output of
    the same size; the replay's rule kept the scores and freed the output, and placed every block's
    saved probabilities elsewhere (h200-2026-12-19 trace-2: 5.7 GiB more reserved than the run).
    The loss's backward frees the log-softmax the forward saved while its own gradient of that size
    lives (nll_loss_backward's, then _log_softmax_backward_data's, both tokens x vocab fp32): the rule
    freed the gradient and kept the saved one (gemma3_text trace, h200-2026-12-02c family-truth)."""
    live: dict[int, list[int]] = {}
    out = []
    for index, event in enumerate(events):
        if event > 0:
            live.setdefault(event, []).append(index)
        elif event < 0 and index in frees:
            stack, made = live.get(-event, []), frees[index]
            if made == FREED_OUTSIDE:
                if stack:
                    out.append([index, FREED_OUTSIDE])
                continue
            if made not in stack:
                continue
            if stack[-1] != made:
                out.append([index, made])
            stack.remove(made)
    return out


# Ops that launch no kernel (views are told apart by their schema, `OpOverload.is_view`).
NO_KERNEL = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach",
                       "alias", "lift_fresh", "_unsafe_view", "set_", "resize_", "_local_scalar_dense"})
# Ops that read rows of a table (the embedding lookup): they move their output's bytes, not the table's.
GATHERS = frozenset({"embedding", "index_select", "gather", "index"})
# ATen's row-wise softmax ops (SoftMax.cu `host_softmax` / `host_softmax_backward`, the softmax over
# the last dimension), whose kernel is chosen by the row's length (`_row_softmax_bytes`)
SOFTMAX_FORWARD = frozenset({"_softmax", "_log_softmax"})
SOFTMAX_BACKWARD = frozenset({"_softmax_backward_data", "_log_softmax_backward_data"})
ROW_SOFTMAX = SOFTMAX_FORWARD | SOFTMAX_BACKWARD
# the shared memory a CUDA block gets without opting in (cudaDeviceProp.sharedMemPerBlock: 48 KiB on
# every GPU the planner knows), which bounds the rows SoftMax.cu stages in shared memory
SHARED_MEMORY_PER_BLOCK = 48 * 1024
# the negative log-likelihood's kernels (Loss.cu): forward reads one log-probability a row, backward
# zero-fills the gradient and writes one element a row
NLL_LOSS = frozenset({"nll_loss_forward", "nll_loss_backward", "nll_loss2d_forward", "nll_loss2d_backward"})
# index_put(self, indices, values, accumulate): with accumulate (autograd's backward of `index`), CUDA
# sorts the indices and runs indexing_backward_kernel (core.card.SCATTER_SUFFIX)
INDEX_PUTS = frozenset({"index_put", "index_put_", "_index_put_impl_", "_index_put_impl"})


def _accumulates(args, kwargs) -> bool:
    return bool(kwargs.get("accumulate", args[3] if len(args) > 3 else False))


def grouped_mm_flops(mat_a: torch.Tensor, mat_b: torch.Tensor, *args, out_val: torch.Tensor, **kwargs) -> int:
    """`aten._grouped_mm`'s FLOPs (transformers' grouped experts, integrations/moe.py): every row
    of the token-expert pairs (tokens x top-k, sorted by expert) goes through its own expert, so the
    output's elements each cost one dot product over the contraction. In the weight gradient (2-D
    by 2-D, a 3-D output of one matrix per expert) each expert contracts only its own rows: the
    contraction is split over the groups. The meta device has no routing: the offsets are taken to
    cover every row, as they do without expert parallelism."""
    contraction = mat_a.shape[-1]
    if mat_a.dim() == 2 and mat_b.dim() == 2:
        return 2 * out_val.numel() * contraction // max(out_val.shape[0], 1)
    return 2 * out_val.numel() * contraction


# A batched matmul is attention's when it is q @ k^T, probs @ v or one of their gradients: of its
# three dimensions (M, K, N) two are the sequence and one is a head's width (64-256). Any other is a
# dense GEMM per batch entry, as Llama-4's experts run (`Llama4TextExperts`: one bmm over every
# expert, each taking every token), and is recorded under another name. (Not "the narrowest side
# is wide": at short traced sequences an expert's weight gradient contracts over few tokens.)
HEAD_WIDTH_MAX = 256

# FLOP formulas for ops torch's flop counter does not know.
EXTRA_FLOPS = {torch.ops.aten._grouped_mm: grouped_mm_flops}


def _vector_aligned(tensor: torch.Tensor) -> bool:
    """Whether a kernel can walk the tensor in 16-byte vector loads: its offset and every stride
    of a dimension longer than one (but a unit innermost one) a multiple of 16 bytes. PyTorch's
    row-wise kernels (softmax), cuBLAS's tensor-core GEMMs and elementwise ops not walked as one
    contiguous run (`_one_walk`) fall back to narrower loads otherwise (GPT-OSS's attention sinks:
    rows of T + 1 logits, and its `[..., :-1]` slice)."""
    size = tensor.element_size()
    if not _aligned_start(tensor):
        return False
    return all(stride == 1 or stride * size % 16 == 0 for extent, stride in zip(tensor.shape, tensor.stride())
               if extent > 1)


def _aligned_start(tensor: torch.Tensor) -> bool:
    """Whether the tensor's first element sits on a 16-byte boundary (its storage is allocated so)."""
    return tensor.storage_offset() * tensor.element_size() % 16 == 0


def _misaligned(tensors: list[torch.Tensor]) -> bool:
    """Whether an op runs on the slower kernels of misaligned tensors: any floating-point tensor it
    reads or writes is (an index's or the labels' alignment does not choose the kernel: the loss's
    `nll_loss` reads labels `[..., 1:]`, one element off, beside aligned log-probabilities)."""
    return not all(_vector_aligned(t) for t in tensors if t.is_floating_point())


# copies are the layout changes (a transpose's `.contiguous()`, casts) that the vectorized rate was
# fitted with; PyTorch runs them on their own copy kernels
COPIES = frozenset({"clone", "_to_copy", "copy_", "copy"})


def _pointwise(func) -> bool:
    """A TensorIterator elementwise op (torch's `pointwise` tag), copies not counted (`COPIES`)."""
    return torch.Tag.pointwise in func.tags and func._overloadpacket.__name__ not in COPIES


def _one_walk(func, tensors: list[torch.Tensor], out: torch.Tensor) -> bool:
    """Whether TensorIterator walks an elementwise op or a copy as one contiguous dimension: every
    operand laid out as the dense output (Loops.cuh, `iter.is_contiguous()`). Its vectorized kernel
    then needs only each operand's start 16-byte aligned (`can_vectorize_up_to` on the data
    pointers): rows of an odd length do not matter (GPT-2's logits cast to float32). A pointwise op
    that is not one walk, over a broadcast operand (the causal mask over batch and heads, RoPE's cos
    and sin over heads) or one strided unlike its output (a transposed view, a slice), runs on the
    offset-computing `elementwise_kernel`: recorded as strided. Profiled on the H200 (h200-2026-12-12
    profiles/, Falcon-7B's math attention): its mask add ran at 1.80 TB/s and the fill of fully
    masked rows at 2.53, where the vectorized softmax and casts beside them ran at 3.9-4.4."""
    if torch.Tag.pointwise not in func.tags and func._overloadpacket.__name__ not in COPIES:
        return False
    return _dense(out) and all(t.numel() <= 1 or _layout(t) == _layout(out) for t in tensors)


def _softmax_block(row: int) -> int:
    """SoftMax.cu `SoftMaxForward_getBlockSize`: the row's length up to 1,024 threads, a whole number of warps."""
    return min(-(-min(row, 1024) // 32) * 32, 1024)


def _row_softmax_bytes(name: str, args: tuple, outputs: list[torch.Tensor], width: int | None) -> int | None:
    """What a row-wise softmax moves when CUDA runs it on the global-memory kernels: rows too long for
    the warp-per-row kernels, the register kernel (forward, under ten elements a thread) and shared
    memory (or misaligned for it). `cunn_SoftMaxForward` then reads each row three times (its max,
    the sum of exponentials, the write pass) and writes it once; `cunn_SoftMaxBackward` reads the
    gradient twice (the sum pass, the write pass) and the output once, and writes the input's
    gradient. Both realign a row that starts off a 16-byte boundary with a scalar prologue (`shift`)
    and load the rest in 16-byte vectors, so a misaligned row runs at the vectorized rate: CTRL's
    loss, rows of 246,534 float32, ran its log-softmax's 32 GB in 11.3 ms on an H100 (h200-2026-12-31
    profiles/), where the misaligned rate priced it at 26.5. None for every other path (the op's
    inputs and output, read and written once, as the caller counts them), and for rows other than
    the logits' (`width`)."""
    if not outputs or not isinstance(args[0], torch.Tensor) or args[0].dim() == 0:
        return None
    x = args[0]
    dim = (args[2] if name in SOFTMAX_BACKWARD else args[1]) % x.dim()
    if x.shape[dim] != width or any(size != 1 for size in x.shape[dim + 1:]):
        return None  # not the loss's rows, or over an inner dimension (SoftMax.cu's spatial kernel)
    row, out = x.shape[dim], outputs[0]
    size = max(t.element_size() for t in (x, out))
    vector = 16 // out.element_size()
    smem_rows = (SHARED_MEMORY_PER_BLOCK - _softmax_block(row) // 32 * 4) // size
    operands = (x, out) if name in SOFTMAX_FORWARD else (x, args[1], out)
    fits_smem = row < smem_rows and row % vector == 0 and all(_aligned_start(t) for t in operands)
    if name in SOFTMAX_FORWARD:
        if row <= 2048 and row * x.element_size() <= 8192:
            return None  # the warp-per-row kernels
        if x.dtype == out.dtype and -(-row // _softmax_block(row)) < 10:
            return None  # cunn_SoftMaxForwardReg (not for half_to_float)
        if fits_smem:
            return None
        return 3 * _bytes(x) + _bytes(out)
    if row <= 1024 and row * out.element_size() <= 4096:
        return None
    if fits_smem:
        return None
    return 2 * _bytes(x) + _bytes(args[1]) + _bytes(out)


def _nll_loss_bytes(name: str, args: tuple, outputs: list[torch.Tensor]) -> int:
    """What Loss.cu's negative log-likelihood moves: forward reads each row's target and its one
    log-probability; backward zero-fills the input's gradient (one vectorized write of it all) and
    writes one element a row. Not the log-probabilities' whole tensor, which neither reads."""
    target = args[2] if name.endswith("backward") else args[1]
    rows = target.numel()
    if name.endswith("backward"):
        grad_input = outputs[0]
        return _bytes(grad_input) + rows * (target.element_size() + grad_input.element_size())
    logp = args[0]
    return rows * (target.element_size() + logp.element_size()) + sum(_bytes(t) for t in outputs)


def _misaligned_start(tensors: list[torch.Tensor]) -> bool:
    """Whether a floating-point operand of a one-walk op starts off a 16-byte boundary."""
    return any(t.is_floating_point() and t.numel() > 1 and not _aligned_start(t) for t in tensors)


def _layout(tensor: torch.Tensor) -> tuple:
    """A tensor's shape and strides, the strides of unit dimensions left out (any value walks them)."""
    return tuple((size, stride if size > 1 else 0) for size, stride in zip(tensor.shape, tensor.stride()))


def _dense(tensor: torch.Tensor) -> bool:
    """Whether the tensor's elements fill a block of memory in some order of its dimensions (a
    permuted tensor is; a slice is not)."""
    expected = 1
    for size, stride in sorted((d for d in zip(tensor.shape, tensor.stride()) if d[0] > 1), key=lambda d: d[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def _index_put_in_place(zeros, indices, values, accumulate=False):
    if not accumulate:  # index_put_'s own backward, `grad.index_put(indices, zeros, false)`: a copy on CUDA too
        return torch.ops.aten.index_put.default(zeros, indices, values, accumulate)
    return torch.ops.aten._index_put_impl_.default(zeros, indices, values, accumulate, True)


# Backward formulas (FunctionsManual.cpp) that fill a fresh zero tensor in place unless
# `areAnyTensorSubclassLike`, which any dispatch mode makes true: `index_backward` (autograd's
# backward of `x[idx]`, a MoE's token gather: `_index_put_impl_` into zeros the size of x with
# accumulate, else `index_put`, one more such tensor) and `value_selecting_reduction_backward`
# (topk's, max's: `scatter_` of the gradient into zeros, else `scatter`). In backward (grad mode
# off: not a checkpoint's recompute) the ledger runs them in place where the zeros are held by
# the formula alone. (scatter's own backward, `grad.scatter(dim, index, 0)`, copies on CUDA too:
# scatter.value is not here.)
IN_PLACE_IN_BACKWARD = {
    torch.ops.aten.index_put.default: _index_put_in_place,
    torch.ops.aten.scatter.src: torch.ops.aten.scatter_.src,
}


def _sole_dense(tensor: torch.Tensor) -> bool:
    """Whether autograd may sum into `tensor` in place: its storage held by it alone and its
    elements dense and non-overlapping (`can_accumulate_inplace`). Asking for the storage makes
    one more reference to it (the Python storage object) while the count is read: 2 is 1."""
    return (torch._C._storage_Use_Count(tensor.untyped_storage()._cdata) == 2
            and is_non_overlapping_and_dense_or_false(tensor))


def engine_hooks(ledger: "StorageLedger", root) -> list:
    """Hooks on every node of the graph under `root` that tell the ledger when autograd's engine
    is between one node's backward and the next one's: where it sums a gradient that reached a
    tensor twice into the tensor's input buffer (`StorageLedger._accumulate`). Returns the
    handles."""
    handles, seen, stack = [], set(), [root]

    def started(*_):
        ledger.accumulating = False

    def finished(*_):
        ledger.accumulating = True

    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        handles.append(node.register_prehook(started))
        handles.append(node.register_hook(finished))
        stack.extend(child for child, _ in node.next_functions)
    return handles


def _bytes(tensor: torch.Tensor) -> int:
    """What a kernel moves for a tensor: its elements, at most its storage (a broadcast
    (expanded) tensor is read once, from its storage)."""
    return min(tensor.numel() * tensor.element_size(), tensor.untyped_storage().nbytes())


class StorageLedger(TorchDispatchMode):
    """Live bytes, their peak, per-window requests, and each op's FLOPs and bytes moved."""

    def __init__(self, logits_width: int | None = None) -> None:
        super().__init__()
        # the head's output width (the vocabulary): the loss's softmax rows, whose kernel
        # `_row_softmax_bytes` picks by their length (attention's rows, as long as the tokens, keep
        # one count: a card's terms are polynomials in the tokens, and SoftMax.cu switches kernels
        # at a row length)
        self.logits_width = logits_width
        self.live: dict[int, int] = {}
        # which storage a live address holds, numbered in the order they were seen: an address is
        # reused once its storage dies, and a set of addresses would take the new storage for the
        # old (which addresses malloc reuses differs between processes: a card must not)
        self.serial: dict[int, int] = {}
        self.seen = 0
        self.current = 0
        self.peak = 0
        self.open: list[Window] = []
        self.closed: list[Window] = []
        self.op_flops: Counter = Counter()
        self.op_bytes: Counter = Counter()
        self.op_calls: Counter = Counter()  # kernel launches
        self.op_ops: Counter = Counter()  # the ops that launched them (`add_work`)
        self.allocated_by_dtype: Counter = Counter()
        self.external: set[int] = set()
        self.sdpa_kernels: Counter = Counter()  # which kernel each attention call ran (cuda_sdpa_kernel)
        self.accumulating = False  # between a backward node's end and the next one's start (`engine_hooks`)
        self.backward = False  # while `run_backward` runs: backward formulas in place (`IN_PLACE_IN_BACKWARD`)
        self.math_mask_add = False  # inside the math attention until its mask is added (`_mask_add`)

    def exclude(self, tensors) -> None:
        """Storages made outside the step (weights, buffers, the input): a view of one (a
        transposed weight) is not an allocation."""
        self.external.update(t.untyped_storage()._cdata for t in tensors)

    # --------------------------------------------------------------- storages

    def _see(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self.live or key in self.external:
            return
        nbytes = storage.nbytes()
        self.live[key] = nbytes
        self.serial[key] = self.seen = self.seen + 1
        self.current += nbytes
        self.peak = max(self.peak, self.current)
        self.allocated_by_dtype[str(tensor.dtype).removeprefix("torch.")] += nbytes
        for window in self.open:
            window.peak = max(window.peak, self.current)
            window.made_at[key] = len(window.events)
            window.events.append(nbytes)
        weakref.finalize(storage, self._free, key, nbytes)

    def _free(self, key: int, nbytes: int) -> None:
        if self.live.pop(key, None) is None:
            return
        del self.serial[key]
        self.current -= nbytes
        for window in self.open:
            made = window.made_at.pop(key, None)
            window.frees[len(window.events)] = FREED_OUTSIDE if made is None else made
            window.events.append(-nbytes)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._safe_softmax.default:
            return self._safe_softmax(*args, **kwargs)
        in_place = False
        if self.math_mask_add and func is torch.ops.aten.add.Tensor and not kwargs:
            out, in_place = self._mask_add(*args)
        elif self.accumulating and func is torch.ops.aten.add.Tensor and not kwargs:
            out = self._accumulate(*args)
        elif self.backward and func in IN_PLACE_IN_BACKWARD and not torch.is_grad_enabled() \
                and _sole_dense(args[0]):
            out, in_place = IN_PLACE_IN_BACKWARD[func](*args, **kwargs), True
        else:
            out = func(*args, **kwargs)
        outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        for tensor in outputs:
            self._see(tensor)
        if func is torch.ops.aten._softmax_backward_data.default:
            self._softmax_backward_product(*args[:2])
        shape = reduction_shape(func, args, kwargs)
        if shape is not None:
            self._reduction(shape)
        self.count(func, args, kwargs, out, outputs, in_place)
        return out

    def run_backward(self, loss: torch.Tensor, formulas: bool = True) -> None:
        """`loss.backward()` under the ledger, making the requests a run without a dispatch mode
        makes: gradients summed in place (`engine_hooks`, `_accumulate`) and, unless `formulas` is
        False (a test's comparison), the backward formulas that fill fresh zeros in place
        (`IN_PLACE_IN_BACKWARD`)."""
        handles = engine_hooks(self, loss.grad_fn)
        self.backward = formulas
        try:
            loss.backward()
        finally:
            self.accumulating = self.backward = False
            for handle in handles:
                handle.remove()

    def _accumulate(self, old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        """A gradient summed into autograd's input buffer (input_buffer.cpp `accumulate`), as a run
        with no dispatch mode sums it. Under any TorchDispatchMode `isTensorSubclassLike` answers
        yes for every tensor, so the engine takes its out-of-place path, `old + new`: one more
        tensor of the gradient's size wherever a tensor feeds two ops (the residual stream into a
        norm, q into RoPE's two products, a norm's float32 input). Without a mode it adds in place
        into whichever of the two it holds the only reference to, dense and non-overlapping
        (`can_accumulate_inplace`): `old` first, then `new`."""
        if isinstance(new, torch.Tensor) and old.shape == new.shape and old.dtype == new.dtype:
            for into, other in ((old, new), (new, old)):
                if _sole_dense(into):
                    return torch.ops.aten.add_.Tensor(into, other)
        return torch.ops.aten.add.Tensor(old, new)

    def _mask_add(self, attn: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """The math attention's mask, added into the scores in place as a run without a mode adds
        it (attention.cpp `_scaled_dot_product_attention_math`: `attn.add_(*attn_mask)` unless
        `areAnyTensorSubclassLike`, which any dispatch mode makes true: then `attn.add(mask)`, one
        more heads x T x T tensor a block). Measured on an H100 (h200-2026-12-19 traces, Falcon-7B
        at 4096 tokens): the run makes the scores and the softmax's output, 4,544 MiB each, and no
        third. Autograd is not hurt: add saves nothing, and the scores' own node saved its inputs."""
        self.math_mask_add = False
        if attn.dtype != torch.promote_types(attn.dtype, mask.dtype) or \
                torch.broadcast_shapes(attn.shape, mask.shape) != attn.shape:
            return torch.ops.aten.add.Tensor(attn, mask), False  # add_ would refuse it: CUDA's math path too
        return torch.ops.aten.add_.Tensor(attn, mask), True

    def _reduction(self, shape: dict[str, int]) -> None:
        """A reduction kernel that may allocate a global scratch buffer and semaphores for its one
        launch (core.reductions): after its output, placeholders for the buffer, the semaphores and
        their frees, which the planner fills in for the GPU it plans."""
        for window in self.open:
            window.reductions[len(window.events)] = shape
            window.events.extend([0] * REDUCTION_EVENTS)

    def _softmax_backward_product(self, grad: torch.Tensor, output: torch.Tensor) -> None:
        """CUDA's softmax backward (SoftMax.cu `softmax_backward_cuda_out`) first makes
        `tmp = grad * output`, after its own output and freed once that is written: a tensor of the
        gradient's size, and a kernel reading two. Measured on the H200: Gemma-2-2B's eager attention
        backward holds 256 MiB beyond its inputs and output at 2 x 8 x 2048^2 float32
        (h200-2026-12-13 probe_op_memory.py); the math attention's, three T x T float32 gradients
        at once (h200-2026-12-03 probe_math_attention.py), and one vectorized float BinaryFunctor
        over T x T a block in Falcon-7B's profile (h200-2026-12-12 profiles/: three passes at
        4.4 TB/s). The meta device's kernel makes neither."""
        tmp = torch.empty(grad.shape, dtype=torch.promote_types(grad.dtype, output.dtype), device=grad.device)
        self._see(tmp)
        self.add_work("softmax_backward_product", 0, 3 * _bytes(tmp))
        del tmp

    def _safe_softmax(self, x: torch.Tensor, dim: int, dtype=None) -> torch.Tensor:
        """The math attention's softmax as CUDA runs it, where the meta device has one kernel of
        its own. ATen's `_safe_softmax` (SoftMax.cpp: softmax, `eq(-inf)`, `all`, `where`); on the
        H200 (torch 2.11, h200-2026-12-03 probe_math_attention.py) its requests are the softmax's
        output and the one-byte `eq` mask beside it, freed, and no third tensor: the `where` writes
        no new T x T tensor."""
        aten, run = torch.ops.aten, self.__torch_dispatch__
        if dtype is not None:
            x = run(aten._to_copy.default, (), (x,), {"dtype": dtype})
        out = run(aten._softmax.default, (), (x, dim, False))
        masked = run(aten.eq.Scalar, (), (x, float("-inf")))
        # its other two kernels, work without a request of their own there: `all` over the mask's
        # rows, and `where(masked_rows, 0, out)`, over a broadcast condition (the profile's
        # reduce_kernel<bool> and non-vectorized elementwise_kernel, one each a block)
        rows = masked.numel() // max(masked.shape[dim], 1)
        self.add_work("all", 0, _bytes(masked) + rows)
        self.add_work("where" + STRIDED_SUFFIX, 0, 2 * _bytes(out) + rows)
        del masked
        return out

    def count(self, func, args, kwargs, out, outputs, in_place: bool = False) -> None:
        name = func._overloadpacket.__name__
        if func.is_view or name in NO_KERNEL:
            return
        packet = func._overloadpacket
        formula = flop_registry.get(packet) or EXTRA_FLOPS.get(packet)
        flops = int(formula(*args, **kwargs, out_val=out)) if formula is not None else 0
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if flops and name in BATCHED_GEMM_OPS:
            a, b = args[-2:] if name == "baddbmm" else args[:2]
            m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
            if not any(x == y and z <= HEAD_WIDTH_MAX for x, y, z in ((m, k, n), (m, n, k), (k, n, m))):
                name = WIDE_BATCHED_GEMM  # each batch entry a dense GEMM (core.card prices it so)
        operands = [*inputs, *outputs]
        elementwise = not flops and len(outputs) == 1
        one_walk = elementwise and _one_walk(func, operands, outputs[0])
        row_softmax = _row_softmax_bytes(name, args, outputs, self.logits_width) if name in ROW_SOFTMAX else None
        # realigned row by row (the loss's long softmax rows), or gathers (nll_loss): the vectorized
        # rate whatever the rows' alignment, and their own byte counts
        own_bytes = row_softmax is not None or name in NLL_LOSS
        if name in INDEX_PUTS and _accumulates(args, kwargs):
            name += SCATTER_SUFFIX  # priced apart (core.card): sorted, each row's sources added in turn
        elif own_bytes:
            pass
        elif _misaligned_start(operands) if one_walk else _misaligned(operands):
            name += UNALIGNED_SUFFIX  # priced apart (core.card): no 16-byte vector loads
        elif elementwise and not one_walk and _pointwise(func):
            name += STRIDED_SUFFIX  # priced apart (core.card): the non-vectorized kernel
        if flops and inputs and inputs[0].dtype == torch.float32:
            name += FP32_GEMM_SUFFIX  # a float32 matmul in a bf16 step (the math attention's): no tensor cores
        if name in GATHERS and inputs:  # reads the rows it returns, not the whole table
            inputs = inputs[1:]
            moved = 2 * sum(_bytes(t) for t in outputs)
        elif own_bytes:
            inputs = []
            moved = row_softmax if row_softmax is not None else _nll_loss_bytes(name, args, outputs)
        else:
            moved = sum(_bytes(t) for t in outputs)
        # the kernels CUDA launches for it (zlayout.learn.launches), the in-place form where the ledger ran it
        launches = kernel_launches(func, args, kwargs, out, in_place, self.backward)
        self.add_work(name, flops, moved + sum(_bytes(t) for t in inputs), launches)

    def add_work(self, name: str, flops: int, nbytes: int, launches: int = 1) -> None:
        """One op's work and its kernel launches (also called directly for the attention kernels the
        meta device cannot run). The op itself is counted apart from its launches: the host runs its
        Python, dispatch and autograd once an op, and only a launch for each further kernel (core.
        steptime `host_floor_s`); an op that launches nothing (an empty sort) is no op here either."""
        op = 1 if launches > 0 else 0
        self.op_flops[name] += int(flops)
        self.op_bytes[name] += int(nbytes)
        self.op_calls[name] += launches
        self.op_ops[name] += op
        for window in self.open:
            window.flops[name] += int(flops)
            window.moved[name] += int(nbytes)
            window.calls[name] += launches
            window.ops[name] += op

    # --------------------------------------------------------------- windows

    def open_window(self, phase: str, block: int) -> Window:
        window = Window(phase, block, start=self.current, peak=self.current)
        self.open.append(window)
        return window

    def close_window(self, window: Window) -> None:
        if window in self.open:
            self.open.remove(window)
            window.end = self.current
            self.closed.append(window)

    def saved(self, tensor: torch.Tensor) -> None:
        """A tensor autograd saves for backward, counted once per storage per open window."""
        storage = tensor.untyped_storage()
        # a weight (or another storage made outside the step) keeps its address throughout
        identity = self.serial.get(storage._cdata, -storage._cdata)
        for window in self.open:
            if window.phase in ("forward", "recompute") and identity not in window.saved_storages:
                window.saved_storages.add(identity)
                window.saved_by_dtype[str(tensor.dtype).removeprefix("torch.")] += storage.nbytes()


# --------------------------------------------------------------------- reductions

# Reductions CUDA runs through Reduce.cuh's gpu_reduce_kernel, by the bytes of their accumulator
# (arg_t): a half, bfloat16 or float32 sum accumulates in float32, a float64 one in float64
# (ReduceSumProdKernel.cu, ReduceMomentKernel.cu, ReduceAMinMaxKernel.cu, ReduceNormKernel.cu).
# amax / amin accumulate in their own type. Welford (var, std) and the index-returning ones
# (max.dim, argmax) carry larger accumulators and are not recorded.
_FLOAT_ACCUMULATING = frozenset({"sum", "nansum", "mean", "prod", "linalg_vector_norm"})
_OWN_TYPE_ACCUMULATING = frozenset({"amax", "amin"})


def _reduced_dims(func, args, kwargs, ndim: int) -> set[int]:
    """The dimensions a reduction's call reduces (every one where it names none)."""
    name = func._overloadpacket.__name__
    if name == "linalg_vector_norm":
        dim = kwargs.get("dim", args[2] if len(args) > 2 else None)
    elif func._overloadname == "default" and name in ("sum", "nansum", "mean", "prod"):
        dim = None  # sum(self, dtype): the whole tensor
    else:
        dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return set(range(ndim))
    dims = [dim] if isinstance(dim, int) else list(dim)
    return {d % max(ndim, 1) for d in dims}


def reduction_shape(func, args, kwargs) -> dict[str, int] | None:
    """The TensorIterator a CUDA reduction of this call builds, as `core.reductions.Reduction`
    reads it (its `outputs` and `inputs` as counts at this shape), or None for an op that is not a
    recorded reduction. TensorIterator puts the reduced dimensions first, each group in the order
    of its strides (the input's for the reduced ones, the output's, a new dense tensor, for the
    kept ones), then merges neighbours that are one run of memory in every operand
    (TensorIterator.cpp `reorder_dimensions`, `coalesce_dimensions`)."""
    name = func._overloadpacket.__name__
    if name not in _FLOAT_ACCUMULATING and name not in _OWN_TYPE_ACCUMULATING:
        return None
    x = args[0] if args else None
    if not isinstance(x, torch.Tensor) or x.numel() == 0 or not x.is_floating_point():
        return None
    if name in _OWN_TYPE_ACCUMULATING:
        acc = x.element_size()
    else:
        acc = 8 if x.dtype == torch.float64 else 4
    reduced = _reduced_dims(func, args, kwargs, x.dim())
    # (size, input stride, output stride) of each dimension longer than one, fastest first
    red = sorted(((x.shape[d], x.stride(d), 0) for d in range(x.dim()) if d in reduced and x.shape[d] > 1),
                 key=lambda dim: (dim[1], dim[0]))
    kept_dims = [d for d in range(x.dim()) if d not in reduced and x.shape[d] > 1]
    out_strides, step = {}, 1
    for d in reversed(kept_dims):  # the output is dense in the kept dimensions' own order
        out_strides[d] = step
        step *= x.shape[d]
    kept = [(x.shape[d], x.stride(d), out_strides[d]) for d in reversed(kept_dims)]

    def coalesce(dims):
        merged = []
        for size, stride, out in dims:
            if merged and merged[-1][1] * merged[-1][0] == stride and merged[-1][2] * merged[-1][0] == out:
                merged[-1] = (merged[-1][0] * size, merged[-1][1], merged[-1][2])
            else:
                merged.append((size, stride, out))
        return merged

    red, kept = coalesce(red), coalesce(kept)
    dims = red + kept
    outputs = 1
    for size, _, _ in kept:
        outputs *= size
    inputs = x.numel() // max(outputs, 1)
    if not dims:  # one element
        fastest, contiguous = True, True
    else:
        fastest = not kept or (bool(red) and red[0][1] < kept[0][1])
        contiguous = (red[0] if fastest else kept[0])[1] == 1
    vec = 4
    if not fastest and contiguous:  # get_output_vec_size: outputs a thread writes at once
        checked = [x.storage_offset(), kept[0][0], *(stride for i, (_, stride, _) in enumerate(dims) if i != len(red))]
        for n in checked:
            while vec > 1 and n % vec:
                vec //= 2
    return {"outputs": outputs, "inputs": inputs, "fastest": int(fastest), "contiguous": int(contiguous),
            "reduce_dims": len(red), "ndim": len(dims), "output_vec": vec, "acc_bytes": acc,
            "max_threads": 512}


# --------------------------------------------------------------------- attention


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _attention_op(phase: str, masked: bool) -> str:
    """The ledger's name for a fused attention call's work (core.card ATTENTION_OPS, MASKED_ATTENTION_OPS)."""
    return f"masked_attention_{phase}" if masked else f"attention_{phase}"


def _dropout_scores(ledger: StorageLedger, phase: str, scores: int) -> None:
    """A fused attention call with dropout draws a random number for every score it computes (the
    kernel's Philox generator; the backward draws them again from the seed): recorded as their count
    (0: no dropout, nothing recorded) under core.card ATTENTION_DROPOUT_FORWARD's or _BACKWARD's
    name, in the FLOPs field, launching nothing of its own (the attention kernel does it). Priced
    by core.steptime as the share of attention run on its dropout kernels."""
    if scores > 0:
        ledger.add_work(f"attention_dropout_{phase}", scores, 0, launches=0)


def _output_like_query(query: torch.Tensor, dim_v: int) -> torch.Tensor:
    """A fused kernel's output (batch, heads, seq, dim_v), laid out in memory in query's stride
    order. Flash allocates it `empty_like` its (batch, seq, heads, dim) view of q (flash_api.cpp
    mha_fwd, `out = at::empty_like(q_padded)`), cuDNN (torch 2.11 on sm90 / sm100 puts it first:
    sdp_utils.cpp `check_prefer_cudnn_attention`) with `alloc_with_matching_layout(q, o, ...)`
    (cudnn/MHA.cpp, an argsort of q's strides); both keep q's order. Where q is (batch, seq,
    heads, dim) memory (a projection viewed and transposed) transformers' `transpose(1, 2)
    .contiguous()` after attention copies nothing; where q is (batch, heads, seq, dim) memory
    (partial rotary's `torch.cat`: gpt_neox, stablelm, phi; MLA's q) it copies the output, and
    the next projection saves the copy while attention saves its own output: one more output's
    bytes per block (h200-2026-12-03 probe_blocks: pythia-6.9b-L8 and deepseek-v3-L3 on the H200).
    Masked calls (a sliding window) run cuDNN too and keep q's order: Phi-3's window mask with its
    partial rotary's (batch, heads, seq, dim) q copies the output after attention (h200-2026-12-02c
    phi3 allocator trace, sdpa_attention.py's `.contiguous()`; h200-2026-12-24 trace-2,
    Phi-3-medium on an H100: the o_proj saves the copy), Gemma-3's (batch, seq, heads, dim) q does
    not (gemma3_text trace). MLA's unmasked calls (q and v head sizes differ: no flash) run cuDNN on
    the H200 (probe_blocks: deepseek-v3-L3). A pre-sm90 GPU runs the memory-efficient kernel for
    masked and MLA calls, whose (batch, seq, heads, dim) output copies nothing: one output's bytes per
    block less than the card holds."""
    batch, heads, seq, _ = query.shape
    order = sorted(range(4), key=lambda dim: query.stride(dim), reverse=True)  # outermost first
    shape = (batch, heads, seq, dim_v)
    out = torch.empty([shape[dim] for dim in order], dtype=query.dtype, device=query.device)
    return out.permute([order.index(dim) for dim in range(4)])


def workspace_like(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """The attention backward's workspace on sm90 (cuDNN: `_output_like_query`): one byte buffer of a
    float32 dq accumulator (batch, heads, seq, dim), the float32 row sums (batch, heads, seq) and 256
    bytes, and with fewer key/value heads than query heads (`enable_gqa`) dk and dv expanded to every
    query head in q's dtype; made after dq, dk and dv and freed before the kernel returns. Allocator
    traces, torch 2.11: 67,633,408 bytes for 1 x 32 x 4096 x 128 unmasked (h200-2026-12-02c
    llama-ctl), 50,856,192 for 1 x 32 x 4096 x 96 and 33,685,760 for 1 x 8 x 4096 x 256 with a
    sliding-window mask (phi3, gemma3_text), 169,083,136 for 2 x 40 x 4096 x 128 masked
    (h200-2026-12-24 trace-2, Phi-3-medium on an H100), 134,742,272 for 2 x 32 x 2048 x 128 over 8
    key/value heads (h200-2026-12-25 trace-4, Mixtral-8x7B on an H100: 64 MiB of expanded dk, dv)."""
    batch, heads, seq, dim = query.shape
    rows = batch * heads * seq
    expanded = rows * (key.shape[-1] + value.shape[-1]) * query.element_size() if key.shape[-3] != heads else 0
    return torch.empty(4 * rows * dim + 4 * rows + 256 + expanded, dtype=torch.uint8, device=query.device)


class _FusedAttention(torch.autograd.Function):
    """scaled_dot_product_attention as the CUDA kernels run it, on the meta device.

    On meta, sdpa falls back to the math path, which saves the (tokens x tokens) probabilities;
    the fused kernels do not. On sm90 torch 2.11 runs cuDNN's attention first, with or without a
    mask (`_output_like_query`): the output in query's memory order and float32 row statistics
    (batch, heads, seq), both saved with q, k and v; its backward allocates dq, dk and dv, then one
    workspace (`workspace_like`) freed before it returns. Allocator traces of torch 2.11 on the
    H200 and the H100 show exactly that for unmasked and masked calls alike (h200-2026-12-02c
    family-truth llama-ctl, phi3, gemma3_text; h200-2026-12-24 trace-2); the card once priced
    flash's backward (a softmax_d and a dq accumulator made before the gradients) and, with a
    mask, the memory-efficient kernel's (batch, seq, heads, dim) output, which copied nothing where
    the run copies Phi-3's (80 MiB a block on Phi-3-medium at 2 x 4096: -2.2% reserved).

    The work: 4 (forward) and 10 (backward) x batch x heads x q x k x dim FLOPs, halved with
    is_causal (the kernels skip the tiles above the diagonal). An explicit attn_mask (transformers
    passes one for a sliding window once the sequence reaches the window, masking_utils
    `_ignore_causal_mask_sdpa`) is a dense bias every kernel reads tile by tile: no tile is
    skipped, whatever the mask holds, so the full square is done; and the kernels that take a mask
    (memory-efficient, cuDNN with a bias) run it slower than flash runs a causal one. Those calls
    are recorded under MASKED_ATTENTION_OPS' names, priced apart (core.steptime)."""

    @staticmethod
    def forward(ctx, query, key, value, bias, ledger, causal, dropout=0.0):
        masked = bias is not None
        batch, heads, seq, _ = query.shape
        out = _output_like_query(query, value.shape[-1])
        lse = torch.empty(batch, heads, seq, dtype=torch.float32, device=query.device)
        ctx.save_for_backward(query, key, value, out, lse, bias)
        # the scores the kernel computes (causal: the tiles above the diagonal skipped), each drawn
        # dropout for where `dropout`, again in the backward
        scores = batch * heads * seq * key.shape[2] // (2 if causal else 1)
        ctx.ledger, ctx.masked, ctx.causal, ctx.dropout_scores = ledger, masked, causal, scores if dropout > 0 else 0
        flops = 4 * batch * heads * seq * key.shape[2] * query.shape[-1] // (2 if causal else 1)
        ledger.add_work(_attention_op("forward", masked), flops, sum(t.numel() * t.element_size()
                                                        for t in (query, key, value, out, lse)))
        _dropout_scores(ledger, "forward", ctx.dropout_scores)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        query, key, value, out, lse, _bias = ctx.saved_tensors
        batch, heads, seq, dim = query.shape
        grads = (torch.empty_like(query), torch.empty_like(key), torch.empty_like(value))
        # one workspace after the gradients, freed at once: float32 dq accumulator and row sums
        workspace = workspace_like(query, key, value)
        del workspace
        flops = 10 * batch * heads * seq * key.shape[2] * dim // (2 if ctx.causal else 1)
        ctx.ledger.add_work(_attention_op("backward", ctx.masked), flops, sum(t.numel() * t.element_size()
                                                             for t in (query, key, value, out, grad_out, *grads)))
        _dropout_scores(ctx.ledger, "backward", ctx.dropout_scores)
        return (*grads, None, None, None, None)  # no gradient for the bias, the ledger, is_causal, dropout


# The dtypes each fused kernel takes on sm80 and newer (sdp_utils.cpp: check_dtypes_low_precision,
# can_use_mem_efficient_attention).
_FLASH_DTYPES = (torch.float16, torch.bfloat16)
_EFFICIENT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def cuda_sdpa_kernel(query, key, value, attn_mask=None, is_causal=False, enable_gqa=False) -> str:
    """The kernel PyTorch's CUDA dispatcher runs for these inputs on sm80-sm90 with no backend
    disabled: "flash", "efficient" or "math" (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp,
    `select_sdp_backend`, torch 2.5-2.13: flash first, then memory-efficient, then the math
    fallback). The filters that decide it for a training run's dense 4-D inputs:
    - both fused kernels need the same batch size in q, k, v, and the same number of heads unless
      `enable_gqa` (flash only: q's heads a multiple of k's and v's), and a last-dim stride of 1;
    - flash: no attn_mask, half or bfloat16, q, k, v of one head size at most 256, and with
      is_causal as many queries as keys;
    - memory-efficient: q's and k's head sizes equal, q's and v's multiples of the GEMM alignment
      (16 bytes: 8 half / bfloat16 elements, 4 float32), a mask allowed.
    Falcon's multi-query attention (71 query heads against 1 key head, no enable_gqa) and any
    model passing broadcast heads fail both and run the math fallback, which saves the T x T
    probabilities (in float32: math upcasts half inputs unless
    `torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)`)."""
    q_heads, k_heads, v_heads = query.shape[-3], key.shape[-3], value.shape[-3]
    same_batch = query.shape[0] == key.shape[0] == value.shape[0]
    same_heads = q_heads == k_heads == v_heads
    grouped = bool(enable_gqa) and k_heads == v_heads and k_heads > 0 and q_heads % k_heads == 0
    unit_stride = all(t.stride(-1) == 1 or t.shape[-1] == 1 for t in (query, key, value))
    dq, dk, dv = query.shape[-1], key.shape[-1], value.shape[-1]
    if not (same_batch and unit_stride):
        return "math"
    if (attn_mask is None and query.dtype in _FLASH_DTYPES and dq == dk == dv and dq <= 256
            and (same_heads or grouped) and (not is_causal or query.shape[-2] == key.shape[-2])):
        return "flash"
    alignment = 4 if query.dtype == torch.float32 else 8
    if (query.dtype in _EFFICIENT_DTYPES and same_heads and dq == dk and dq % alignment == 0
            and dv % alignment == 0):
        return "efficient"
    return "math"


def attention_bias(attn_mask: torch.Tensor | None, query: torch.Tensor) -> torch.Tensor | None:
    """The additive bias a fused kernel is given for `attn_mask`, which its autograd node saves
    for backward (derivatives.yaml: the memory-efficient and cuDNN kernels' backward take
    attn_bias). A boolean mask (transformers' sliding window) is converted anew at every call,
    `at::where(mask, 0, -inf)` in query's dtype and the mask's shape (attention.cpp
    `convert_boolean_attn_mask`); the memory-efficient kernel pads its last dimension to a
    multiple of 16 (`preprocess_mask` / `pad_bias`), a copy where it is not one. So each masked
    block keeps one bias of batch x queries x keys elements until its backward (h200-2026-12-02d
    gemma-3-1b, 22 sliding blocks at 2 x 4096: the plan was 1.57e9 bytes under, 22 such biases
    are 1.48e9). A float mask is passed through: saved as it is, no new storage."""
    if attn_mask is None or attn_mask.dtype != torch.bool:
        return attn_mask
    *lead, keys = attn_mask.shape
    return torch.empty(*lead, _round_up(keys, 16), dtype=query.dtype, device=query.device)[..., :keys]


def fused_attention(ledger: StorageLedger, math_sdpa=None):
    """A stand-in for `torch.nn.functional.scaled_dot_product_attention` that runs what the CUDA
    dispatcher would (`cuda_sdpa_kernel`): the fused kernels priced by `_FusedAttention`, the math
    fallback by running it (`math_sdpa`, torch's own function: on the meta device it is the math
    path, op by op, each op recorded as any other)."""

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        kernel = cuda_sdpa_kernel(query, key, value, attn_mask, is_causal, enable_gqa)
        ledger.sdpa_kernels[kernel] += 1
        if kernel == "math" and math_sdpa is not None:
            ledger.math_mask_add = attn_mask is not None or bool(is_causal)
            try:
                return math_sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                                 scale=scale, enable_gqa=enable_gqa)
            finally:
                ledger.math_mask_add = False
        # grouped k/v heads (enable_gqa) are expanded inside the kernels; gradients come back at k/v's size
        return _FusedAttention.apply(query, key, value, attention_bias(attn_mask, query), ledger, bool(is_causal),
                                     float(dropout_p))

    return sdpa


# --------------------------------------------------------------------- linear attention
# Qwen3.5 / Qwen3-Next's gated-delta-rule blocks (and OLMo-Hybrid's, Lara-Mini's, Qwen4-Exp's: the
# same two functions, the same arguments) call two module globals of their modeling module,
# looked up at call time: `torch_chunk_gated_delta_rule` and `causal_conv1d_fn`. transformers
# (integrations/hub_kernels.py, `use_kernel_func_from_hub_with_fallback`) binds them when the module
# is imported: to flash-linear-attention's `chunk_gated_delta_rule` and causal-conv1d's
# `causal_conv1d_fn` where those import (a CUDA node with them installed), else to a torch reference
# (a Python loop over 64-token chunks: the request count grows with T, and no card could hold it).
# The learner routes both to the stand-ins below, which make the kernels' allocations on meta, as
# `fused_attention` does for sdpa; the card records that assumption (core.card.LINEAR_ATTENTION_FLA).
# Sources: fla-org/flash-linear-attention at bc3b101 (after v0.5.2), Dao-AILab/causal-conv1d at 0d2252d.

# The chunk of flash-linear-attention's chunked kernels (fla.ops.gated_delta_rule.chunk: chunk_size 64).
FLA_CHUNK = 64
# transformers' modeling packages whose layers call those globals, as core.card.LINEAR_ATTENTION_MODEL_TYPES
# names their model types. In 5.24 the three later ones define both globals byte for byte as qwen3_5 does
# and call them as Qwen3.5 does: q, k [B, T, H, K] and v [B, T, HV, V] split from one channel-last conv
# output, g float32 log decay, beta a sigmoid, use_qk_l2norm_in_kernel=True, no cache in training.
# OLMo-Hybrid's differences are outside the calls: q, k, v projected apart and concatenated before the
# conv (the same channel-last layout), beta doubled (`linear_allow_neg_eigval`: an elementwise op in
# torch; fla's kernel takes beta in [0, 2] with the same allocations), a separate output gate.
# Qwen4-Exp's full-attention layers (`indexed_attention`, the QSA indexer) read the mask's values
# (torch.nonzero per query): the learner still cannot trace them, its GDN blocks are priced as these.
LINEAR_ATTENTION_PACKAGES = ("qwen3_5", "qwen3_5_moe", "qwen3_next", "olmo_hybrid", "lara_mini", "qwen4_exp")
# LFM2's short convolution blocks call the same `causal_conv1d_fn` global, without a scan: its torch
# code (a depthwise F.conv1d over the sequence, a slice, a cast) runs as any other op, and the card
# prices it, what a node without causal-conv1d runs (a node with it runs the fused kernel, which
# keeps no padded output: less than the card). The learner calls the torch code the wrapper keeps
# (`torch_function`), whatever this machine has installed.
TORCH_CONV_PACKAGES = ("lfm2", "lfm2_moe")
# Mamba-2's mixer and the hybrids built on it (core.card.STATE_SPACE_MODEL_TYPES) wrap five globals
# each (causal_conv1d_fn / _update, mamba2_split_conv1d_scan_combined, mamba2_chunk_scan,
# mamba2_selective_state_update): the learner calls every one's torch code (the fused training
# path's returns None, and the mixer goes on to the unfused one), a chunked scan without a Python
# loop whose requests a card holds; the card prices that reference (core.card.STATE_SPACE_TORCH),
# whatever this machine has installed. Each of those model types' modeling package has its name.
TORCH_SCAN_PACKAGES = tuple(sorted(STATE_SPACE_MODEL_TYPES))


def _empty(*shape, dtype, like: torch.Tensor) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device=like.device)


class _FlaChunkGatedDeltaRule(torch.autograd.Function):
    """fla's `ChunkGatedDeltaRuleFunction` (fla/ops/gated_delta_rule/chunk.py: Triton path, chunk 64,
    no initial or final state, no cu_seqlens, `use_qk_l2norm_in_kernel` as transformers passes it)
    as its allocations: the kernels are not run, their outputs are `torch.empty` on meta in the
    order and with the lifetimes fla's Python gives them. All paths below are in fla/.

    q, k: [B, T, H, K]; v: [B, T, HV, V]; g (log decay, float32) and beta: [B, T, HV]; NT = T / 64.
    Forward (`chunk_gated_delta_rule_fwd`):
      utils/_decorators.py `input_guard`: every input `.contiguous()` (transformers passes q, k, v
        as strided views of the conv output: three copies, held until forward returns);
      modules/l2norm.py `l2norm_fwd` of q and k: y = empty_like(x) and a float32 rstd [B*T*H] each;
      ops/utils/cumsum.py `chunk_local_cumsum(g)`: float32 [B, T, HV];
      ops/gated_delta_rule/chunk_fwd.py `chunk_gated_delta_rule_fwd_intra`: A = zeros [B, T, HV, 64]
        (k's dtype), and wy_fast.py `recompute_w_u_fwd`: w [B, T, HV, K], u [B, T, HV, V];
      ops/common/chunk_delta_h.py `chunk_gated_delta_rule_fwd_h`: h [B, NT, HV, K, V], v_new = empty_like(u);
      ops/common/chunk_o.py `chunk_fwd_o`: o = empty_like(v_new); w, u, h, v_new die at return.
      Saved: q and k normalised, their rstd, v, the g cumsum, beta, A (no per-chunk state).
    Backward (`chunk_gated_delta_rule_bwd`): `do` made contiguous; w, u, h, v_new recomputed (as
      above); chunk_o.py `chunk_bwd_dv_local`: dv [B, T, HV, V]; chunk_delta_h.py
      `chunk_gated_delta_rule_bwd_dhu`: dh [B, NT, HV, K, V], dv2 = empty_like(dv) (dv freed);
      chunk_o.py `chunk_bwd_dqkwg`: dq, dk [B, T, HV, K], dg float32 [NK, B, T, HV] (NK = K / 128,
      Hopper's BK), dw = empty_like(w), with HV > H dq and dk summed to [B, T, H, K], dg summed over
      NK; wy_fast.py `prepare_wy_repr_bwd`: dk2, dv3, dg2, db (dv2 freed); a reverse
      `chunk_local_cumsum(dg)` (a new float32 tensor); l2norm.py `l2norm_bwd`: dq and dk anew."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, ledger, l2norm):
        B, T, H, K = q.shape
        HV, V = v.shape[2], v.shape[3]
        NT = -(-T // FLA_CHUNK)
        guard = [t.contiguous() for t in (q, k, v, g, beta)]  # input_guard: a copy where strided
        qc, kc, vc, gc, bc = guard
        if l2norm:
            qn, q_rstd = torch.empty_like(qc), _empty(B * T * H, dtype=torch.float32, like=q)
            kn, k_rstd = torch.empty_like(kc), _empty(B * T * H, dtype=torch.float32, like=q)
        else:
            qn, kn, q_rstd, k_rstd = qc, kc, None, None
        gcum = torch.empty_like(gc, dtype=torch.float32)
        A = torch.zeros(B, T, HV, FLA_CHUNK, dtype=k.dtype, device=k.device)
        w, u = _empty(B, T, HV, K, dtype=k.dtype, like=k), torch.empty_like(vc)
        h, v_new = _empty(B, NT, HV, K, V, dtype=k.dtype, like=k), torch.empty_like(u)
        o = torch.empty_like(v_new)
        del w, u, h, v_new
        ctx.save_for_backward(qn, q_rstd, kn, k_rstd, vc, gcum, bc, A)
        ctx.ledger, ctx.l2norm, ctx.heads = ledger, l2norm, H
        flops = 2 * B * HV * T * (3 * FLA_CHUNK * K + 2 * FLA_CHUNK * V + 3 * K * V)
        ledger.add_work("linear_attention_forward", flops,
                        sum(_bytes(t) for t in (qc, kc, vc, gc, bc, A, o)) + 2 * _bytes(o), launches=7)
        del guard, qc, kc, gc
        return o

    @staticmethod
    def backward(ctx, do):
        qn, q_rstd, kn, k_rstd, v, g, beta, A = ctx.saved_tensors
        B, T, H, K = qn.shape
        HV, V = v.shape[2], v.shape[3]
        NT = -(-T // FLA_CHUNK)
        do = do.contiguous()  # input_guard
        w, u = _empty(B, T, HV, K, dtype=kn.dtype, like=kn), torch.empty_like(v)
        h, v_new = _empty(B, NT, HV, K, V, dtype=kn.dtype, like=kn), torch.empty_like(u)
        dv = torch.empty_like(do)
        dh, dv2 = _empty(B, NT, HV, K, V, dtype=qn.dtype, like=qn), torch.empty_like(dv)
        dv = dv2
        del dv2
        nk = -(-K // 128)  # Hopper's tiling (chunk_o.chunk_bwd_dqkwg: BK = min(next_pow2(K), 128))
        dq, dk = _empty(B, T, HV, K, dtype=qn.dtype, like=qn), _empty(B, T, HV, K, dtype=kn.dtype, like=kn)
        dg = _empty(nk, B, T, HV, dtype=torch.float32, like=qn)
        dw = torch.empty_like(w)
        if H != HV:
            dq = dq.view(B, T, H, HV // H, K).sum(3)
            dk = dk.view(B, T, H, HV // H, K).sum(3)
        dg = dg.sum(0)
        dk2, dv3 = _empty(B, T, HV, K, dtype=kn.dtype, like=kn), torch.empty_like(v)
        dg2, db = torch.empty_like(g), torch.empty_like(beta)
        if H != HV:
            dk2 = dk2.view(B, T, H, HV // H, K).sum(3)
        dv = dv3
        del dv3
        dk.add_(dk2)
        dg.add_(dg2)
        dg = torch.empty_like(dg)  # chunk_local_cumsum(dg, reverse=True): a new float32 tensor
        del w, u, h, v_new, dh, dw, dk2, dg2
        if ctx.l2norm:
            dq, dk = torch.empty_like(qn), torch.empty_like(kn)
        flops = 3 * 2 * B * HV * T * (3 * FLA_CHUNK * K + 2 * FLA_CHUNK * V + 3 * K * V)
        ctx.ledger.add_work("linear_attention_backward", flops,
                            4 * sum(_bytes(t) for t in (qn, kn, v, A, do)), launches=12)
        return dq, dk, dv, dg, db, None, None


def fla_chunk_gated_delta_rule(ledger: StorageLedger):
    """A stand-in for transformers' `torch_chunk_gated_delta_rule` (a Python loop over 64-token
    chunks, saving a [B, HV, K, V] float32 state and a chunk's v per chunk) that makes the requests
    fla's `chunk_gated_delta_rule` makes on a CUDA GPU (`_FlaChunkGatedDeltaRule`): a fixed number
    of requests per block whatever the token count."""

    def chunk_gated_delta_rule(query, key, value, g, beta, scale=None, initial_state=None,
                               output_final_state=False, use_qk_l2norm_in_kernel=False, **kwargs):
        if initial_state is not None or output_final_state or kwargs.get("cu_seqlens") is not None:
            raise NotImplementedError("the fla stand-in models training steps without cache or packing")
        return _FlaChunkGatedDeltaRule.apply(query, key, value, g, beta, ledger, bool(use_qk_l2norm_in_kernel)), None

    return chunk_gated_delta_rule


class _CausalConv1d(torch.autograd.Function):
    """causal-conv1d's `CausalConv1dFn` (causal_conv1d/causal_conv1d_interface.py `forward` /
    `backward`, the allocations in causal_conv1d/cpp_functions.py): x [B, C, T] made contiguous
    unless channel-first or channel-last (transformers passes the projection transposed:
    channel-last, no copy); out = empty_like(x) with SiLU fused (transformers' torch
    `causal_conv1d_fn` keeps the SiLU's input too: one more [B, C, T]); saves x and the weight.
    Backward: dout copied to x's layout where it differs, dx = empty_like(x), dweight float32
    zeros [C, W] cast to the weight's dtype (dbias likewise)."""

    @staticmethod
    def forward(ctx, x, weight, bias, ledger):
        if x.stride(2) != 1 and x.stride(1) != 1:
            x = x.contiguous()
        out = torch.empty_like(x)
        ctx.save_for_backward(x, weight, bias)
        ctx.ledger = ledger
        ledger.add_work("causal_conv1d_forward", 0, 2 * _bytes(x))
        return out

    @staticmethod
    def backward(ctx, dout):
        x, weight, bias = ctx.saved_tensors
        channel_last = x.stride(1) == 1 and x.stride(2) > 1
        if not channel_last and dout.stride(2) != 1:
            dout = dout.contiguous()
        if channel_last and dout.stride(1) != 1:
            dout = dout.transpose(-1, -2).contiguous().transpose(-1, -2)
        dx = torch.empty_like(x)
        dweight = torch.zeros_like(weight, dtype=torch.float32).to(weight.dtype)
        dbias = torch.zeros_like(bias, dtype=torch.float32).to(bias.dtype) if bias is not None else None
        ctx.ledger.add_work("causal_conv1d_backward", 0, 3 * _bytes(x), launches=3)
        return dx, dweight, dbias, None


def causal_conv1d_standin(ledger: StorageLedger):
    """A stand-in for transformers' `causal_conv1d_fn` (F.conv1d, a slice, the activation and a cast:
    the conv's padded output and the activation's input kept for backward) that makes the requests
    causal-conv1d's fused kernel makes (`_CausalConv1d`)."""

    def causal_conv1d_fn(x, weight, bias=None, activation=None, seq_idx=None, **kwargs):
        if seq_idx is not None or kwargs.get("initial_states") is not None or kwargs.get("return_final_states"):
            raise NotImplementedError("the causal-conv1d stand-in models training steps without cache or packing")
        return _CausalConv1d.apply(x, weight, bias, ledger)

    return causal_conv1d_fn


# ---------------------------------------------------------------- values read as Python numbers
# Three models read a tensor's values into Python while they run, which the meta device holds none of;
# each is answered inside its own forward only, as a real run's are for the learner's input (one
# unpadded sequence per row), and nowhere else:
# - JetMoE's router (transformers 5.24 jetmoe/modeling_jetmoe.py `JetMoeTopKGating.forward`) turns its
#   per-expert token counts into Python ints (`expert_size.tolist()`) to cut the sorted token-expert
#   rows between experts. The counts only decide where the rows are cut: every expert's input, output
#   and gradient are pieces of the same tokens x top-k rows, so the block's requests add to the same
#   bytes whatever the routing. The learner cuts them evenly (as `grouped_mm_flops` takes the offsets
#   to), what a freshly initialised router does on average.
# - XLM (xlm/modeling_xlm.py `XLMModel.forward` and its `get_masks`) asserts that its lengths' largest
#   (`lengths.max().item()`) is at most the sequence: for a sequence without padding it is the sequence.
# - DBRX's experts (dbrx/modeling_dbrx.py `DbrxExperts.forward`) loop in Python over the experts any
#   token chose (`expert_mask.sum(...) > 0).nonzero()`) and take each expert's tokens with
#   `torch.where(expert_mask[e])`: a gather of those rows, the expert's three matmuls, and an index_add
#   back. As JetMoE's, the rows only decide how tokens x top-k are cut between experts: every expert is
#   hit, and each gets an even share.


def even_split(total: int, parts: int) -> list[int]:
    """`total` rows cut into `parts` pieces as evenly as integers allow (the first get one more)."""
    return [total // parts + (i < total % parts) for i in range(parts)]


@contextlib.contextmanager
def _answering(method: str, answer):
    """torch.Tensor.`method` answers `answer(tensor)` for a meta tensor where that is not None, and is
    torch's own everywhere else; put back on leaving."""
    original = getattr(torch.Tensor, method)

    def answered(tensor, *args, **kwargs):
        value = answer(tensor) if tensor.is_meta and not args and not kwargs else None
        return original(tensor, *args, **kwargs) if value is None else value

    setattr(torch.Tensor, method, answered)
    try:
        yield
    finally:
        setattr(torch.Tensor, method, original)


def _jetmoe_router(original):
    def forward(self, hidden_states):
        rows = hidden_states.shape[0] * self.top_k

        def counts(tensor):  # only the router's own [num_experts] count
            if tensor.shape == (self.num_experts,) and not tensor.is_floating_point():
                return even_split(rows, self.num_experts)
            return None

        with _answering("tolist", counts):
            return original(self, hidden_states)
    return forward


def _xlm_model(original):
    def forward(self, input_ids=None, *args, **kwargs):
        embeds = kwargs.get("inputs_embeds")
        length = (input_ids if input_ids is not None else embeds).shape[1]

        def longest(tensor):  # only an integer scalar: the lengths' largest
            return length if tensor.dim() == 0 and not tensor.is_floating_point() else None

        with _answering("item", longest):
            return original(self, input_ids, *args, **kwargs)
    return forward


def _dbrx_experts(original):
    def forward(self, hidden_states, top_k_index, top_k_weights):
        if not hidden_states.is_meta:
            return original(self, hidden_states, top_k_index, top_k_weights)
        shares = iter(even_split(top_k_index.numel(), self.num_experts))
        where = torch.where

        def every_expert(tensor):  # the experts hit: [[0], [1], ...], each row indexed [0]
            return [[e] for e in range(self.num_experts)] if tensor.dim() == 1 else None

        def rows(condition, *args, **kwargs):  # one expert's (top-k slot, token) pairs
            if args or kwargs or not condition.is_meta:
                return where(condition, *args, **kwargs)
            share = next(shares)
            return tuple(torch.empty(share, dtype=torch.long, device=condition.device) for _ in range(2))

        torch.where = rows
        try:
            with _answering("nonzero", every_expert):
                return original(self, hidden_states, top_k_index, top_k_weights)
        finally:
            torch.where = where
    return forward


# (modeling module, class, method, what wraps the original)
VALUE_ANSWERS = (("jetmoe", "JetMoeTopKGating", "forward", _jetmoe_router),
                 ("xlm", "XLMModel", "forward", _xlm_model),
                 ("dbrx", "DbrxExperts", "forward", _dbrx_experts))


class Swaps:
    """Attributes of modules and classes set to stand-ins for a trace, each original kept as its
    owner holds it (`vars`: a class's own function, not one bound or inherited). `restore` puts
    them back in reverse, so that an attribute swapped twice ends as it began."""

    _NONE = object()  # the owner had no attribute of its own by that name: restore deletes it

    def __init__(self) -> None:
        self._originals: list[tuple[Any, str, Any]] = []

    def swap(self, owner: Any, name: str, stand_in: Any) -> None:
        self._originals.append((owner, name, vars(owner).get(name, self._NONE)))
        setattr(owner, name, stand_in)

    def restore(self) -> None:
        while self._originals:
            owner, name, original = self._originals.pop()
            if original is self._NONE:
                delattr(owner, name)
            else:
                setattr(owner, name, original)


def value_answers_patch() -> Swaps:
    """Wrap VALUE_ANSWERS' methods of the loaded modeling modules (`restore` puts them back)."""
    import sys

    swaps = Swaps()
    for package, owner_name, method, wrap in VALUE_ANSWERS:
        module = sys.modules.get(f"transformers.models.{package}.modeling_{package}")
        owner = getattr(module, owner_name, None)
        if owner is not None:
            swaps.swap(owner, method, wrap(vars(owner)[method]))
    return swaps


# ------------------------------------------------------------- Mamba-1: mamba-ssm's selective scan
# Jamba's mixer (core.card.MAMBA_KERNEL_MODEL_TYPES) calls its module's `mamba_selective_scan` and
# `causal_conv1d_fn`, which transformers binds to mamba-ssm's `selective_scan_fn` and causal-conv1d's
# kernel where they import, else to a Python loop over every token. The learner routes both to
# stand-ins that make the kernels' allocations (core.card.STATE_SPACE_KERNELS).
# Source: state-spaces/mamba at e9594ce, mamba_ssm/ops/selective_scan_interface.py `SelectiveScanFn`
# and csrc/selective_scan/selective_scan.cpp.
MAMBA_KERNEL_PACKAGES = tuple(sorted(MAMBA_KERNEL_MODEL_TYPES))
# The scan's chunk (selective_scan.cpp: n_chunks = (seqlen + 2047) / 2048): its saved states are one
# (2 x dstate) float32 row per channel and chunk
SCAN_CHUNK = 2048


def _chunk_states(batch: int, dim: int, state: int, length: int, like: torch.Tensor) -> torch.Tensor:
    """The scan's float32 chunk states, [B, D, n_chunks, 2N], priced as L / 2048 + 1 chunks (a card's
    requests are polynomials in L; at a multiple of 2,048 that is one chunk more than the kernel's)."""
    return _empty(batch * dim * 2 * state * (length + SCAN_CHUNK) // SCAN_CHUNK, dtype=torch.float32, like=like)


def _scan_gradients(u, delta, A, B, C, D, delta_bias):
    """`selective_scan_cuda.bwd`'s gradients as it allocates them (selective_scan.cpp): du and ddelta
    empty, dA zeros, dB and dC float32 zeros (input-dependent B and C), dD and ddelta_bias zeros; the
    result cast to B's and C's dtype, the float32 ones freed on return."""
    du, ddelta = torch.empty_like(u), torch.empty_like(delta)
    dA = torch.zeros_like(A)
    dB32, dC32 = torch.zeros_like(B, dtype=torch.float32), torch.zeros_like(C, dtype=torch.float32)
    dD = torch.zeros_like(D) if D is not None else None
    ddelta_bias = torch.zeros_like(delta_bias) if delta_bias is not None else None
    return du, ddelta, dA, dB32.to(B.dtype), dC32.to(C.dtype), dD, ddelta_bias


class _SelectiveScan(torch.autograd.Function):
    """mamba-ssm's `SelectiveScanFn` as its allocations. u, delta, z: [B, D, L]; A: [D, N] float32;
    B, C: [B, N, L] (input-dependent); D, delta_bias: [D] float32.
    Forward: u, delta, B, C, z made contiguous where their last stride is not 1 (transformers passes
      u, B and C transposed, z as a chunk of the projection: copies); `selective_scan_cuda.fwd`:
      out_z = empty_like(z), out = empty_like(delta), x = empty [B, D, n_chunks, 2N] in A's float32
      (the chunk states). With z: saves u, delta, A, B, C, D, z, delta_bias, x and out (out stays),
      returns out_z.
      x is priced as L / 2048 + 1 chunks (a card's requests are polynomials in L; at a multiple of
      2,048 that is one chunk, 2N x 4 bytes a channel, more than the kernel's).
    Backward (`selective_scan_cuda.bwd`, recompute_out_z off): dz = empty_like(z), du, ddelta =
      empty_like, dA = zeros_like(A), dB, dC = float32 zeros_like(B, C), dD, ddelta_bias = zeros_like;
      the result casts dB and dC to B's and C's dtype (the float32 ones freed on return)."""

    @staticmethod
    def forward(ctx, u, delta, A, B, C, D, z, delta_bias, ledger):
        u, delta = (t if t.stride(-1) == 1 else t.contiguous() for t in (u, delta))
        B, C = (t if t.stride(-1) == 1 else t.contiguous() for t in (B, C))
        if z is not None and z.stride(-1) != 1:
            z = z.contiguous()
        batch, dim, length = u.shape
        out_z = torch.empty_like(z) if z is not None else None
        out = torch.empty_like(delta)
        x = _chunk_states(batch, dim, A.shape[-1], length, like=u)
        ctx.save_for_backward(u, delta, A, B, C, D, z, delta_bias, x, out if z is not None else None)
        ctx.ledger = ledger
        moved = sum(_bytes(t) for t in (u, delta, B, C, out, x) + ((z, out_z) if z is not None else ()))
        ledger.add_work("selective_scan_forward", 9 * batch * dim * length * A.shape[-1], moved)
        return out_z if z is not None else out

    @staticmethod
    def backward(ctx, dout):
        u, delta, A, B, C, D, z, delta_bias, x, out = ctx.saved_tensors
        if dout.stride(-1) != 1:
            dout = dout.contiguous()
        dz = torch.empty_like(z) if z is not None else None
        du, ddelta, dA, dB, dC, dD, ddelta_bias = _scan_gradients(u, delta, A, B, C, D, delta_bias)
        batch, dim, length = u.shape
        moved = 2 * sum(_bytes(t) for t in (u, delta, B, C, x, dout)) + (3 * _bytes(z) if z is not None else 0)
        ctx.ledger.add_work("selective_scan_backward", 2 * 9 * batch * dim * length * A.shape[-1], moved, launches=2)
        return du, ddelta, dA, dB, dC, dD, dz, ddelta_bias, None


def _rms_norm_copy(t: torch.Tensor, rows: int) -> torch.Tensor:
    """mamba-ssm's `rms_norm_forward` after its first rearrange, as allocations: t [b, width, l] made
    (b l, width) contiguous, the Triton layer norm's output and float32 rstd (freed at once)."""
    flat = t.transpose(-1, -2).reshape(rows, -1).contiguous()
    out, rstd = torch.empty_like(flat), _empty(rows, dtype=torch.float32, like=flat)
    del rstd
    return out


class _MambaInner(torch.autograd.Function):
    """mamba-ssm's `MambaInnerFn` (selective_scan_interface.py at e9594ce; checkpoint_lvl 1, input-dependent
    B and C, no B/C projection bias) as its allocations, its torch ops run as written and its kernels
    (causal-conv1d's fwd/bwd, `selective_scan_cuda`) as `_CausalConv1d` and `_SelectiveScan` allocate.
    Forward: xz made contiguous (transformers passes the projection transposed: a copy, saved); the
      convolution's output; x_dbl = its (b l, d) copy times x_proj; delta = dt_proj @ x_dbl's first
      columns; B and C made (b, 1, N, l) contiguous; with Falcon-Mamba's norms each of B, C and delta
      made row-major, normed (output, float32 rstd) and made contiguous back; the scan's out_z, out and
      chunk states; the output projection of out_z. The convolution's output and delta are dropped
      (recomputed in backward). Saved: xz, x_dbl, B, C, the states, out.
    Backward: the convolution and delta (and the norms) recomputed; dxz empty; dout_y = out_proj^T @ dout;
      the scan's backward into dxz's z half (out_z recomputed: a new one); dout_proj_weight from out_z's
      (d, b l) copy; dx_dbl filled from dB, dC (each made (b l, N) contiguous) and delta's gradient; the
      convolution's input gradient into dxz's x half, its weight and bias gradients float32 then cast.
      The norms' weights get no gradient (mamba-ssm returns None for them)."""

    @staticmethod
    def forward(ctx, xz, conv_weight, conv_bias, x_proj_weight, delta_proj_weight, out_proj_weight, out_proj_bias,
                A, D, delta_bias, normed, ledger):
        F = torch.nn.functional
        if xz.stride(-1) != 1:
            xz = xz.contiguous()
        batch, _, length = xz.shape
        rows, rank, state = batch * length, delta_proj_weight.shape[1], A.shape[-1]
        x, z = xz.chunk(2, dim=1)
        conv_out = torch.empty_like(x)
        x_dbl = F.linear(conv_out.transpose(1, 2).reshape(rows, -1), x_proj_weight)
        delta = (delta_proj_weight @ x_dbl[:, :rank].t()).view(-1, batch, length).transpose(0, 1)
        B = x_dbl[:, rank:rank + state].reshape(batch, length, 1, state).permute(0, 2, 3, 1).contiguous()
        C = x_dbl[:, -state:].reshape(batch, length, 1, state).permute(0, 2, 3, 1).contiguous()
        if normed:  # each rebinding frees the tensor before it as mamba-ssm's does: kept as two statements
            B = _rms_norm_copy(B.view(batch, state, length), rows).view(batch, length, 1, state).permute(0, 2, 3, 1)
            B = B.contiguous()
            C = _rms_norm_copy(C.view(batch, state, length), rows).view(batch, length, 1, state).permute(0, 2, 3, 1)
            C = C.contiguous()
            delta = _rms_norm_copy(delta, rows).view(batch, length, -1).transpose(1, 2).contiguous()
        out_z = torch.empty_like(z)
        out = torch.empty_like(delta)
        states = _chunk_states(batch, x.shape[1], state, length, like=xz)
        del conv_out, delta
        ctx.save_for_backward(xz, conv_weight, conv_bias, x_dbl, x_proj_weight, delta_proj_weight, out_proj_weight,
                              A, B, C, D, delta_bias, states, out)
        ctx.ledger, ctx.normed, ctx.has_out_bias = ledger, normed, out_proj_bias is not None
        ledger.add_work("selective_scan_forward", 9 * batch * x.shape[1] * length * state,
                        sum(_bytes(t) for t in (xz, out, out_z, states)) + 2 * _bytes(out))
        return F.linear(out_z.transpose(1, 2), out_proj_weight, out_proj_bias)

    @staticmethod
    def backward(ctx, dout):
        (xz, conv_weight, conv_bias, x_dbl, x_proj_weight, delta_proj_weight, out_proj_weight, A, B, C, D,
         delta_bias, states, out) = ctx.saved_tensors
        batch, _, length = xz.shape
        rows, rank, state = batch * length, delta_proj_weight.shape[1], A.shape[-1]
        x, z = xz.chunk(2, dim=1)
        if dout.stride(-1) != 1:
            dout = dout.contiguous()
        conv_out = torch.empty_like(x)
        delta = (delta_proj_weight @ x_dbl[:, :rank].t()).view(-1, batch, length).transpose(0, 1)
        if ctx.normed:  # mamba-ssm's order here: delta, then B and C
            delta = _rms_norm_copy(delta, rows).view(batch, length, -1).transpose(1, 2).contiguous()
            B = _rms_norm_copy(B.view(batch, state, length), rows).view(batch, length, 1, state).permute(0, 2, 3, 1)
            B = B.contiguous()
            C = _rms_norm_copy(C.view(batch, state, length), rows).view(batch, length, 1, state).permute(0, 2, 3, 1)
            C = C.contiguous()
        dxz = torch.empty_like(xz)
        dx, dz = dxz.chunk(2, dim=1)
        dout = dout.permute(2, 0, 1).reshape(dout.shape[-1], rows)
        dout_y = (out_proj_weight.t() @ dout).view(-1, batch, length).transpose(0, 1)
        out_z = torch.empty_like(out)  # recompute_out_z
        dconv_out, ddelta, dA, dB, dC, dD, ddelta_bias = _scan_gradients(conv_out, delta, A, B, C, D, delta_bias)
        del dout_y
        dout_proj_weight = dout @ out_z.permute(1, 0, 2).reshape(out_z.shape[1], rows).t()
        dout_proj_bias = dout.sum(dim=1) if ctx.has_out_bias else None
        del out_z
        dx_dbl = torch.empty_like(x_dbl)
        dx_dbl[:, rank:rank + state] = dB.permute(0, 3, 1, 2).reshape(rows, state).contiguous()
        del dB
        dx_dbl[:, -state:] = dC.permute(0, 3, 1, 2).reshape(rows, state).contiguous()
        del dC
        ddelta = ddelta.transpose(0, 1).reshape(ddelta.shape[1], rows)
        ddelta_proj_weight = ddelta @ x_dbl[:, :rank]
        dx_dbl[:, :rank] = ddelta.t() @ delta_proj_weight
        dconv_out = dconv_out.permute(1, 0, 2).reshape(dconv_out.shape[1], rows)
        dx_proj_weight = dx_dbl.t() @ conv_out.transpose(1, 2).reshape(rows, -1)
        torch.addmm(dconv_out, x_proj_weight.t(), dx_dbl.t(), out=dconv_out)
        dconv_weight = torch.zeros(conv_weight.shape[0], conv_weight.shape[-1], dtype=torch.float32,
                                   device=xz.device).to(conv_weight.dtype).view(conv_weight.shape)
        dconv_bias = (torch.zeros_like(conv_bias, dtype=torch.float32).to(conv_bias.dtype)
                      if conv_bias is not None else None)
        del dx, dz, delta, conv_out, dconv_out, ddelta
        moved = 3 * sum(_bytes(t) for t in (xz, x_dbl, states, out, dxz))
        ctx.ledger.add_work("selective_scan_backward", 2 * 9 * batch * x.shape[1] * length * state, moved, launches=3)
        return (dxz, dconv_weight, dconv_bias, dx_proj_weight, ddelta_proj_weight, dout_proj_weight, dout_proj_bias,
                dA, dD, ddelta_bias, None, None)


def mamba_inner_standin(ledger: StorageLedger):
    """A stand-in for transformers' `mamba_inner_fn` (None without mamba-ssm: the mixer then runs its
    per-token loop) that makes the requests mamba-ssm's fused `mamba_inner_fn` makes (`_MambaInner`)."""

    def mamba_inner_fn(xz, conv1d_weight, conv1d_bias, x_proj_weight, delta_proj_weight, out_proj_weight,
                       out_proj_bias, A, B=None, C=None, D=None, delta_bias=None, delta_softplus=True,
                       b_rms_weight=None, c_rms_weight=None, dt_rms_weight=None, **kwargs):
        if B is not None or C is not None:
            raise NotImplementedError("the mamba_inner_fn stand-in models input-dependent B and C")
        normed = b_rms_weight is not None
        return _MambaInner.apply(xz, conv1d_weight, conv1d_bias, x_proj_weight, delta_proj_weight, out_proj_weight,
                                 out_proj_bias, A, D, delta_bias, normed, ledger)

    return mamba_inner_fn


def selective_scan_standin(ledger: StorageLedger):
    """A stand-in for transformers' `mamba_selective_scan` (a loop over every token without mamba-ssm)
    that makes the requests mamba-ssm's `selective_scan_fn` makes (`_SelectiveScan`)."""

    def mamba_selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                             return_last_state=False, **kwargs):
        if return_last_state:
            raise NotImplementedError("the selective-scan stand-in models training steps without cache")
        return _SelectiveScan.apply(u, delta, A, B, C, D, z, delta_bias, ledger)

    return mamba_selective_scan


class UnpricedKernel(Exception):
    """A model called a kernel transformers takes from a package (flash-linear-attention,
    causal-conv1d, mamba-ssm) and falls back to a torch loop without it, for which the learner has
    no stand-in (Kimi-Linear's `chunk_kda`)."""


def _package_fallback(function: Any) -> tuple[str, str] | None:
    """(the package's kernel name, the package) of a function transformers' hub_kernels wrapped to
    take a package's kernel where it imports, and its own torch code where not (5.24:
    `use_kernel_func_from_hub_with_fallback` keeps both in the wrapper's closure), if it is one."""
    cells = _closure(function)
    if "is_new_implementation" not in cells:
        return None
    name, package = cells.get("func_name"), cells.get("package")
    return (name, package) if isinstance(name, str) and isinstance(package, str) else None


def _closure(function: Any) -> dict[str, Any]:
    """A function's closure by name (empty for anything else)."""
    code, cells = getattr(function, "__code__", None), getattr(function, "__closure__", None)
    if code is None or not cells:
        return {}
    return dict(zip(code.co_freevars, (cell.cell_contents for cell in cells)))


def _unpriced(name: str, package: str):
    try:  # transformers' own names for the packages' distributions ("fla": flash-linear-attention)
        from transformers.integrations.hub_kernels import _PACKAGE_TO_DISTRIBUTION as distributions
    except ImportError:
        distributions = {}
    distribution = distributions.get(package, package)

    def raises(*args, **kwargs):
        raise UnpricedKernel(f"its layers call `{name}` ({distribution}'s kernel; transformers' torch loop where "
                             f"{distribution} is not installed), which zlayout has no stand-in for")
    return raises


def linear_kernels_patch(ledger: StorageLedger) -> Swaps:
    """Route `torch_chunk_gated_delta_rule` and `causal_conv1d_fn` of every loaded modeling module
    of LINEAR_ATTENTION_PACKAGES, and `mamba_selective_scan` and `causal_conv1d_fn` of
    MAMBA_KERNEL_PACKAGES, to the stand-ins, TORCH_CONV_PACKAGES' convolution and every
    kernel wrapper of TORCH_SCAN_PACKAGES to transformers' torch code, and every other package kernel
    a loaded modeling module falls back from to a function that stops the trace (UnpricedKernel: a card of the torch
    loop would price neither what the package runs nor, its requests growing with the chunks of the
    sequence, anything a card holds); `restore` puts the originals back."""
    import sys

    standins = {"torch_chunk_gated_delta_rule": fla_chunk_gated_delta_rule(ledger),
                "causal_conv1d_fn": causal_conv1d_standin(ledger)}
    mamba_standins = {"mamba_selective_scan": selective_scan_standin(ledger), "mamba_inner_fn": mamba_inner_standin(ledger),
                      "causal_conv1d_fn": standins["causal_conv1d_fn"]}
    swaps = Swaps()
    for packages, routed in ((LINEAR_ATTENTION_PACKAGES, standins), (MAMBA_KERNEL_PACKAGES, mamba_standins)):
        for package in packages:
            module = sys.modules.get(f"transformers.models.{package}.modeling_{package}")
            for name, standin in routed.items():
                if module is not None and callable(module.__dict__.get(name)):
                    swaps.swap(module, name, standin)
    for package in TORCH_CONV_PACKAGES:
        module = sys.modules.get(f"transformers.models.{package}.modeling_{package}")
        original = module.__dict__.get("causal_conv1d_fn") if module is not None else None
        torch_code = _closure(original).get("torch_function")
        if callable(torch_code):
            swaps.swap(module, "causal_conv1d_fn", torch_code)
    for package in TORCH_SCAN_PACKAGES:
        module = sys.modules.get(f"transformers.models.{package}.modeling_{package}")
        for name, original in list(vars(module).items()) if module is not None else ():
            torch_code = _closure(original).get("torch_function") if _package_fallback(original) else None
            if callable(torch_code):
                swaps.swap(module, name, torch_code)
    for module_name, module in list(sys.modules.items()):
        if not module_name.startswith("transformers.models.") or ".modeling_" not in module_name or module is None:
            continue
        for name, original in list(vars(module).items()):
            fallback = _package_fallback(original)
            if fallback is not None and name not in standins:
                swaps.swap(module, name, _unpriced(*fallback))
    return swaps
