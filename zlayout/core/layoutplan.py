"""One layout's planned figures: memory, communication, step time, break-even.

Its own module so that the recommendation (which ranks these) and the plan (which holds
them and the recommendation) do not import each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from zlayout.core.comm import CommEstimate
from zlayout.core.memory import MemoryEstimate
from zlayout.core.steptime import StepTimeEstimate
from zlayout.spec import Layout

if TYPE_CHECKING:  # a plan without break-even (`zlayout plan`) does not load its searches
    from zlayout.core.breakeven import BreakEven


@dataclass(frozen=True, slots=True)
class LayoutPlan:
    layout: Layout
    memory: MemoryEstimate
    comm: CommEstimate
    time: StepTimeEstimate
    breakeven: BreakEven | None
