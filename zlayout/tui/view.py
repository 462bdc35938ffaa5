"""What the widgets show, derived from a `Plan` by pure functions (no Textual here).

The widgets only lay these out; keeping the arithmetic of "which term goes in which column"
here means it is tested without an app, and the app cannot drift from the core's numbers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Sequence

from zlayout.messages import EXPANDABLE_NOTE, EXPANDABLE_NOTE_IN_APP
from zlayout.spec import Layout, gib_figure

if TYPE_CHECKING:  # the app draws its first frame before the planner is imported
    from zlayout.core.memory import MemoryEstimate, MemoryTerm
    from zlayout.core.plan import LayoutPlan, Plan

# The per-GPU columns of the table and the segments of the bar chart, in stacking order.
MEMORY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("params", "Param"),
    ("grads", "Grad"),
    ("optimizer", "Optim"),
    ("activations", "Activ"),
    ("buffers", "DSbuf"),
    ("overhead", "Other"),
)

HEADROOM_OK_FRACTION = 0.20  # green at or above this share of the card free at the peak; yellow below


def column_of(term: MemoryTerm) -> str:
    """Which table column a memory term is summed into."""
    if term.category == "activations":
        return "activations"
    if term.category == "deepspeed_buffers":
        return "buffers"
    if term.category == "overhead":
        return "overhead"
    name = term.name.lower()
    if "grad" in name:
        return "grads"
    if "optim" in name or "adam" in name or "master" in name or "moment" in name:
        return "optimizer"
    if "param" in name or "weight" in name:
        return "params"
    return "optimizer"


def gpu_bytes_by_column(memory: MemoryEstimate) -> dict[str, int]:
    """Per-GPU bytes of each column. What the allocator reserves and the CUDA context add on
    top of the listed terms is shown as overhead, so the columns add up to the device use."""
    by_column = {key: 0 for key, _ in MEMORY_COLUMNS}
    for term in memory.gpu_terms():
        by_column[column_of(term)] += term.bytes
    unlisted = memory.gpu_device_used_bytes - sum(by_column.values())
    if unlisted > 0:
        by_column["overhead"] += unlisted
    return by_column


def headroom_level(memory: MemoryEstimate) -> str:
    """'ok' (green), 'tight' (yellow: under 20% of the card free, or full with the allocator
    flushing its cache) or 'over' (red: it does not fit)."""
    if not memory.fits:
        return "over"
    fit = memory.gpu_fit
    if fit.state == "fits-flushing" or memory.gpu_headroom_fraction < HEADROOM_OK_FRACTION:
        return "tight"
    return "ok"


def headroom_text(memory: MemoryEstimate) -> str:
    """The core's headroom (core/fit.py: the card less device used at the peak) as a percentage
    when it fits, 'full' when the cache fills the card and the allocator flushes it; when the
    GPU is short, by how many GiB what the step needs is over what is usable ('✗ +1830 GiB':
    an exact figure, never a cut percentage)."""
    fit = memory.gpu_fit
    if memory.fits:
        return "full" if fit.state == "fits-flushing" else f"{memory.gpu_headroom_fraction * 100:.0f}%"
    if not memory.fits_gpu:
        return f"✗ +{fmt_gib(fit.short_by_bytes)} GiB"
    return "✗ host" if not memory.fits_host else "✗ nvme"


def fmt_gib(n_bytes: int | float) -> str:
    """Bytes as GiB, always in GiB (every title and suffix says GiB): 0.42, 9.87, 99.9, 1234,
    10434. Five characters up to 99999 GiB; beyond, the whole figure (never a 'T' that would
    read as tera-GiB under a GiB title)."""
    return "·" if n_bytes == 0 else gib_figure(n_bytes)


def fmt_gb(n_bytes: int | float) -> str:
    """Bytes as decimal GB (the unit of link bandwidths)."""
    gb = n_bytes / 1e9
    if gb == 0:
        return "·"
    return f"{gb:.2f}" if gb < 10 else f"{gb:.1f}" if gb < 1000 else f"{gb:.0f}"


def fmt_seconds(seconds: float) -> str:
    """A duration with its unit: 463ms, 1.71s, 42.1s, 1234s."""
    if seconds <= 0:
        return "·"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 10:
        return f"{seconds:.2f}s"
    if seconds < 100:
        return f"{seconds:.1f}s"
    return f"{seconds:.0f}s"


def fmt_rate(per_s: float) -> str:
    """Tokens per second with its scale always shown: 937, 70.8k, 1.25M."""
    if per_s <= 0:
        return "·"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if per_s >= scale:
            return f"{per_s / scale:.1f}{unit}" if per_s < 100 * scale else f"{per_s / scale:.0f}{unit}"
    return f"{per_s:.0f}" if per_s >= 1 else f"{per_s:.2g}"


def fmt_params(params: int) -> str:
    """A parameter count the way people say it (1.87B, 70.6B, 350M, 17.7M): the command
    line's formatter (`zlayout.catalog.format_params`); "—" for none."""
    from zlayout.catalog import format_params

    return "—" if params <= 0 else format_params(params)


def fmt_percent_change(new: float, old: float) -> str:
    """'+62%', '-5%', '=' when unchanged, 'new' when there was nothing before."""
    if new == old:
        return "="
    if not old:
        return "new"
    change = (new - old) / old * 100
    return f"{change:+.0f}%" if abs(change) >= 1 else f"{change:+.1f}%"


@dataclass(frozen=True, slots=True)
class GpuFigures:
    """A layout's per-GPU memory figures as every surface of the app shows them (status,
    table, detail, chart): one place, so they cannot disagree. `needed` decides "fits" and
    is what the recommendation's "needs X of Y GiB" says; `free` is the headroom on it."""

    needed: str  # the least device memory the peak runs in (the verdict's figure)
    peak: str  # torch.cuda.max_memory_allocated()
    used: str  # what nvidia-smi shows (the allocator's cache included)
    capacity: str
    free: str  # '61%', '✗ +74.9 GiB', '✗ host'
    level: str  # 'ok', 'tight', 'over'
    device_full: bool  # used reaches the card: the allocator runs at its edge


def gpu_figures(memory: MemoryEstimate) -> GpuFigures:
    return GpuFigures(
        needed=fmt_gib(memory.gpu_needed_bytes), peak=fmt_gib(memory.gpu_peak_allocated_bytes),
        used=fmt_gib(memory.gpu_device_used_bytes), capacity=fmt_gib(memory.gpu_capacity_bytes),
        free=headroom_text(memory), level=headroom_level(memory),
        device_full=memory.gpu_device_used_bytes >= memory.gpu_fit.allocatable_bytes)


@dataclass(frozen=True, slots=True)
class LayoutRow:
    """One row of the layouts table, already in display units."""

    key: str
    stage: str
    optimizer_on: str
    params_on: str
    columns: tuple[str, ...]  # one per MEMORY_COLUMNS
    needed: str
    peak_allocated: str
    device_used: str
    headroom: str
    headroom_level: str
    host: str
    host_fits: bool
    comm: str
    step_time: str
    tokens_per_s: str
    recommended: bool


WILL_NOT_RUN_CELL = "✗ run"  # a cell (Free, break-even) of a layout that will not run; breakeven.WILL_NOT_RUN is its limited_by


def layout_rows(plan: Plan) -> list[LayoutRow]:
    recommended = plan.recommendation.layout
    wont = plan.will_not_run()
    rows = []
    for lp in plan.layouts:
        mem, layout = lp.memory, lp.layout
        by_column = gpu_bytes_by_column(mem)
        gpu = gpu_figures(mem)
        if mem.fits and layout.key in wont:
            # DeepSpeed packs a grouped-experts weight off a 16-byte boundary there, with no switch to
            # pad it: torch's grouped GEMM refuses it at the first forward (export and verify refuse)
            gpu = replace(gpu, free=WILL_NOT_RUN_CELL, level="over")
        rows.append(LayoutRow(
            key=layout.key,
            stage=str(layout.stage),
            optimizer_on=layout.offload_optimizer,
            params_on=layout.offload_param,
            columns=tuple(fmt_gib(by_column[key]) for key, _ in MEMORY_COLUMNS),
            needed=gpu.needed,
            peak_allocated=gpu.peak,
            device_used=gpu.used,
            headroom=gpu.free,
            headroom_level=gpu.level,
            host=fmt_gib(mem.host_peak_bytes),
            host_fits=mem.fits_host,
            comm=fmt_gb(lp.comm.network_bytes),
            step_time=fmt_seconds(lp.time.step_time_s),
            tokens_per_s=fmt_rate(lp.time.tokens_per_s),
            recommended=layout == recommended,
        ))
    return rows


@dataclass(frozen=True, slots=True)
class BarSegments:
    """One layout's stacked bar on the card's scale: cells per column, and whether it runs
    past the card (its end is then an overflow mark, not a longer bar)."""

    key: str
    label: str
    cells: tuple[tuple[str, int], ...]  # (column key, cells)
    capacity_cell: int  # the card's edge: the last cell
    overflow: bool  # the device use is past the card
    fits_gpu: bool  # the verdict (the figure turns red when the GPU does not fit)
    used_gib: str


def bar_segments(plan: Plan, width: int) -> list[BarSegments]:
    """Every layout's per-GPU bytes in `width` cells on the card's scale: the card's capacity
    is the last cell, so the layouts that fit keep their length (scaled to the largest layout,
    a 1816 GiB ZeRO-0 left every layout that fits one cell long); a bar past the card stops
    one cell short of it and is marked overflowing."""
    if not plan.layouts or width < 2:
        return []
    capacity = plan.layouts[0].memory.gpu_capacity_bytes
    inner = width - 1  # cells for the card's bytes; the last one is the capacity mark
    cells_per_byte = inner / capacity if capacity else 0
    out = []
    for lp in plan.layouts:
        by_column = gpu_bytes_by_column(lp.memory)
        used = lp.memory.gpu_device_used_bytes
        overflow = used > capacity
        # the terms are each at their own largest, which can add up past what the device
        # holds at once: the bar is as long as its figure (device used), split as they are
        total = sum(by_column.values())
        shrink = used / total if total > used else 1.0
        cells = []
        cumulative_bytes = 0
        drawn = 0
        for key, _ in MEMORY_COLUMNS:
            cumulative_bytes += by_column[key] * shrink
            end = min(inner, round(cumulative_bytes * cells_per_byte))
            cells.append((key, max(0, end - drawn)))
            drawn = max(drawn, end)
        out.append(BarSegments(
            key=lp.layout.key, label=short_label(lp),
            cells=tuple(cells), capacity_cell=inner, overflow=overflow,
            fits_gpu=lp.memory.fits_gpu, used_gib=fmt_gib(lp.memory.gpu_device_used_bytes),
        ))
    return out


def short_label(lp: LayoutPlan) -> str:
    return layout_label(lp.layout)


@dataclass(frozen=True, slots=True)
class BreakEvenRow:
    key: str
    label: str
    max_params: str
    max_micro_batch: str
    limited_by: str
    then: str  # the fastest layout that still fits the next size up ('—': none known)
    will_not_run: str = ""  # why no size of this model runs there (max_params is then WILL_NOT_RUN_CELL)


def breakeven_rows(plan: Plan, crossovers: Sequence[Any] | None = None) -> list[BreakEvenRow]:
    """Largest model and micro-batch per layout, and what takes over beyond it; '—' where
    nothing fits or nothing was computed, WILL_NOT_RUN_CELL (no figures) where the layout will not
    run this model (Plan.will_not_run's layouts). `crossovers` are the core's `Crossover`s."""
    takes_over = {c.stops_fitting: c.takes_over for c in (crossovers or ())}
    rows = []
    for lp in plan.layouts:
        be = lp.breakeven
        label = compact_label(lp.layout)
        if lp.layout in takes_over:
            nxt = takes_over[lp.layout]
            then = layout_label(nxt) if nxt is not None else "none fits"
        else:
            then = "—"
        if be is None:
            rows.append(BreakEvenRow(lp.layout.key, label, "—", "—", "not computed", then))
            continue
        if be.will_not_run is not None:  # no size to show: it would read as one this layout trains
            rows.append(BreakEvenRow(lp.layout.key, label, WILL_NOT_RUN_CELL, "—", "—", then, be.will_not_run))
            continue
        rows.append(BreakEvenRow(
            key=lp.layout.key, label=label,
            max_params=fmt_params(be.max_params),
            max_micro_batch=str(be.max_micro_batch) if be.max_micro_batch > 0 else "—",
            limited_by=be.limited_by if be.max_params > 0 else "—",
            then=then,
        ))
    return rows


def list_label(row: BreakEvenRow) -> str:
    """'Z0 gpu/gpu': a break-even row's layout (its compact label's three columns) in the panel's
    one-line lists (the layouts no size fits, those that will not run)."""
    return "Z{} {}/{}".format(*row.label.split())


def will_not_run_line(rows: Sequence[BreakEvenRow]) -> str:
    """The break-even panel's line for the layouts that will not run this model: which, and the
    head of each reason (tensors.grouped_gemm_refusal: 'ZeRO-0 will not run this model'), once;
    '' when every layout runs."""
    wont = [row for row in rows if row.will_not_run]
    if not wont:
        return ""
    heads = "; ".join(dict.fromkeys(row.will_not_run.split(":")[0] for row in wont))
    names = ", ".join(list_label(row) for row in wont)
    return (f"{names}: no size ({heads}: DeepSpeed packs its grouped-experts weights off a "
            "16-byte boundary, which torch's grouped GEMM refuses)")


def first_crossover_line(plan: Plan, crossovers: Sequence[Any] | None) -> str:
    """Where this model sits among the crossovers: the next size at which the choice changes.
    The size named is the table's own number for that layout (its largest model), so the
    sentence and the table never disagree."""
    if not crossovers:
        return ""
    current = plan.input.model.params
    ahead = sorted((c for c in crossovers if c.params > current), key=lambda c: c.params)
    if not ahead:
        return f"This model ({fmt_params(current)}) is past every crossover."
    nxt = ahead[0]
    takes = layout_label(nxt.takes_over) if nxt.takes_over is not None else "nothing fits"
    largest = _largest_fitting(plan, nxt.stops_fitting)
    if largest is None:
        return (f"This model: {fmt_params(current)}; beyond {fmt_params(nxt.params)} "
                f"{layout_label(nxt.stops_fitting)} stops fitting, then {takes}.")
    return (f"This model: {fmt_params(current)}; {layout_label(nxt.stops_fitting)} fits up to "
            f"{largest}, beyond it {takes}.")


def _largest_fitting(plan: Plan, layout: Layout) -> str | None:
    try:
        be = plan.for_layout(layout).breakeven
    except KeyError:
        return None
    return fmt_params(be.max_params) if be is not None and be.max_params > 0 else None


def scaling_text(plan: Plan) -> str:
    """How the break-even sizes grow the model: the family named, or depth at fixed width."""
    model = plan.input.model
    scaling = next((lp.breakeven.scaling for lp in plan.layouts if lp.breakeven is not None), None)
    if scaling == "family" and model.family:
        return f"sizes of the {model.family} family (its shapes, scaled together)"
    if scaling is None:
        return ""
    return f"this model's layers at hidden {model.hidden} (more or fewer layers)"


def compact_label(layout: Layout) -> str:
    """The table's three columns in 14 characters, under a 'ZeRO Opt  Par' header."""
    return f"{layout.stage:^4} {layout.offload_optimizer:<4} {layout.offload_param:<4}"


def layout_label(layout: Layout) -> str:
    """'Z3 opt:cpu par:nvme': a layout in the chart's and panels' short form."""
    parts = [f"Z{layout.stage}"]
    if layout.offload_optimizer != "gpu":
        parts.append(f"opt:{layout.offload_optimizer}")
    if layout.offload_param != "gpu":
        parts.append(f"par:{layout.offload_param}")
    return " ".join(parts)


@dataclass(frozen=True, slots=True)
class CompareRow:
    key: str
    label: str
    pinned_peak: str
    peak: str
    peak_delta: str
    peak_delta_sign: int
    pinned_step: str
    step: str
    step_delta: str
    step_delta_sign: int


def compare_rows(pinned: Plan, current: Plan) -> list[CompareRow]:
    """Peak memory and step time now vs the pinned plan, per layout present in both."""
    rows = []
    for lp in current.layouts:
        try:
            old = pinned.for_layout(lp.layout)
        except KeyError:
            continue
        new_peak, old_peak = lp.memory.gpu_peak_allocated_bytes, old.memory.gpu_peak_allocated_bytes
        new_step, old_step = lp.time.step_time_s, old.time.step_time_s
        rows.append(CompareRow(
            key=lp.layout.key, label=compact_label(lp.layout),
            pinned_peak=fmt_gib(old_peak), peak=fmt_gib(new_peak),
            peak_delta=fmt_percent_change(new_peak, old_peak),
            peak_delta_sign=(new_peak > old_peak) - (new_peak < old_peak),
            pinned_step=fmt_seconds(old_step), step=fmt_seconds(new_step),
            step_delta=fmt_percent_change(new_step, old_step),
            step_delta_sign=(new_step > old_step) - (new_step < old_step),
        ))
    return rows


def input_changes(pinned: Plan, current: Plan) -> list[str]:
    """Which inputs differ between the pinned plan and now, named by the panel's labels
    ('Sequence: 2048 → 4096', 'Micro-batch: 1 → 2')."""
    from zlayout.tui.fields import FIELD_LABELS, readable
    changes = []
    old, new = pinned.input.model_dump(), current.input.model_dump()
    for section in ("model", "hardware", "training", "zero"):
        for key, value in new[section].items():
            before = old[section].get(key)
            if isinstance(value, dict) or isinstance(before, dict):
                value = (value or {}).get("name") if isinstance(value, dict) or value is None else value
                before = (before or {}).get("name") if isinstance(before, dict) or before is None else before
            if value != before:
                label = FIELD_LABELS.get(key) or readable(key)
                changes.append(f"{label}: {before} → {value}")
    return changes


HEADER_SPARE_COLUMNS = 30  # Textual's header: icon, "zlayout — ", the space kept for its clock, centring


def plan_summary(plan: Plan, width: int = 200) -> str:
    """The header's subtitle (model, size, hardware, sequence, micro-batch), in the longest
    form that fits `width` columns, so no figure is cut."""
    inp = plan.input
    hw, t = inp.hardware, inp.training
    nodes = f" × {hw.nodes} nodes" if hw.nodes > 1 else ""
    forms = (
        f"{inp.model.name} · {fmt_params(inp.model.params)} params · "
        f"{hw.gpus_per_node}× {hw.gpu.name}{nodes} · seq {t.seq} · mb {t.micro_batch}",
        f"{inp.model.name} {fmt_params(inp.model.params)} · {hw.gpus_per_node}×{hw.gpu.name}"
        f"{f'×{hw.nodes}' if hw.nodes > 1 else ''} · seq {t.seq} · mb {t.micro_batch}",
        f"{fmt_params(inp.model.params)} · {hw.world}×{hw.gpu.name} · seq {t.seq} · mb {t.micro_batch}",
    )
    room = width - HEADER_SPARE_COLUMNS
    return next((form for form in forms if len(form) <= room), forms[-1])


_FIGURE_AND_UNIT = re.compile(r"(\d) (?=(?:s/step|GiB|GB|ms|s|tok/s)\b)")


def wrap_keeping_figures(text: str, width: int) -> list[str]:
    """`text` wrapped at spaces into lines of at most `width` cells, never between a figure
    and its unit (Rich's wrap left "at 0.43" at a line's end and "s/step" on the next)."""
    from rich.cells import cell_len

    glued = _FIGURE_AND_UNIT.sub("\\1\u00a0", text)  # one cell, and no space to split at
    lines: list[str] = []
    for paragraph in glued.split("\n"):
        line = ""
        for word in paragraph.split(" "):
            if line and cell_len(line) + 1 + cell_len(word) > width:
                lines.append(line)
                line = word
            else:
                line = f"{line} {word}" if line else word
            while cell_len(line) > width > 0:  # a word longer than the line: folded, as Rich does
                lines.append(line[:width])
                line = line[width:]
        lines.append(line)
    return [line.replace("\u00a0", " ") for line in lines]


def fold_at_slashes(text: str, width: int) -> str:
    """`text` wrapped at spaces into lines of `width` cells, a word longer than a line (a path
    in an error) broken only after its slashes: the toast folded
    '/tmp/pytest-of-root/pytest-1/test' / '_a_broken0/models/...' mid-name."""
    lines = []
    for paragraph in text.split("\n"):
        line = ""
        for word in paragraph.split(" "):
            pieces = re.findall(r"[^/]*/|[^/]+$", word) if len(word) > width and "/" in word else [word]
            for index, piece in enumerate(pieces):
                glue = " " if index == 0 and line else ""
                if line and len(line) + len(glue) + len(piece) > width:
                    lines.append(line)
                    line = piece
                else:
                    line += glue + piece
        lines.append(line)
    return "\n".join(lines)


def short_path(path: str, width: int) -> str:
    """`path` in one line of at most `width` cells, broken nowhere: the file name whole and
    as much of the directory as fits after an ellipsis ('…/team-llama/llama3-70b-z3-...').
    A toast folded 'profiles/llama3-8b-z3-opt_c' / 'pu-param_gpu' mid-name. A name longer
    than `width` alone is returned whole (the caller's line then wraps, but never a
    directory)."""
    if len(path) <= width:
        return path
    parts = path.rstrip("/").split("/")
    shown = parts[-1]
    if len(f"…/{shown}") > width:
        return shown
    for part in reversed(parts[:-1]):
        if len(f"…/{part}/{shown}") > width:
            break
        shown = f"{part}/{shown}"
    return f"…/{shown}"


def recommendation_text(plan: Plan) -> str:
    rec = plan.recommendation
    if rec.layout is None:
        fixes = getattr(rec, "fixes", ())
        if fixes:
            ways = f"{len(fixes)} way{'s' if len(fixes) > 1 else ''}"
            return f"✗ {rec.reason} (ctrl+p → 'Apply suggestion': {ways} to make it fit)"
        extra = f" Try: {'; '.join(rec.suggestions)}" if rec.suggestions else ""
        return f"✗ {rec.reason}{extra}"
    reason = rec.reason.replace(EXPANDABLE_NOTE, EXPANDABLE_NOTE_IN_APP)
    if reason.startswith(rec.layout.label):
        return f"★ {reason}"
    return f"★ {rec.layout.label}: {reason}"


def fit_phrase(memory: MemoryEstimate) -> str:
    """A layout's fit in a few words, in the table's Free figures: '14% free', 'full (its
    cache flushes)', 'does not fit: needs 91.7 GiB per GPU, ...' (the core's shortfall)."""
    if not memory.fits:
        return f"does not fit: {memory.shortfall}"
    free = gpu_figures(memory).free
    return "fits, full (its cache flushes)" if free == "full" else f"fits, {free} free"


def action_title(plan: Plan, layout: Layout, verb: str) -> str:
    """The first line of the export and verify dialogs, and of the question before a layout
    that does not fit: the layout acted on and, when it is not ★, what it costs against ★,
    step time and fit (a pick made minutes ago must not be exported unread)."""
    rec = plan.recommendation.layout
    lp = plan.for_layout(layout)
    step = fmt_seconds(lp.time.step_time_s)
    if rec is None:
        return f"{verb} {layout.label} ({step}/step; {fit_phrase(lp.memory)}; no layout fits)"
    if layout == rec:
        return f"{verb} ★ {layout.label} ({step}/step, {fit_phrase(lp.memory)}, the recommended layout)"
    star = plan.for_layout(rec)
    change = fmt_percent_change(lp.time.step_time_s, star.time.step_time_s)
    return (f"{verb} {layout.label}, not ★: {step}/step, {change} against ★ {rec.label} "
            f"({fmt_seconds(star.time.step_time_s)}/step); {fit_phrase(lp.memory)} "
            f"(★ {fit_phrase(star.memory)})")
