"""Break-even sizes (stub: filled in by the break-even work)."""

from __future__ import annotations

from dataclasses import dataclass

from zlayout.spec import Layout, PlanInput


@dataclass(frozen=True, slots=True)
class BreakEven:
    max_params: int  # largest model of the family that fits with the requested headroom
    max_micro_batch: int  # largest micro-batch that fits the current model (0: none)
    limited_by: str  # "gpu", "host" or "nvme"


def break_even(inp: PlanInput, layout: Layout) -> BreakEven:
    return BreakEven(max_params=0, max_micro_batch=0, limited_by="gpu")
