"""Step time per layout (stub: filled in by the comm/step-time work)."""

from __future__ import annotations

from dataclasses import dataclass

from zlayout.core.comm import CommEstimate
from zlayout.spec import Layout, PlanInput


@dataclass(frozen=True, slots=True)
class StepTimeEstimate:
    compute_s: float
    comm_s: float  # exposed (not overlapped) communication
    offload_s: float  # CPU optimizer step, PCIe and NVMe traffic not hidden
    step_time_s: float
    tokens_per_s: float
    mfu: float


def estimate_step_time(inp: PlanInput, layout: Layout, comm: CommEstimate) -> StepTimeEstimate:
    t = inp.training
    tokens = t.seq * t.micro_batch * t.grad_accum * inp.hardware.world
    flops = 6 * inp.model.params * tokens
    compute = flops / (inp.hardware.world * inp.hardware.gpu.peak_bf16_flops * 0.45)
    step = compute
    return StepTimeEstimate(compute, 0.0, 0.0, step, tokens / step, 0.45)
