"""Making a profile from a plan, and folding a verification result into it.

`build_profile` is what `zlayout export` calls; `attach_verification` is what the verification
run calls with its result dict. Both return new frozen `Profile`s; nothing here touches files.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Mapping

from pydantic import ValidationError

from zlayout import __version__
from zlayout.core.breakeven import break_even, crossovers
from zlayout.core.plan import plan_layout
from zlayout.profile.alerts import derive_alerts
from zlayout.profile.errors import describe_validation_error
from zlayout.profile.schema import (MEASURED_STATUSES, ChangeEntry, LayoutLimit, Limits, PredictedTerm,
                                    Prediction, Profile, RestartDrill, RunSettings, Verification, utc_now,
                                    without_custom_family)
from zlayout.spec import Layout, PlanInput, all_layouts

PRECISION_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
OPTIMIZER_STATE_BYTES_PER_PARAM = 12  # fp32 master weights + AdamW's two fp32 moments


def checkpoint_bytes(inp: PlanInput, layout: Layout) -> int:
    """One DeepSpeed checkpoint over all ranks: the optimizer state (always saved, partitioned
    from stage 1) plus the module's weights in training precision, which stages 0-2 save whole
    and stage 3 only as its fp32 partitions (already counted in the optimizer state)."""
    params = inp.model.params
    weights = 0 if layout.stage == 3 else PRECISION_BYTES[inp.training.precision] * params
    return OPTIMIZER_STATE_BYTES_PER_PARAM * params + weights


def limits(inp: PlanInput, layout: Layout, presets_dirs: tuple[str, ...] = ()) -> Limits:
    """Break-even on this hardware: how far this layout carries the model, and what comes next.

    `presets_dirs`: `--presets-dir`'s folders, where the model's family may be defined."""
    evens = {other: break_even(inp, other, presets_dirs) for other in all_layouts()}
    mine = evens.get(layout) or break_even(inp, layout, presets_dirs)
    crossing = next((c for c in crossovers(inp, presets_dirs=presets_dirs) if c.stops_fitting == layout), None)
    model = mine.max_model
    return Limits(
        scaling=mine.scaling, max_params=mine.max_params,
        max_model=None if model is None else
        f"{model.name}: {model.layers} layers, hidden {model.hidden}, {model.heads} heads",
        next_params=mine.next_params, limited_by=mine.limited_by, max_micro_batch=mine.max_micro_batch,
        takes_over=crossing.takes_over if crossing else None,
        layouts=[LayoutLimit(layout=other.label, max_params=be.max_params, max_micro_batch=be.max_micro_batch,
                             limited_by=be.limited_by) for other, be in evens.items()],
    )


def predict(inp: PlanInput, layout: Layout) -> Prediction:
    """The planner's prediction for one layout, as the profile stores it."""
    lp = plan_layout(inp, layout, with_breakeven=False)
    mem, time, comm = lp.memory, lp.time, lp.comm
    return Prediction(
        planner=f"zlayout {__version__}",
        gpu_peak_allocated_bytes=mem.gpu_peak_allocated_bytes,
        gpu_peak_reserved_bytes=mem.gpu_peak_reserved_bytes,
        gpu_device_used_bytes=mem.gpu_device_used_bytes, gpu_needed_bytes=mem.gpu_needed_bytes,
        gpu_flushes_per_step=mem.gpu_flushes_per_step,
        host_peak_bytes=mem.host_peak_bytes,
        nvme_bytes=mem.nvme_bytes,
        gpu_capacity_bytes=mem.gpu_capacity_bytes,
        gpu_usable_bytes=mem.gpu_usable_bytes,
        gpu_headroom_bytes=mem.gpu_headroom_bytes,
        host_capacity_bytes=mem.host_capacity_bytes,
        nvme_capacity_bytes=mem.nvme_capacity_bytes,
        peak_phase=mem.peak_phase,
        fits=mem.fits, fits_gpu=mem.fits_gpu, fits_host=mem.fits_host, fits_nvme=mem.fits_nvme,
        step_time_s=time.step_time_s, compute_s=time.compute_s, comm_s=time.comm_s,
        offload_s=time.offload_s, host_overhead_s=time.host_overhead_s, tokens_per_s=time.tokens_per_s,
        mfu=time.mfu,
        intra_node_bytes=comm.intra_node_bytes, inter_node_bytes=comm.inter_node_bytes,
        pcie_bytes=comm.pcie_bytes, nvme_read_bytes=comm.nvme_read_bytes,
        nvme_write_bytes=comm.nvme_write_bytes,
        checkpoint_bytes=checkpoint_bytes(inp, layout),
        terms=[PredictedTerm(name=t.name, where=t.where, bytes=t.bytes, category=t.category,
                             explanation=t.explanation) for t in mem.terms],
    )


def default_name(inp: PlanInput, layout: Layout) -> str:
    hw = inp.hardware
    return f"{inp.model.name}-{hw.world}x{hw.gpu.name}-{layout.key}"


def describe(inp: PlanInput, layout: Layout) -> str:
    hw = inp.hardware
    nodes = f"{hw.nodes} nodes of " if hw.nodes > 1 else ""
    return f"{layout.label} for {inp.model.name} on {nodes}{hw.gpus_per_node}x {hw.gpu.name}"


def build_profile(inp: PlanInput, layout: Layout, *, name: str | None = None,
                  description: str | None = None, run: RunSettings | None = None,
                  why: str | None = None, previous: Profile | None = None,
                  now: datetime | None = None, presets_dirs: tuple[str, ...] = ()) -> Profile:
    """A fresh, unverified profile for `layout`.

    With `previous` (the profile being replaced) its change log is kept and this export is
    appended with the before/after figures, so the file remembers why the layout changed.
    """
    when = now or utc_now()
    inp = without_custom_family(inp)
    prediction = predict(inp, layout)
    verification = Verification()
    if previous is not None:
        before = _figures(previous)
        entry = ChangeEntry(
            when=when, why=why or f"re-exported: {describe(inp, layout)}", basis="predicted",
            layout_before=previous.layout.label, layout_after=layout.label,
            gpu_peak_bytes_before=before[0], gpu_peak_bytes_after=prediction.gpu_peak_allocated_bytes,
            host_peak_bytes_before=before[1], host_peak_bytes_after=prediction.host_peak_bytes,
            step_time_s_before=before[2], step_time_s_after=prediction.step_time_s)
        changelog = [*previous.changelog, entry]
        run = run or previous.run
    else:
        changelog = [ChangeEntry(
            when=when, why=why or f"exported: {describe(inp, layout)}", basis="predicted",
            layout_after=layout.label,
            gpu_peak_bytes_after=prediction.gpu_peak_allocated_bytes,
            host_peak_bytes_after=prediction.host_peak_bytes,
            step_time_s_after=prediction.step_time_s)]
    return Profile(
        name=name or default_name(inp, layout),
        description=description or describe(inp, layout),
        zlayout_version=__version__,
        inputs=inp, layout=layout, run=run or RunSettings(),
        prediction=prediction, verification=verification, changelog=changelog,
        limits=limits(inp, layout, presets_dirs),
        alerts=derive_alerts(inp, prediction, verification, checkpoint_dir=(run or RunSettings()).checkpoint_dir),
    )


def _figures(profile: Profile) -> tuple[int, int, float | None]:
    """(GPU peak, host peak, step time) as best known: measured after a complete run."""
    p = profile.prediction
    v = profile.verification
    m = v.measured if v.status in MEASURED_STATUSES and v.world in (None, profile.world) else {}
    step = m.get("step_time_s", p.step_time_s)
    return (int(m.get("gpu_peak_allocated_bytes", p.gpu_peak_allocated_bytes)),
            int(m.get("host_peak_bytes", p.host_peak_bytes)),
            None if step is None else float(step))


def _numbers(block: Mapping[str, Any] | None) -> dict[str, int | float]:
    """Numeric figures only: lists, strings, bools and None are left out (TOML has no null)."""
    out: dict[str, int | float] = {}
    for key, value in (block or {}).items():
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, (int, float)):
            out[str(key)] = value
    return out


def _gpus_text(gpus: Any) -> tuple[str | None, int | None]:
    if gpus is None:
        return None, None
    if isinstance(gpus, (list, tuple)):
        names = [str(g) for g in gpus if g]
        if not names:
            return None, None
        if len(set(names)) == 1:
            return f"{len(names)}x {names[0]}", len(names)
        return ", ".join(names), len(names)
    return str(gpus), None


_WORLD_KEYS = ("gpus_per_node", "nodes", "inter_link")


def _check_same_run(profile: Profile, result: Mapping[str, Any]) -> int | None:
    """A result for another layout or other inputs must not be filed under this profile.

    The run may use fewer GPUs than the profile (one node of a multi-node profile); everything
    else must match. Returns the world the run used, when the result says."""
    layout = result.get("layout")
    if isinstance(layout, Mapping):
        try:
            ran = Layout(**{k: v for k, v in layout.items() if k in Layout.model_fields})
        except ValidationError:
            raise ValueError(f"verification result: unreadable layout {dict(layout)}") from None
        if ran != profile.layout:
            raise ValueError(f"verification result is for {ran.label}, this profile is {profile.layout.label}: "
                             "verify the profile's own layout")
    inputs = result.get("inputs")
    if not isinstance(inputs, Mapping):
        return None
    try:
        ran_inputs = PlanInput.model_validate(inputs)
    except ValidationError:
        raise ValueError("verification result: its inputs are not a valid plan input") from None

    def comparable(inp: PlanInput) -> dict[str, Any]:
        data = inp.model_dump(mode="json")
        for key in _WORLD_KEYS:
            data["hardware"].pop(key, None)
        return data

    mine, theirs = comparable(profile.inputs), comparable(ran_inputs)
    if mine != theirs:
        differing = sorted(f"{section}" for section in mine if mine[section] != theirs.get(section))
        raise ValueError(f"verification result was run with other inputs than this profile's "
                         f"({', '.join(differing)} differ): verify the profile itself")
    return ran_inputs.hardware.world


def never_started(result: Mapping[str, Any]) -> bool:
    """A run that measured nothing because no rank ever reported (a failed preflight, a launcher
    that could not start): it says nothing about the layout."""
    return (result.get("status") == "failed" and not _numbers(result.get("measured"))
            and not result.get("ranks"))


def _kept_after_a_run_that_never_started(profile: Profile, result: Mapping[str, Any],
                                         now: datetime | None) -> Profile:
    """The profile with its last real verification kept, and the attempt in the change log."""
    cause = " ".join(str(result.get("cause") or result.get("message") or "no rank started").split())[:200]
    gpu, host, step = _figures(profile)
    basis = "measured" if profile.alerts.gpu_memory.basis == "measured" else "predicted"
    entry = ChangeEntry(
        when=now or utc_now(), why=f"verification did not start ({cause}); kept the last result: "
                                   f"{profile.verification.status}", basis=basis,
        layout_before=profile.layout.label, layout_after=profile.layout.label,
        gpu_peak_bytes_before=gpu, gpu_peak_bytes_after=gpu, host_peak_bytes_before=host,
        host_peak_bytes_after=host, step_time_s_before=step, step_time_s_after=step)
    return profile.model_copy(update={"changelog": [*profile.changelog, entry]})


def attach_verification(profile: Profile, result: Mapping[str, Any],
                        now: datetime | None = None) -> Profile:
    """Fold a verification run's result (zlayout.verify's result dict) into the profile.

    Reads `status` (validated, mismatch, does-not-fit, failed, cpu-ok; `cancelled` is refused),
    `cause`, `measured` and `predicted` figures (gpu_peak_allocated_bytes, gpu_peak_reserved_bytes,
    gpu_device_used_bytes, host_peak_bytes, step_time_s, tokens_per_s, ...: numbers are kept,
    per-step lists dropped), `restart_drill` {resumed_ok, resume_s, ...}, `environment`
    {gpus (list or text), driver, cuda, torch, deepspeed}, and when present `layout`/`inputs`
    (which must be the profile's) and `when`. Fills [verification] and [restart_drill],
    recomputes [alerts] from the measurement and appends a change-log entry. A run that never
    started (`never_started`: a failed preflight) keeps the last verification and only logs the attempt.
    Raises ValueError naming what is wrong.
    """
    status = result.get("status")
    if status == "cancelled":
        raise ValueError("the verification run was cancelled: it verified nothing; run it to the end")
    ran_world = _check_same_run(profile, result)
    if never_started(result):
        return _kept_after_a_run_that_never_started(profile, result, now)
    env = dict(result.get("environment") or {})
    measured_block = result.get("measured") or {}
    measured = _numbers(measured_block)
    world = int(measured.get("world") or ran_world or 0) or None
    message = result.get("message") or result.get("cause")
    if result.get("emulated_world"):
        note = (f"emulated: rank 0 of {result['emulated_world']} GPUs on one GPU (per-GPU memory of "
                "the full run; step time and host memory not measured)")
        message = f"{note}. {message}" if message else note
    elif world is not None and world != profile.world:
        note = (f"run on {world} of the profile's {profile.world} GPUs: per-GPU figures are for "
                f"{world}; alerts stay on the prediction")
        message = f"{note}. {message}" if message else note
    predicted = _numbers(result.get("predicted")) or profile.prediction.figures()
    errors = {k: round((predicted[k] - v) / v, 6) for k, v in measured.items()
              if k in predicted and v and k not in ("world", "params")}
    gpus, count = _gpus_text(env.get("gpus"))
    steps_run = measured_block.get("steps_run") if isinstance(measured_block, Mapping) else None
    fields = {
        "status": status,
        "when": result.get("when") or env.get("when") or now or utc_now(),
        "gpus": gpus, "gpu_count": env.get("gpu_count", count),
        "driver": env.get("driver"), "cuda": env.get("cuda"),
        "torch": env.get("torch"), "deepspeed": env.get("deepspeed"),
        "steps": result.get("steps", len(steps_run) if isinstance(steps_run, list) and steps_run else None),
        "message": message, "world": world,
        "measured": measured, "predicted": predicted, "error_fraction": errors,
    }
    fields = {k: (str(v) if k in ("driver", "cuda", "torch", "deepspeed") and v is not None else v)
              for k, v in fields.items() if v is not None}
    try:
        verification = Verification(**fields)
        drill_block = result.get("restart_drill")
        drill = profile.restart_drill
        if drill_block:
            drill_fields = dict(drill_block)
            drill_fields.setdefault("message", drill_fields.get("cause"))
            drill = RestartDrill(**{k: v for k, v in drill_fields.items()
                                    if k in RestartDrill.model_fields and v is not None})
    except ValidationError as exc:
        raise ValueError(f"verification result: {describe_validation_error(exc)}") from None

    before = _figures(profile)
    complete = verification.status in MEASURED_STATUSES and world in (None, profile.world)
    after_gpu = int(measured.get("gpu_peak_allocated_bytes", before[0])) if complete else before[0]
    after_host = int(measured.get("host_peak_bytes", before[1])) if complete else before[1]
    after_step = measured.get("step_time_s", before[2]) if complete else before[2]
    where = f" on {verification.gpus}" if verification.gpus else ""
    first_line = (verification.message or "").strip().splitlines()
    entry = ChangeEntry(
        when=verification.when, why=f"verification {verification.status}{where}"
        + (f": {first_line[0][:200]}" if first_line else ""),
        basis="measured" if complete and measured else "predicted",
        layout_before=profile.layout.label, layout_after=profile.layout.label,
        gpu_peak_bytes_before=before[0], gpu_peak_bytes_after=after_gpu,
        host_peak_bytes_before=before[1], host_peak_bytes_after=after_host,
        step_time_s_before=before[2],
        step_time_s_after=None if after_step is None else float(after_step))
    return profile.model_copy(update={
        "verification": verification,
        "restart_drill": drill,
        "alerts": derive_alerts(profile.inputs, profile.prediction, verification,
                                checkpoint_dir=profile.run.checkpoint_dir),
        "changelog": [*profile.changelog, entry],
    })
