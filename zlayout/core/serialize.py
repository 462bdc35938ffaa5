"""A plan as plain JSON-ready dicts: the one shape `zlayout plan --json`, profiles and tests read.

Offload devices are written as the command line spells them ("none", "cpu", "nvme").
"""

from __future__ import annotations

import dataclasses
from typing import Any

from zlayout.core.fit import GpuFit
from zlayout.core.memory import MemoryEstimate
from zlayout.core.plan import LayoutPlan, Plan
from zlayout.spec import Layout, offload_flag


def layout_dict(layout: Layout) -> dict[str, Any]:
    return {
        "stage": layout.stage,
        "offload_optimizer": offload_flag(layout.offload_optimizer),
        "offload_param": offload_flag(layout.offload_param),
        "label": layout.label,
    }


def fit_dict(fit: GpuFit) -> dict[str, Any]:
    """core.fit's verdict and figures, each on what it measures (its module docstring)."""
    return {
        "state": fit.state,
        "summary": fit.summary(),
        "needed_bytes": fit.needed_bytes,
        "usable_bytes": fit.usable_bytes,
        "device_used_bytes": fit.device_used_bytes,
        "headroom_bytes": fit.headroom_bytes,
        "headroom_fraction": round(fit.headroom_fraction, 4),
        "headroom_measures": "the card's memory minus device used at the peak",
        "margin_bytes": fit.margin_bytes,
        "flushes_per_step": fit.flushes_per_step,
        "flush_cost_s": round(fit.flush_cost_s, 4),
        "alert_thresholds": [{"name": a.name, "bytes": a.bytes, "watches": a.watches}
                             for a in fit.alert_thresholds()],
    }


def memory_dict(memory: MemoryEstimate) -> dict[str, Any]:
    return {
        "gpu_peak_allocated_bytes": memory.gpu_peak_allocated_bytes,
        "gpu_peak_reserved_bytes": memory.gpu_peak_reserved_bytes,
        "gpu_device_used_bytes": memory.gpu_device_used_bytes,
        "gpu_capacity_bytes": memory.gpu_capacity_bytes,
        "gpu_headroom_bytes": memory.gpu_headroom_bytes,
        "gpu_headroom_fraction": round(memory.gpu_headroom_fraction, 4),
        "after_init_bytes": memory.after_init_bytes,
        "peak_phase": memory.peak_phase,
        "host_peak_bytes": memory.host_peak_bytes,
        "host_capacity_bytes": memory.host_capacity_bytes,
        "nvme_bytes": memory.nvme_bytes,
        "nvme_capacity_bytes": memory.nvme_capacity_bytes,
        "fits": memory.fits,
        "fits_gpu": memory.fits_gpu,
        "gpu_fit": fit_dict(memory.gpu_fit),
        "fits_host": memory.fits_host,
        "fits_nvme": memory.fits_nvme,
        "terms": [
            {"name": t.name, "where": t.where, "bytes": t.bytes, "category": t.category,
             "explanation": t.explanation}
            for t in memory.terms
        ],
    }


def _scalars(obj: Any) -> dict[str, Any]:
    """The scalar fields and properties of a result dataclass (nested collections are skipped)."""
    out: dict[str, Any] = {}
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name)
        if isinstance(value, (bool, int, float, str)) or value is None:
            out[field.name] = value
    for name in dir(type(obj)):
        if isinstance(getattr(type(obj), name, None), property):
            value = getattr(obj, name)
            if isinstance(value, (bool, int, float, str)):
                out[name] = value
    return out


def layout_plan_dict(lp: LayoutPlan) -> dict[str, Any]:
    out = layout_dict(lp.layout)
    out.update(memory_dict(lp.memory))
    out["step_time_s"] = lp.time.step_time_s
    out["tokens_per_s"] = lp.time.tokens_per_s
    out["mfu"] = lp.time.mfu
    out["time"] = _scalars(lp.time)
    out["comm"] = _scalars(lp.comm)
    if lp.breakeven is not None:
        out["breakeven"] = _scalars(lp.breakeven)
    return out


def recommendation_dict(plan: Plan) -> dict[str, Any]:
    rec = plan.recommendation
    return {
        "layout": layout_dict(rec.layout) if rec.layout is not None else None,
        "reason": rec.reason,
        "runner_up": layout_dict(rec.runner_up) if rec.runner_up is not None else None,
        "suggestions": list(rec.suggestions),
        "fixes": [{"text": fix.text, "flags": fix.flags, "change": fix.change,
                   "layout": layout_dict(fix.layout), "step_time_s": fix.step_time_s}
                  for fix in rec.fixes],
    }


def model_dict(plan: Plan) -> dict[str, Any]:
    m = plan.input.model
    return {"params": m.params, **m.model_dump()}
