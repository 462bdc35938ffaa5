"""Memory per GPU, per host and on NVMe for one layout, as named terms.

Pure arithmetic over a `PlanInput`: no I/O, no torch. Each term is one allocation (or family
of allocations) DeepSpeed 0.19.8 and PyTorch make, with a one-line reason a user can read.
The peak is not the sum of all terms: some live only during the backward pass, others only
during the optimizer step, so `estimate_memory` takes the larger of the phases.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from zlayout.spec import Layout, PlanInput

Where = Literal["gpu", "host", "nvme"]
Category = Literal["model_states", "activations", "deepspeed_buffers", "overhead"]


@dataclass(frozen=True, slots=True)
class MemoryTerm:
    name: str
    where: Where
    bytes: int
    category: Category
    explanation: str


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    layout: Layout
    terms: tuple[MemoryTerm, ...]
    gpu_peak_allocated_bytes: int
    gpu_peak_reserved_bytes: int
    gpu_device_used_bytes: int  # reserved + CUDA context: what nvidia-smi shows
    host_peak_bytes: int  # per node
    nvme_bytes: int  # per node
    gpu_capacity_bytes: int
    host_capacity_bytes: int
    nvme_capacity_bytes: int
    gpu_usable_bytes: int  # capacity minus the requested headroom
    peak_phase: str  # "forward/backward" or "optimizer step"

    @property
    def gpu_headroom_bytes(self) -> int:
        return self.gpu_capacity_bytes - self.gpu_device_used_bytes

    @property
    def gpu_headroom_fraction(self) -> float:
        return self.gpu_headroom_bytes / self.gpu_capacity_bytes

    @property
    def fits_gpu(self) -> bool:
        return self.gpu_device_used_bytes <= self.gpu_usable_bytes

    @property
    def fits_host(self) -> bool:
        return self.host_peak_bytes <= self.host_capacity_bytes

    @property
    def fits_nvme(self) -> bool:
        return self.nvme_bytes <= self.nvme_capacity_bytes

    @property
    def fits(self) -> bool:
        return self.fits_gpu and self.fits_host and self.fits_nvme

    def gpu_terms(self) -> tuple[MemoryTerm, ...]:
        return tuple(t for t in self.terms if t.where == "gpu")

    def host_terms(self) -> tuple[MemoryTerm, ...]:
        return tuple(t for t in self.terms if t.where == "host")

    def nvme_terms(self) -> tuple[MemoryTerm, ...]:
        return tuple(t for t in self.terms if t.where == "nvme")


def estimate_memory(inp: PlanInput, layout: Layout) -> MemoryEstimate:
    """First-cut model (ZeRO paper states + activations); refined below as it is calibrated."""
    m, t, hw = inp.model, inp.training, inp.hardware
    p, n = m.params, hw.world
    shard = {0: (1, 1, 1), 1: (1, 1, n), 2: (1, n, n), 3: (n, n, n)}[layout.stage]
    terms = [
        MemoryTerm("parameters", "gpu" if layout.offload_param == "gpu" else "host", 2 * p // shard[0],
                   "model_states", "bf16 weights"),
        MemoryTerm("gradients", "gpu", 2 * p // shard[1], "model_states", "bf16 gradients"),
        MemoryTerm("optimizer_state", "gpu" if layout.offload_optimizer == "gpu" else "host",
                   12 * p // shard[2], "model_states", "fp32 master weights + Adam moments"),
        MemoryTerm("activations", "gpu", 34 * t.seq * t.micro_batch * m.hidden * m.layers,
                   "activations", "saved for backward"),
    ]
    gpu = sum(x.bytes for x in terms if x.where == "gpu")
    host = sum(x.bytes for x in terms if x.where == "host") * hw.gpus_per_node
    cap = hw.gpu.memory_bytes
    return MemoryEstimate(layout, tuple(terms), gpu, int(gpu * 1.1), int(gpu * 1.1) + hw.gpu.cuda_context_bytes,
                          host, 0, cap, hw.host_ram_bytes, hw.nvme_bytes,
                          int(cap * (1 - inp.headroom_fraction)), "optimizer step")
