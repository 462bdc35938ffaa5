"""Communication volume per optimizer step (stub: filled in by the comm/step-time work)."""

from __future__ import annotations

from dataclasses import dataclass

from zlayout.spec import Layout, PlanInput


@dataclass(frozen=True, slots=True)
class CommEstimate:
    intra_node_bytes: int  # bytes each GPU sends per optimizer step over the intra-node link
    inter_node_bytes: int  # ... over the inter-node link
    pcie_bytes: int  # host<->GPU offload traffic per GPU per step
    nvme_read_bytes: int  # per node per step
    nvme_write_bytes: int

    @property
    def network_bytes(self) -> int:
        return self.intra_node_bytes + self.inter_node_bytes


def estimate_comm(inp: PlanInput, layout: Layout) -> CommEstimate:
    p, n = inp.model.params, inp.hardware.world
    if n == 1:
        return CommEstimate(0, 0, 0, 0, 0)
    factor = 3 if layout.stage == 3 else 2
    vol = int(factor * 2 * p * (n - 1) / n)
    return CommEstimate(vol, 0, 0, 0, 0)
