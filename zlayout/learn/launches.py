"""How many kernels CUDA launches for one ATen op, where it is more than one.

The ledger (zlayout.learn.trace) sees each op once, at the dispatcher; most run as one kernel. The ops
here run several, chosen by their shapes and dtypes, as PyTorch's CUDA code does on an H100/H200
(torch 2.11, CUDA 13, CCCL's cub): a sort is a copy, an index fill and a radix sort of several
passes; an accumulating index_put sorts its linearized indices first. Counted from PyTorch's source
(each function names the file and function), checked against the profiles of
benchmarks/measurements/h200-2026-12-13/profiles/prof-3 and h200-2026-12-16/results/prof-1
(granite-3.0-1b-a400m, its forward 1,766 kernels and backward 3,056, where the card had counted one
per op: 1,372 and 2,186). Memsets and copies the profiler counts apart (cub's lookback resets) are
not kernels here either.

`kernel_launches` takes the op as the ledger ran it (`in_place`: the backward formula's in-place
form a run without a dispatch mode takes, `trace.IN_PLACE_IN_BACKWARD`).
"""

from __future__ import annotations

import math

import torch

# cub's DeviceRadixSort (at::cuda::cub::radix_sort_pairs, ATen/cuda/cub.cuh) on sm90, its tuning
# (cub/device/dispatch/tuning/tuning_radix_sort.cuh, Policy900): keys of 4 bytes or more run the
# onesweep path, 8 bits a pass: one histogram kernel, one exclusive-sum kernel, then a onesweep
# kernel per pass (DeviceRadixSortOnesweepKernel: 8 a sort of int64 keys, 192 for granite's 24
# forward sorts, h200-2026-12-16 prof-1). Shorter keys take the upsweep / scan / downsweep passes
# of 7 bits (5 for one byte). A sort of one tile (256 threads x 19 4-byte items, fewer for wider
# keys or values: MemBoundScaling) is one kernel (DeviceRadixSortSingleTileKernel).
ONESWEEP_RADIX_BITS = 8
SINGLE_TILE_THREADS, SINGLE_TILE_ITEMS_4B = 256, 19
# PyTorch sorts a slice of at most this many elements in one kernel in shared memory
# (native/cuda/Sort.h `should_use_small_sort`; Sort.cu `sortKeyValueInplace`: bitonic, warp merge
# or block radix sort by size)
SMALL_SORT_MAX = 4096
# cub's DeviceScan (at::cuda::cub::inclusive_scan / exclusive_sum): a tile-state init kernel and the
# scan kernel (cub/device/dispatch/dispatch_scan.cuh)
CUB_SCAN_KERNELS = 2


def radix_sort_pairs(n: int, key_bytes: int, bits: int | None = None, value_bytes: int = 8) -> int:
    """Kernels of one cub radix sort of `n` key-value pairs over `bits` of the keys (all of them:
    None), ATen/cuda/cub.cuh `radix_sort_pairs`."""
    if n <= 0:
        return 0
    bits = 8 * key_bytes if bits is None else bits
    wider = max(key_bytes, value_bytes)
    items = max(1, min(SINGLE_TILE_ITEMS_4B * 4 // wider, SINGLE_TILE_ITEMS_4B * 2))
    if n <= SINGLE_TILE_THREADS * items:
        return 1
    if key_bytes >= 4:
        return 2 + math.ceil(bits / ONESWEEP_RADIX_BITS)
    return 3 * math.ceil(bits / (7 if key_bytes > 1 else 5))


def num_bits(max_key: int) -> int:
    """ATen/cuda/cub.h `get_num_bits`: the bits a radix sort of keys up to `max_key` looks at."""
    bits = 1
    while max_key > 1:
        max_key >>= 1
        bits += 1
    return bits


def sort_launches(self: torch.Tensor, dim: int) -> int:
    """aten::sort / sort.stable on CUDA. native/Sorting.cpp `sort_stable_out` copies the input into
    the values first; native/cuda/Sort.cpp `sort_cuda_kernel` then sorts a slice of at most 4,096
    in shared memory (`fillSliceWithIndex`: arange and its copy into the indices, the values' copy,
    `sortKeyValueInplace`), a longer one by cub (native/cuda/SortStable.cu
    `launch_stable_sort_kernel`): one slice, `segmented_sort_large_segments` (an index fill and a
    radix sort per slice); under 128 slices, `segmented_sort_pairs_by_full_sort` (an index-and-
    slice fill, a radix sort of the values, one of the slice numbers, a gather); more,
    `segmented_sort_pairs` (an index fill and cub's segmented sort, 6 bits a pass)."""
    if self.numel() == 0:
        return 0
    if self.dim() == 0:
        return 2  # the copy, the indices' zero
    dim = dim % self.dim()
    nsort = self.shape[dim]
    launches = 1  # sort_stable_out's values.copy_(self)
    if nsort <= SMALL_SORT_MAX:
        return launches + 4
    if not (self.is_contiguous() and self.stride(dim) == 1):
        launches += 3  # the input made dense with `dim` last, values and indices copied back
    key_bytes = self.element_size()
    segments = self.numel() // nsort
    if segments == 1 or nsort >= 1_000_000:
        return launches + 1 + segments * radix_sort_pairs(nsort, key_bytes)
    if segments < 128:
        segment_bits = max(1, math.ceil(math.log2(segments)))
        return (launches + 2 + radix_sort_pairs(self.numel(), key_bytes)
                + radix_sort_pairs(self.numel(), 8, segment_bits, value_bytes=0))
    return launches + 1 + math.ceil(8 * key_bytes / 6)


def topk_launches(self: torch.Tensor, k: int, dim: int, sorted_: bool) -> int:
    """aten::topk on CUDA: native/cuda/TensorTopK.cu `launch_gather_topk_kernel` selects with one
    kernel a slice (sbtopk::gatherTopK; a MoE router's rows of a few dozen to 256 experts), or with
    the multi-block radix select over long slices (`should_use_multiblock`: mbtopk::launch, a fill,
    three kernels per 8-bit digit, the k-th counts, two cub scans by key, the gather);
    native/cuda/TensorTopK.cpp `topk_out_cuda` then sorts the k results (`sortKeyValueInplace`,
    one kernel for k <= 4,096; a full sort, a gather and two copies beyond)."""
    if k == 0 or self.numel() == 0:
        return 0
    dim = dim % max(self.dim(), 1)
    slice_size = self.shape[dim] if self.dim() else 1
    slices = self.numel() // max(slice_size, 1)
    launches = 0 if self.is_contiguous() else 1  # input.contiguous()
    if _multiblock_topk(slices, slice_size):
        launches += 7 + 3 * self.element_size()  # a pass per 8-bit digit
    else:
        launches += 1
    if sorted_ and k > 1:
        if k <= SMALL_SORT_MAX:
            launches += 1
        else:
            values = torch.empty(slices * k, dtype=self.dtype, device="meta")
            launches += sort_launches(values, 0) - 1 + 3
    return launches


def _multiblock_topk(slices: int, size: int) -> bool:
    """native/cuda/TensorTopK.cu `should_use_multiblock` (cub with scan-by-key)."""
    return ((slices <= 20 and size >= 20000) or (20 < slices <= 40 and size >= 10000)
            or (40 < slices <= 80 and size >= 8000) or (80 < slices < 200 and size >= 5000)
            or (200 <= slices < 800 and size >= 3000) or (800 <= slices <= 4000 and size >= 800)
            or (slices > 4000 and size >= 400))


def index_put_accumulate_launches(self: torch.Tensor, indices, values: torch.Tensor, unsafe: bool) -> int:
    """An accumulating index_put on CUDA (native/TensorAdvancedIndexing.cpp `_index_put_impl_` ->
    native/cuda/Indexing.cu `index_put_with_sort_kernel`): per index tensor `wrapIndexOnce` (a
    remainder; unless unsafe, an aminmax and two `_assert_async`) and the multiply by its stride
    (`computeLinearIndex`), the divide by the slice, an arange, cub's radix sort of the linear
    indices over the bits of the largest (`get_num_bits`), and `indexing_backward_kernel` (granite:
    48 a backward, two of its three a block). Autograd's backward of `x[idx]` calls it unsafe
    (FunctionsManual.cpp `index_backward`)."""
    positions = [d for d, index in enumerate(indices) if index is not None]
    if not positions:
        return 1
    launches = 0 if self.is_contiguous() else 2  # self.contiguous(), and the copy back
    for number, d in enumerate(positions):
        index = indices[d]
        if index.dtype == torch.bool:
            return 1  # a mask (made indices by nonzero first): not a MoE's gather, not counted here
        launches += (0 if unsafe else 3) + 2 + (index.dtype != torch.int64) + (number > 0)
    num_indices = max(indices[d].numel() for d in positions)
    before = math.prod(self.shape[:positions[0]])
    slice_size = math.prod(self.shape[positions[-1] + 1:])
    if not values.is_contiguous() or values.numel() != before * num_indices * slice_size:
        launches += 1  # expandedValue.expand(...).contiguous()
    if num_indices == 0 or slice_size == 0:
        return launches
    largest = sum((size - 1) * stride for size, stride in zip(self.shape, self.stride()))
    bits = num_bits(largest // slice_size)
    return launches + 2 + radix_sort_pairs(num_indices, 8, bits) + 1


def cumsum_launches(self: torch.Tensor, dim: int, out: torch.Tensor) -> int:
    """aten::cumsum on CUDA: native/ReduceOps.cpp `impl_func_cum_ops` casts the input to the
    output's dtype; native/cuda/ScanUtils.cuh `scan_dim` scans a tensor of one slice with cub
    (`cuda::cub::inclusive_scan`: two kernels), any other along its innermost or an outer dimension
    (one kernel), after making it contiguous."""
    if self.numel() == 0 or self.dim() == 0:
        return 1
    launches = 1 if self.dtype != out.dtype else 0
    if self.numel() == self.shape[dim % self.dim()]:
        return launches + CUB_SCAN_KERNELS
    return launches + (0 if self.is_contiguous() else 1) + 1


def histc_launches(self: torch.Tensor, low: float, high: float) -> int:
    """aten::histc on CUDA (native/cuda/SummaryOps.cu `_histc_cuda_template`): the zeroed bins and
    `kernelHistogram1D`; min == max (their defaults) first reads the input's aminmax back."""
    return 2 + (1 if low == high and self.numel() else 0)


# Functional forms that copy their input and then run the in-place kernel (structured `*_out`
# kernels with `if (!self.is_same(out)) out.copy_(self)`, or CompositeExplicitAutograd
# `self.clone().op_()`): scatter, index_add, masked_fill, an index_put that does not accumulate.
COPY_THEN_IN_PLACE = frozenset({"scatter", "scatter_add", "scatter_reduce", "index_add", "index_copy",
                                "index_fill", "masked_fill", "masked_scatter", "index_put"})


def kernel_launches(func, args, kwargs, out, in_place: bool = False, backward: bool = False) -> int:
    """Kernels CUDA launches for `func` at these arguments (1 for any op not listed). `in_place`:
    the ledger ran the op's in-place form (a backward formula's); `backward`: the op comes from a
    backward formula (an accumulating index_put there is autograd's unsafe one)."""
    name = func._overloadpacket.__name__
    kwargs = kwargs or {}
    try:
        if name in ("sort", "argsort"):  # sort.stable's `stable` is keyword-only: dim is args[1] in both
            return sort_launches(args[0], kwargs.get("dim", args[1] if len(args) > 1 else -1))
        if name == "topk":
            k = args[1] if len(args) > 1 else kwargs["k"]
            dim = kwargs.get("dim", args[2] if len(args) > 2 else -1)
            sorted_ = kwargs.get("sorted", args[4] if len(args) > 4 else True)
            return topk_launches(args[0], k, dim, sorted_)
        if name in ("index_put", "index_put_", "_index_put_impl_"):
            accumulate = kwargs.get("accumulate", args[3] if len(args) > 3 else False)
            if accumulate:
                unsafe = backward or (name == "_index_put_impl_" and kwargs.get("unsafe", args[4] if len(args) > 4
                                                                              else False))
                launches = index_put_accumulate_launches(args[0], args[1], args[2], unsafe)
                return launches + (1 if name == "index_put" and not in_place else 0)  # the clone
            return 2 if name == "index_put" else 1  # the functional form's clone (the ledger runs it so too)
        if name == "cumsum":
            return cumsum_launches(args[0], args[1] if len(args) > 1 else kwargs["dim"], out)
        if name == "histc":
            low = kwargs.get("min", args[2] if len(args) > 2 else 0)
            high = kwargs.get("max", args[3] if len(args) > 3 else 0)
            return histc_launches(args[0], low, high)
        if name == "_grouped_mm":
            # native/cuda/GroupMM.cu `bf16bf16_grouped_gemm_impl_sm90_sm100`: prepare_grouped_gemm_data
            # (the per-group pointers and shapes) before CUTLASS's grouped GEMM
            return 2 if args[0].dtype == torch.bfloat16 else 1
        if name in ("slice_backward", "select_backward"):
            return 2  # native/TensorShape.cpp: at::zeros, then the gradient copied into its slice
        if name == "nll_loss_backward":
            return 2  # native/cuda/Loss.cu `nll_loss_backward_out_cuda`: grad_input.zero_() first
        if name == "constant_pad_nd":
            return 2  # native/PadNd.cpp `constant_pad_nd`: the fill, then the input copied in
        if name == "embedding_dense_backward":
            return embedding_backward_launches(args[1], kwargs.get("scale_grad_by_freq",
                                                                   args[4] if len(args) > 4 else False))
        if name in COPY_THEN_IN_PLACE and not in_place:
            return 2
    except (IndexError, KeyError, TypeError, AttributeError, ZeroDivisionError):
        return 1
    return 1


def embedding_backward_launches(indices: torch.Tensor, scale_grad_by_freq: bool) -> int:
    """native/cuda/Embedding.cu `embedding_dense_backward_cuda`: up to 3,072 indices the zeroed
    gradient and one kernel; more, an arange and a radix sort of the indices (all their bits), then
    EmbeddingBackwardKernel.cu `embedding_backward_cuda_kernel`: the zeros, cub's unique_by_key (2),
    the partial segments (2 kernels and a cub exclusive sum), the partial sums and their scatter."""
    n = indices.numel()
    if n <= 3072 and not scale_grad_by_freq:
        return 2
    sort = 1 + radix_sort_pairs(n, indices.element_size())  # the arange, the sort
    counts = 3 if scale_grad_by_freq else 0
    segments = 1 + 2 + 1 + CUB_SCAN_KERNELS + 1 + 1  # zeros, unique_by_key, partials, their sum and offsets
    return sort + counts + segments + 2  # compute_grad_weight, sum_and_scatter
