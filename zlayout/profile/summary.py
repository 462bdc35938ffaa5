"""A profile as text a person reads: what lives where, why, and the numbers.

Pure formatting (no I/O), shared by `zlayout show` and anything else that displays a profile.
"""

from __future__ import annotations

from zlayout.catalog import format_params
from zlayout.profile.schema import Profile
from zlayout.spec import GiB, gib_figure

def gib(n: float | int | None) -> str:
    return "-" if n is None else f"{gib_figure(n)} GiB"  # the app's figures (spec.gib_figure)


def host_ram_text(profile: Profile) -> str:
    """The host RAM per node with where the figure came from: a default is never shown as a fact."""
    from zlayout.profile.schema import HOST_RAM_SOURCE_TEXT

    return f"{gib(profile.inputs.hardware.host_ram_bytes)} ({HOST_RAM_SOURCE_TEXT[profile.host_ram_source]})"


def team_config_text(profile: Profile) -> str:
    """Whose optimizer and scheduler ds_config.json holds, in a line."""
    team = profile.ds_config_team
    if team is None:
        return "zlayout's AdamW (lr 1e-4, no scheduler); bring yours with export --ds-config"
    optimizer = team.get("optimizer") or {}
    params = optimizer.get("params") or {}
    parts = [f"optimizer {optimizer.get('type')}" + (f" lr {params['lr']:g}" if isinstance(params.get("lr"), (int, float))
                                                     and not isinstance(params.get("lr"), bool) else "")
             if optimizer else "no optimizer block (the script's own)"]
    scheduler = team.get("scheduler") or {}
    parts.append(f"scheduler {scheduler.get('type')}" if scheduler else "no scheduler")
    rest = sorted(k for k in team if k not in ("optimizer", "scheduler"))
    return "the team's: " + ", ".join(parts) + (f"; also {', '.join(rest)}" if rest else "") + \
        "; zlayout's ZeRO, batch and precision keys"


def free_gpu_memory_needed(profile: Profile) -> int:
    """The free memory each GPU must have for the run: the least its peak runs in (the
    allocator model's verdict figure), not the device use it reaches on a card with room
    (the caching allocator grows into whatever is free, up to the whole card)."""
    pred = profile.prediction
    return pred.gpu_needed_bytes if pred.gpu_needed_bytes is not None else pred.gpu_device_used_bytes


def seconds(s: float | None) -> str:
    return "-" if s is None else f"{s:.3g} s"


def figure(key: str, value: float | int | None) -> str:
    """A named figure in its unit: bytes as GiB, seconds as s, the rest as numbers."""
    if value is None:
        return "-"
    if key.endswith("_bytes"):
        return gib(value)
    if key.endswith("_per_s"):
        return f"{value:,.0f}/s"
    if key.endswith("_s"):
        return seconds(float(value))
    return f"{value:,.4g}" if isinstance(value, float) else f"{value:,}"


def status_line(profile: Profile) -> str:
    v = profile.verification
    if v.status == "unverified":
        return (f"UNVERIFIED: predicted by {profile.prediction.planner}, not yet run on GPUs "
                "(run `zlayout verify` on the target machine)")
    where = f" on {v.gpus}" if v.gpus else ""
    when = f" at {v.when:%Y-%m-%d %H:%M} UTC" if v.when else ""
    versions = ", ".join(f"{label} {value}" for label, value in
                         (("driver", v.driver), ("CUDA", v.cuda), ("torch", v.torch),
                          ("DeepSpeed", v.deepspeed)) if value)
    text = f"{v.status.upper()}{where}{when}" + (f" ({versions})" if versions else "")
    if v.message:
        text += f": {v.message}"
    return text


def format_profile(profile: Profile) -> str:
    inp, layout, pred = profile.inputs, profile.layout, profile.prediction
    m, hw, t = inp.model, inp.hardware, inp.training
    out: list[str] = [profile.name, profile.description, f"Status: {status_line(profile)}", ""]

    out.append("Inputs")
    kv = f" ({m.num_kv_heads} kv)" if m.num_kv_heads != m.heads else ""
    out.append(f"  model     {m.name}: {format_params(m.params)} params, {m.layers} layers, hidden {m.hidden}, "
               f"{m.heads} heads{kv}, ffn {m.ffn_size}, vocab {m.vocab}, {m.mlp}, {m.norm}")
    inter = f", {hw.inter_link.name} between nodes" if hw.inter_link and hw.nodes > 1 else ""
    out.append(f"  hardware  {hw.nodes} node(s) x {hw.gpus_per_node} {hw.gpu.name} ({gib(hw.gpu.memory_bytes)} each), "
               f"{hw.intra_link.name} within a node{inter}; host RAM {host_ram_text(profile)}/node, "
               f"NVMe {gib(hw.nvme_bytes)}/node")
    out.append(f"  training  seq {t.seq}, micro-batch {t.micro_batch}, grad-accum {t.grad_accum}, "
               f"{t.precision}, checkpointing {t.checkpointing}, "
               f"global batch {t.micro_batch * t.grad_accum * hw.world} sequences")
    out.append(f"  layout    ZeRO-{layout.stage}, optimizer state on {layout.offload_optimizer}, "
               f"parameters on {layout.offload_param}")
    out.append("")

    out.append(f"What lives where (predicted, {pred.planner})")
    width = max(len(term.name) for term in pred.terms)
    for where, title in (("gpu", "GPU, per GPU"), ("host", "host"), ("nvme", "NVMe")):
        terms = [term for term in pred.terms if term.where == where]
        if not terms:
            continue
        out.append(f"  {title}")
        for term in terms:
            out.append(f"    {term.name:<{width}}  {gib(term.bytes):>12}  {term.explanation}")
    fits = "fits" if pred.fits else (
        "DOES NOT FIT (" + ", ".join(name for name, ok in (("GPU", pred.fits_gpu), ("host", pred.fits_host),
                                                           ("NVMe", pred.fits_nvme)) if not ok) + ")")
    room = cache_fills_card_text(pred) or f"headroom {gib(pred.gpu_headroom_bytes)}"
    out.append(f"  peak per GPU: {gib(pred.gpu_peak_allocated_bytes)} allocated, "
               f"{gib(pred.gpu_peak_reserved_bytes)} reserved, {gib(pred.gpu_device_used_bytes)} device used "
               f"of {gib(pred.gpu_capacity_bytes)} ({room}, "
               f"peak during {pred.peak_phase}): {fits}")
    out.append(f"  host peak per node: {gib(pred.host_peak_bytes)} of {host_ram_text(profile)}; "
               f"NVMe per node: {gib(pred.nvme_bytes)} of {gib(pred.nvme_capacity_bytes)}")
    if pred.step_time_s is not None:
        parts = ", ".join(f"{label} {seconds(value)}" for label, value in
                          (("compute", pred.compute_s), ("host (not hidden)", pred.host_overhead_s),
                           ("exposed comm", pred.comm_s), ("offload", pred.offload_s)) if value is not None)
        rate = f", {pred.tokens_per_s:,.0f} tokens/s" if pred.tokens_per_s else ""
        mfu = f", MFU {pred.mfu:.0%}" if pred.mfu is not None else ""
        out.append(f"  step time {seconds(pred.step_time_s)} ({parts}){rate}{mfu}")
    out.append("")

    v = profile.verification
    if v.measured:
        out.append("Measured vs predicted")
        out.append(f"  {'figure':<28} {'measured':>14} {'predicted':>14} {'error':>8}")
        for key, value in v.measured.items():
            err = v.error_fraction.get(key)
            out.append(f"  {key:<28} {figure(key, value):>14} {figure(key, v.predicted.get(key)):>14} "
                       f"{'' if err is None else f'{err:+.1%}':>8}")
        out.append("")
    if profile.restart_drill is not None:
        d = profile.restart_drill
        took = f" in {seconds(d.resume_s)}" if d.resume_s is not None else ""
        out.append(f"Restart drill: {'resumed OK' if d.resumed_ok else 'FAILED to resume'}{took}"
                   + (f": {d.message}" if d.message else ""))
        out.append("")

    a = profile.alerts
    out.append("Alerts (wire these into monitoring)")
    g = a.gpu_memory
    used = ("" if g.warn_device_used_above_bytes is None else
            f" or device used > {gib(g.warn_device_used_above_bytes)}")
    out.append(f"  GPU memory   warn when max allocated > {gib(g.warn_allocated_above_bytes)}{used} per GPU ({g.basis})")
    if g.critical_device_used_above_bytes is not None:
        out.append(f"               nearly full above {gib(g.critical_device_used_above_bytes)} in use per GPU")
    out.append(f"               why: {g.why}")
    h = a.host_memory
    out.append(f"  host memory  warn above {gib(h.warn_above_bytes)} per node ({h.basis})")
    out.append(f"               why: {h.why}")
    if a.step_time is not None:
        s = a.step_time
        out.append(f"  step time    warn above {seconds(s.warn_above_s)} ({s.basis})")
        out.append(f"               why: {s.why}")
    out.append(f"  loss spike   {a.loss_spike.rule}")
    out.append(f"               why: {a.loss_spike.why}")
    out.append("")

    out.append("Change log")
    for entry in profile.changelog:
        step = (f"; step {seconds(entry.step_time_s_before)} -> {seconds(entry.step_time_s_after)}"
                if entry.step_time_s_after is not None else "")
        out.append(f"  {entry.when:%Y-%m-%d %H:%M} UTC  {entry.why}")
        out.append(f"      GPU peak {gib(entry.gpu_peak_bytes_before)} -> {gib(entry.gpu_peak_bytes_after)}, "
                   f"host {gib(entry.host_peak_bytes_before)} -> {gib(entry.host_peak_bytes_after)}"
                   f"{step} ({entry.basis})")
    r = profile.run
    out.append("")
    out.append(f"DeepSpeed config: {team_config_text(profile)}")
    out.append(f"Run: {r.train_script} --deepspeed_config ds_config.json"
               + (f"; checkpoints in {r.checkpoint_dir}" if r.checkpoint_dir else "")
               + (f"; NVMe offload at {r.nvme_path}" if "nvme" in (layout.offload_optimizer, layout.offload_param) else ""))
    return "\n".join(out)


def _flushes_text(pred) -> str:
    """How often a step's cache fills the card and PyTorch flushes it, '' when it does not
    (core.fit's fits-flushing: the app's Free column says `full`, its status 'the device will be full')."""
    n = pred.gpu_flushes_per_step or 0
    return f"{n} time{'s' if n != 1 else ''}" if n else ""


def cache_fills_card_text(pred) -> str | None:
    """What the card has left at the peak when the cache fills it, in the app's terms (its Free
    column says `full`): a headroom of 0.7 GiB read as room to spare beside a layout whose
    allocator flushes its cache twice a step. None when the cache does not fill the card."""
    flushes = _flushes_text(pred)
    return f"its cache fills the card: flushed about {flushes} a step" if flushes else None


def fits_text(pred) -> str:
    """The runbook's 'Fits' for a layout that fits, with the status line's words when the device
    will be full."""
    flushes = _flushes_text(pred)
    if not flushes:
        return "yes"
    needed = pred.gpu_needed_bytes or pred.gpu_device_used_bytes
    return (f"yes; the device will be full and the allocator flushes its cache about {flushes} a step "
            f"(needs {gib(needed)} of {gib(pred.gpu_capacity_bytes)} per GPU)")
