"""Step time: the FLOP count, monotonicity, overlap bounds, the CPU optimizer's threads, the loss."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zlayout import catalog
from zlayout.core.comm import estimate_comm
from zlayout.core.steptime import (BACKWARD_OVERLAP_P, CPU_OPTIMIZER_S_PER_PARAM_ONE_THREAD, GEMM_EFFICIENCY,
                                   HBM_EFFICIENCY, HOST_S_PER_KERNEL, KERNEL_OVERHEAD_S, LOSS_BYTES_PER_LOGIT,
                                   OVERLAP_P, STAGE3_FETCH_OVERHEAD_S, STAGE3_GRAD_HOOK_S, STEP_BASE_OVERHEAD_S,
                                   STAGE0_STEP_OVERHEAD_PER_TENSOR_S, STEP_OVERHEAD_PER_TENSOR_S,
                                   compute_flops_per_token, cpu_optimizer_s_per_param, estimate_step_time,
                                   host_floor_s, host_pass_s, matmul_params, micro_step_work, parameter_tensors,
                                   pass_s, pass_weights, phase_kernel_s, stage3_hooked_modules, stage3_hooks_s)
from zlayout.spec import HardwareSpec, Layout, ModelSpec, PlanInput, StepTimeCalibration, TrainingSpec, all_layouts

MODEL = ModelSpec(name="gpt-1.9b", layers=8, hidden=4096, heads=32, vocab=32000)


def make_input(gpus_per_node=2, nodes=1, seq=2048, micro_batch=2, grad_accum=1,
               checkpointing="none", model=MODEL, host_mem_gbps=200.0, host_cores=None) -> PlanInput:
    hardware = HardwareSpec(
        gpu=catalog.load_gpu("h200"), gpus_per_node=gpus_per_node, nodes=nodes,
        intra_link=catalog.load_link("nvlink4"),
        inter_link=catalog.load_link("ib-ndr") if nodes > 1 else None, host_mem_gbps=host_mem_gbps,
        host_cores=host_cores)
    return PlanInput(model=model, hardware=hardware,
                     training=TrainingSpec(seq=seq, micro_batch=micro_batch, grad_accum=grad_accum,
                                           checkpointing=checkpointing))


def step(inp: PlanInput, layout: Layout, **kwargs):
    return estimate_step_time(inp, layout, estimate_comm(inp, layout), **kwargs)


def test_flops_per_token_by_hand():
    """6 per matmul parameter (blocks + head, not the embedding lookup) + causal flash attention."""
    inp = make_input(seq=2048)
    blocks_and_head = 8 * (12 * 4096**2 + 13 * 4096) + 32000 * 4096
    assert matmul_params(inp) == blocks_and_head
    attention = 12 * 8 * 4096 * 2048 / 2
    assert compute_flops_per_token(inp) == pytest.approx(6 * blocks_and_head + attention)


def test_checkpointing_recomputes_the_blocks_not_the_head():
    plain = compute_flops_per_token(make_input())
    recomputed = compute_flops_per_token(make_input(checkpointing="full"))
    blocks = 8 * MODEL.layer_params()
    attention = 8 * 4096 * 2048 / 2  # 12 -> 16 times layers*hidden*seq, halved by the causal kernel
    assert recomputed - plain == pytest.approx(2 * blocks + 4 * attention)


def test_mfu_counts_six_flops_per_parameter_per_token():
    inp = make_input(gpus_per_node=1)
    est = step(inp, Layout(stage=0))
    tokens = 2048 * 2
    assert est.tokens_per_step == tokens
    assert est.mfu == pytest.approx(6 * MODEL.params * tokens / (est.step_time_s * 989e12))
    assert est.tokens_per_s == pytest.approx(tokens / est.step_time_s)
    # MFU can never beat the matmuls' achieved efficiency (plus the embedding's share)
    assert est.mfu < GEMM_EFFICIENCY * MODEL.params / matmul_params(inp)


@settings(max_examples=80, deadline=None)
@given(layout=st.sampled_from(all_layouts()), gpus=st.sampled_from([1, 2, 8]),
       seq=st.integers(256, 8192), micro=st.integers(1, 8), accum=st.integers(1, 8),
       which=st.sampled_from(["seq", "micro", "accum"]))
def test_step_time_grows_with_tokens(layout, gpus, seq, micro, accum, which):
    base = make_input(gpus_per_node=gpus, seq=seq, micro_batch=micro, grad_accum=accum)
    bigger = {"seq": make_input(gpus_per_node=gpus, seq=seq + 256, micro_batch=micro, grad_accum=accum),
              "micro": make_input(gpus_per_node=gpus, seq=seq, micro_batch=micro + 1, grad_accum=accum),
              "accum": make_input(gpus_per_node=gpus, seq=seq, micro_batch=micro, grad_accum=accum + 1)}[which]
    small, large = step(base, layout), step(bigger, layout)
    if layout.stage == 3 and which != "accum":
        # a pass bound by ZeRO-3's hooks (host time per module, not per token) takes as long with
        # more tokens, until the kernels outgrow the hooks
        assert large.step_time_s >= small.step_time_s * (1 - 1e-12)
    else:
        assert large.step_time_s > small.step_time_s
    assert large.tokens_per_step > small.tokens_per_step


def test_parameter_tensors_of_the_reference_gpt():
    """8 blocks x (qkv, proj, fc1, fc2 weights and biases + two LayerNorms' weight and bias) = 96,
    plus the embedding, the untied head and the final LayerNorm's two tensors."""
    assert parameter_tensors(make_input()) == 96 + 1 + 1 + 2


@settings(max_examples=60, deadline=None)
@given(layout=st.sampled_from(all_layouts()), gpus=st.sampled_from([1, 2, 4, 8]),
       nodes=st.sampled_from([1, 2, 4]), accum=st.integers(1, 4))
def test_parts_add_up_and_exposed_comm_is_bounded(layout, gpus, nodes, accum):
    inp = make_input(gpus_per_node=gpus, nodes=nodes, grad_accum=accum)
    est = step(inp, layout)
    assert 0 <= est.comm_s <= est.comm_total_s + 1e-12
    # stage 3 steps flat sub-groups, not tensor by tensor, but launches its gradient norm per tensor
    tensors = 1 if layout.stage == 3 else parameter_tensors(inp)
    if layout.stage == 0 and layout.offload_optimizer == "gpu":  # FP16_Optimizer: per tensor, no fixed part
        overhead = STAGE0_STEP_OVERHEAD_PER_TENSOR_S * tensors
    else:
        overhead = (STEP_BASE_OVERHEAD_S + STEP_OVERHEAD_PER_TENSOR_S * tensors
                    + HOST_S_PER_KERNEL * (2 * parameter_tensors(inp) if layout.stage == 3 else 0))
    assert est.step_overhead_s == pytest.approx(overhead)
    assert est.step_time_s == pytest.approx(est.compute_s + est.launch_overhead_s + overhead + est.gpu_optimizer_s
                                            + est.host_overhead_s + est.comm_s + est.offload_s)
    assert est.offload_s == pytest.approx(est.cpu_optimizer_s + est.pcie_s + est.nvme_s)
    assert 0 < est.mfu < 1


def test_stage0_all_reduce_is_not_hidden():
    est = step(make_input(gpus_per_node=8), Layout(stage=0))
    assert est.comm_s == pytest.approx(est.comm_total_s)


def test_overlap_comm_hides_stage2_reduction():
    inp = make_input(gpus_per_node=8)
    overlapped = step(inp, Layout(stage=2))
    serial_inp = inp.model_copy(update={"zero": inp.zero.model_copy(update={"overlap_comm": False})})
    serial = step(serial_inp, Layout(stage=2))
    assert serial.comm_s == pytest.approx(serial.comm_total_s)
    assert overlapped.comm_s < serial.comm_s


def test_crossing_nodes_is_slower_than_nvlink():
    one_node = step(make_input(gpus_per_node=16), Layout(stage=3))
    two_nodes = step(make_input(gpus_per_node=8, nodes=2), Layout(stage=3))
    assert two_nodes.comm_total_s > one_node.comm_total_s


def test_cpu_optimizer_bound_by_host_bandwidth_when_many_ranks_share_it():
    layout = Layout(stage=2, offload_optimizer="cpu")
    slow_host = step(make_input(host_mem_gbps=50, host_cores=64), layout)
    slower_host = step(make_input(host_mem_gbps=25, host_cores=64), layout)
    assert slower_host.cpu_optimizer_s == pytest.approx(2 * slow_host.cpu_optimizer_s)
    one_thread = step(make_input(host_mem_gbps=400, host_cores=64), layout, cpu_threads_per_rank=1)
    assert one_thread.cpu_optimizer_s > step(make_input(host_mem_gbps=400, host_cores=64), layout).cpu_optimizer_s


def test_cpu_optimizer_by_hand_on_one_thread():
    """One rank, one thread, ample host bandwidth: the partition times one thread's s/param."""
    inp = make_input(gpus_per_node=1, host_mem_gbps=10_000, host_cores=1)
    est = step(inp, Layout(stage=2, offload_optimizer="cpu"))
    assert est.cpu_threads_per_rank == 1
    assert est.cpu_optimizer_s == pytest.approx(MODEL.params * CPU_OPTIMIZER_S_PER_PARAM_ONE_THREAD)


def test_threads_per_rank_are_the_cores_shared_by_the_ranks():
    layout = Layout(stage=2, offload_optimizer="cpu")
    assert step(make_input(gpus_per_node=8, host_cores=112), layout).cpu_threads_per_rank == 14
    assert step(make_input(gpus_per_node=2, host_cores=3), layout).cpu_threads_per_rank == 1
    # without --host-cores: the GPU preset's cores per GPU (H200: a DGX's 112 cores / 8)
    assert step(make_input(gpus_per_node=1), layout).cpu_threads_per_rank == 14
    assert make_input(gpus_per_node=8).hardware.node_host_cores == 112


@settings(max_examples=40, deadline=None)
@given(cores=st.integers(1, 256), gpus=st.sampled_from([1, 2, 4, 8]))
def test_more_cores_never_slow_the_cpu_optimizer(cores, gpus):
    layout = Layout(stage=3, offload_optimizer="cpu", offload_param="cpu")
    fewer = step(make_input(gpus_per_node=gpus, host_cores=cores, host_mem_gbps=500), layout)
    more = step(make_input(gpus_per_node=gpus, host_cores=cores + gpus, host_mem_gbps=500), layout)
    assert more.cpu_optimizer_s <= fewer.cpu_optimizer_s


def test_the_scaling_curve_saturates():
    """Doubling the threads helps less and less: the threads share the memory bus."""
    speedups = [cpu_optimizer_s_per_param(1) / cpu_optimizer_s_per_param(t) for t in (1, 2, 4, 8, 16, 32, 64)]
    gains = [b / a for a, b in zip(speedups, speedups[1:])]
    assert all(g > 1 for g in gains)
    assert all(later < earlier for earlier, later in zip(gains, gains[1:]))
    assert speedups[-1] < 10


def test_the_large_vocabulary_loss_is_priced():
    """The softmax/cross-entropy passes over tokens x vocab, by hand, and a larger vocabulary costs more."""
    small = ModelSpec(layers=4, hidden=2048, heads=16, vocab=32000)
    large = small.model_copy(update={"vocab": 256000})
    est = step(make_input(gpus_per_node=1, seq=4096, micro_batch=4, model=large), Layout(stage=0))
    hbm_bytes_per_s = 4800e9 * HBM_EFFICIENCY
    assert est.loss_s == pytest.approx(LOSS_BYTES_PER_LOGIT * 4 * 4096 * 256000 / hbm_bytes_per_s)
    assert est.loss_s < est.compute_s
    assert est.step_time_s > step(make_input(gpus_per_node=1, seq=4096, micro_batch=4, model=small),
                                  Layout(stage=0)).step_time_s + est.loss_s * 0.8


def test_calibration_scales_each_group():
    inp = make_input(gpus_per_node=2)
    layout = Layout(stage=3, offload_optimizer="cpu")
    base = step(inp, layout)
    doubled = step(inp.model_copy(update={"calibration": StepTimeCalibration(cpu_optimizer_factor=2.0,
                                                                              overhead_factor=3.0)}), layout)
    assert doubled.cpu_optimizer_s == pytest.approx(2 * base.cpu_optimizer_s)
    assert doubled.step_overhead_s == pytest.approx(3 * base.step_overhead_s)
    # the hooks' host time triples; what the kernels leave exposed grows at least as much
    assert doubled.host_overhead_s >= 3 * base.host_overhead_s - 1e-12
    assert doubled.host_overhead_s > base.host_overhead_s
    assert doubled.compute_s == pytest.approx(base.compute_s)
    gpu = step(inp.model_copy(update={"calibration": StepTimeCalibration(gpu_factor=0.5)}), layout)
    assert gpu.compute_s == pytest.approx(0.5 * base.compute_s)
    assert gpu.gpu_optimizer_s == pytest.approx(0.5 * base.gpu_optimizer_s)


def test_offload_costs_time():
    inp = make_input(gpus_per_node=8)
    assert step(inp, Layout(stage=2, offload_optimizer="cpu")).step_time_s > step(inp, Layout(stage=2)).step_time_s
    assert (step(inp, Layout(stage=3, offload_optimizer="nvme")).step_time_s
            > step(inp, Layout(stage=3, offload_optimizer="cpu")).step_time_s)


def test_stage3_backward_copies_fetches_up_while_gradients_go_down():
    """ZeRO-3 opt->cpu on one GPU, 128 tokens (nothing hides a copy): the gradients go down
    (bf16 into the host buffer, fp32 at the boundary: 6 B/param) and 2 B/param come back on the
    reduce stream; with the weights on the host too, their fetches come up on the all-gather stream
    at the same time, each direction at its own rate, so the backward's copies take no longer: the
    2 B/param the weights' updated partition no longer sends up after the step is what the forward's
    fetch costs."""
    tiny = ModelSpec(name="wide", layers=2, hidden=8192, heads=64, vocab=32000)
    inp = make_input(gpus_per_node=1, seq=128, micro_batch=1, model=tiny)
    on_gpu = step(inp, Layout(stage=3, offload_optimizer="cpu"))
    on_host = step(inp, Layout(stage=3, offload_optimizer="cpu", offload_param="cpu"))
    bytes_per_s = inp.hardware.gpu.pcie_gbps * 1e9
    assert on_gpu.pcie_s == pytest.approx((8 + 2) * tiny.params / bytes_per_s, rel=0.05)  # a little hides
    assert on_host.pcie_s == pytest.approx(on_gpu.pcie_s, rel=0.02)


def test_measured_rows_in_the_repository():
    """Every H200 row in benchmarks/measurements/ (two hosts, 32 and 16 cores; all in-sample since
    the constants were refitted on both): within 25%, the steady steps (the third on where there
    are three). GPU-resident rows sit within 17% but two ZeRO-3 rows on 2 GPUs: L8 h4096 b2 (-26%,
    allowed 30% here) and L16 h3072 b2 ckpt (-21%). With 2 GPUs the host waits on the all-gathers,
    at most two fetches ahead, so its hooks hide less than the model's hooks-or-kernels pass says."""
    import sys
    from pathlib import Path

    benchmarks = Path(__file__).resolve().parents[2] / "benchmarks"
    sys.path.insert(0, str(benchmarks))
    from measurements import load_measured

    rows = [m for m in load_measured(with_memory=False)
            if m.steady_step_s and (benchmarks / "measurements" / m.source).exists()]
    assert {m.host for m in rows} == {"h200-32core", "h200-16core"}
    for m in rows:
        predicted = step(m.inp, m.layout, cpu_threads_per_rank=m.cpu_threads_per_rank).step_time_s
        offloaded = "cpu" in (m.layout.offload_optimizer, m.layout.offload_param)
        worst = (m.layout.stage == 3 and m.row["world"] == 2 and m.inp.model.layers == 8
                 and m.inp.training.micro_batch == 2 and m.layout.offload_optimizer == "gpu")
        assert predicted == pytest.approx(m.steady_step_s, rel=0.3 if worst else 0.25), (m.label, m.host, offloaded)


def test_stage3_hooks_run_ahead_of_the_kernels():
    """A ZeRO-3 pass takes a smooth maximum of its kernels and its host side (the host floor and the
    hooks, which never wait on the compute stream): a short-sequence model waits on its hooks, a
    long one hides them."""
    z3 = Layout(stage=3)
    for seq, micro, hooks_longer in ((256, 1, True), (8192, 8, False)):
        inp = make_input(gpus_per_node=1, seq=seq, micro_batch=micro)
        est = step(inp, z3)
        fwd, bwd = micro_step_work(inp, z3)
        for work, measured, p in ((fwd, est.forward_s, OVERLAP_P), (bwd, est.backward_s, BACKWARD_OVERLAP_P)):
            gpu_s = phase_kernel_s(inp, work) + work.kernels * KERNEL_OVERHEAD_S
            host_s = host_pass_s(inp, work)
            assert host_s == pytest.approx(host_floor_s(work) + stage3_hooks_s(inp, work))
            assert (host_s > gpu_s) == hooks_longer
            assert measured == pytest.approx(pass_s(gpu_s, host_s, p))
            assert max(gpu_s, host_s) < measured < max(gpu_s, host_s) * 2 ** (1 / p) + 1e-12
        assert est.host_overhead_s > 0


def test_a_pass_is_a_smooth_maximum_of_its_two_sides():
    """Equal sides take 2^(1/p) times one (where the queue's lead wanders most); a side a tenth of
    the other adds almost nothing; the pass is its weights times its sides (what the fit uses)."""
    assert pass_s(1.0, 1.0) == pytest.approx(2 ** (1 / OVERLAP_P))
    assert pass_s(1.0, 0.1) == pytest.approx(1.0, rel=0.002)
    assert pass_s(0.1, 1.0) == pytest.approx(1.0, rel=0.002)
    assert pass_s(1.0, 0.0) == 1.0 and pass_s(0.0, 0.0) == 0.0
    assert pass_s(0.4, 0.3, float("inf")) == 0.4
    for gpu_s, host_s in ((0.04, 0.039), (0.3, 0.01), (1e-4, 0.05)):
        w_gpu, w_host = pass_weights(gpu_s, host_s, OVERLAP_P)
        assert w_gpu * gpu_s + w_host * host_s == pytest.approx(pass_s(gpu_s, host_s))


SMALL_HF = ModelSpec(name="hf-l32-h1024", layers=32, hidden=1024, heads=8, ffn=2816, vocab=32000, mlp="swiglu",
                     norm="rmsnorm", bias=False, tie_embeddings=True)


def test_a_small_transformers_model_waits_on_its_host():
    """Issue 13's host floor: transformers' L32 h1024 at 128 tokens a micro-step, where its kernels
    take microseconds, measured 39 ms forward and 75 ms backward (ZeRO-0, one H200, 16 cores); the
    launches alone priced it at 3 and 7 ms. Its forward is at least the host's time, and at 8192
    tokens (vocabulary 151936), where the GPU's kernels and the host take about as long, longer
    than either."""
    hf = TrainingSpec(seq=128, micro_batch=1, impl="hf")
    inp = make_input(gpus_per_node=1, model=SMALL_HF).model_copy(update={"training": hf})
    est = step(inp, Layout(stage=0))
    fwd, bwd = micro_step_work(inp, Layout(stage=0))
    assert est.forward_s >= host_floor_s(fwd) > 0.035
    assert est.backward_s >= host_floor_s(bwd) > 0.065
    long = inp.model_copy(update={"training": hf.model_copy(update={"seq": 4096, "micro_batch": 2}),
                                  "model": SMALL_HF.model_copy(update={"vocab": 151936})})  # held-out batch 3's
    est = step(long, Layout(stage=0))
    fwd, _ = micro_step_work(long, Layout(stage=0))
    gpu_s = phase_kernel_s(long, fwd)
    assert 0.7 < host_floor_s(fwd) / gpu_s < 1.3
    assert est.forward_s > 1.2 * max(gpu_s, host_floor_s(fwd))  # measured: 56 ms, GPU busy 44, host 39


def test_the_host_floor_rows_are_the_hosts_time():
    """The five host-floor rows (benchmarks/measurements/h200-2026-12-02/hostfloor-results.jsonl), read
    as calibrate reads them: the forward and backward each within 15% of what verify timed (the
    constants were measured on them; the host's own steps spread 10-20%), the step within 10%."""
    from pathlib import Path

    from zlayout.profile.calibration import read_results

    path = Path(__file__).resolve().parents[2] / "benchmarks/measurements/h200-2026-12-02/hostfloor-results.jsonl"
    rows, skipped = read_results([path], default_host_cores=16)
    assert len(rows) == 5 and not skipped
    for row in rows:
        est = step(row.inp, row.layout, cpu_threads_per_rank=row.cpu_threads_per_rank)
        fwd, bwd, _ = row.phases_s
        assert est.forward_s == pytest.approx(fwd, rel=0.15), row.label
        assert est.backward_s == pytest.approx(bwd, rel=0.15), row.label
        assert est.step_time_s == pytest.approx(row.measured_step_s, rel=0.10), row.label


def test_a_moe_blocks_experts_are_not_on_the_host_floor():
    """moe_block_bench timed a MoE block whole (its host's time with it: MOE_ROUTING_FIXED_S), so the
    host floor prices a MoE layer's attention half only; a dense layer's kernels all count."""
    moe = SMALL_HF.model_copy(update={"layers": 8, "experts": 8, "top_k": 2, "tie_embeddings": False})
    hf = TrainingSpec(seq=2048, micro_batch=4, impl="hf")
    for model, fewer in ((SMALL_HF, False), (moe, True)):
        inp = make_input(gpus_per_node=1, model=model).model_copy(update={"training": hf})
        for work in micro_step_work(inp, Layout(stage=2)):
            assert (work.host_kernels < work.kernels) == fewer


def test_stage3_hooks_counted_per_module_and_per_gradient():
    """Forward: one fetch per hooked module; backward: again (twice with checkpointing's recompute)
    and one gradient hook per parameter tensor. Other stages have none."""
    for ckpt in ("none", "full"):
        inp = make_input(gpus_per_node=1, checkpointing=ckpt)
        fwd, bwd = micro_step_work(inp, Layout(stage=3))
        modules = stage3_hooked_modules(inp)
        assert fwd.stage3_fetches == modules and fwd.stage3_grad_hooks == 0
        assert bwd.stage3_fetches == modules * (2 if ckpt == "full" else 1)
        assert bwd.stage3_grad_hooks == parameter_tensors(inp)
        assert stage3_hooks_s(inp, bwd) == pytest.approx(bwd.stage3_fetches * STAGE3_FETCH_OVERHEAD_S
                                                         + parameter_tensors(inp) * STAGE3_GRAD_HOOK_S)
        for work in micro_step_work(inp, Layout(stage=2)):
            assert work.stage3_fetches == work.stage3_grad_hooks == 0


def test_stage3_gathers_nothing_on_one_gpu():
    """On one GPU a ZeRO-3 fetch points the parameter at its partition (the whole tensor): no copy,
    so its passes move the bytes stage 2's do plus the fp32 gradient partition; with two GPUs each
    pass also splits the gathered buffer into the parameters (r2 w2 per parameter)."""
    params = MODEL.params
    for gpus, gathered in ((1, 0.0), (2, 4 * params)):
        inp = make_input(gpus_per_node=gpus)
        z2_fwd, z2_bwd = micro_step_work(inp, Layout(stage=2))
        z3_fwd, z3_bwd = micro_step_work(inp, Layout(stage=3))
        assert z3_fwd.hbm_bytes - z2_fwd.hbm_bytes == pytest.approx(gathered)
        assert z3_bwd.hbm_bytes - z2_bwd.hbm_bytes == pytest.approx(gathered + 6 * params / gpus)


def test_stage3_step_launches_its_gradient_norm_per_tensor():
    """Stage 3 steps flat sub-groups (one tensor's Python) but get_grad_norm_direct runs two kernels
    per gradient (double, norm): its step overhead grows with the tensors at the host floor's rate."""
    from zlayout.core.steptime import optimizer_kernels

    inp = make_input(gpus_per_node=1)
    assert optimizer_kernels(inp, Layout(stage=3)) == 2 * parameter_tensors(inp)
    assert optimizer_kernels(inp, Layout(stage=2)) == 0
    est = step(inp, Layout(stage=3))
    assert est.step_overhead_s == pytest.approx(STEP_BASE_OVERHEAD_S + STEP_OVERHEAD_PER_TENSOR_S
                                                + 2 * parameter_tensors(inp) * HOST_S_PER_KERNEL)


def test_stage0_optimizer_is_fp16_optimizers_per_tensor_walk():
    """ZeRO-0 steps through DeepSpeed's FP16_Optimizer, which checks, casts and copies back each
    parameter tensor with a host sync per tensor (fused_optimizer.py step(), utils.has_overflow_serial):
    its optimizer overhead is STAGE0_STEP_OVERHEAD_PER_TENSOR_S per tensor with no fixed part, and a
    transformers layout with more (smaller) tensors pays more than stages 1-2's rate would price."""
    per_tensor_s = STAGE0_STEP_OVERHEAD_PER_TENSOR_S
    assert per_tensor_s > STEP_OVERHEAD_PER_TENSOR_S  # a sync and 14 launches per tensor vs bookkeeping
    inp = make_input(gpus_per_node=1)
    more = make_input(gpus_per_node=1, model=MODEL.model_copy(update={"layers": 2 * MODEL.layers}))
    added = parameter_tensors(more) - parameter_tensors(inp)
    assert added > 0
    grown = step(more, Layout(stage=0)).step_overhead_s - step(inp, Layout(stage=0)).step_overhead_s
    assert grown == pytest.approx(added * per_tensor_s)
    assert step(inp, Layout(stage=0)).step_overhead_s == pytest.approx(parameter_tensors(inp) * per_tensor_s)
    # stages 1-2 keep the ZeRO optimizer's fixed part and their own rate
    assert step(inp, Layout(stage=2)).step_overhead_s == pytest.approx(
        STEP_BASE_OVERHEAD_S + STEP_OVERHEAD_PER_TENSOR_S * parameter_tensors(inp))


def test_a_moe_model_cut_to_its_dense_blocks_moves_the_dense_mlps_activations():
    """The hand model's elementwise work per token: a dense block moves its MLP's activations, a MoE
    block its top-k experts'. A MoE model cut to its dense blocks (DeepSeek's first three) moves what
    the dense model does, and one of its two blocks dense, half of each."""
    from zlayout.core.steptime import _elementwise_bytes_per_token

    shape = dict(layers=2, hidden=1024, heads=8, vocab=32000, ffn=4096, mlp="swiglu")
    dense = ModelSpec(name="dense", **shape)
    moe = dict(experts=8, top_k=2, expert_ffn=512)
    cut = ModelSpec(name="moe-cut", dense_layers=(0, 1), **moe, **shape)
    half = ModelSpec(name="moe-half", dense_layers=(0,), **moe, **shape)
    routed = ModelSpec(name="moe", **moe, **shape)
    fwd = {m.name: _elementwise_bytes_per_token(make_input(model=m))[0] for m in (dense, cut, half, routed)}
    assert fwd["moe-cut"] == fwd["dense"]
    # swiglu: 10 bytes per MLP activation element; the dense MLP's 4096 against two experts' 2 x 512
    assert fwd["dense"] - fwd["moe"] == 2 * 10 * (4096 - 2 * 512)
    assert fwd["moe-half"] == (fwd["dense"] + fwd["moe"]) / 2
