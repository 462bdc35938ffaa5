"""The global scratch a CUDA reduction kernel asks the caching allocator for, from PyTorch's source.

A reduction whose outputs are few and whose inputs per output are many (a norm's weight gradient,
a bias's: a sum over batch x sequence of every hidden column) splits each output over several
thread blocks. They meet in a global buffer that `gpu_reduce_kernel` allocates through the caching
allocator for the one kernel, with a semaphore array beside it, and frees on return
(aten/src/ATen/native/cuda/Reduce.cuh: `setReduceConfig`, `ReduceConfig::global_memory_size`,
`semaphore_size`; torch 2.x). How many blocks share an output follows the launch heuristics, which
read the GPU's multiprocessor count, so the card records the reduction's shape (`Reduction`, from
`zlayout.learn.trace`) and the planner sizes the buffer for the GPU it plans (`scratch_bytes`).

Measured on the H200 (h200-2026-12-13 probe_op_memory.py, Gemma-2-2B at 2 x 2048): each RMSNorm's
weight gradient, a float32 sum over 4096 tokens of 2304 columns, holds 72 MiB of its own during
the sum; this port gives 75,497,472 bytes (4 bytes x 2304 outputs x 64 blocks an output x 32
threads x 4 outputs a thread), and the allocator trace shows the request there, in every block.
"""

from __future__ import annotations

from typing import NamedTuple


class Device(NamedTuple):
    """What the launch heuristics read of the GPU (cudaDeviceProp)."""

    multiprocessors: int
    max_threads_per_multiprocessor: int
    warp_size: int = 32


class Reduction(NamedTuple):
    """A reduction kernel's TensorIterator as `setReduceConfig` reads it, after the iterator has
    put the reduced dimensions first and merged what it can. `outputs` and `inputs` (inputs per
    output) are the card's polynomials in one sequence's tokens (core.card.bytes_at); the rest
    does not change with the tokens."""

    outputs: tuple[float, float, float]
    inputs: tuple[float, float, float]
    fastest: bool  # the reduced dimension is the input's fastest-moving one
    contiguous: bool  # that fastest-moving stride is one element
    reduce_dims: int  # iter.num_reduce_dims()
    ndim: int  # iter.ndim(): 0 for a reduction of a single element
    output_vec: int  # get_output_vec_size (1, 2 or 4): outputs a thread writes, from alignment
    acc_bytes: int  # sizeof(arg_t): the accumulator (float for a bfloat16 or float32 sum)
    max_threads: int = 512  # mnt_wrapper<scalar_t>::MAX_NUM_THREADS (256 only for complex double)


# The requests a reduction's scratch makes, in the card's order (`gpu_reduce_kernel`: the buffer,
# then the semaphores; freed in reverse as the kernel's launcher returns)
REDUCTION_EVENTS = 4

# Reduce.cuh: a reduction on the fastest dimension reads vt0 = 4 inputs a load (input_vec_size)
INPUT_VEC_SIZE = 4
MIN_VALUES_PER_THREAD = 16
MAX_VALUES_PER_THREAD = 256


def _div_up(a: int, b: int) -> int:
    return -(-a // b)


def _last_pow2(dim: int, cap: int) -> int:
    """`dim < cap ? last_pow2(dim) : cap`: the largest power of two not above dim, at most cap."""
    while cap > 1 and dim < cap:
        cap //= 2
    return cap


def scratch_bytes(reduction: Reduction, outputs: int, inputs: int, device: Device) -> tuple[int, int]:
    """(global buffer, semaphores) in bytes that the reduction's kernel allocates on `device`
    for `outputs` outputs of `inputs` inputs each; (0, 0) where its blocks do not share outputs."""
    r = reduction
    if outputs < 1 or inputs < 1:  # nothing to reduce (or a damaged card's polynomial below zero)
        return 0, 0
    if r.ndim > 0:
        dim0, dim1 = (inputs, outputs) if r.fastest else (outputs, inputs)
        fastest = r.fastest
    else:
        dim0 = dim1 = 1
        fastest = True
    output_vec = 1
    if r.contiguous:
        if fastest and dim0 >= 128 and r.reduce_dims == 1:
            dim0 //= INPUT_VEC_SIZE
        elif not fastest:
            output_vec = r.output_vec
            dim0 //= output_vec
    # set_block_dimension
    max_threads = r.max_threads // output_vec
    dim0_pow2, dim1_pow2 = _last_pow2(dim0, max_threads), _last_pow2(dim1, max_threads)
    block_width = min(dim0_pow2, device.warp_size)
    block_height = min(dim1_pow2, max_threads // block_width)
    block_width = min(dim0_pow2, max_threads // block_height)
    threads = block_width * block_height
    step_input = step_output = 1
    block_x_reduce = r.ndim == 0 or fastest  # input_mult[BLOCK_X]: the block's lanes share an output
    if block_x_reduce:
        step_input *= block_width
    else:
        step_output *= block_width
    split_across_warps = _div_up(inputs, step_input) >= min(block_height * 16, MAX_VALUES_PER_THREAD)
    if split_across_warps:
        step_input *= block_height
    else:
        step_output *= block_height
    target_grid = device.multiprocessors * (device.max_threads_per_multiprocessor // threads)
    grid_x = _div_up(outputs // output_vec, step_output)
    values_per_thread = _div_up(inputs, step_input)
    if not (split_across_warps and values_per_thread >= MAX_VALUES_PER_THREAD and grid_x <= target_grid):
        return 0, 0
    # as many blocks an output as fill the GPU, each thread left 16 to 256 values
    ctas = max(_div_up(values_per_thread, MAX_VALUES_PER_THREAD),
               min(_div_up(target_grid, grid_x), _div_up(values_per_thread, MIN_VALUES_PER_THREAD)))
    if ctas <= 1:
        return 0, 0
    size = r.acc_bytes * outputs * ctas
    if not block_x_reduce:
        size *= block_width * output_vec
    return size, 4 * grid_x  # sizeof(int) a column of blocks


def bias_gradient_scratch(outputs: int, tokens: int, device: Device) -> int:
    """The buffer a bias's gradient takes on `device`: a bf16 or float32 gradient of `tokens` rows
    of `outputs` contiguous columns summed over the rows, in float32 (a Linear's AddmmBackward0).
    zlayout's GPT's biased Linears, which the hand-written replay writes: on the H200 the traces
    took 132.0 to 136.0 MiB, this function's figures (132.5 MiB at 2560 columns, 135.0 at 10240)."""
    output_vec = 4 if outputs % 4 == 0 else 2 if outputs % 2 == 0 else 1
    column_sum = Reduction(outputs=(0.0, 0.0, float(outputs)), inputs=(0.0, 1.0, 0.0), fastest=False,
                           contiguous=True, reduce_dims=1, ndim=2, output_vec=output_vec, acc_bytes=4)
    return scratch_bytes(column_sum, outputs, tokens, device)[0]


def device_of(gpu) -> Device:
    """The launch heuristics' view of a `spec.GpuSpec`."""
    return Device(gpu.multiprocessors, gpu.max_threads_per_multiprocessor, gpu.warp_size)
