"""Step time per layout: compute from FLOPs, the communication that cannot hide, the offload.

A roofline-style model with a handful of constants, each calibrated on the H200 measurements
(`benchmarks/steptime_accuracy.py` prints the error on every measured layout):

- Compute: matmul FLOPs (6 per parameter per token, 8 with full checkpointing's recompute)
  over the GPU's peak times the GEMMs' achieved efficiency, plus attention's (12*layers*
  hidden*seq per token for forward+backward, 16 recomputed; the causal flash kernel skips
  the masked half of the blocks) at the attention kernels' (much lower) achieved efficiency,
  plus a time per step for DeepSpeed's engine and the Python around the kernels (a fixed part
  and a part per parameter tensor).
- Transformers classes (`impl = "hf"`): their unfused RMSNorm and rotary kernels, priced by
  the HBM bytes they move; their MoE blocks' Python loop over the experts, a time per visit.
- The GPU-side optimizer and gradient bookkeeping: memory-bound passes over HBM, at the
  (lower) rate the optimizer's kernels reach.
- Communication: each collective's bytes over the bus bandwidth of the link it crosses
  (intra- vs inter-node, the slower share paces the ring), plus a latency per ring step.
  What overlaps: stage 1-3 gradient reductions run in the backward hooks on a side stream
  with overlap_comm, hidden behind the backward pass except the last bucket; stage 3's
  prefetch hides part of the parameter all-gathers behind forward and backward; stage 0's
  all-reduce and stage 1-2's post-step all-gather are fully exposed.
- Stage 3's per-module hooks (fetch, release, partition) cost a fixed time per fetch, in each
  pass (forward, backward, and the recompute's forward with checkpointing).
- The large-vocabulary loss: the head's logits matmul is in the FLOPs (6 per head parameter
  per token, never recomputed: checkpointing wraps the blocks); the softmax/cross-entropy
  passes over tokens x vocab (a bf16 slice copy, the fp32 cast, log-softmax and its backward)
  are memory-bound: bytes per logit over HBM bandwidth.
- Offload: PCIe copies at the GPU's achieved host<->device bandwidth (gradients going down
  overlap with backward, parameters coming up after the step do not); the CPU optimizer
  step (DeepSpeedCPUAdam plus gradient clipping and the fp32->bf16 cast) per parameter at
  one thread, over the threads each rank runs with (cores per node / ranks per node, as
  the launchers zlayout writes set OMP_NUM_THREADS) on a measured scaling curve, and never
  faster than the node's host memory bandwidth shared by its GPUs allows; NVMe reads and
  writes at the node's NVMe bandwidth, not overlapped.
- A calibration (`PlanInput.calibration`, from `zlayout calibrate`) scales the four groups
  of parts: GPU kernels, Python overheads, the CPU optimizer, exposed transfers.
"""

from __future__ import annotations

from dataclasses import dataclass

from zlayout.core.comm import Collective, CommEstimate, estimate_comm, stage3_fetched_modules
from zlayout.core.memory import layer_tensor_sizes
from zlayout.spec import Layout, LinkSpec, PlanInput

# Fitted on every measured H200 row of both hosts (benchmarks/steptime_accuracy.py; docs/tradeoffs.md).
GPU_MATMUL_EFFICIENCY = 0.68  # achieved / peak bf16 FLOP/s of the dense layers' GEMMs, fwd+bwd
GPU_ATTENTION_EFFICIENCY = 0.195  # the same for causal SDPA (on its halved FLOP count), fwd+bwd
# Per optimizer step, DeepSpeed's engine runs Python around the kernels: a fixed part, and a part
# per parameter tensor (gradient hooks, bookkeeping, norms). A flat 32 ms missed a 2-layer
# model by 36%. Refitted (issue 13) with the GPU optimizer at its own HBM rate: its per-parameter
# cost no longer hides in the per-tensor part.
STEP_BASE_OVERHEAD_S = 0.0016
STEP_OVERHEAD_PER_TENSOR_S = 0.18e-3
HBM_EFFICIENCY = 0.8  # achieved / nominal HBM bandwidth of large streaming kernels (the loss's passes)
GPU_OPTIMIZER_BYTES_PER_PARAM = 42  # fused Adam r/w of fp32 master+moments, grad read, bf16 write, clip
# The GPU optimizer step's kernels (grad norm, clip, multi-tensor Adam in chunks, fp32->bf16 copy)
# reach well under the streaming rate: verify's optimizer_s on the 16-core host grows 19.6 ms per
# billion parameters at ZeRO-0 (vocab sweep, 48 modelled bytes/param) and 24-26 ms at ZeRO-2.
GPU_OPTIMIZER_HBM_EFFICIENCY = 0.49
# Transformers classes run elementwise work zlayout's GPT fuses (its RMSNorm is torch's fused
# rms_norm; it has no rotary). Bytes per element, forward+backward, bf16 activations:
# LlamaRMSNorm-style norms upcast to fp32 and run ~6 kernels (x.float r2 w4, pow r4 w4, mean r4,
# rsqrt-mul r4 w4, .to(bf16) r4 w2, weight-mul r2 w2: ~40 forward, ~2x backward) where the fused
# kernel moves ~12: 108 more per element of hidden, per norm; rotary (q*cos, rotate_half's slice,
# neg and cat, *sin, add: ~20 forward, ~40 backward) on the queries' and keys' widths.
HF_RMSNORM_BYTES_PER_ELEMENT = 108
HF_ROPE_BYTES_PER_ELEMENT = 60
ELEMENTWISE_HBM_EFFICIENCY = 0.77  # small broadcasting elementwise kernels' achieved / nominal HBM rate
# Transformers' MoE blocks (Mixtral, Qwen-MoE) loop over the experts in Python: per expert and
# MoE layer a host sync (torch.where on the routing mask), a gather, the expert's kernels and an
# index_add, then as many again backward; a fixed time per expert visit, forward+backward.
MOE_EXPERT_LOOP_S = 0.48e-3
HOST_MEM_EFFICIENCY = 0.55  # DeepSpeedCPUAdam's achieved / nominal host memory bandwidth
CPU_OPTIMIZER_BYTES_PER_PARAM = 42  # clip r/w 8 + Adam r 16 w 12 + fp32->bf16 cast r 4 w 2
# The CPU optimizer step per parameter (DeepSpeedCPUAdam + clipping + the bf16 cast) and how it
# scales with threads: t threads take (1 + c(t-1)) / t of one thread's time (Amdahl-like: the
# threads contend for the memory bus, so it saturates near 1/c times one thread's speed).
# Source: benchmarks/measurements/cpu-adam-scaling.jsonl, rows "h200-32core" (fitted there by
# `python benchmarks/cpu_adam_scaling.py --fit`): the 2-GPU torchrun rows (1 thread per rank)
# and the 1-GPU rows (32 threads) of the 32-core H200 host; the 16-core host was held out.
CPU_OPTIMIZER_S_PER_PARAM_ONE_THREAD = 2.670e-9
CPU_THREAD_CONTENTION = 0.115
# Softmax/cross-entropy bytes per logit (tokens x vocab), forward+backward, as the worker's loss
# runs it (`cross_entropy(logits[:, :-1].flatten(0, 1).float(), ...)`): forward, the slice's
# copy (bf16 r2 w2), the fp32 cast (r2 w4), log-softmax (a row of a large vocabulary does not fit
# shared memory: max, sum and write passes, r12 w4); backward, nll's zero-filled gradient (w4),
# log-softmax backward (sum pass, then r8 w4: r12 w4), the bf16 cast (r4 w2), the slice's
# zero-filled gradient and copy (w2, r2 w2). Transformers' loss upcasts the same way (its labels
# are shifted instead of the logits: 10 bytes fewer, not modelled apart).
LOSS_BYTES_PER_LOGIT = 58
# Stage 3 with the optimizer offloaded and the parameters on the GPU: PyTorch's fp32(host) ->
# bf16(GPU) copy casts on the CPU into a fresh pageable temporary and copies from pageable
# memory; measured (two layouts, one thread per rank) as this many more bytes' worth per param.
STAGE3_HOST_CAST_BYTES_PER_PARAM = 30
STAGE3_FETCH_OVERHEAD_S = 0.15e-3  # Python hooks per gathered module per pass (fetch, release, reduce)
STAGE3_GATHER_OVERHEAD_S = 0.075e-3  # more per fetch with world > 1: gather buffers, waits, record_stream
STAGE3_PREFETCH_OVERLAP = 0.0  # share of fwd+bwd compute stage-3 prefetch hides gathers behind (measured: ~none)



def steady_step_s(step_times_s: list[float]) -> float | None:
    """The step time this model predicts, read from measured per-step times: the steady state.

    The first step pays one-time costs and the second still warms up where DeepSpeed builds
    state on it: ZeRO-3's prefetch trace (H200: 0.62 s, then 0.38-0.39 s; 0.99 s, then 0.45 s)
    and checkpointed runs (0.54 s, then 0.32-0.33 s). With three or more steps: the median of
    the third and later; with two, the second; with one, that one.
    """
    steps = [float(x) for x in step_times_s]
    if len(steps) >= 3:
        later = sorted(steps[2:])
        mid = len(later) // 2
        return later[mid] if len(later) % 2 else (later[mid - 1] + later[mid]) / 2
    return steps[-1] if steps else None


@dataclass(frozen=True, slots=True)
class StepTimeEstimate:
    compute_s: float
    comm_s: float  # exposed (not overlapped) communication
    offload_s: float  # CPU optimizer step, PCIe and NVMe traffic not hidden
    step_time_s: float
    tokens_per_s: float
    mfu: float
    gpu_optimizer_s: float = 0.0  # optimizer step and gradient bookkeeping on the GPU (HBM-bound)
    step_overhead_s: float = 0.0  # fixed per step: engine and Python
    stage3_overhead_s: float = 0.0  # stage 3's per-module hooks
    comm_total_s: float = 0.0  # all network communication, hidden or not
    cpu_optimizer_s: float = 0.0  # of offload_s: the optimizer step on the host
    pcie_s: float = 0.0  # of offload_s: exposed PCIe copies
    nvme_s: float = 0.0  # of offload_s: NVMe reads and writes
    tokens_per_step: int = 0  # all GPUs together
    model_flops_per_step: float = 0.0  # 6 * active params * tokens (what MFU counts)
    loss_s: float = 0.0  # of compute_s: the memory-bound softmax/cross-entropy passes over the logits
    cpu_threads_per_rank: int = 0  # the CPU optimizer's threads the estimate assumed


def matmul_params(inp: PlanInput) -> int:
    """Parameters that take part in one token's matmuls: the blocks (a MoE block's router,
    top-k experts and shared experts, not every expert) and the output head (not the lookup)."""
    m = inp.model
    return m.active_blocks_params() + m.vocab * m.hidden


def matmul_flops_per_token(inp: PlanInput) -> float:
    """Dense-layer FLOPs per token, forward+backward (+ the blocks' recomputed forward).

    The head (6 * hidden * vocab per token: the logits matmul and its two backward matmuls)
    sits outside the checkpointed blocks, so it is never recomputed.
    """
    m = inp.model
    block_params = m.active_blocks_params()  # a MoE block: its router, top-k and shared experts
    return (8 if inp.training.checkpointing == "full" else 6) * block_params + 6 * m.vocab * m.hidden


def loss_bytes_per_micro_step(inp: PlanInput) -> float:
    """HBM traffic of the softmax/cross-entropy over one micro-batch's logits, forward+backward."""
    t = inp.training
    return LOSS_BYTES_PER_LOGIT * t.micro_batch * t.seq * inp.model.vocab


def attention_flops_per_token(inp: PlanInput) -> float:
    """QK^T and AV: 4*hidden*seq per layer forward, twice that backward, once more recomputed."""
    m, t = inp.model, inp.training
    # the queries' width: hidden, unless config.json sets head_dim (Gemma) or MLA
    attention = (16 if t.checkpointing == "full" else 12) * m.layers * m.q_size * t.seq
    if t.flash_attention:
        attention *= 0.5  # the causal flash kernel skips the fully masked blocks
    return attention


def compute_flops_per_token(inp: PlanInput) -> float:
    """Hardware FLOPs one token costs in forward+backward, recompute included."""
    return matmul_flops_per_token(inp) + attention_flops_per_token(inp)


def collective_time_s(coll: Collective, inp: PlanInput) -> float:
    """Bandwidth time of the slower share plus a link latency per hop for every launch.

    Hops: a pass around the GPUs of a node, then around the nodes (what a ring pays when its
    node-local steps pipeline over NVLink); an all-reduce makes two passes.
    """
    hw = inp.hardware
    intra_s = coll.intra_node_bytes / _bus_bytes_per_s(hw.intra_link)
    inter_s = 0.0
    latency_s = (hw.gpus_per_node - 1) * hw.intra_link.latency_us * 1e-6
    if hw.nodes > 1 and hw.inter_link is not None:
        inter_s = coll.inter_node_bytes / _bus_bytes_per_s(hw.inter_link)
        latency_s += (hw.nodes - 1) * hw.inter_link.latency_us * 1e-6
    passes = 2 if coll.kind == "all_reduce" else 1
    return max(intra_s, inter_s) + coll.calls_per_step * passes * latency_s


def _bus_bytes_per_s(link: LinkSpec) -> float:
    return link.bandwidth_gbps * link.efficiency * 1e9


def cpu_optimizer_s_per_param(threads: int) -> float:
    """One rank's CPU optimizer step per parameter of its partition, on `threads` threads."""
    threads = max(1, threads)
    return CPU_OPTIMIZER_S_PER_PARAM_ONE_THREAD * (1 + CPU_THREAD_CONTENTION * (threads - 1)) / threads


def host_optimizer_s_per_param(inp: PlanInput, cpu_threads_per_rank: int | None,
                               host_bytes_per_param: float = CPU_OPTIMIZER_BYTES_PER_PARAM) -> float:
    """The CPU optimizer's time per parameter of one rank: its threads' speed, or the rank's share
    of the node's host memory bandwidth when that is slower (many ranks on one node).

    `cpu_threads_per_rank` None: the launchers' share, host cores / ranks on the node.
    """
    hw = inp.hardware
    threads = hw.cpu_threads_per_rank if cpu_threads_per_rank is None else cpu_threads_per_rank
    by_threads = cpu_optimizer_s_per_param(threads) * host_bytes_per_param / CPU_OPTIMIZER_BYTES_PER_PARAM
    shared_bytes_per_s = hw.host_mem_gbps * HOST_MEM_EFFICIENCY * 1e9 / hw.gpus_per_node
    return max(by_threads, host_bytes_per_param / shared_bytes_per_s)


def hf_elementwise_bytes_per_micro_step(inp: PlanInput) -> float:
    """HBM traffic of the elementwise kernels a transformers class runs unfused (its RMSNorms, its
    rotary embedding), forward+backward plus the checkpointed forward's recompute; 0 for zlayout's GPT."""
    m, t = inp.model, inp.training
    if t.impl != "hf":
        return 0.0
    per_token_layer = 0.0
    if m.norm == "rmsnorm":
        per_token_layer += HF_RMSNORM_BYTES_PER_ELEMENT * m.norms_per_layer * m.hidden
    if m.position_embeddings == 0:  # rotary on the queries and keys
        per_token_layer += HF_ROPE_BYTES_PER_ELEMENT * (m.q_size + m.kv_size)
    recompute = 4 / 3 if t.checkpointing == "full" else 1.0  # the forward third again
    return per_token_layer * m.layers * t.seq * t.micro_batch * recompute


def moe_expert_loop_s_per_micro_step(inp: PlanInput) -> float:
    """A transformers MoE class's Python loop over its experts: per expert, per MoE layer."""
    m, t = inp.model, inp.training
    if t.impl != "hf" or not m.is_moe:
        return 0.0
    recompute = 4 / 3 if t.checkpointing == "full" else 1.0
    return MOE_EXPERT_LOOP_S * m.experts * (m.layers - len(m.dense_layers)) * recompute


def parameter_tensors(inp: PlanInput) -> int:
    """The model's parameter tensors: each block's, the embedding, the head unless tied, the final norm."""
    m = inp.model
    final_norm = 2 if m.norm == "layernorm" else 1
    return m.layers * len(layer_tensor_sizes(m)) + 1 + (0 if m.tie_embeddings else 1) + final_norm


def step_overhead(inp: PlanInput) -> float:
    return STEP_BASE_OVERHEAD_S + STEP_OVERHEAD_PER_TENSOR_S * parameter_tensors(inp)


def estimate_step_time(inp: PlanInput, layout: Layout, comm: CommEstimate | None = None,
                       cpu_threads_per_rank: int | None = None) -> StepTimeEstimate:
    """Wall time of one optimizer step (all micro-steps) and what it buys.

    `cpu_threads_per_rank`: the threads each rank's CPU optimizer runs with (None: host cores /
    ranks per node, what the launchers zlayout writes set OMP_NUM_THREADS to).
    """
    if comm is None:
        comm = estimate_comm(inp, layout)
    m, t, hw = inp.model, inp.training, inp.hardware
    n, accum = hw.world, t.grad_accum
    tokens_per_micro = t.seq * t.micro_batch  # per GPU
    peak = hw.gpu.peak_bf16_flops * (0.5 if t.precision == "fp32" else 1.0)
    cal = inp.calibration
    hbm_bytes_per_s = hw.gpu.hbm_gbps * HBM_EFFICIENCY * 1e9
    micro_kernels_s = tokens_per_micro * (matmul_flops_per_token(inp) / (peak * GPU_MATMUL_EFFICIENCY)
                                          + attention_flops_per_token(inp) / (peak * GPU_ATTENTION_EFFICIENCY))
    micro_loss_s = loss_bytes_per_micro_step(inp) / hbm_bytes_per_s
    micro_kernels_s += hf_elementwise_bytes_per_micro_step(inp) / (hw.gpu.hbm_gbps * ELEMENTWISE_HBM_EFFICIENCY * 1e9)
    micro_kernels_s += moe_expert_loop_s_per_micro_step(inp)
    micro_compute_s = (micro_kernels_s + micro_loss_s) * cal.gpu_factor
    compute_s = micro_compute_s * accum
    loss_s = micro_loss_s * cal.gpu_factor * accum
    backward_share = (6 / 8) if t.checkpointing == "full" else (2 / 3)  # recompute runs in backward
    micro_backward_s = micro_compute_s * backward_share

    # GPU memory-bound passes: the optimizer (on the rank's partition) and gradient copies
    params = m.params
    partition = params / n if layout.stage >= 1 else params
    hbm_bytes = 0.0
    if layout.offload_optimizer == "gpu":
        hbm_bytes += GPU_OPTIMIZER_BYTES_PER_PARAM * partition
    if layout.stage == 0:
        hbm_bytes += 6 * params  # bf16 gradients accumulated into fp32 (BF16_Optimizer)
    else:
        hbm_bytes += 4 * params * accum + 6 * partition  # bucket copies, partition cast to fp32
    gpu_optimizer_s = hbm_bytes / (hw.gpu.hbm_gbps * GPU_OPTIMIZER_HBM_EFFICIENCY * 1e9) * cal.gpu_factor

    stage3_overhead_s = 0.0
    if layout.stage == 3:
        per_fetch_s = STAGE3_FETCH_OVERHEAD_S + (STAGE3_GATHER_OVERHEAD_S if n > 1 else 0.0)
        passes = 3 if t.checkpointing == "full" else 2  # forward, backward, and the recompute's forward
        stage3_overhead_s = passes * accum * stage3_fetched_modules(inp) * per_fetch_s * cal.overhead_factor

    # What hides behind compute: two side streams, each serial (a bucket is reduced, then its
    # partition copied to the host; a module's partition comes up, then is gathered), each
    # hidden behind its pass except the piece that has nothing to wait behind.
    pcie_bytes_per_s = hw.gpu.pcie_gbps * 1e9 / cal.transfer_factor
    down_s = comm.pcie_to_host_bytes / pcie_bytes_per_s
    fetch_s = comm.pcie_param_fetch_bytes / pcie_bytes_per_s
    up_after_step_s = (comm.pcie_to_gpu_bytes - comm.pcie_param_fetch_bytes) / pcie_bytes_per_s
    comm_total_s = 0.0
    exposed_comm_s = 0.0
    streams = {"forward": [0.0, 0.0, fetch_s / 2], "backward": [0.0, 0.0, down_s + fetch_s / 2]}
    for coll in comm.collectives:  # stream: [network s, longest single launch s, PCIe s]
        coll_s = collective_time_s(coll, inp) * cal.transfer_factor
        comm_total_s += coll_s
        if coll.phase in ("after_backward", "after_step"):
            exposed_comm_s += coll_s
            continue
        stream = streams[coll.phase]
        stream[0] += coll_s
        stream[1] = max(stream[1], coll_s / max(1, coll.calls_per_step))
    windows = {
        "forward": STAGE3_PREFETCH_OVERLAP * (micro_compute_s - micro_backward_s) * accum,
        "backward": micro_backward_s * (1 if layout.stage == 1 else accum),
    }
    pcie_exposed_s = up_after_step_s
    for phase, (network_s, piece_s, pcie_s) in streams.items():
        busy_s = network_s + pcie_s
        if busy_s <= 0:
            continue
        # the piece with nothing to hide behind: the first gather, or the last bucket
        # reduced and its copy to the host
        tail_s = piece_s + pcie_s / max(1, accum * stage3_fetched_modules(inp))
        exposed_s = min(busy_s, max(tail_s, busy_s - windows[phase]))
        exposed_comm_s += exposed_s * network_s / busy_s
        pcie_exposed_s += exposed_s * pcie_s / busy_s

    threads = hw.cpu_threads_per_rank if cpu_threads_per_rank is None else max(1, cpu_threads_per_rank)
    cpu_optimizer_s = 0.0
    if layout.offload_optimizer != "gpu":
        host_bytes_per_param = CPU_OPTIMIZER_BYTES_PER_PARAM
        if layout.stage == 3 and layout.offload_param == "gpu":
            host_bytes_per_param += STAGE3_HOST_CAST_BYTES_PER_PARAM
        cpu_optimizer_s = (params / n * host_optimizer_s_per_param(inp, threads, host_bytes_per_param)
                           * cal.cpu_optimizer_factor)
    nvme_s = (comm.nvme_read_bytes + comm.nvme_write_bytes) / (hw.nvme_gbps * 1e9) * cal.transfer_factor
    offload_s = cpu_optimizer_s + pcie_exposed_s + nvme_s

    step_overhead_s = step_overhead(inp) * cal.overhead_factor
    step_s = compute_s + step_overhead_s + gpu_optimizer_s + stage3_overhead_s + exposed_comm_s + offload_s
    tokens = tokens_per_micro * accum * n
    model_flops = 6 * m.active_params * tokens  # MoE: the parameters a token goes through
    return StepTimeEstimate(
        compute_s=compute_s,
        comm_s=exposed_comm_s,
        offload_s=offload_s,
        step_time_s=step_s,
        tokens_per_s=tokens / step_s,
        mfu=model_flops / (step_s * n * hw.gpu.peak_bf16_flops),
        gpu_optimizer_s=gpu_optimizer_s,
        step_overhead_s=step_overhead_s,
        stage3_overhead_s=stage3_overhead_s,
        comm_total_s=comm_total_s,
        cpu_optimizer_s=cpu_optimizer_s,
        pcie_s=pcie_exposed_s,
        nvme_s=nvme_s,
        tokens_per_step=tokens,
        model_flops_per_step=model_flops,
        loss_s=loss_s,
        cpu_threads_per_rank=threads,
    )
