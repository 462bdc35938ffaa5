"""alerts.yml: the profile's alert table as Prometheus alerting rules.

The rules read what standard exporters and the training job export: the NVIDIA DCGM exporter
(DCGM_FI_DEV_FB_USED and DCGM_FI_DEV_FB_FREE in MiB, DCGM_FI_DEV_GPU_UTIL in percent,
DCGM_FI_DEV_XID_ERRORS), the process exporter for the job's own resident memory per node
(`namedprocess_namegroup_memory_bytes`, the figure zlayout's host peak is: the ranks' resident
memory summed per node, not the node's OS and other jobs), the node exporter for the checkpoint
file system, and three gauges the training script sets (TRAINING_METRICS; RUNBOOK.md gives the
lines of code). Every selector carries the job's label matchers given at export
(`--alert-labels job=...`), so no rule fires for another job's GPUs.

Strings are YAML double-quoted scalars (JSON strings with every non-printable character escaped),
so no text can break the file; text from the profile in labels and annotations, which Prometheus
expands as Go templates, has its `{{` written as a template literal, so a name cannot run one.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from zlayout.core.fit import NEARLY_FULL_FRACTION
from zlayout.profile.schema import Profile
from zlayout.profile.summary import gib

MiB = 2**20
PROCESS_GROUP = "zlayout-training"  # the process exporter's group for the ranks (RUNBOOK.md: its config)
STEP_TIME_METRIC = "zlayout_step_time_seconds"
ALLOCATED_METRIC = "zlayout_gpu_max_memory_allocated_bytes"
LOSS_METRIC = "zlayout_train_loss"
TRAINING_METRICS = (STEP_TIME_METRIC, ALLOCATED_METRIC, LOSS_METRIC)


@dataclass(frozen=True, slots=True)
class Rule:
    alert: str
    expr: str
    for_: str
    severity: str
    summary: str
    description: str


def _sentence(text: str) -> str:
    text = text.strip()
    return (text[:1].upper() + text[1:]).rstrip(".") + "."


def mib(n_bytes: int) -> int:
    """DCGM reports framebuffer memory in MiB."""
    return round(n_bytes / MiB)


def template_literal(text: str) -> str:
    """`text` as Go-template text that prints itself: Prometheus expands {{ ... }} in alert labels
    and annotations, so a profile name holding `{{ $value }}` (or worse) must not run."""
    return text.replace("{{", '{{ "{{" }}')


def yaml_string(text: str) -> str:
    """A YAML double-quoted scalar: JSON's escapes, plus every character YAML would read as a
    line break or that is not printable (U+0085, U+2028, ...) escaped; no surrogate pairs."""
    out = []
    for c in json.dumps(text, ensure_ascii=False)[1:-1]:
        if c.isprintable() or c == " ":
            out.append(c)
        elif ord(c) <= 0xFFFF:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(f"\\U{ord(c):08x}")
    return '"' + "".join(out) + '"'


def selector(profile: Profile, **fixed: str) -> str:
    """`{name="value",...}`: the metric's own matchers, then the job's (--alert-labels); PromQL
    strings take JSON's escapes."""
    matchers = {**fixed, **profile.run.alert_labels}
    if not matchers:
        return ""
    return "{" + ",".join(f"{name}={json.dumps(value)}" for name, value in matchers.items()) + "}"


def _loss_window(profile: Profile) -> str:
    """The loss-spike window in time: its steps at the step time, whole minutes, at least 5."""
    a = profile.alerts
    step_s = a.step_time.step_time_s if a.step_time is not None else 1.0
    return f"{max(5, math.ceil(a.loss_spike.window_steps * step_s / 60))}m"


def rules(profile: Profile) -> list[Rule]:
    """The rules, in the order of the runbook's alert table."""
    a = profile.alerts
    g, h = a.gpu_memory, a.host_memory
    sel = selector(profile)
    out = []
    if g.warn_device_used_above_bytes is not None:
        out.append(Rule(
            "ZlayoutGpuMemoryHigh", f"DCGM_FI_DEV_FB_USED{sel} > {mib(g.warn_device_used_above_bytes)}", "2m",
            "warning", f"GPU memory in use above {gib(g.warn_device_used_above_bytes)} on "
            "{{ $labels.Hostname }} GPU {{ $labels.gpu }}",
            f"The {g.basis} device use is {gib(g.device_used_bytes)} per GPU; {g.why}."))
    if g.critical_device_used_above_bytes is not None:
        out.append(Rule(
            "ZlayoutGpuMemoryFull", f"DCGM_FI_DEV_FB_USED{sel} > {mib(g.critical_device_used_above_bytes)}", "1m",
            "critical", f"GPU memory in use above {gib(g.critical_device_used_above_bytes)} on "
            "{{ $labels.Hostname }} GPU {{ $labels.gpu }}",
            f"Within {1 - NEARLY_FULL_FRACTION:.0%} of the card: the next larger request may not fit (CUDA out of "
            "memory). See RUNBOOK.md, On-call notes: CUDA out of memory later in the run."))
    out.append(Rule(
        "ZlayoutGpuAllocatedHigh", f"{ALLOCATED_METRIC}{sel} > {g.warn_allocated_above_bytes}", "1m", "warning",
        f"peak allocated GPU memory above {gib(g.warn_allocated_above_bytes)} on {{{{ $labels.instance }}}}",
        f"The {g.basis} peak allocated is {gib(g.peak_allocated_bytes)} per GPU "
        "(torch.cuda.max_memory_allocated(), set by the training script); " + f"{g.why}."))
    process = selector(profile, groupname=PROCESS_GROUP, memtype="resident")
    out.append(Rule(
        "ZlayoutHostMemoryHigh",
        f"sum by ({', '.join(['instance', *profile.run.alert_labels])}) "
        f"(namedprocess_namegroup_memory_bytes{process}) > {h.warn_above_bytes}", "5m", "warning",
        f"the training processes' host memory above {gib(h.warn_above_bytes)} on {{{{ $labels.instance }}}}",
        _sentence(h.why)))
    if a.step_time is not None:
        s = a.step_time
        out.append(Rule(
            "ZlayoutStepTimeHigh", f"{STEP_TIME_METRIC}{sel} > {s.warn_above_s}", "5m", "warning",
            f"step time above {s.warn_above_s:.3g} s on {{{{ $labels.instance }}}}",
            _sentence(s.why) + " See RUNBOOK.md, On-call notes: step time far above the plan."))
    loss = f"{LOSS_METRIC}{sel}"
    out.append(Rule(
        "ZlayoutLossSpike",
        f"({loss} > {a.loss_spike.factor} * quantile_over_time(0.5, {loss}[{_loss_window(profile)}])) "
        f"or ({loss} != {loss}) or (abs({loss}) == +Inf)", "0m", "critical",
        f"loss spike on {{{{ $labels.instance }}}}: {{{{ $value }}}}",
        f"{_sentence(a.loss_spike.rule)} {_sentence(a.loss_spike.why)}"))
    if a.gpu_health is not None and profile.run.alert_labels:
        # unscoped, "a GPU below 10% busy" is every idle GPU the Prometheus watches
        hl = a.gpu_health
        out.append(Rule(
            "ZlayoutGpuIdle", f"DCGM_FI_DEV_GPU_UTIL{sel} < {hl.idle_util_below_percent}", f"{hl.idle_for_minutes}m",
            "warning",
            f"GPU {{{{ $labels.gpu }}}} on {{{{ $labels.Hostname }}}} below {hl.idle_util_below_percent}% busy "
            f"for {hl.idle_for_minutes} minutes",
            "While the job runs, a near-idle GPU means a hang: see RUNBOOK.md, On-call notes: NCCL timeout "
            "or hang. " + _sentence(hl.why)))
    if a.gpu_health is not None:
        out.append(Rule(
            "ZlayoutGpuXid", f"DCGM_FI_DEV_XID_ERRORS{sel} > 0", "0m", "critical",
            "XID {{ $value }} on {{ $labels.Hostname }} GPU {{ $labels.gpu }}",
            "The driver reported a GPU fault; drain the node, then resume the job from its last checkpoint "
            "elsewhere (RUNBOOK.md, Restart procedure)."))
    if a.checkpoint_space is not None:
        c = a.checkpoint_space
        path = template_literal(c.path)
        out.append(Rule(
            "ZlayoutCheckpointSpaceLow",
            f"node_filesystem_avail_bytes{selector(profile, mountpoint=c.path)} < {c.warn_free_below_bytes}",
            "10m", "warning",
            f"less than {gib(c.warn_free_below_bytes)} free for checkpoints in {path}",
            f"{_sentence(template_literal(c.why))} Set mountpoint to the mount that holds {path} "
            f"(df --output=target {path})."))
    return out


def alerts_yaml(profile: Profile) -> str:
    """alerts.yml text (deterministic)."""
    a = profile.alerts
    name = " ".join(profile.name.split())
    labels = profile.run.alert_labels
    scope = (f"# Scoped to the job by {selector(profile)} on every metric (--alert-labels at export)."
             if labels else
             "# UNSCOPED: no --alert-labels at export, so these rules watch every GPU and node this Prometheus\n"
             "# scrapes, and the GPU-idle rule is left out (it would fire for every idle GPU). Re-export with\n"
             "# --alert-labels job=YOUR_JOB (the labels your scrape config gives the job's targets).")
    lines = [
        f"# Prometheus alerting rules for the zlayout profile {yaml_string(name)}",
        f"# ({' '.join(profile.description.split())}). Written by zlayout from profile.toml and rewritten",
        "# with it: re-export rather than edit. Thresholds follow the "
        f"{a.gpu_memory.basis} figures; why each value: RUNBOOK.md, Alerts.",
        "# Metrics: NVIDIA DCGM exporter, process exporter (group " + PROCESS_GROUP + "), node exporter, and",
        f"# the training script's {', '.join(TRAINING_METRICS)} (RUNBOOK.md, Alerts, gives the code).",
        *scope.split("\n"),
        "# Load with `rule_files: [alerts.yml]`; check with `promtool check rules alerts.yml`.",
    ]
    lines += ["groups:", f"  - name: {yaml_string('zlayout-' + name)}", "    rules:"]
    for rule in rules(profile):
        lines += [
            f"      - alert: {rule.alert}",
            f"        expr: {yaml_string(rule.expr)}",
            f"        for: {rule.for_}",
            "        labels:",
            f"          severity: {rule.severity}",
            f"          profile: {yaml_string(template_literal(name))}",
            "        annotations:",
            f"          summary: {yaml_string(rule.summary)}",
            f"          description: {yaml_string(rule.description)}",
        ]
    return "\n".join(lines) + "\n"
