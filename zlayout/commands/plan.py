"""`zlayout plan`: memory, step time and fit for one layout (--stage) or every layout.

With --json, one JSON object: for one layout its figures at the top level (`params`,
`gpu_peak_allocated_bytes`, `gpu_peak_reserved_bytes`, `host_peak_bytes`, `fits`,
`step_time_s`, the memory terms, comm and time); for every layout a `layouts` list of those.
Each layout also carries `short_by_bytes` (per broken limit, how much is missing: "gpu",
"host", "nvme"). Both carry the recommendation over every layout; for one layout,
`recommended` says whether it is that layout, and `recommendation_note` says so in words.
"""

from __future__ import annotations

import argparse
import json
from functools import partial

from zlayout.catalog import format_params
from zlayout.core.card import STATE_SPACE_TORCH
from zlayout.cli import add_plan_arguments, layout_from_args, plan_input_from_args
from zlayout.core.memory import MemoryEstimate, card_of
from zlayout.core.plan import LayoutPlan, Plan, make_plan, plan_layout
from zlayout.core.serialize import layout_plan_dict, model_dict, recommendation_dict
from zlayout.core.steptime import StepTimeEstimate, step_time_notes, step_time_parts
from zlayout.replaycache import lasting, warm_in_parallel
from zlayout.spec import GiB, Layout, all_layouts


def step_time_lines(t: StepTimeEstimate) -> list[str]:
    """The step time of one layout, part by part, and a note when the host's side or the offload sets it."""
    lines = [f"Step time {t.step_time_s:.3f} s (forward {t.forward_s:.3f}, backward {t.backward_s:.3f}, "
             f"optimizer {t.optimizer_s:.3f}):"]
    lines += [f"  {name:18} {seconds:7.3f} s  {why}" for name, seconds, why in step_time_parts(t)]
    return lines + [f"  {label}: {note}" for label, note in step_time_notes(t)]


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("plan", help="memory per GPU/host/NVMe, fit and step time per layout",
                            description=__doc__.splitlines()[0])
    add_plan_arguments(parser)
    parser.set_defaults(func=run)


# Measured on 2 CPUs (whole `zlayout plan --json` processes, empty cache, medians of 15-21 paired
# runs): llama3-70b (80 layers) on 64 H100s 0.244 s against 0.320 serial; the 8-layer contract
# plan 0.176 against 0.181; a 2-layer model 0.165 against 0.160.
PARALLEL_REPLAY_MIN_LAYERS = 8


def run(args: argparse.Namespace) -> int:
    layout = layout_from_args(args)
    inp = plan_input_from_args(args)
    # Every layout is evaluated (cheaply, without break-even) so the recommendation is real;
    # the allocator replays of an earlier plan with the same inputs are kept (replaycache).
    with lasting() as memo:
        # replays the cache does not hold yet run side by side, layouts split over the CPUs
        # (replaycache); a shallow model's replays take less than the forks
        if inp.model.layers >= PARALLEL_REPLAY_MIN_LAYERS:
            # each job plans its layouts whole (memory, comm, step time): a child's come back
            # with its replays' answers, and the plan below only gathers them (10 ms of a
            # carded model's plan when made after the replays, in this process alone)
            planned: dict[int, object] = {}
            warm_in_parallel(memo, replay_jobs(inp), results=planned)
            done = {lp.layout: lp for plans in planned.values() for lp in plans}
        else:
            done = None
        plan = make_plan(inp, with_breakeven=False, planned=done)
    if args.json:
        # allow_nan=False: Infinity/NaN is not JSON; the spec's bounds keep every figure finite
        print(json.dumps(plan_json(plan, layout), indent=None, allow_nan=False))
    else:
        print(plan_table(plan, layout))
    return 0


def _plan_each(inp, layouts: list[Layout]) -> tuple[LayoutPlan, ...]:
    return tuple(plan_layout(inp, layout, with_breakeven=False) for layout in layouts)


def _replay_cost(layouts: list[Layout]) -> int:
    """A rank of a job's replay time, for the order jobs are taken in: not replayed (NVMe) last;
    a ZeRO-3 replay with the weights on the CPU (gemma-2-2b 40 ms, Qwen3-8B 50-60) before the
    other ZeRO-3 ones (32, 40-50; llama3-70b's on 64 H100s fill the card and replay twice), those
    before ZeRO 0-2's, the optimizer on the CPU first (25, 41) then on the GPU (24-27, 34)."""
    layout = layouts[0]
    if "nvme" in (layout.offload_optimizer, layout.offload_param):
        return 0
    if layout.stage == 3:
        return 4 if layout.offload_param == "cpu" else 3
    return 2 if layout.offload_optimizer == "cpu" else 1


def replay_jobs(inp) -> list[partial]:
    """Every layout's plan (without break-even) as jobs for `warm_in_parallel`: layouts one replay
    serves in one job (ZeRO-1 and ZeRO-2 without accumulation: allocator_sim.replay_stage), the
    costliest first, so the process that takes the last job is the least left waiting for."""
    from zlayout.core.allocator_sim import replay_stage

    groups: dict[tuple, list[Layout]] = {}
    for layout in all_layouts():
        groups.setdefault((replay_stage(inp, layout), layout.offload_optimizer, layout.offload_param),
                          []).append(layout)
    ordered = sorted(groups.values(), key=_replay_cost, reverse=True)  # stable: ties in layout order
    return [partial(_plan_each, inp, layouts) for layouts in ordered]


def short_by_bytes(mem: MemoryEstimate) -> dict[str, int]:
    """How much each broken limit is missing: the device memory the peak needs past the usable
    part (capacity less the headroom), host RAM per node, NVMe per node; the same comparisons
    as `fits`. Empty when the layout fits."""
    short = {"gpu": mem.gpu_fit.short_by_bytes,
             "host": mem.host_peak_bytes - mem.host_capacity_bytes,
             "nvme": mem.nvme_bytes - mem.nvme_capacity_bytes}
    return {where: nbytes for where, nbytes in short.items() if nbytes > 0}


def _layout_json(lp) -> dict:
    return {**layout_plan_dict(lp), "short_by_bytes": short_by_bytes(lp.memory)}


def plan_json(plan: Plan, layout=None) -> dict:
    base = {"params": plan.input.model.params, "model": model_dict(plan),
            "world": plan.input.hardware.world, "gpu": plan.input.hardware.gpu.name,
            "host_cores": plan.input.hardware.node_host_cores,
            "calibration": plan.input.calibration.source, "loop": plan.input.training.loop,
            "recommendation": recommendation_dict(plan)}
    if (linear := linear_attention(plan)) is not None:
        base["linear_attention"] = linear
    if wont := plan.will_not_run():
        base["will_not_run"] = wont
    if layout is not None:
        return {**base, **_layout_json(plan.for_layout(layout)),
                "recommended": plan.recommendation.layout == layout,
                "recommendation_note": recommendation_note(plan, layout)}
    return {**base, "layouts": [_layout_json(lp) for lp in plan.layouts]}


def linear_attention(plan: Plan) -> dict | None:
    """How the card priced a hybrid model's linear attention or state-space blocks (core.card's notes), for
    --json; None where the plan takes no card or the card has no linear attention."""
    card = card_of(plan.input.model, plan.input.training)
    note = card.linear_attention_note() if card is not None else None
    # fla's stand-ins (learn/trace.py) are read from fla's and causal-conv1d's code, not measured on a GPU
    # yet; the Mamba-2 torch reference was (benchmarks/measurements/h200-2026-12-27: six held-out lines)
    if note is None:
        return None
    return {"priced_as": card.linear_attention, "measured_on_gpu": card.linear_attention == STATE_SPACE_TORCH,
            "note": note}


def recommendation_note(plan: Plan, layout: Layout) -> str:
    """Whether the recommendation (made over every layout) is the layout asked about."""
    rec = plan.recommendation.layout
    if rec is None:
        return f"no layout fits, {layout.label} included"
    if rec == layout:
        return f"{layout.label} is the recommended layout"
    return f"the recommendation is another layout, {rec.label}, not {layout.label}"


def _gib(nbytes: float) -> str:
    return f"{nbytes / GiB:8.2f}"


def fits_text(mem: MemoryEstimate) -> str:
    """'yes', or every broken limit with what is missing: 'no (gpu +12.3 GiB, host +62.7 GiB)'."""
    short = short_by_bytes(mem)
    if not short:
        return "yes"
    return "no (" + ", ".join(f"{where} +{_missing(nbytes)}" for where, nbytes in short.items()) + ")"


def _missing(nbytes: int) -> str:
    """'12.3 GiB'; under 0.05 GiB in MiB, so a layout that misses by a few MiB never reads
    'no (gpu +0.0 GiB)'."""
    return f"{nbytes / GiB:.1f} GiB" if nbytes >= 0.05 * GiB else f"{max(1, round(nbytes / 2**20))} MiB"


def plan_table(plan: Plan, layout=None) -> str:
    inp = plan.input
    m, hw, t = inp.model, inp.hardware, inp.training
    lines = [
        f"{m.name}: {format_params(m.params)} params (L{m.layers} h{m.hidden} heads {m.heads}"
        f"{f'/{m.num_kv_heads} kv' if m.num_kv_heads != m.heads else ''} ffn {m.ffn_size} vocab {m.vocab}"
        + (f"; {m.experts} experts, top-{m.top_k}"
           + (f", {format_params(m.active_params)} active" if m.active_params < m.params else "") if m.is_moe else "")
        + ")",
        f"{hw.nodes} x {hw.gpus_per_node} {hw.gpu.name} ({hw.gpu.memory_bytes / GiB:.0f} GiB), "
        f"seq {t.seq}, micro-batch {t.micro_batch}, accumulation {t.grad_accum}, {t.precision}, "
        f"checkpointing {t.checkpointing}, loop {t.loop}"
        + (" (outputs held to the next forward)" if t.loop == "deepspeed" else " (outputs dropped after the loss)"),
        "",
    ]
    chosen = [plan.for_layout(layout)] if layout is not None else list(plan.layouts)
    header = f"{'layout (GiB)':26} {'GPU alloc':>9} {'reserved':>9} {'device':>9} {'card free':>9} " \
             f"{'host/node':>10} {'NVMe':>8} {'step s':>7}  fits (+ GiB missing)"
    lines += [header, "-" * len(header)]
    rec = plan.recommendation.layout
    wont = plan.will_not_run()
    for lp in chosen:
        mem = lp.memory
        mark = ", but will not run (Note)" if lp.layout.key in wont else " <- recommended" if lp.layout == rec else ""
        lines.append(
            f"{lp.layout.label:26} {_gib(mem.gpu_peak_allocated_bytes):>9} {_gib(mem.gpu_peak_reserved_bytes):>9} "
            f"{_gib(mem.gpu_device_used_bytes):>9} {_gib(mem.gpu_headroom_bytes):>9} "
            f"{_gib(mem.host_peak_bytes):>10} {_gib(mem.nvme_bytes):>8} {lp.time.step_time_s:7.3f}  "
            f"{fits_text(mem)}{mark}")
    lines.append("card free: what the driver hands out of the card less device used at the peak (0: the "
                 "cache fills the card); fits: what the step needs against the card less --headroom")
    if (linear := linear_attention(plan)) is not None:
        lines.append(f"Note: {linear['note']}.")
    for why in dict.fromkeys(wont.values()):  # each reason once, whichever layouts it rules out
        lines.append(f"Note: {why}.")
    if layout is not None:
        mem = chosen[0].memory
        lines += ["", f"GPU: {mem.gpu_fit.summary()}."]
        lines += ["", f"Terms (peak in the {mem.peak_phase} phase):"]
        for term in mem.terms:
            lines.append(f"  {term.where:4} {term.name:30} {_gib(term.bytes)} GiB  {term.explanation}")
    if layout is not None:
        lines += ["", *step_time_lines(chosen[0].time)]
    if layout is not None and rec != layout:
        lines += ["", f"Note: {recommendation_note(plan, layout)}."]
    lines += ["", f"Recommendation: {plan.recommendation.reason}"]
    lines += [f"  - {s}" for s in plan.recommendation.suggestions]
    return "\n".join(lines)
