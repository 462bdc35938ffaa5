"""memory.svg: the per-GPU memory of a profile as a bar chart, for the runbook to link.

Pure string building (no plotting library): one bar per predicted GPU term on a scale where
the full width is the GPU's capacity, then the peaks and the capacity itself. The terms are
not stacked: they do not all live at the same moment (the fp32 step gradients exist only inside
step(), the logits only at the start of backward), so their sum is not the peak.
"""

from __future__ import annotations

from xml.sax.saxutils import escape

from zlayout.profile.schema import Profile
from zlayout.profile.summary import gib

WIDTH_PX = 780
LABEL_PX = 200
BAR_PX = 420
ROW_PX = 22
TOP_PX = 46
CATEGORY_COLOURS = {
    "model_states": "#4e79a7",
    "deepspeed_buffers": "#f28e2b",
    "activations": "#59a14f",
    "overhead": "#9c9c9c",
}
PEAK_COLOUR = "#e15759"
CAPACITY_COLOUR = "#333333"


def _attr(text: str) -> str:
    return escape(text, {'"': "&quot;"})


def memory_svg(profile: Profile) -> str:
    """The chart as SVG text (deterministic: same profile, same bytes)."""
    pred = profile.prediction
    capacity = pred.gpu_capacity_bytes
    rows: list[tuple[str, int, str, str]] = [  # label, bytes, colour, tooltip
        (t.name, t.bytes, CATEGORY_COLOURS.get(t.category, "#76b7b2"), t.explanation)
        for t in pred.terms if t.where == "gpu"]
    summary_rows = [
        ("peak allocated (predicted)", pred.gpu_peak_allocated_bytes, PEAK_COLOUR,
         f"torch.cuda.max_memory_allocated(), during {pred.peak_phase}"),
        ("device used (predicted)", pred.gpu_device_used_bytes, PEAK_COLOUR,
         "what nvidia-smi shows: reserved by PyTorch's allocator + CUDA context + NCCL"),
    ]
    measured = profile.verification.measured
    if profile.verification.status in ("validated", "mismatch") and "gpu_peak_allocated_bytes" in measured:
        summary_rows.append(("peak allocated (measured)", int(measured["gpu_peak_allocated_bytes"]), "#b07aa1",
                             f"measured {profile.verification.status} run"))
    summary_rows.append(("GPU capacity", capacity, CAPACITY_COLOUR, profile.inputs.hardware.gpu.name))

    height = TOP_PX + ROW_PX * (len(rows) + len(summary_rows)) + 18 + 30
    title = f"{profile.name}: memory per GPU ({profile.layout.label}), bars scaled to the GPU's capacity"
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH_PX}" height="{height}" '
        f'viewBox="0 0 {WIDTH_PX} {height}" font-family="sans-serif" font-size="12">',
        f"<title>{escape(title)}</title>",
        f'<rect width="{WIDTH_PX}" height="{height}" fill="#ffffff"/>',
        f'<text x="10" y="20" font-size="14" font-weight="bold">{escape(title)}</text>',
        f'<text x="10" y="36" fill="#555555">predicted by {escape(pred.planner)}; terms are not all alive '
        "at once, so they do not add up to the peak</text>",
    ]
    y = TOP_PX

    def bar(label: str, n_bytes: int, colour: str, tooltip: str, css_class: str) -> None:
        nonlocal y
        width = 0.0 if capacity <= 0 else min(n_bytes / capacity, 1.0) * BAR_PX
        out.append(f'<g class="{css_class}" data-bytes="{n_bytes}">')
        out.append(f"<title>{escape(label)}: {escape(gib(n_bytes))}. {escape(tooltip)}</title>")
        out.append(f'<text x="{LABEL_PX - 8}" y="{y + 15}" text-anchor="end">{escape(label)}</text>')
        out.append(f'<rect x="{LABEL_PX}" y="{y + 3}" width="{width:.1f}" height="{ROW_PX - 6}" '
                   f'fill="{_attr(colour)}"/>')
        out.append(f'<text x="{LABEL_PX + width + 6:.1f}" y="{y + 15}">{escape(gib(n_bytes))}</text>')
        out.append("</g>")
        y += ROW_PX

    for row in rows:
        bar(*row, css_class="term")
    y += 18
    out.append(f'<line x1="{LABEL_PX}" y1="{y - 9}" x2="{LABEL_PX + BAR_PX}" y2="{y - 9}" stroke="#cccccc"/>')
    for row in summary_rows:
        bar(*row, css_class="total")
    legend_x = 10
    for category, colour in CATEGORY_COLOURS.items():
        out.append(f'<rect x="{legend_x}" y="{y + 10}" width="10" height="10" fill="{colour}"/>')
        out.append(f'<text x="{legend_x + 14}" y="{y + 19}">{category.replace("_", " ")}</text>')
        legend_x += 150
    out.append("</svg>")
    return "\n".join(out) + "\n"
