"""A CUDA reduction that splits its outputs over several thread blocks allocates a global scratch
buffer for its one launch (Reduce.cuh); its size follows the GPU's multiprocessor count. The card
records the reduction's shape and the planner sizes the buffer for the GPU it plans."""

from __future__ import annotations

import pytest

from zlayout import catalog
from zlayout.core.card import CardError, Phase, _phase
from zlayout.core.reductions import Device, Reduction, device_of, scratch_bytes

H200 = Device(132, 2048)
A100 = Device(108, 2048)
MiB = 2**20


def column_sum(outputs: int, acc_bytes: int = 4) -> Reduction:
    """A weight gradient of a norm or a bias: a sum over batch x sequence of each column of a
    contiguous (tokens, columns) tensor, the columns kept (the iterator's shape after merging)."""
    return Reduction(outputs=(0.0, 0.0, outputs), inputs=(0.0, 1.0, 0.0), fastest=False, contiguous=True,
                     reduce_dims=1, ndim=2, output_vec=4, acc_bytes=acc_bytes)


def test_a_norms_weight_gradient_holds_the_72_mib_the_h200_measured():
    # Gemma-2-2B at 2 x 2048 (h200-2026-12-13 probe_op_memory.py): each float32 RMSNorm weight
    # gradient held 72 MiB of its own; 64 blocks an output x 32 lanes x 4 outputs a lane x 2304 x 4 bytes
    buffer, semaphores = scratch_bytes(column_sum(2304), 2304, 4096, H200)
    assert buffer == 72 * MiB == 4 * 2304 * 64 * 32 * 4
    assert semaphores == 4 * 18  # one int a column of blocks: 2304 / 4 / 32


def test_the_buffer_follows_the_gpus_multiprocessors_where_they_bound_the_blocks():
    # 4096 columns over 8192 tokens: 66 blocks an output fill an H200's 132 SMs x 16 blocks, 54 an A100's 108
    assert scratch_bytes(column_sum(4096), 4096, 8192, H200)[0] == 4 * 4096 * 66 * 128
    assert scratch_bytes(column_sum(4096), 4096, 8192, A100)[0] == 4 * 4096 * 54 * 128
    # where the values per thread bound them (few tokens), every GPU makes the same
    assert scratch_bytes(column_sum(2304), 2304, 4096, A100) == scratch_bytes(column_sum(2304), 2304, 4096, H200)


def test_no_buffer_where_one_block_reduces_an_output():
    assert scratch_bytes(column_sum(4096), 4096, 512, H200) == (0, 0)  # 128 values a thread: one block
    row_mean = Reduction(outputs=(0.0, 1.0, 0.0), inputs=(0.0, 0.0, 4096.0), fastest=True, contiguous=True,
                         reduce_dims=1, ndim=2, output_vec=4, acc_bytes=4)  # RMSNorm's variance over hidden
    assert scratch_bytes(row_mean, 8192, 4096, H200) == (0, 0)
    # a damaged card's polynomial evaluated below zero is no request, not a negative one
    assert scratch_bytes(column_sum(4096), -4096, 8192, H200) == (0, 0)


def test_the_gpu_presets_carry_what_the_heuristics_read():
    assert device_of(catalog.load_gpu("h200")) == Device(132, 2048, 32)
    assert device_of(catalog.load_gpu("a100-80gb")) == Device(108, 2048, 32)
    assert device_of(catalog.load_gpu("l40s")) == Device(142, 1536, 32)
    assert device_of(catalog.load_gpu("mi300x")).warp_size == 64


def card_phase(reductions: str) -> Phase:
    return _phase("0 1000 0, 0 0 0, 0 0 0, 0 0 0, 0 0 0, 0 -1000 0", "block.backward", reductions)


def test_a_cards_phase_sizes_its_reductions_for_the_gpu_it_is_planned_on():
    phase = card_phase("1 0 0 4096 0 1 0 0 1 1 2 4 4 512")
    assert phase.net(2, 4096) == 0
    h200, a100 = phase.sizes(2, 4096, H200), phase.sizes(2, 4096, A100)
    assert h200[1:5] == [4 * 4096 * 66 * 128, 4 * 32, -4 * 32, -4 * 4096 * 66 * 128]
    assert a100[1] == 4 * 4096 * 54 * 128
    # the peak holds the scratch above the phase's own 2 x 4096 x 1000 bytes
    assert phase.net_and_peak(2, 4096, H200) == (0, 2 * 4096 * 1000 + h200[1] + h200[2])


@pytest.mark.parametrize("text, says", [
    ("9 0 0 4096 0 1 0 0 1 1 2 4 4 512", "index"),  # past the requests
    ("0 0 0 4096 0 1 0 0 1 1 2 4 4 512", "index"),  # a real request, not a placeholder
    ("1 0 0 4096 0 1 0 0 1 1 2 3 4 512", "vector size"),
    ("1 0 0 4096 0 1", "14"),
    ("1 0 0 x 0 1 0 0 1 1 2 4 4 512", "14"),
])
def test_a_damaged_reduction_is_one_line_naming_the_phase(text, says):
    with pytest.raises(CardError, match="block.backward_reductions") as caught:
        card_phase(text)
    assert says in str(caught.value)


def test_a_bias_gradient_takes_what_the_h200_traces_of_zlayouts_gpt_took():
    # w2-z0-L6-h2560 (h200-2026-12-02 traces): +132.5 MiB at fc2's bias (2560 columns), +135 at
    # fc1's (10240), 4 x 2048 tokens; the hand-written replay took 132 MiB for every shape before
    from zlayout.core.reductions import bias_gradient_scratch

    assert bias_gradient_scratch(2560, 8192, H200) == int(132.5 * MiB)
    assert bias_gradient_scratch(10240, 8192, H200) == 135 * MiB
    assert bias_gradient_scratch(10240, 8192, A100) < bias_gradient_scratch(10240, 8192, H200)
    assert bias_gradient_scratch(1024, 512, H200) == 0  # a short sequence: one block an output
