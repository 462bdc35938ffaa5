"""Communication volume per step: the ZeRO paper's rule, hand-computed volumes, the topology split."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zlayout import catalog
from zlayout.core.comm import estimate_comm, split_intra_inter, stage3_fetched_modules
from zlayout.spec import HardwareSpec, Layout, ModelSpec, PlanInput, TrainingSpec, all_layouts

MODEL = ModelSpec(name="gpt-1.9b", layers=8, hidden=4096, heads=32, vocab=32000)  # the reference GPT
P = MODEL.params  # 1,873,190,912


def make_input(gpus_per_node: int = 8, nodes: int = 1, grad_accum: int = 1,
               precision: str = "bf16", model: ModelSpec = MODEL) -> PlanInput:
    hardware = HardwareSpec(
        gpu=catalog.load_gpu("h200"), gpus_per_node=gpus_per_node, nodes=nodes,
        intra_link=catalog.load_link("nvlink4"),
        inter_link=catalog.load_link("ib-ndr") if nodes > 1 else None)
    return PlanInput(model=model, hardware=hardware,
                     training=TrainingSpec(seq=2048, micro_batch=2, grad_accum=grad_accum,
                                           precision=precision))


def test_reference_model_parameter_count():
    assert P == 1_873_190_912  # benchmarks/measurements/README.md


@pytest.mark.parametrize("stage, factor", [(0, 2), (1, 2), (2, 2), (3, 3)])
def test_zero_paper_rule_at_large_world(stage, factor):
    """ZeRO paper: stages 0-2 move 2x the parameter bytes per GPU per step, stage 3 moves 3x."""
    inp = make_input(gpus_per_node=8, nodes=128)  # n = 1024
    comm = estimate_comm(inp, Layout(stage=stage))
    param_bytes = 2 * P  # bf16
    assert comm.network_bytes / param_bytes == pytest.approx(factor, rel=2e-3)
    # and exactly the ring volume (n-1)/n for each of the `factor` passes
    assert comm.network_bytes == pytest.approx(factor * 1023 / 1024 * param_bytes, rel=1e-9)


def test_hand_computed_volumes_with_accumulation():
    """n = 4, accumulation 4, S = 2P bytes: per-GPU share (n-1)/n = 3/4 of S per pass."""
    inp = make_input(gpus_per_node=4, grad_accum=4)
    share = 0.75 * 2 * P
    assert estimate_comm(inp, Layout(stage=0)).network_bytes == pytest.approx(2 * share, abs=2)
    # stage 1: one reduce-scatter at the boundary + one all-gather after the step
    assert estimate_comm(inp, Layout(stage=1)).network_bytes == pytest.approx(2 * share, abs=2)
    # stage 2: a reduce-scatter at each of the 4 micro-steps + one all-gather
    assert estimate_comm(inp, Layout(stage=2)).network_bytes == pytest.approx(5 * share, abs=5)
    # stage 3: gather forward + gather backward + reduce-scatter, each micro-step
    assert estimate_comm(inp, Layout(stage=3)).network_bytes == pytest.approx(12 * share, abs=12)


def test_fp32_training_doubles_the_volume():
    bf16 = estimate_comm(make_input(), Layout(stage=2)).network_bytes
    fp32 = estimate_comm(make_input(precision="fp32"), Layout(stage=2)).network_bytes
    assert fp32 == pytest.approx(2 * bf16, abs=4)


def test_one_gpu_sends_nothing():
    inp = make_input(gpus_per_node=1)
    for layout in all_layouts():
        comm = estimate_comm(inp, layout)
        assert comm.network_bytes == 0 and comm.collectives == ()


def test_one_node_is_all_intra_node():
    comm = estimate_comm(make_input(gpus_per_node=8), Layout(stage=3))
    assert comm.inter_node_bytes == 0 and comm.intra_node_bytes > 0


def test_one_gpu_per_node_is_all_inter_node():
    comm = estimate_comm(make_input(gpus_per_node=1, nodes=4), Layout(stage=2))
    assert comm.intra_node_bytes == 0
    assert comm.inter_node_bytes == pytest.approx(2 * 0.75 * 2 * P, abs=2)


def test_two_nodes_of_eight_send_an_eighth_across():
    """A ring over 16 GPUs on 2 nodes: each GPU's NIC carries 1/8 of its volume."""
    comm = estimate_comm(make_input(gpus_per_node=8, nodes=2), Layout(stage=1))
    total = 2 * (15 / 16) * 2 * P
    assert comm.network_bytes == pytest.approx(total, abs=4)
    assert comm.inter_node_bytes == pytest.approx(total / 8, abs=4)


@settings(max_examples=60, deadline=None)
@given(gpus_per_node=st.integers(1, 16), nodes=st.integers(1, 8), accum=st.integers(1, 8),
       layout=st.sampled_from(all_layouts()))
def test_intra_and_inter_shares_sum_to_each_collective(gpus_per_node, nodes, accum, layout):
    comm = estimate_comm(make_input(gpus_per_node, nodes, accum), layout)
    for coll in comm.collectives:
        assert coll.intra_node_bytes + coll.inter_node_bytes == coll.bytes_per_gpu
        assert coll.intra_node_bytes >= 0 and coll.inter_node_bytes >= 0
    assert comm.intra_node_bytes == sum(c.intra_node_bytes for c in comm.collectives)
    assert comm.inter_node_bytes == sum(c.inter_node_bytes for c in comm.collectives)
    if nodes == 1:
        assert comm.inter_node_bytes == 0


def test_split_rule_directly():
    assert split_intra_inter(800, gpus_per_node=8, nodes=1) == (800, 0)
    assert split_intra_inter(800, gpus_per_node=8, nodes=2) == (700, 100)
    assert split_intra_inter(800, gpus_per_node=1, nodes=3) == (0, 800)


def test_optimizer_offload_pcie_traffic_stage2():
    """2 GPUs: each rank's gradient partition (P/2) goes down as fp32, comes back up as bf16."""
    comm = estimate_comm(make_input(gpus_per_node=2), Layout(stage=2, offload_optimizer="cpu"))
    assert comm.pcie_to_host_bytes == pytest.approx(4 * P / 2, abs=1)
    assert comm.pcie_to_gpu_bytes == pytest.approx(2 * P / 2, abs=1)
    assert comm.pcie_bytes == comm.pcie_to_host_bytes + comm.pcie_to_gpu_bytes


def test_gradient_offload_per_micro_step_from_stage_2():
    s1 = estimate_comm(make_input(gpus_per_node=2, grad_accum=4), Layout(stage=1, offload_optimizer="cpu"))
    s2 = estimate_comm(make_input(gpus_per_node=2, grad_accum=4), Layout(stage=2, offload_optimizer="cpu"))
    assert s1.pcie_to_host_bytes == pytest.approx(4 * P / 2, abs=1)
    assert s2.pcie_to_host_bytes == pytest.approx(4 * 4 * P / 2, abs=1)


def test_parameter_offload_fetches_every_micro_step():
    """Stage 3 param->cpu, 4 GPUs, accumulation 3: the bf16 partition up in fwd and bwd."""
    inp = make_input(gpus_per_node=4, grad_accum=3)
    comm = estimate_comm(inp, Layout(stage=3, offload_optimizer="cpu", offload_param="cpu"))
    assert comm.pcie_param_fetch_bytes == pytest.approx(2 * 3 * 2 * P / 4, abs=1)
    # updated on the host: what comes up besides the fetches is the gradients' round trip
    assert comm.pcie_to_gpu_bytes == comm.pcie_param_fetch_bytes + comm.pcie_grad_return_bytes
    assert comm.pcie_to_host_bytes == pytest.approx((3 * 2 + 4) * P / 4, abs=1)


def test_stage3_gradients_round_trip_through_the_host_buffer():
    """Stage 3 opt->cpu (stage3.py partition_grads): every micro-step a partition goes down into the
    host accumulation buffer (bf16) and back up; at the boundary it goes down once more as fp32.
    Batch h's profiles: 8 bytes a parameter in the backward's copies at accumulation 1."""
    inp = make_input(gpus_per_node=2, grad_accum=3)
    comm = estimate_comm(inp, Layout(stage=3, offload_optimizer="cpu"))
    assert comm.pcie_grad_return_bytes == pytest.approx(3 * 2 * P / 2, abs=1)
    assert comm.pcie_to_host_bytes == pytest.approx((3 * 2 + 4) * P / 2, abs=1)
    # the updated bf16 partition after the step, besides the round trip
    assert comm.pcie_to_gpu_bytes == pytest.approx(3 * 2 * P / 2 + 2 * P / 2, abs=1)
    one = estimate_comm(make_input(gpus_per_node=1), Layout(stage=3, offload_optimizer="cpu"))
    assert one.pcie_to_host_bytes + one.pcie_grad_return_bytes == pytest.approx(8 * P, abs=1)
    stage2 = estimate_comm(inp, Layout(stage=2, offload_optimizer="cpu"))
    assert stage2.pcie_grad_return_bytes == 0


def test_gpu_resident_layouts_use_no_pcie_or_nvme():
    for layout in (Layout(stage=0), Layout(stage=2), Layout(stage=3)):
        comm = estimate_comm(make_input(), layout)
        assert (comm.pcie_bytes, comm.nvme_read_bytes, comm.nvme_write_bytes) == (0, 0, 0)


def test_nvme_optimizer_reads_and_writes_the_node_states_once():
    """2 nodes x 4 GPUs: a node holds 4/8 of the fp32 master + moments (12 B/param)."""
    inp = make_input(gpus_per_node=4, nodes=2)
    comm = estimate_comm(inp, Layout(stage=3, offload_optimizer="nvme"))
    assert comm.nvme_read_bytes == pytest.approx(12 * P / 2, abs=1)
    assert comm.nvme_write_bytes == comm.nvme_read_bytes


def test_nvme_parameters_read_per_fetch_written_once():
    inp = make_input(gpus_per_node=4, grad_accum=2)
    both = estimate_comm(inp, Layout(stage=3, offload_optimizer="nvme", offload_param="nvme"))
    opt_only = estimate_comm(inp, Layout(stage=3, offload_optimizer="nvme"))
    assert both.nvme_read_bytes - opt_only.nvme_read_bytes == pytest.approx(2 * 2 * 2 * P, abs=2)
    assert both.nvme_write_bytes - opt_only.nvme_write_bytes == pytest.approx(2 * P, abs=2)


def test_stage3_fetches_the_large_modules():
    """Reference GPT: per layer qkv, proj, fc1, fc2 (norms are persistent) + embedding + head."""
    assert stage3_fetched_modules(make_input()) == 8 * 4 + 2


def test_stage3_optimizer_offload_brings_bf16_parameters_back():
    """Stage 3, params on the GPU: the fp32 partition is cast on the host (by PyTorch's
    cross-device copy), so 2 bytes per parameter of the partition come up after the step."""
    comm = estimate_comm(make_input(gpus_per_node=2, grad_accum=2), Layout(stage=3, offload_optimizer="cpu"))
    assert comm.pcie_to_gpu_bytes - comm.pcie_grad_return_bytes == pytest.approx(2 * P / 2, abs=1)
    assert comm.pcie_param_fetch_bytes == 0
