"""alerts.yml's rules can fire and fire only for the job: every threshold below what the card has,
the nearly-full rule whenever the plan is near the card, text from the profile inert in Prometheus'
templates. With promtool installed (Debian's `prometheus` package; .ci/run installs it) the rules
are checked and unit-tested by Prometheus' own rule engine."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
import yaml

from zlayout.profile import build_profile
from zlayout.profile.prometheus import alerts_yaml, mib
from zlayout.profile.schema import RunSettings
from zlayout.spec import Layout

PROMTOOL = shutil.which("promtool")
# CI (.ci/run) installs promtool and sets ZLAYOUT_REQUIRE_PROMTOOL: there a missing one fails, not skips
needs_promtool = pytest.mark.skipif(PROMTOOL is None and not os.environ.get("ZLAYOUT_REQUIRE_PROMTOOL"),
                                    reason="promtool not installed (apt-get install prometheus)")

# llama3-8b on 8x H100 80 GB: ZeRO-3 at seq 4096, micro-batch 1 leaves room (54 of 80 GiB); ZeRO-2 at
# seq 2048, micro-batch 6 with checkpointing runs near the card (76 GiB); micro-batch 3 without
# checkpointing fits only by flushing the allocator's cache once a step (core.fit: fits-flushing)
PLANS = {"room": (3, dict(seq=4096, micro_batch=1)),
         "near": (2, dict(seq=2048, micro_batch=6, checkpointing="full")),
         # flushes in every steady step (the replay settled: llama3-8b's ZeRO-2 2048 x 3, which flushed in
         # its first two replayed steps, runs without a retry from the third)
         "flushes": (3, dict(model="mistral-7b", seq=2048, micro_batch=5))}
ODD_NAME = 'x {{ $value }} {{ template "y" }}'


def _profile(make_input, plan: str, **run):
    stage, inputs = PLANS[plan]
    return build_profile(make_input(**inputs), Layout(stage=stage), name=ODD_NAME,
                         run=RunSettings(alert_labels={"job": "llama"}, **run))


@pytest.mark.parametrize("plan", PLANS)
def test_thresholds_are_the_fit_rules_below_the_card_with_nearly_full_near_it(make_input, plan):
    from zlayout.core.fit import GpuFit

    profile = _profile(make_input, plan)
    g, pred = profile.alerts.gpu_memory, profile.prediction
    capacity = pred.gpu_capacity_bytes
    assert pred.fits and (pred.gpu_flushes_per_step > 0) == (plan == "flushes")
    fit = GpuFit(capacity_bytes=capacity, needed_bytes=pred.gpu_needed_bytes, usable_bytes=pred.gpu_usable_bytes,
                 device_used_bytes=pred.gpu_device_used_bytes, flushes_per_step=pred.gpu_flushes_per_step)
    expected = {t.name: t.bytes for t in fit.alert_thresholds()}
    assert g.warn_device_used_above_bytes == expected.get("above_plan")
    assert g.critical_device_used_above_bytes == expected.get("nearly_full")
    # near the card: there; a plan whose cache fills the card (flushes) is past it on every healthy step
    assert ("nearly_full" in expected) == (plan == "near")
    assert (pred.gpu_device_used_bytes >= 0.97 * capacity) == (plan == "flushes")
    assert g.peak_allocated_bytes < g.warn_allocated_above_bytes < capacity
    for threshold in (g.warn_device_used_above_bytes, g.critical_device_used_above_bytes):
        assert threshold is None or threshold < capacity
    rules = {r["alert"]: r for r in yaml.safe_load(alerts_yaml(profile))["groups"][0]["rules"]}
    assert ("ZlayoutGpuMemoryFull" in rules) == (plan == "near")
    if plan == "near":
        assert rules["ZlayoutGpuMemoryFull"]["expr"] == \
            f'DCGM_FI_DEV_FB_USED{{job="llama"}} > {mib(g.critical_device_used_above_bytes)}'


def _fires(alert: str, series: str, values: str, labels: dict, at: str = "15m", value: str | None = None) -> dict:
    """A promtool unit test: `series` taking `values`, and `alert` firing with `labels` at `at`
    (none when `labels` is empty); `value` is what {{ $value }} renders as."""
    return {"interval": "1m", "input_series": [{"series": series, "values": values}],
            "alert_rule_test": [{"eval_time": at, "alertname": alert, "exp_alerts": [labels] if labels else [],
                                 "value": value}]}


def _rendered(text: str, labels: dict, value: str | None) -> str:
    """An annotation as Prometheus renders it for these labels (the few template forms zlayout writes)."""
    text = text.replace('{{ "{{" }}', "\0")
    for name, label in labels.items():
        text = text.replace(f"{{{{ $labels.{name} }}}}", label)
    if value is not None:
        text = text.replace("{{ $value }}", value)
    text = re.sub(r"\{\{ \$labels\.\w+ \}\}", "", text)  # a label the series lacks renders empty
    return text.replace("\0", "{{")


def _with_annotations(profile, tests: list[dict]) -> list[dict]:
    """Each expected alert with the annotations its rule gives (a promtool test compares them too)."""
    rules = {r["alert"]: r for r in yaml.safe_load(alerts_yaml(profile))["groups"][0]["rules"]}
    for test in tests:
        for case in test["alert_rule_test"]:
            value = case.pop("value", None)
            annotations = rules[case["alertname"]]["annotations"]
            for alert in case["exp_alerts"]:
                alert["exp_annotations"] = {k: _rendered(v, alert["exp_labels"], value)
                                            for k, v in annotations.items()}
    return tests


def _promtool_test(tmp_path, profile, tests: list[dict]) -> None:
    tests = _with_annotations(profile, tests)
    rules = tmp_path / "alerts.yml"
    rules.write_text(alerts_yaml(profile))
    checked = subprocess.run([PROMTOOL, "check", "rules", str(rules)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    spec = tmp_path / "test.yml"
    spec.write_text(yaml.safe_dump({"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": tests}))
    done = subprocess.run([PROMTOOL, "test", "rules", str(spec)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_the_framebuffer_rules_fire_above_the_plan_and_not_on_it(make_input, tmp_path):
    profile = _profile(make_input, "room", checkpoint_dir="/ckpt/{{ $labels }}")
    g = profile.alerts.gpu_memory
    gpu = 'Hostname="n1",gpu="0",job="llama"'
    expected = {"exp_labels": {"severity": "warning", "profile": ODD_NAME, "Hostname": "n1", "gpu": "0",
                               "job": "llama"}}
    over = mib(g.warn_device_used_above_bytes) + 1
    healthy = mib(g.device_used_bytes)
    _promtool_test(tmp_path, profile, [
        # the profile's name comes through as written: its {{ }} ran no template
        _fires("ZlayoutGpuMemoryHigh", f"DCGM_FI_DEV_FB_USED{{{gpu}}}", f"{over}x20", expected),
        _fires("ZlayoutGpuMemoryHigh", f"DCGM_FI_DEV_FB_USED{{{gpu}}}", f"{healthy}x20", {}),
        # another job's GPU over the threshold is not this job's alert
        _fires("ZlayoutGpuMemoryHigh", 'DCGM_FI_DEV_FB_USED{Hostname="n9",gpu="0",job="other"}', f"{over}x20", {}),
    ])


@needs_promtool
@pytest.mark.parametrize("plan", ["near"])
def test_the_nearly_full_rule_fires_within_3_percent_of_the_card(make_input, tmp_path, plan):
    profile = _profile(make_input, plan)
    g = profile.alerts.gpu_memory
    gpu = 'Hostname="n1",gpu="0",job="llama"'
    labels = {"severity": "critical", "profile": ODD_NAME, "Hostname": "n1", "gpu": "0", "job": "llama"}
    _promtool_test(tmp_path, profile, [
        _fires("ZlayoutGpuMemoryFull", f"DCGM_FI_DEV_FB_USED{{{gpu}}}",
               f"{mib(g.critical_device_used_above_bytes) + 1}x20", {"exp_labels": labels}),
        _fires("ZlayoutGpuMemoryFull", f"DCGM_FI_DEV_FB_USED{{{gpu}}}",
               f"{mib(g.critical_device_used_above_bytes) - 200}x20", {}),
        _fires("ZlayoutGpuAllocatedHigh", f"zlayout_gpu_max_memory_allocated_bytes{{{gpu}}}",
               f"{g.warn_allocated_above_bytes + 1}x20", {"exp_labels": {**labels, "severity": "warning"}}),
    ])


@needs_promtool
def test_the_host_and_training_log_rules_fire(make_input, tmp_path):
    profile = _profile(make_input, "room")
    a = profile.alerts
    labels = {"profile": ODD_NAME, "instance": "n1:9256", "job": "llama"}
    ranks = [f'namedprocess_namegroup_memory_bytes{{groupname="zlayout-training",memtype="resident",'
             f'instance="n1:9256",job="llama",rank="{r}"}}' for r in range(2)]
    half = a.host_memory.warn_above_bytes // 2 + 1  # two ranks, summed per node: just over
    loss = 'zlayout_train_loss{instance="n1:9256",job="llama"}'
    _promtool_test(tmp_path, profile, [
        {"interval": "1m", "input_series": [{"series": s, "values": f"{half}x20"} for s in ranks],
         "alert_rule_test": [{"eval_time": "15m", "alertname": "ZlayoutHostMemoryHigh",
                              "exp_alerts": [{"exp_labels": {**labels, "severity": "warning"}}]}]},
        _fires("ZlayoutStepTimeHigh", 'zlayout_step_time_seconds{instance="n1:9256",job="llama"}',
               f"{a.step_time.warn_above_s * 1.01}x20", {"exp_labels": {**labels, "severity": "warning"}}),
        _fires("ZlayoutLossSpike", loss, "2x10 9", {"exp_labels": {**labels, "severity": "critical"}},
               at="11m", value="9"),
        _fires("ZlayoutLossSpike", loss, "2x20", {}),
        _fires("ZlayoutLossSpike", loss, "2x10 NaN", {"exp_labels": {**labels, "severity": "critical"}},
               at="11m", value="NaN"),
    ])
