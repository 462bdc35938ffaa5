"""RUNBOOK.md: the handoff pack a team runs production with, generated from the profile.

Pure: a Profile in, markdown text out (no I/O; every figure is one the profile holds, rounded as a
person would and as the app shows them: GiB as `spec.gib_figure` (0.42, 9.87, 75.3, 2128), seconds to 3 digits, except "What the training script must do", whose
figures for a script that departs from the plan are the planner's from the profile's inputs). `extra_files` is what the
profile writer puts beside profile.toml, so the runbook, its chart and the Prometheus rules are
rewritten whenever the profile is (export, verify --update-profile, any change-log entry).
"""

from __future__ import annotations

import json
import re
import shlex

from zlayout.catalog import format_params
from zlayout.core.breakeven import WILL_NOT_RUN
from zlayout.core.fit import NEARLY_FULL_FRACTION, PREDICTED_DEVICE_USED_WORST_UNDER, fills_alert_range
from zlayout.profile.contract import script_contract
from zlayout.profile.diff import Effect, diff_profiles
from zlayout.profile.launch import DEEPSPEED_SCRIPT, SLURM_SCRIPT, TORCHRUN_SCRIPT
from zlayout.profile.memory_svg import memory_svg
from zlayout.profile.prometheus import (ALLOCATED_METRIC, LOSS_METRIC, PROCESS_GROUP, STEP_TIME_METRIC, alerts_yaml,
                                        mib, rules)
from zlayout.profile.schema import Profile, inputs_to_file
from zlayout.profile.summary import (cache_fills_card_text, figure, fits_text, free_gpu_memory_needed, gib, host_ram_text,
                                    seconds, team_config_text)
from zlayout.spec import Layout, offload_flag

RUNBOOK_FILE = "RUNBOOK.md"
MEMORY_SVG_FILE = "memory.svg"
ALERTS_FILE = "alerts.yml"
EXTRA_FILES = (RUNBOOK_FILE, MEMORY_SVG_FILE, ALERTS_FILE)

SECTIONS = (
    "## Summary",
    "## What lives where",
    "## Where it stops fitting",
    "## Pre-run checklist",
    "## Launch",
    "## What the training script must do",
    "## Restart procedure",
    "## Alerts",
    "## On-call notes",
    "## Change log",
)
NVIDIA_SMI = "nvidia-smi --query-gpu=name,memory.total,memory.free,driver_version --format=csv,noheader"
RUN_OUT_OF = {"gpu": "GPU memory", "host": "host memory", "nvme": "NVMe space", "range": "nothing up to zlayout's limits (10T params, 1,000 layers)"}


def extra_files(profile: Profile) -> dict[str, str]:
    """File name -> text of everything generated beside profile.toml besides the DeepSpeed files."""
    return {RUNBOOK_FILE: render_runbook(profile), MEMORY_SVG_FILE: memory_svg(profile),
            ALERTS_FILE: alerts_yaml(profile)}


def _cell(text: object) -> str:
    """Text safe inside a markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _table(header: tuple[str, ...], rows: list[tuple[object, ...]], right: tuple[int, ...] = ()) -> list[str]:
    align = ["---:" if i in right else "---" for i in range(len(header))]
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return out


def layout_flags(layout: Layout) -> str:
    return (f"--stage {layout.stage} --offload-optimizer {offload_flag(layout.offload_optimizer)} "
            f"--offload-param {offload_flag(layout.offload_param)}")


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


def _uses_nvme(profile: Profile) -> bool:
    return "nvme" in (profile.layout.offload_optimizer, profile.layout.offload_param)


def _drilled(profile: Profile) -> bool:
    return profile.restart_drill is not None


# --------------------------------------------------------------------------- sections

def _summary(p: Profile) -> list[str]:
    s, inp, v = p.summary(), p.inputs, p.verification
    hw, t = inp.hardware, inp.training
    inter = f"; {hw.inter_link.name} between nodes" if hw.inter_link and hw.nodes > 1 else ""
    rows: list[tuple[object, ...]] = [
        ("Model", s.model),
        ("Hardware", f"{s.hardware}, {hw.intra_link.name} within a node{inter}; "
                     f"host RAM {host_ram_text(p)} per node"),
        ("Training", f"sequence {t.seq}, micro-batch {t.micro_batch}, gradient accumulation {t.grad_accum}, "
                     f"global batch {t.micro_batch * t.grad_accum * hw.world} sequences, {t.precision}, "
                     f"activation checkpointing {t.checkpointing}"),
        ("Layout", f"{s.layout} (optimizer state on {p.layout.offload_optimizer}, "
                   f"parameters on {p.layout.offload_param})"),
        ("Verdict", f"**{v.status.upper()}**" + s.verdict.removeprefix(v.status)),
        ("Fits", fits_text(p.prediction) if s.fits else "NO: the prediction says it does not fit; re-plan before launching"),
        (f"GPU memory, peak allocated ({s.basis})", f"{gib(s.gpu_peak_allocated_bytes)} of "
                                                    f"{gib(s.gpu_capacity_bytes)} per GPU"),
        (f"GPU memory in use, nvidia-smi ({s.basis})", f"{gib(s.gpu_device_used_bytes)} per GPU"),
        (f"Host memory, peak ({s.basis})", f"{gib(s.host_peak_bytes)} per node, of {host_ram_text(p)}"),
    ]
    if s.nvme_bytes:
        rows.append(("NVMe", f"{gib(s.nvme_bytes)} per node"))
    if s.step_time_s is not None:
        rate = f", {s.tokens_per_s:,} tokens/s" if s.tokens_per_s else ""
        rows.append((f"Step time ({s.basis})", f"{seconds(s.step_time_s)}{rate}"))
    if s.checkpoint_bytes is not None:
        rows.append(("One checkpoint (estimate)", gib(s.checkpoint_bytes)))
    out = _table(("", ""), rows)
    if v.status == "unverified":
        out += ["", f"Not yet run on GPUs: every figure is a prediction. Verify on the target machine: "
                    f"`zlayout verify {_dir(p)} --steps 5 --restart-drill`."]
    elif v.message:
        out += ["", f"Verification note: {_cell(v.message)}"]
    if v.measured:
        out += ["", "Measured against predicted:", ""]
        rows = [(key, figure(key, value), figure(key, v.predicted.get(key)),
                 "" if v.error_fraction.get(key) is None else f"{v.error_fraction[key]:+.1%}")
                for key, value in v.measured.items() if key not in ("world", "params")]
        out += _table(("figure", "measured", "predicted", "error"), rows, right=(1, 2, 3))
    return out


def _dir(p: Profile) -> str:
    return "."  # the runbook sits in the profile's directory; commands run from there


def _what_lives_where(p: Profile) -> list[str]:
    pred = p.prediction
    out = [f"Predicted by {pred.planner}; the peak falls during {pred.peak_phase}. "
           "The terms are not all alive at once, so they add up to more than the peak.", "",
           f"![Memory per GPU]({MEMORY_SVG_FILE})", ""]
    titles = {"gpu": "Per GPU", "host": "Per host (each node)", "nvme": "On NVMe (each node)"}
    for where, title in titles.items():
        terms = [t for t in pred.terms if t.where == where]
        out.append(f"**{title}**")
        out.append("")
        if not terms:
            out += ["Nothing.", ""]
            continue
        out += _table(("term", "size", "why"), [(t.name, gib(t.bytes), t.explanation) for t in terms], right=(1,))
        out.append("")
    room = cache_fills_card_text(pred) or f"{gib(pred.gpu_headroom_bytes)} to spare"
    out.append(f"Peak per GPU: {gib(pred.gpu_peak_allocated_bytes)} allocated, {gib(pred.gpu_peak_reserved_bytes)} "
               f"reserved by PyTorch, {gib(pred.gpu_device_used_bytes)} in use as nvidia-smi shows it, of "
               f"{gib(pred.gpu_capacity_bytes)}; {room}. Host peak "
               f"{gib(pred.host_peak_bytes)} per node, of {host_ram_text(p)}"
               + (f"; NVMe {gib(pred.nvme_bytes)} of {gib(pred.nvme_capacity_bytes)} per node." if pred.nvme_bytes
                  else "."))
    return out


def _stops_fitting(p: Profile) -> list[str]:
    lim, inp = p.limits, p.inputs
    if lim is None:
        return ["This profile was written before zlayout recorded break-even sizes (schema 1). Re-export it "
                "with `zlayout export ... --force` to add them, or run `zlayout breakeven` with the same flags."]
    rule = (f"the {inp.model.family} family's shapes" if lim.scaling == "family"
            else f"more or fewer layers of this shape (hidden {inp.model.hidden})")
    out = []
    if lim.max_params:
        model = f" ({lim.max_model})" if lim.max_model else ""
        out.append(f"On this hardware {p.layout.label} carries models up to **{format_params(lim.max_params)}** "
                   f"parameters{model}, growing the model along {rule}. This model has "
                   f"{format_params(inp.model.params)}.")
    else:
        out.append(f"On this hardware {p.layout.label} carries no size of the model along {rule}.")
    if lim.next_params:
        beyond = (f"**{lim.takes_over.label}** is the fastest layout that fits it" if lim.takes_over
                  else "no layout fits it on this hardware")
        # a profile of a layout that does not fit: the "next size" is this model itself
        # (its own size: the next family size after the largest that fits can be below it)
        this_model = lim.next_params <= inp.model.params
        which = "This model" if this_model else "The next size"
        size = inp.model.params if this_model else lim.next_params
        out.append(f"{which}, {format_params(size)}, runs out of {RUN_OUT_OF.get(lim.limited_by, lim.limited_by)}; "
                   f"{beyond}.")
    else:
        out.append("No size up to 10T parameters runs out of memory with this layout.")
    out += ["", f"Largest micro-batch for this model with this layout: **{lim.max_micro_batch}** "
                f"(the profile runs {inp.training.micro_batch}).", ""]
    rows = [(f"**{row.layout}**" if row.layout == p.layout.label else row.layout,
             format_params(row.max_params) if row.max_params else "none",
             row.max_micro_batch or "none", RUN_OUT_OF.get(row.limited_by, row.limited_by))
            if row.limited_by != WILL_NOT_RUN else  # no size: the layout will not run this model
            (row.layout, "will not run", "—", "— (it will not run this model: `zlayout plan` says why)")
            for row in lim.layouts]
    out += _table(("layout", "largest model", "largest micro-batch", "beyond it, runs out of"), rows, right=(1, 2))
    out += ["", "What to change first if the model grows:", ""]
    steps = []
    if lim.takes_over is not None:
        steps.append(f"Switch to {lim.takes_over.label}: re-export with `{layout_flags(lim.takes_over)} --force "
                     "--why \"model grew\"`, then verify it.")
    if lim.limited_by == "gpu":
        if inp.training.checkpointing == "none":
            steps.append("Turn on activation checkpointing (`--checkpointing full`): activations shrink to one "
                         "block's inputs per layer, for about a third more compute.")
        if inp.training.micro_batch > 1:
            steps.append("Halve the micro-batch and double `--grad-accum`: the global batch stays the same.")
        steps.append("Add GPUs (`--gpus-per-node`, `--nodes`): ZeRO partitions the model states over all of them.")
    elif lim.limited_by == "host":
        steps.append("Host memory runs out first: move the optimizer state to NVMe (`--stage 3 "
                     "--offload-optimizer nvme`), or use nodes with more RAM (`--host-ram-gib`).")
    elif lim.limited_by == "nvme":
        steps.append("NVMe space runs out first: a larger NVMe per node (`--nvme-gib`), or more nodes.")
    out += [f"{i}. {step}" for i, step in enumerate(steps, start=1)]
    return out


def _checklist(p: Profile) -> list[str]:
    hw, a, v = p.inputs.hardware, p.alerts, p.verification
    d = _dir(p)
    need_gpu = free_gpu_memory_needed(p)
    out = [f"`zlayout check {d}` tests every item below on the node you launch on (exit 0: all pass, 1: a "
           "failure; run it at the top of the job script). By hand:", ""]
    items = [
        ("GPUs visible", f"`{NVIDIA_SMI}`", f"at least {_count(hw.gpus_per_node, 'GPU')} listed (after CUDA_VISIBLE_DEVICES)"),
        ("GPU model", f"`{NVIDIA_SMI}`", f"{hw.gpu.name} with {gib(hw.gpu.memory_bytes)} "
                                          f"({mib(hw.gpu.memory_bytes):,} MiB, within 3%) each"),
        ("GPU free memory", f"`{NVIDIA_SMI}`",
         f"memory.free at least {gib(need_gpu)} ({mib(need_gpu):,} MiB) on each GPU (the least the peak runs in)"),
        ("host memory", "`grep MemAvailable /proc/meminfo`",
         f"at least {gib(a.host_memory.peak_bytes)} available ({a.host_memory.basis} host peak per node)"),
        ("driver", f"`{NVIDIA_SMI}`",
         f"driver_version {v.driver}, the one the profile was verified with (another is a warning: re-verify)"
         if v.driver else "nothing to compare until the profile is verified (then: the same driver)"),
    ]
    if _uses_nvme(p):
        items.append(("NVMe offload path", f"`df -h {shlex.quote(p.run.nvme_path)}`",
                      f"exists, writable, at least {gib(p.prediction.nvme_bytes)} free"))
    else:
        items.append(("NVMe offload path", "-", "not needed: this layout keeps nothing on NVMe"))
    if p.run.checkpoint_dir:
        ck = shlex.quote(p.run.checkpoint_dir)  # commands are copied into a shell: quoted like the scripts
        items.append(("last checkpoint", f"`cat {ck}/latest; ls -l {ck}/\"$(cat {ck}/latest)\"`",
                      f"the tag `latest` names exists, holds *model_states.pt, every file reads; "
                      f"{p.world} optim_states files (another count needs a universal checkpoint)"))
    else:
        items.append(("last checkpoint", f"`zlayout check {d} --checkpoint-dir DIR`",
                      "no checkpoint_dir in the profile: pass it, or re-export with --checkpoint-dir"))
    items.append(("profile verified", f"`zlayout show {d}`",
                  "validated" + ("" if v.status == "validated" else
                                 f" (now {v.status}: run `zlayout verify {d} --steps 5 --restart-drill`)")))
    out += [f"- [ ] **{name}**: {how}; expect {expect}" for name, how, expect in items]
    return out


def _code(text: str) -> str:
    """`text` as a Markdown code span that holds any backticks in it (a fence one longer than its
    longest run, padded where it starts or ends with one): a script or directory name is the
    user's, and a backtick in it broke the span."""
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _launch(p: Profile) -> list[str]:
    hw, run = p.inputs.hardware, p.run
    out = [f"ds_config.json: {team_config_text(p)}.", "",
           "From the profile's directory; each runs "
           f"{_code(f'${{TRAIN_SCRIPT:-{shlex.quote(run.train_script)}}} --deepspeed_config ds_config.json')} "
           "plus your arguments, one process per GPU "
           f"({_count(hw.world, 'process', 'processes')} in all), and gives each rank its share of the node's cores.", "", "```sh"]
    if hw.nodes > 1:
        out += [f"HOSTFILE=hostfile bash {DEEPSPEED_SCRIPT}     # DeepSpeed's launcher over ssh; hostfile: "
                f"{hw.nodes} lines 'host slots={hw.gpus_per_node}'",
                f"NODE_RANK=0 MASTER_ADDR=node0 bash {TORCHRUN_SCRIPT}   # torchrun: once per node, "
                f"NODE_RANK 0..{hw.nodes - 1}",
                f"sbatch {SLURM_SCRIPT}                # SLURM: srun starts one torchrun per node"]
    else:
        out += [f"bash {DEEPSPEED_SCRIPT}     # DeepSpeed's launcher, {_count(hw.gpus_per_node, 'GPU')}",
                f"bash {TORCHRUN_SCRIPT}      # torchrun --standalone, {_count(hw.gpus_per_node, 'GPU')}",
                f"sbatch {SLURM_SCRIPT}        # SLURM: srun starts one torchrun on the node"]
    out += ["```", "", f"`MASTER_PORT` overrides port {run.master_port}; `DS_CONFIG` another config file.", ""]
    files = [
        ("profile.toml", "the profile: inputs, layout, prediction, verification, limits, alerts, change log"),
        ("ds_config.json", "the DeepSpeed config, exactly what deepspeed.initialize reads"),
        (DEEPSPEED_SCRIPT, "launch with DeepSpeed's launcher"),
        (TORCHRUN_SCRIPT, "launch with torchrun"),
        (SLURM_SCRIPT, "submit to SLURM (cd here first: sbatch runs a copy)"),
        (RUNBOOK_FILE, "this runbook"),
        (MEMORY_SVG_FILE, "the per-GPU memory chart"),
        (ALERTS_FILE, "Prometheus alerting rules (DCGM, process and node exporters, the job's gauges)"),
    ]
    if p.hf_config_json is not None:
        files.append(("hf_config.json", "the model's config.json, as exported with --hf-config"))
    out += _table(("file", "what it is"), [(f"`{name}`", what) for name, what in files])
    out += ["", "All of them are generated from profile.toml and rewritten with it: re-export or verify "
                "rather than editing them by hand."]
    return out


def _script_contract(p: Profile) -> list[str]:
    out = ["The plan assumes these of your training script; each row gives the figure it protects and what "
           "the planner gives when the script does otherwise. A script that departs from one runs a layout "
           "zlayout did not plan: re-plan with its way (`--init`, `--loop`, `--seq`, `--checkpointing`), "
           "re-export and verify.", ""]
    rows = [(i, r.what, r.how, r.protects) for i, r in enumerate(script_contract(p), start=1)]
    return out + _table(("", "the script must", "how", "the figure it protects"), rows)


def _restart(p: Profile) -> list[str]:
    run, d, pred = p.run, _dir(p), p.prediction
    where = _code(run.checkpoint_dir) if run.checkpoint_dir else (
        "not named in the profile (re-export with `--checkpoint-dir DIR` so `zlayout check` tests it)")
    size = f"; one checkpoint is about {gib(pred.checkpoint_bytes)} (all ranks)" if pred.checkpoint_bytes else ""
    out = [f"Checkpoints: {where}{size}.", ""]
    drill = p.restart_drill
    if drill is None:
        out.append(f"Not drilled yet: run `zlayout verify {d} --steps 5 --restart-drill` on the target machine "
                   "(it kills the run after a checkpoint, restarts it and compares the loss).")
    else:
        parts = [f"{label} {seconds(value)}" for label, value in
                 (("save", drill.save_s), ("restart to first resumed step", drill.resume_s),
                  ("restart wall time", drill.restart_wall_s)) if value is not None]
        loss = ""
        if drill.loss_exact is not None:
            loss = "; the loss after resuming was " + ("identical" if drill.loss_exact else
                                                         f"within {drill.loss_max_rel_diff:.2g} (relative)"
                                                         if drill.loss_max_rel_diff is not None else "different")
        verdict = "resumed OK" if drill.resumed_ok else "FAILED to resume"
        out.append(f"Drill: {verdict}" + (f" ({', '.join(parts)})" if parts else "") + loss
                   + (f": {_cell(drill.message)}" if drill.message else "") + ".")
    ck = shlex.quote(run.checkpoint_dir) if run.checkpoint_dir else "CHECKPOINT_DIR"
    ck_python = json.dumps(run.checkpoint_dir or "CHECKPOINT_DIR")
    out += ["", "Steps:", "",
            "1. Stop the job (`scancel JOBID`, or stop the launcher) and wait until no rank is left "
            "(`nvidia-smi` lists no training process on any node).",
            f"2. Check the last checkpoint: `zlayout check {d} --checkpoint-dir {ck}`. If `latest` names a "
            "missing or cut-short tag, point `latest` at the previous tag.",
            f"3. Relaunch with the same script and the same world ({_count(p.world, 'process', 'processes')}); the training script "
            f"calls `engine.load_checkpoint({ck_python})` before its first step. Another world size needs "
            "DeepSpeed's universal checkpoint (`ds_to_universal.py`).",
            "4. Confirm the resume: the log shows the step it resumed from, and the first losses match the last "
            "ones before the stop; watch the loss-spike alert for the next "
            f"{p.alerts.loss_spike.window_steps} steps."]
    return out


def _expr(names: dict, alert: str) -> str:
    return f"`{names[alert].expr}`" if alert in names else "-"


def _alerts(p: Profile) -> list[str]:
    a = p.alerts
    g, h = a.gpu_memory, a.host_memory
    names = {r.alert: r for r in rules(p)}
    labels = p.run.alert_labels
    scope = (f"Every rule selects the job's own series ({', '.join(_code(f'{k}={v}') for k, v in labels.items())}, "
             "from `--alert-labels` at export)." if labels else
             "**The rules are unscoped**: no `--alert-labels` was given at export, so they watch every GPU and node "
             "the Prometheus scrapes, and the GPU-idle rule is left out (it would fire for every idle GPU). "
             "Re-export with `--alert-labels job=YOUR_JOB`.")
    out = [f"Thresholds follow the {g.basis} figures; every one is below what the card has, so each can fire. "
           f"`{ALERTS_FILE}` holds them as Prometheus alerting rules (`promtool check rules {ALERTS_FILE}`). {scope}",
           ""]
    rows: list[tuple[object, ...]] = [
        ("GPU memory allocated", f"> {gib(g.warn_allocated_above_bytes)} per GPU",
         _expr(names, "ZlayoutGpuAllocatedHigh"), g.why,
         "look for growth: longer sequences, a larger batch, tensors kept across steps; before the OOM, "
         "lower the micro-batch or resume with checkpointing on")]
    if g.warn_device_used_above_bytes is not None:
        over = g.warn_device_used_above_bytes / g.device_used_bytes - 1 if g.device_used_bytes else 0.0
        used_why = (f"the {g.basis} device use per GPU (the allocator's cache and CUDA's context with the "
                    f"tensors) is {gib(g.device_used_bytes)}; {over:.0%} above it the cache has grown past "
                    + ("the measured run's" if g.basis == "measured" else
                       f"the plan's (which held-out runs exceeded by up to {PREDICTED_DEVICE_USED_WORST_UNDER:.1%})")
                    + ": larger requests, fragmentation, or another process")
        rows.append(("GPU memory in use", f"> {gib(g.warn_device_used_above_bytes)} per GPU",
                     f"{_expr(names, 'ZlayoutGpuMemoryHigh')} (MiB)", used_why,
                     "as above; also another process on the GPU (`nvidia-smi`)"))
    if g.critical_device_used_above_bytes is not None:
        rows.append(("GPU memory nearly full", f"> {gib(g.critical_device_used_above_bytes)} in use per GPU",
                     f"{_expr(names, 'ZlayoutGpuMemoryFull')} (MiB)",
                     "the plan runs near the card (or its cache fills it and flushes): within 3% of the card the "
                     "next larger request may not fit",
                     "an OOM is near: checkpoint now if the job can, then see On-call notes"))
    elif fills_alert_range(g.device_used_bytes, g.capacity_bytes):
        out += [f"No \"GPU memory nearly full\" rule: the plan's own device use ({gib(g.device_used_bytes)} of "
                f"{gib(g.capacity_bytes)}) is past {NEARLY_FULL_FRACTION:.0%} of the card, because the caching "
                "allocator's cache fills it, so such a rule would fire on every healthy step. The allocated peak "
                "(first row) tells growth; an out-of-memory error shows in the job's log.", ""]
    rows.append(("Host memory (the job's processes)", f"> {gib(h.warn_above_bytes)} per node",
                 _expr(names, "ZlayoutHostMemoryHigh"), h.why,
                 "find the process growing (`ps -eo rss,cmd --sort=-rss | head`); fewer dataloader workers"))
    if a.step_time is not None:
        s = a.step_time
        rows.append(("Step time", f"> {seconds(s.warn_above_s)}", _expr(names, "ZlayoutStepTimeHigh"),
                     s.why, "see On-call notes: step time far above the plan"))
    if a.gpu_health is not None:
        hl = a.gpu_health
        if "ZlayoutGpuIdle" in names:
            rows.append(("GPU idle", f"< {hl.idle_util_below_percent}% busy for {hl.idle_for_minutes} min",
                         _expr(names, "ZlayoutGpuIdle"), hl.why, "see On-call notes: NCCL timeout or hang"))
        rows.append(("GPU fault (XID)", hl.xid_rule, _expr(names, "ZlayoutGpuXid"),
                     "the driver only reports faults", "drain the node; resume elsewhere (Restart procedure)"))
    if a.checkpoint_space is not None:
        c = a.checkpoint_space
        rows.append(("Checkpoint space", f"< {gib(c.warn_free_below_bytes)} free in {c.path}",
                     _expr(names, "ZlayoutCheckpointSpaceLow"), c.why,
                     "delete old checkpoint tags (keep the one `latest` names and the one before)"))
    rows.append(("Loss spike", a.loss_spike.rule, _expr(names, "ZlayoutLossSpike"), a.loss_spike.why,
                 "see On-call notes: loss spikes after resume"))
    out += _table(("alert", "threshold", "source", "why this value", "what to do"), rows)
    out += ["", "**Where the metrics come from.** `DCGM_FI_DEV_*`: NVIDIA's DCGM exporter on every node. "
            "`node_filesystem_avail_bytes`: the node exporter. `namedprocess_namegroup_memory_bytes`: the process "
            "exporter (ncabatoff/process-exporter), which sums the resident memory of the job's own processes per "
            "node (what zlayout's host peak is: not the OS, the page cache or other jobs) with this group in its "
            "config:", "", "```yaml", "process_names:", f"  - name: {PROCESS_GROUP}",
            "    cmdline: ['--deepspeed_config']   # every rank of the launch scripts has it", "```", "",
            f"`{STEP_TIME_METRIC}`, `{ALLOCATED_METRIC}` and `{LOSS_METRIC}`: the training script sets them "
            "(`pip install prometheus-client`; scrape port 9400 + local rank on every node, with the job's labels):",
            "", "```python", *TRAINING_METRICS_SNIPPET, "```"]
    return out


TRAINING_METRICS_SNIPPET = (
    "import os, time, torch",
    "from prometheus_client import Gauge, start_http_server",
    "",
    "start_http_server(9400 + int(os.environ.get(\"LOCAL_RANK\", 0)))",
    f"step_time = Gauge(\"{STEP_TIME_METRIC}\", \"wall time of one optimizer step\")",
    f"allocated = Gauge(\"{ALLOCATED_METRIC}\", \"torch.cuda.max_memory_allocated()\")",
    f"train_loss = Gauge(\"{LOSS_METRIC}\", \"loss of the last micro-batch\")",
    "",
    "started = time.perf_counter()",
    "for batch in loader:",
    "    loss = engine(batch)          # your forward and loss",
    "    engine.backward(loss)",
    "    engine.step()",
    "    if engine.is_gradient_accumulation_boundary():   # an optimizer step ended",
    "        train_loss.set(loss.item())",
    "        allocated.set(torch.cuda.max_memory_allocated())",
    "        step_time.set(time.perf_counter() - started)",
    "        started = time.perf_counter()",
)


def _on_call(p: Profile) -> list[str]:
    inp, pred, a, lim = p.inputs, p.prediction, p.alerts, p.limits
    t, hw = inp.training, inp.hardware
    d = _dir(p)
    offload = p.layout.offload_optimizer != "gpu" or p.layout.offload_param != "gpu"
    bigger = (f"switch to {lim.takes_over.label} (`{layout_flags(lim.takes_over)}`)" if lim and lim.takes_over
              else "offload more (`--offload-optimizer cpu`, stage 3 `--offload-param cpu`)")
    mb = ("" if lim is None else f" (largest that fits: {lim.max_micro_batch})" if lim.max_micro_batch
          else " (none fits this model with this layout)")
    notes: list[tuple[str, str, str]] = [
        ("CUDA out of memory at step 1",
         f"`nvidia-smi`: another process holding memory (the run needs {gib(free_gpu_memory_needed(p))} "
         f"per GPU, `zlayout check {d}`); the job really uses this ds_config.json (micro-batch {t.micro_batch}) "
         f"and sequence length {t.seq}; the OOM's phase (the plan's peak is during {pred.peak_phase}; the optimizer "
         "state is created by the first step())",
         f"free the GPUs; if the job's batch or sequence differ, re-plan with its values; else lower "
         f"`--micro-batch`{mb}, turn on `--checkpointing full`, or {bigger}; re-export and verify"),
        ("CUDA out of memory later in the run",
         "the GPU-memory alerts' history; `torch.cuda.max_memory_allocated()` per step in the log; longer "
         "sequences in some batches; an evaluation loop without `torch.no_grad()`; tensors kept across steps "
         "(a loss appended without `.item()`)",
         "cap or pad batches to the planned sequence; fix the leak; `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` "
         "against fragmentation; resume from the last checkpoint (Restart procedure)"),
        ("Host out of memory with offload",
         f"the job ends without a Python traceback: `dmesg -T | grep -i -e oom -e 'killed process'`; `free -g`; "
         f"the plan's host peak is {gib(a.host_memory.peak_bytes)} per node, of {host_ram_text(p)}"
         + ("" if offload else " (this layout offloads nothing: the peak is the model built on the host)"),
         "fewer dataloader workers per rank; other jobs off the node; optimizer state to NVMe "
         "(`--stage 3 --offload-optimizer nvme`); nodes with more RAM; re-export and verify"),
        ("NCCL timeout or hang",
         "the GPU-idle alert; which rank stopped first (launcher log, `NCCL_DEBUG=INFO`); an XID "
         "(`nvidia-smi -q | grep -i xid`, `dmesg | grep -i xid`); " + (
             "the inter-node network (`ibstat`, link errors)" if hw.nodes > 1 else "NVLink (`nvidia-smi nvlink -s`)"),
         "drain a node with XIDs; restart from the last checkpoint (Restart procedure); "
         "`TORCH_NCCL_ASYNC_ERROR_HANDLING=1` so a hang becomes an error that ends the job"),
        ("Step time far above the plan",
         (f"the plan says {seconds(a.step_time.step_time_s)} per step ({a.step_time.basis}); "
          if a.step_time else "") + "clocks and throttling (`nvidia-smi -q -d PERFORMANCE`); one slow GPU or node "
         "(DCGM_FI_DEV_GPU_UTIL per GPU); host swapping (`vmstat 1`: si/so); `OMP_NUM_THREADS` per rank "
         "(the launch scripts set it; CPU Adam needs cores); with offload, `THP_MEM_ALLOC_ENABLE=1` "
         "(the launch scripts set it: the step's host copies on huge pages, not 4 KiB page faults); "
         "dataloader wait in the log",
         "replace a throttled GPU or a straggler node; give offloading ranks their cores; stop swapping "
         "(less host memory use, see above)"),
        ("NVMe swap slow",
         (f"`iostat -x 1` on the device under {p.run.nvme_path} (utilisation, await); the plan moves "
          f"{gib(pred.nvme_read_bytes or 0)} in and {gib(pred.nvme_write_bytes or 0)} out per step at "
          f"{hw.nvme_gbps:g} GB/s per node; the path is a local NVMe, not a network filesystem")
         if _uses_nvme(p) else "not applicable: this layout keeps nothing on NVMe",
         "a local NVMe (several in RAID 0) for the offload path; raise `aio` block size and queue depth in "
         "ds_config.json; or offload to CPU instead if host memory allows" if _uses_nvme(p) else "-"),
        ("Loss spikes after resume",
         "the resumed step equals the saved one; the dataloader resumed its position (not replaying the first "
         "batches); the learning-rate scheduler state was loaded; the same world size and ds_config.json "
         f"(global batch {t.micro_batch * t.grad_accum * hw.world} sequences)"
         + ("" if _drilled(p) else f"; the restart drill has not run: `zlayout verify {d} --restart-drill`"),
         "resume from the checkpoint before the spike and skip the batch, or lower the learning rate"),
    ]
    out = []
    for symptom, checks, fix in notes:
        out += [f"**{symptom}**", "", f"- First checks: {checks}.", f"- Fix: {fix}.", ""]
    return out[:-1]


def _change_log(p: Profile) -> list[str]:
    rows = []
    for e in p.changelog:
        layout = e.layout_after if not e.layout_before or e.layout_before == e.layout_after else \
            f"{e.layout_before} → {e.layout_after}"
        step = (f"{seconds(e.step_time_s_before)} → {seconds(e.step_time_s_after)}"
                if e.step_time_s_after is not None else "-")
        rows.append((f"{e.when:%Y-%m-%d %H:%M}", e.why, e.basis, layout,
                     f"{gib(e.gpu_peak_bytes_before)} → {gib(e.gpu_peak_bytes_after)}",
                     f"{gib(e.host_peak_bytes_before)} → {gib(e.host_peak_bytes_after)}", step))
    out = _table(("when (UTC)", "change", "basis", "layout", "GPU peak", "host peak", "step time"), rows)
    out += ["", "For a change request: `zlayout diff OLD NEW --markdown` gives the before/after section."]
    return out


def render_runbook(profile: Profile) -> str:
    """RUNBOOK.md text: the nine sections, in order (SECTIONS)."""
    bodies = (_summary, _what_lives_where, _stops_fitting, _checklist, _launch, _script_contract, _restart,
              _alerts, _on_call, _change_log)
    out = [f"# Runbook: {_cell(profile.name)}", "",
           f"{_cell(profile.description)}. Generated by zlayout {profile.zlayout_version} from `profile.toml` "
           "and rewritten whenever the profile changes; sizes in GiB (2^30 bytes), times in seconds.", ""]
    for heading, body in zip(SECTIONS, bodies):
        out += [heading, "", *body(profile), ""]
    return "\n".join(out).rstrip("\n") + "\n"


# --------------------------------------------------------------------------- diff

def _file_field(dotted: str) -> str:
    """A spec field path as the file spells it (inputs.hardware.nvme_gbps -> ..._gb_per_s)."""
    parts = dotted.split(".")
    return ".".join(next(iter(inputs_to_file({part: None}))) for part in parts)


def diff_markdown(a: Profile, b: Profile) -> str:
    """The before/after section of a change request: what changed from A to B and what it does."""
    d = diff_profiles(a, b)
    out = [f"## Change: {_cell(a.name)} → {_cell(b.name)}", "",
           *_table(("", "before", "after"), [("layout", a.layout.label, b.layout.label),
                                              ("status", d.status_before, d.status_after)]), ""]
    if d.changes:
        out += ["What changed:", "", *_table(("setting", "before", "after"),
                                            [(f"`{_file_field(c.field)}`", "(absent)" if c.before is None else c.before,
                                              "(absent)" if c.after is None else c.after) for c in d.changes]), ""]
    else:
        out += ["What changed: nothing in the inputs, layout or run settings.", ""]

    def row(e: Effect, label: str) -> tuple[object, ...]:
        delta = e.delta if e.delta is not None else (
            None if isinstance(e.before, bool) or isinstance(e.after, bool) else (e.after or 0) - (e.before or 0))
        change = "" if delta is None else ("+" if delta >= 0 else "-") + figure(e.figure, abs(delta))
        if e.delta_fraction is not None:
            change += f" ({e.delta_fraction:+.1%})"
        return (label, e.basis, figure(e.figure, e.before), figure(e.figure, e.after), change)

    if d.effects:
        out += ["Effect:", "", *_table(("figure", "basis", "before", "after", "change"),
                                       [row(e, e.figure) for e in d.effects], right=(2, 3, 4)), ""]
    else:
        out += ["Effect: none on the predicted figures.", ""]
    if d.term_changes:
        terms = [row(Effect(e.figure + "_bytes", e.basis, e.before, e.after), e.figure) for e in d.term_changes[:12]]
        out += ["Memory terms that moved (predicted, largest first):", "",
                *_table(("term", "basis", "before", "after", "change"), terms, right=(2, 3, 4)), ""]
    return "\n".join(out).rstrip("\n") + "\n"
