"""Communication volume per optimizer step: collectives on the network, offload over PCIe, NVMe.

Follows what DeepSpeed 0.19.8 issues for each ZeRO stage (A = gradient accumulation steps,
S = the model's parameter bytes at the training precision, n = GPUs):

- stage 0: one gradient all-reduce per step, at the accumulation boundary.
- stage 1: gradients reduce-scattered at the boundary micro-step (during its backward),
  then the updated parameter partitions all-gathered after the optimizer step.
- stage 2: gradients reduce-scattered at every micro-step (they are partitioned as they
  are produced), parameters all-gathered once after the step.
- stage 3: parameters all-gathered in forward and again in backward at every micro-step,
  gradients reduce-scattered at every micro-step; no gather after the step.

Ring volumes per GPU: all-reduce 2(n-1)/n * S, reduce-scatter and all-gather (n-1)/n * S.
With A = 1 this is the ZeRO paper's rule: 2S for stages 0-2, 3S for stage 3.

Intra- vs inter-node split. NCCL runs one ring per NIC; on a ring over all n GPUs of m
nodes, m of its n hops cross a node boundary, and the rings are rotated so each GPU's NIC
carries one of them. So each GPU sends 1/gpus_per_node of its volume over its NIC and the
rest over the intra-node link (one node: everything intra; one GPU per node: everything
inter). The collective then takes as long as the slower of the two shares.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from zlayout.spec import Layout, PlanInput

CollectiveKind = Literal["all_reduce", "reduce_scatter", "all_gather"]
# When a collective runs, which decides what compute can hide it:
#   "forward": stage-3 parameter prefetch during the forward pass
#   "backward": issued during the backward pass (gradient reduction from the backward hooks
#               with overlap_comm, stage-3 parameter prefetch)
#   "after_backward": after the last backward, before the step, or on the compute stream
#                     without overlap_comm (nothing to hide behind)
#   "after_step": after the optimizer step (nothing to hide behind)
Phase = Literal["forward", "backward", "after_backward", "after_step"]

MASTER_BYTES_PER_PARAM = 4  # fp32 master weights and gradients that the offloaded optimizer reads
OPTIMIZER_STATE_BYTES_PER_PARAM = 12  # fp32 master weights + Adam's two moments


@dataclass(frozen=True, slots=True)
class Collective:
    """One kind of collective, summed over the optimizer step, for one GPU."""

    name: str
    kind: CollectiveKind
    phase: Phase
    calls_per_step: int  # separate collective launches (each pays the link latency)
    bytes_per_gpu: int  # what one GPU sends per optimizer step (it receives as much)
    intra_node_bytes: int
    inter_node_bytes: int


@dataclass(frozen=True, slots=True)
class CommEstimate:
    intra_node_bytes: int  # bytes each GPU sends per optimizer step over the intra-node link
    inter_node_bytes: int  # ... over the inter-node link
    pcie_bytes: int  # host<->GPU offload traffic per GPU per step
    nvme_read_bytes: int  # per node per step
    nvme_write_bytes: int
    collectives: tuple[Collective, ...] = ()
    pcie_to_gpu_bytes: int = 0  # parameters coming up (per GPU per step)
    pcie_to_host_bytes: int = 0  # gradients going down (per GPU per step)
    pcie_param_fetch_bytes: int = 0  # of pcie_to_gpu_bytes: stage-3 parameter fetches in fwd/bwd
    pcie_grad_return_bytes: int = 0  # of pcie_to_gpu_bytes: stage 3's gradients back from the host buffer in bwd

    @property
    def network_bytes(self) -> int:
        return self.intra_node_bytes + self.inter_node_bytes


def param_bytes_per_element(inp: PlanInput) -> int:
    """Bytes of one parameter (and gradient) at the training precision."""
    return 4 if inp.training.precision == "fp32" else 2


def ring_bytes_per_gpu(kind: CollectiveKind, payload_bytes: float, world: int) -> float:
    """What one GPU sends in a ring collective over `world` GPUs of a `payload_bytes` tensor."""
    if world <= 1:
        return 0.0
    share = (world - 1) / world
    return 2 * share * payload_bytes if kind == "all_reduce" else share * payload_bytes


def split_intra_inter(bytes_per_gpu: float, gpus_per_node: int, nodes: int) -> tuple[int, int]:
    """(intra, inter) share of a GPU's ring traffic: 1/gpus_per_node crosses nodes when nodes > 1."""
    if nodes <= 1:
        return round(bytes_per_gpu), 0
    inter = bytes_per_gpu / gpus_per_node
    return round(bytes_per_gpu - inter), round(inter)


def stage3_fetched_modules(inp: PlanInput) -> int:
    """Modules whose parameters stage 3 gathers one by one (larger than the persistence threshold).

    Each is one fetch in forward and one in backward: the count sets the per-fetch overheads.
    """
    m, threshold = inp.model, inp.zero.stage3_param_persistence_threshold
    h, kv, f = m.hidden, m.kv_size, m.ffn_size
    # fused QKV for the GELU (GPT-style) blocks, separate q/k/v for SwiGLU (Llama-style)
    attention = [h * (h + 2 * kv), h * h] if m.mlp == "gelu" else [h * h, h * kv, h * kv, h * h]
    mlp = [h * f, f * h] if m.mlp == "gelu" else [h * f, h * f, f * h]
    per_layer = sum(1 for numel in attention + mlp if numel > threshold)
    ends = int(m.embedding_params() > threshold) + int(m.head_params() > threshold)
    return m.layers * per_layer + ends


def _collective(inp: PlanInput, name: str, kind: CollectiveKind, phase: Phase, payload_bytes: float,
                times: int, calls: int) -> Collective:
    hw = inp.hardware
    per_gpu = ring_bytes_per_gpu(kind, payload_bytes, hw.world) * times
    intra, inter = split_intra_inter(per_gpu, hw.gpus_per_node, hw.nodes)
    return Collective(name, kind, phase, calls, intra + inter, intra, inter)


def collectives(inp: PlanInput, layout: Layout) -> tuple[Collective, ...]:
    """The collectives one optimizer step issues, per GPU (empty on one GPU)."""
    hw, zero = inp.hardware, inp.zero
    if hw.world <= 1:
        return ()
    params = inp.model.params
    accum = inp.training.grad_accum
    elem = param_bytes_per_element(inp)
    model_bytes = params * elem
    grad_buckets = max(1, math.ceil(params / zero.reduce_bucket_size))
    gather_buckets = max(1, math.ceil(params / hw.world / zero.allgather_bucket_size))
    if layout.stage == 0:
        return (_collective(inp, "gradient all-reduce", "all_reduce", "after_backward",
                            model_bytes, 1, grad_buckets),)
    if layout.stage in (1, 2):
        reduce_times = 1 if layout.stage == 1 else accum
        grad_phase: Phase = "backward" if zero.overlap_comm else "after_backward"
        return (
            _collective(inp, "gradient reduce-scatter", "reduce_scatter", grad_phase,
                        model_bytes, reduce_times, reduce_times * grad_buckets),
            _collective(inp, "parameter all-gather", "all_gather", "after_step",
                        model_bytes, 1, gather_buckets),
        )
    fetches = stage3_fetched_modules(inp)
    return (
        _collective(inp, "parameter all-gather (forward)", "all_gather", "forward",
                    model_bytes, accum, accum * fetches),
        _collective(inp, "parameter all-gather (backward)", "all_gather", "backward",
                    model_bytes, accum, accum * fetches),
        _collective(inp, "gradient reduce-scatter", "reduce_scatter",
                    "backward" if zero.overlap_comm else "after_backward",
                    model_bytes, accum, accum * grad_buckets),
    )


def pcie_traffic(inp: PlanInput, layout: Layout) -> tuple[int, int, int, int]:
    """Offload bytes per GPU per step over PCIe.

    Optimizer offload: each rank's gradient partition goes down as fp32 (DeepSpeed casts on
    the GPU, then copies) - at every micro-step for stage 2, once for stage 1 - and the
    updated partition comes back up as bf16 (cast on the host: into a pinned buffer for
    stages 1-2; for stage 3 by PyTorch's cross-device copy, which casts on the CPU). Stage 3
    (stage3.py `partition_grads`) accumulates in a flat host buffer of the model's dtype:
    every micro-step a parameter's partition goes down into it and straight back up
    (`grad_buffer.to(device)`, and on later micro-steps up, add, down), and only at the
    boundary goes down once more as fp32 for the optimizer. Measured on one H200 (batch h,
    h200-2026-12-04 profiles): 459 ms of copies in Mixtral-8x7B-L2's backward for 3.16B
    parameters, 637 ms for Qwen3-30B-A3B-L6's 4.36B: 8 bytes a parameter at 55 GB/s within 1%.
    Parameter offload: the partition comes up for every fetch (forward and backward, every
    micro-step) and is updated in host memory, so nothing comes back after the step.

    Returns (to_gpu, to_host, param_fetch, grad_return): param_fetch and grad_return (stage 3's
    gradients coming back from the host buffer during backward) are parts of to_gpu.
    """
    if layout.offload_optimizer == "gpu" and layout.offload_param == "gpu":
        return 0, 0, 0, 0
    partition = inp.model.params / inp.hardware.world
    accum = inp.training.grad_accum
    elem = param_bytes_per_element(inp)
    to_host = to_gpu = fetch = grad_return = 0.0
    if layout.offload_optimizer != "gpu":
        if layout.stage == 3:  # through the host accumulation buffer, then fp32 once
            grad_return = accum * partition * elem
            to_host += grad_return + partition * MASTER_BYTES_PER_PARAM
            to_gpu += grad_return
        else:
            grad_copies = 1 if layout.stage == 1 else accum
            to_host += grad_copies * partition * MASTER_BYTES_PER_PARAM
        if layout.offload_param == "gpu":
            to_gpu += partition * elem
    if layout.offload_param != "gpu":
        fetch = 2 * accum * partition * elem
        to_gpu += fetch
    return round(to_gpu), round(to_host), round(fetch), round(grad_return)


def nvme_traffic(inp: PlanInput, layout: Layout) -> tuple[int, int]:
    """(read, write) bytes per node per step for NVMe offload (ZeRO-Infinity).

    Optimizer on NVMe: the node's fp32 master weights and moments are read in and written
    back once per step. Parameters on NVMe: read for every fetch (forward and backward,
    every micro-step), written once after the update.
    """
    hw = inp.hardware
    node_params = inp.model.params * hw.gpus_per_node / hw.world
    elem = param_bytes_per_element(inp)
    read = write = 0.0
    if layout.offload_optimizer == "nvme":
        read += node_params * OPTIMIZER_STATE_BYTES_PER_PARAM
        write += node_params * OPTIMIZER_STATE_BYTES_PER_PARAM
    if layout.offload_param == "nvme":
        read += 2 * inp.training.grad_accum * node_params * elem
        write += node_params * elem
    return round(read), round(write)


def estimate_comm(inp: PlanInput, layout: Layout) -> CommEstimate:
    """Bytes per optimizer step: network per GPU (intra/inter node), PCIe per GPU, NVMe per node."""
    colls = collectives(inp, layout)
    to_gpu, to_host, fetch, grad_return = pcie_traffic(inp, layout)
    nvme_read, nvme_write = nvme_traffic(inp, layout)
    return CommEstimate(
        intra_node_bytes=sum(c.intra_node_bytes for c in colls),
        inter_node_bytes=sum(c.inter_node_bytes for c in colls),
        pcie_bytes=to_gpu + to_host,
        nvme_read_bytes=nvme_read,
        nvme_write_bytes=nvme_write,
        collectives=colls,
        pcie_to_gpu_bytes=to_gpu,
        pcie_to_host_bytes=to_host,
        pcie_param_fetch_bytes=fetch,
        pcie_grad_return_bytes=grad_return,
    )
