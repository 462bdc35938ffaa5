"""The recommendation (stub: filled in by the comm/step-time work)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from zlayout.spec import Layout, PlanInput

if TYPE_CHECKING:
    from zlayout.core.plan import LayoutPlan


@dataclass(frozen=True, slots=True)
class Recommendation:
    layout: Layout | None  # None when nothing fits
    reason: str  # one sentence a user reads
    suggestions: tuple[str, ...] = ()  # when nothing fits: what would make it fit


def recommend(inp: PlanInput, planned: "tuple[LayoutPlan, ...]") -> Recommendation:
    fitting = [lp for lp in planned if lp.memory.fits]
    if not fitting:
        return Recommendation(None, "No layout fits.", ())
    best = min(fitting, key=lambda lp: lp.time.step_time_s)
    return Recommendation(best.layout, f"{best.layout.label} fits and is fastest.")
