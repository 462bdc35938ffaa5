"""alerts.yml: the profile's alert table as Prometheus alerting rules.

Only what a standard exporter sees becomes a rule: the NVIDIA DCGM exporter
(DCGM_FI_DEV_FB_USED and DCGM_FI_DEV_FB_FREE in MiB, DCGM_FI_DEV_GPU_UTIL in percent,
DCGM_FI_DEV_XID_ERRORS) and the node exporter (node_memory_MemAvailable_bytes,
node_memory_MemTotal_bytes, node_filesystem_avail_bytes). Allocated GPU memory, step time and
loss live in the training job's log; the runbook lists them with their thresholds. Strings are
written as JSON strings, which YAML reads as double-quoted scalars, so no text can break the file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from zlayout.profile.schema import Profile
from zlayout.profile.summary import gib

MiB = 2**20


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


def rules(profile: Profile) -> list[Rule]:
    """The rules, in the order of the runbook's alert table."""
    a = profile.alerts
    g, h = a.gpu_memory, a.host_memory
    out = [Rule(
        "ZlayoutGpuMemoryHigh", f"DCGM_FI_DEV_FB_USED > {mib(g.warn_device_used_above_bytes)}", "2m", "warning",
        f"GPU memory in use above {gib(g.warn_device_used_above_bytes)} on {{{{ $labels.Hostname }}}} "
        "GPU {{ $labels.gpu }}",
        f"The {g.basis} device use is {gib(g.device_used_bytes)} per GPU; {g.why}.")]
    if g.critical_free_below_bytes:
        out.append(Rule(
            "ZlayoutGpuMemoryFull", f"DCGM_FI_DEV_FB_FREE < {mib(g.critical_free_below_bytes)}", "1m", "critical",
            f"less than {gib(g.critical_free_below_bytes)} GPU memory free on {{{{ $labels.Hostname }}}} "
            "GPU {{ $labels.gpu }}",
            "Below the headroom the plan keeps free: the next allocation may fail with CUDA out of memory. "
            "See RUNBOOK.md, On-call notes: CUDA out of memory later in the run."))
    out.append(Rule(
        "ZlayoutHostMemoryHigh",
        f"node_memory_MemTotal_bytes - node_memory_MemAvailable_bytes > {h.warn_above_bytes}", "5m", "warning",
        f"host memory in use above {gib(h.warn_above_bytes)} on {{{{ $labels.instance }}}}",
        _sentence(h.why)))
    if a.gpu_health is not None:
        hl = a.gpu_health
        out.append(Rule(
            "ZlayoutGpuIdle", f"DCGM_FI_DEV_GPU_UTIL < {hl.idle_util_below_percent}", f"{hl.idle_for_minutes}m",
            "warning",
            f"GPU {{{{ $labels.gpu }}}} on {{{{ $labels.Hostname }}}} below {hl.idle_util_below_percent}% busy "
            f"for {hl.idle_for_minutes} minutes",
            "While the job runs, a near-idle GPU means a hang: see RUNBOOK.md, On-call notes: NCCL timeout "
            "or hang. " + _sentence(hl.why)))
        out.append(Rule(
            "ZlayoutGpuXid", "DCGM_FI_DEV_XID_ERRORS > 0", "0m", "critical",
            "XID {{ $value }} on {{ $labels.Hostname }} GPU {{ $labels.gpu }}",
            "The driver reported a GPU fault; drain the node, then resume the job from its last checkpoint "
            "elsewhere (RUNBOOK.md, Restart procedure)."))
    if a.checkpoint_space is not None:
        c = a.checkpoint_space
        out.append(Rule(
            "ZlayoutCheckpointSpaceLow",
            f"node_filesystem_avail_bytes{{mountpoint={json.dumps(c.path)}}} < {c.warn_free_below_bytes}",
            "10m", "warning",
            f"less than {gib(c.warn_free_below_bytes)} free for checkpoints in {c.path}",
            f"{_sentence(c.why)} Set mountpoint to the mount that holds {c.path} (df --output=target {c.path})."))
    return out


def alerts_yaml(profile: Profile) -> str:
    """alerts.yml text (deterministic)."""
    a = profile.alerts
    name = " ".join(profile.name.split())
    lines = [
        f"# Prometheus alerting rules for the zlayout profile {json.dumps(name)}",
        f"# ({' '.join(profile.description.split())}). Written by zlayout from profile.toml and rewritten",
        "# with it: re-export rather than edit. Thresholds follow the "
        f"{a.gpu_memory.basis} figures; why each value: RUNBOOK.md, Alerts.",
        "# Metrics: NVIDIA DCGM exporter and node exporter. Scope the rules to the job's nodes with a",
        '# label matcher if the same Prometheus watches other machines, e.g. {Hostname=~"gpu-.*"}.',
        "# Load with `rule_files: [alerts.yml]`; check with `promtool check rules alerts.yml`.",
    ]
    if a.step_time is not None:
        lines.append(f"# From the training log (no standard metric): step time above {a.step_time.warn_above_s} s, "
                     f"max_memory_allocated above {a.gpu_memory.warn_allocated_above_bytes} bytes,")
    else:
        lines.append(f"# From the training log (no standard metric): max_memory_allocated above "
                     f"{a.gpu_memory.warn_allocated_above_bytes} bytes,")
    lines.append(f"# {a.loss_spike.rule}.")
    lines += ["groups:", f"  - name: {json.dumps('zlayout-' + name)}", "    rules:"]
    for rule in rules(profile):
        lines += [
            f"      - alert: {rule.alert}",
            f"        expr: {json.dumps(rule.expr)}",
            f"        for: {rule.for_}",
            "        labels:",
            f"          severity: {rule.severity}",
            f"          profile: {json.dumps(name)}",
            "        annotations:",
            f"          summary: {json.dumps(rule.summary)}",
            f"          description: {json.dumps(rule.description)}",
        ]
    return "\n".join(lines) + "\n"
