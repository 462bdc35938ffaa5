"""The recommendation: the fastest layout that fits, and why, in one sentence.

Step times within `TIE_FRACTION` (3%) of the fastest fitting layout are a tie, well inside
the step-time model's error: among those the simplest layout wins, the one with the fewest
offloads, then the lowest stage (an offload or a higher stage costs host memory, PCIe
traffic and failure modes that a 1% faster prediction does not pay for). The sentence
names the runner-up and the margin.

When nothing fits, the planner is re-run on changed inputs to find what would make the
model fit: more GPUs (or nodes), NVMe capacity for ZeRO-Infinity, a smaller micro-batch
with more accumulation (same global batch), activation checkpointing. Every suggestion is
checked with the memory model before it is offered, and says which flags to type.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from zlayout.core.comm import estimate_comm
from zlayout.core.layoutplan import LayoutPlan
from zlayout.core.memory import MemoryEstimate, estimate_memory
from zlayout.core.steptime import estimate_step_time
from zlayout.core.tensors import grouped_gemm_refusal
from zlayout.messages import EXPANDABLE_NOTE
from zlayout.spec import GiB, Layout, PlanInput, all_layouts

TIE_FRACTION = 0.03  # step times this close to the fastest are a tie: the simplest layout wins
MAX_GPUS_SUGGESTED = 4096
DEFAULT_INTER_LINK = "ib-ndr"  # the CLI's default, for suggestions that add nodes


@dataclass(frozen=True, slots=True)
class Fix:
    """A change of inputs that makes `layout` fit (verified), for a front end to apply."""

    text: str  # one sentence, with the flags to type
    flags: str  # e.g. "--nodes 2"
    input: PlanInput
    layout: Layout
    step_time_s: float
    change: str = ""  # the change alone, e.g. "use 2 nodes (16 GPUs)"


@dataclass(frozen=True, slots=True)
class Recommendation:
    layout: Layout | None  # None when nothing fits
    reason: str  # one sentence a user reads
    suggestions: tuple[str, ...] = ()  # when nothing fits: what would make it fit
    fixes: tuple[Fix, ...] = ()  # the same suggestions with the inputs they change
    runner_up: Layout | None = None  # the next fastest layout that fits


def offload_count(layout: Layout) -> int:
    """How many of optimizer state and parameters live off the GPU (0, 1 or 2)."""
    return (layout.offload_optimizer != "gpu") + (layout.offload_param != "gpu")


def _order_key(lp: LayoutPlan, fastest_s: float) -> tuple:
    """Ties (within TIE_FRACTION of the fastest) first, simplest first; then by speed."""
    tied = lp.time.step_time_s <= fastest_s * (1 + TIE_FRACTION)
    simplicity = (offload_count(lp.layout), lp.layout.stage) if tied else (0, 0)
    return (not tied, *simplicity, lp.time.step_time_s, lp.layout.key)


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.inf


def _margin(runner_s: float, best_s: float) -> str:
    """'12% slower', '2.3x slower', '1.0% faster', 'as fast'."""
    ratio = _ratio(runner_s, best_s)
    if ratio >= 1.5:
        return f"{ratio:.1f}x slower"
    change = (ratio - 1) * 100
    if abs(change) < 0.05:
        return "as fast"
    return f"{abs(change):.1f}% {'slower' if change > 0 else 'faster'}" if abs(change) < 10 \
        else f"{abs(change):.0f}% {'slower' if change > 0 else 'faster'}"


def _why(best: LayoutPlan, ranked: list[LayoutPlan], fastest: LayoutPlan) -> str:
    """One sentence: the headroom and speed, then the runner-up and by how much it loses.

    `ranked` are the other fitting layouts, best first (so ranked[0] is the runner-up)."""
    mem, t = best.memory, best.time
    head = (f"{best.layout.label}: {mem.gpu_fit.summary()} at {t.step_time_s:.2f} s/step "
            f"({t.mfu:.0%} MFU)")
    if not ranked:
        return f"{head}, the only layout that does."
    runner = ranked[0]
    rt, name = runner.time, runner.layout.label
    tie = rt.step_time_s <= fastest.time.step_time_s * (1 + TIE_FRACTION)
    if tie:
        simpler = ("fewer offloads" if offload_count(best.layout) < offload_count(runner.layout)
                   else "a lower stage" if best.layout.stage < runner.layout.stage else "the same simplicity")
        return (f"{head}; runner-up {name} is {_margin(rt.step_time_s, t.step_time_s)} "
                f"({rt.step_time_s:.2f} s/step), a tie within {TIE_FRACTION:.0%}, so {simpler} wins.")
    why = ""
    if rt.offload_s - t.offload_s > 0.5 * (rt.step_time_s - t.step_time_s):
        why = f", spending {rt.offload_s:.2f} s/step on offload (CPU optimizer, PCIe, NVMe)"
    else:
        data = _ratio(runner.comm.network_bytes, best.comm.network_bytes)
        if data >= 1.2 and math.isfinite(data):
            why = f", moving {data:.1f}x more data at this size"
        elif best.comm.network_bytes == 0 and runner.comm.network_bytes > 0:
            why = ", with communication this layout does not need"
    return (f"{head}; runner-up {name} is {_margin(rt.step_time_s, t.step_time_s)} "
            f"({rt.step_time_s:.2f} s/step){why}.")


def recommend(inp: PlanInput, planned: tuple[LayoutPlan, ...]) -> Recommendation:
    """The simplest of the (tied) fastest fitting layouts with a reason; else verified suggestions."""
    # a layout that fits but will not run (tensors.grouped_gemm_refusal; verify and export refuse it) is none
    fitting = [lp for lp in planned if lp.memory.fits and grouped_gemm_refusal(inp, lp.layout) is None]
    if fitting:
        fastest = min(fitting, key=lambda lp: lp.time.step_time_s)
        ranked = sorted(fitting, key=lambda lp: _order_key(lp, fastest.time.step_time_s))
        best = ranked[0]
        runner = ranked[1] if len(ranked) > 1 else None
        return Recommendation(best.layout, _why(best, ranked[1:], fastest) + _expandable_note(inp, best, planned),
                              runner_up=runner.layout if runner else None)
    layouts = tuple(lp.layout for lp in planned) or all_layouts()
    fixes = suggest_fixes(inp, layouts)
    closest = min(planned, key=lambda lp: _overshoot(lp.memory)) if planned else None
    reason = "No layout fits"
    if closest is not None:
        reason += f": the closest, {closest.layout.label}, {closest.memory.shortfall}"
    return Recommendation(None, reason + ".", tuple(f.text for f in fixes), fixes)


def _expandable_note(inp: PlanInput, best: LayoutPlan, planned: "tuple[LayoutPlan, ...]") -> str:
    """When a faster layout fits only with expandable segments, say so (the default
    allocator's fragmentation is what keeps it out). Step time does not depend on the
    allocator: only the faster layouts that do not fit are re-estimated."""
    if inp.training.allocator != "default":
        return ""
    expandable = _with_training(inp, allocator="expandable")
    limit = best.time.step_time_s * (1 - TIE_FRACTION)
    faster = [lp for lp in planned
              if lp.layout != best.layout and not lp.memory.fits and lp.time.step_time_s < limit
              and estimate_memory(expandable, lp.layout, replay=False).fits]
    if not faster:
        return ""
    lp = min(faster, key=lambda candidate: candidate.time.step_time_s)
    return f" {EXPANDABLE_NOTE} {lp.layout.label} fits too, at {lp.time.step_time_s:.2f} s/step."


def _overshoot(mem: MemoryEstimate) -> float:
    ratios = [mem.gpu_needed_bytes / max(1, mem.gpu_usable_bytes),  # what the verdict compares
              mem.host_peak_bytes / max(1, mem.host_capacity_bytes)]
    if mem.nvme_bytes:
        ratios.append(mem.nvme_bytes / max(1, mem.nvme_capacity_bytes))
    return max(ratios)


# --------------------------------------------------------------------------- suggestions


def _fastest_fitting(inp: PlanInput, layouts: tuple[Layout, ...]) -> tuple[Layout, MemoryEstimate, float] | None:
    # Suggestions ask only "does it fit, with what headroom": both come from the bytes the run
    # needs, not from the allocator replay (peak reserved), which would cost each candidate.
    best = None
    for layout in layouts:
        mem = estimate_memory(inp, layout, replay=False)
        if not mem.fits:
            continue
        step_s = estimate_step_time(inp, layout, estimate_comm(inp, layout)).step_time_s
        if best is None or step_s < best[2]:
            best = (layout, mem, step_s)
    return best


def _fix(inp: PlanInput, layouts: tuple[Layout, ...], flags: str, change: str) -> Fix | None:
    found = _fastest_fitting(inp, layouts)
    if found is None:
        return None
    layout, mem, step_s = found
    text = f"{change}: {layout.label} {mem.gpu_fit.summary()} at {step_s:.2f} s/step ({flags})"
    return Fix(text, flags, inp, layout, step_s, change)


def _with_hardware(inp: PlanInput, **update) -> PlanInput:
    return inp.model_copy(update={"hardware": inp.hardware.model_copy(update=update)})


def _with_training(inp: PlanInput, **update) -> PlanInput:
    return inp.model_copy(update={"training": inp.training.model_copy(update=update)})


def _more_gpus(inp: PlanInput, layouts: tuple[Layout, ...]) -> Fix | None:
    """The fewest GPUs with which some layout fits: more per node (up to 8) or more nodes.

    The two are searched apart (each by bisection, fitting being monotone along each): more
    GPUs on one node share its host RAM and NVMe, more nodes bring their own.
    """
    hw = inp.hardware
    per_node_options = []
    if hw.nodes == 1:
        per_node_options = [(per_node, f"use {per_node} GPUs", f"--gpus-per-node {per_node}",
                             _with_hardware(inp, gpus_per_node=per_node))
                            for per_node in range(hw.gpus_per_node + 1, max(hw.gpus_per_node, 8) + 1)]
    inter = hw.inter_link
    if inter is None:
        from zlayout import catalog

        try:
            inter = catalog.load_link(DEFAULT_INTER_LINK)
        except (KeyError, ValueError):
            inter = None
    node_options = []
    if inter is not None:
        node_options = [(nodes * hw.gpus_per_node, f"use {nodes} nodes ({nodes * hw.gpus_per_node} GPUs)",
                         f"--nodes {nodes}", _with_hardware(inp, nodes=nodes, inter_link=inter))
                        for nodes in (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
                        if nodes > hw.nodes and nodes * hw.gpus_per_node <= MAX_GPUS_SUGGESTED]
    found = [fix for fix in (_fewest(per_node_options, layouts), _fewest(node_options, layouts)) if fix]
    if not found:
        return None
    return min(found, key=lambda pair: pair[0])[1]  # fewest GPUs; one node wins a tie


def _fewest(options: list, layouts: tuple[Layout, ...]) -> tuple[int, Fix] | None:
    """Bisection over options ordered by GPU count: the first with which some layout fits."""
    lo, hi = -1, len(options)
    found = None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        world, change, flags, candidate = options[mid]
        fix = _fix(candidate, layouts, flags, change)
        if fix is not None:
            hi, found = mid, (world, fix)
        else:
            lo = mid
    return found


def _nvme(inp: PlanInput, layouts: tuple[Layout, ...]) -> Fix | None:
    """NVMe offload with enough capacity (ZeRO-Infinity), when GPU and host would then fit."""
    nvme_layouts = tuple(l for l in layouts if "nvme" in (l.offload_optimizer, l.offload_param))
    needed = 0
    for layout in nvme_layouts:
        mem = estimate_memory(inp, layout, replay=False)
        if mem.fits_gpu and mem.fits_host and not mem.fits_nvme:
            size = mem.nvme_bytes
            needed = size if not needed else min(needed, size)
    if not needed:
        return None
    gib = int(math.ceil(needed * 1.1 / GiB / 64) * 64)  # 10% spare, whole 64 GiB
    candidate = _with_hardware(inp, nvme_bytes=gib * GiB)
    return _fix(candidate, nvme_layouts, f"--nvme-gib {gib}", f"add {gib} GiB of NVMe per node")


def _smaller_micro_batch(inp: PlanInput, layouts: tuple[Layout, ...]) -> Fix | None:
    """The largest smaller micro-batch (dividing the current one) that fits, same global batch."""
    t = inp.training
    for micro in sorted((d for d in range(1, t.micro_batch) if t.micro_batch % d == 0), reverse=True):
        accum = t.grad_accum * t.micro_batch // micro
        fix = _fix(_with_training(inp, micro_batch=micro, grad_accum=accum), layouts,
                   f"--micro-batch {micro} --grad-accum {accum}",
                   f"use micro-batch {micro} with {accum} accumulation steps (same global batch)")
        if fix is not None:
            return fix
    return None


def _expandable_segments(inp: PlanInput, layouts: tuple[Layout, ...]) -> Fix | None:
    """Expandable segments leave no split segment behind, so a layout whose peak fits but
    whose fragmentation does not runs with them (and costs nothing in speed)."""
    if inp.training.allocator != "default":
        return None
    return _fix(_with_training(inp, allocator="expandable"), layouts, "--allocator expandable",
                "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (no fragmentation)")


def _checkpointing(inp: PlanInput, layouts: tuple[Layout, ...]) -> Fix | None:
    if inp.training.checkpointing != "none" or not inp.model.can_checkpoint:
        return None
    return _fix(_with_training(inp, checkpointing="full"), layouts, "--checkpointing full",
                "turn on activation checkpointing (a third more compute)")


def suggest_fixes(inp: PlanInput, layouts: tuple[Layout, ...] | None = None) -> tuple[Fix, ...]:
    """What would make the model fit, each verified with the memory model.

    Single changes first, in the order a team would try them (those that keep the hardware
    first). When no single change is enough, NVMe and more GPUs are tried again on top of
    the cheap changes (checkpointing, micro-batch 1 with more accumulation).
    """
    chosen = tuple(layouts) if layouts is not None else all_layouts()
    singles = (_expandable_segments(inp, chosen), _checkpointing(inp, chosen), _smaller_micro_batch(inp, chosen),
               _nvme(inp, chosen), _more_gpus(inp, chosen))
    found = tuple(fix for fix in singles if fix is not None)
    if found:
        return found
    lighter, flags, changes = inp, [], []
    if inp.training.checkpointing == "none" and inp.model.can_checkpoint:
        lighter = _with_training(lighter, checkpointing="full")
        flags.append("--checkpointing full")
        changes.append("turn on activation checkpointing")
    t = inp.training
    if t.micro_batch > 1:
        accum = t.grad_accum * t.micro_batch
        lighter = _with_training(lighter, micro_batch=1, grad_accum=accum)
        flags.append(f"--micro-batch 1 --grad-accum {accum}")
        changes.append(f"use micro-batch 1 with {accum} accumulation steps")
    if not changes:
        return ()
    combined = []
    for fix in (_nvme(lighter, chosen), _more_gpus(lighter, chosen)):
        if fix is None:
            continue
        change = ", ".join(changes + [fix.change])
        all_flags = " ".join(flags + [fix.flags])
        mem = estimate_memory(fix.input, fix.layout, replay=False)
        text = f"{change}: {fix.layout.label} {mem.gpu_fit.summary()} at {fix.step_time_s:.2f} s/step ({all_flags})"
        combined.append(Fix(text, all_flags, fix.input, fix.layout, fix.step_time_s, change))
    return tuple(combined)
