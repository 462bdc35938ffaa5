"""One immutable plan: every layout's memory, communication and step time, break-even sizes
and the recommendation. This is the object the CLI prints and the TUI displays."""

from __future__ import annotations

from dataclasses import dataclass

from zlayout.core.comm import estimate_comm
from zlayout.core.layoutplan import LayoutPlan
from zlayout.core.memory import estimate_memory
from zlayout.core.recommend import Recommendation, recommend
from zlayout.core.steptime import estimate_step_time
from zlayout.core.tensors import grouped_gemm_refusal
from zlayout.spec import Layout, PlanInput, all_layouts

__all__ = ["LayoutPlan", "Plan", "make_plan", "plan_layout"]


@dataclass(frozen=True, slots=True)
class Plan:
    input: PlanInput
    layouts: tuple[LayoutPlan, ...]
    recommendation: Recommendation
    breakeven_error: str = ""  # why break-even is missing (a broken model preset file): for the app

    def for_layout(self, layout: Layout) -> LayoutPlan:
        for lp in self.layouts:
            if lp.layout == layout:
                return lp
        raise KeyError(layout.key)

    def will_not_run(self) -> dict[str, str]:
        """The layouts that will not run whatever their memory, by key, and why (tensors.grouped_gemm_refusal:
        ZeRO-0, or ZeRO-3 on one GPU, of a model whose grouped-experts weights DeepSpeed misaligns); the
        recommendation skips them, verify and export refuse them, plan and the app mark them."""
        return {lp.layout.key: why for lp in self.layouts
                if (why := grouped_gemm_refusal(self.input, lp.layout)) is not None}


def plan_layout(inp: PlanInput, layout: Layout, with_breakeven: bool = True,
                presets_dirs: tuple[str, ...] = ()) -> LayoutPlan:
    memory = estimate_memory(inp, layout)
    comm = estimate_comm(inp, layout)
    time = estimate_step_time(inp, layout, comm, allocator_flush_s=memory.gpu_fit.flush_cost_s)
    breakeven = None
    if with_breakeven:  # imported here: `zlayout plan` plans without it and need not load its searches
        from zlayout.core.breakeven import break_even

        breakeven = break_even(inp, layout, presets_dirs)
    return LayoutPlan(layout=layout, memory=memory, comm=comm, time=time, breakeven=breakeven)


def make_plan(inp: PlanInput, layouts: tuple[Layout, ...] | None = None,
              with_breakeven: bool = True, presets_dirs: tuple[str, ...] = (),
              planned: dict[Layout, LayoutPlan] | None = None) -> Plan:
    """`presets_dirs`: `--presets-dir`'s folders, where break-even looks for the model's family.
    `planned`: layouts `plan_layout` has planned already for these inputs, without break-even
    (`zlayout plan`'s forked replays plan their layouts too)."""
    chosen = layouts if layouts is not None else all_layouts()
    done = planned if planned and not with_breakeven else {}
    plans = tuple(done[layout] if layout in done else plan_layout(inp, layout, with_breakeven, presets_dirs)
                  for layout in chosen)
    return Plan(input=inp, layouts=plans, recommendation=recommend(inp, plans))
