"""alerts.yml's rules can fire and fire only for the job: every threshold below what the card has,
the nearly-full rule whenever the plan is near the card, text from the profile inert in Prometheus'
templates. With promtool installed (Debian's `prometheus` package; .ci/run installs it) the rules
are checked and unit-tested by Prometheus' own rule engine."""

from __future__ import annotations

import os
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

# llama3-8b on 8x H100 80 GB: ZeRO-3 at seq 4096, micro-batch 1 leaves room; micro-batch 2 has the
# caching allocator planned to fill the card (device used = capacity) yet fit; ZeRO-2 at seq 2048,
# micro-batch 6 with checkpointing reaches into the 5% headroom without filling the card
PLANS = {"room": (3, dict(seq=4096, micro_batch=1)), "fills": (3, dict(seq=4096, micro_batch=2)),
         "near": (2, dict(seq=2048, micro_batch=6, checkpointing="full"))}
ODD_NAME = 'x {{ $value }} {{ template "y" }}'


def _profile(make_input, plan: str, **run):
    stage, inputs = PLANS[plan]
    return build_profile(make_input(**inputs), Layout(stage=stage), name=ODD_NAME,
                         run=RunSettings(alert_labels={"job": "llama"}, **run))


@pytest.mark.parametrize("plan", PLANS)
def test_every_threshold_is_below_the_card_and_near_plans_have_a_nearly_full_rule(make_input, plan):
    profile = _profile(make_input, plan)
    g, pred = profile.alerts.gpu_memory, profile.prediction
    capacity = pred.gpu_capacity_bytes
    assert pred.fits
    assert g.peak_allocated_bytes < g.warn_allocated_above_bytes < capacity
    if g.warn_device_used_above_bytes is not None:
        assert g.device_used_bytes < g.warn_device_used_above_bytes < capacity
    near = pred.gpu_device_used_bytes > pred.gpu_usable_bytes
    assert near == (plan != "room")
    rules = {r["alert"]: r for r in yaml.safe_load(alerts_yaml(profile))["groups"][0]["rules"]}
    if near:
        assert "ZlayoutGpuMemoryFull" in rules
    if plan == "fills":  # DCGM shows the card full on a healthy run: only allocated memory tells
        assert g.warn_device_used_above_bytes is None and "ZlayoutGpuMemoryHigh" not in rules
        assert g.warn_allocated_above_bytes < g.critical_allocated_above_bytes < capacity
        assert rules["ZlayoutGpuMemoryFull"]["expr"].startswith("zlayout_gpu_max_memory_allocated_bytes{")
    else:
        assert 0 < g.critical_free_below_bytes < capacity - g.device_used_bytes


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
        _fires("ZlayoutGpuMemoryHigh", 'DCGM_FI_DEV_FB_USED{Hostname="n9",gpu="0",job="other"}',
               f"{over}x20", {}),
        _fires("ZlayoutGpuMemoryFull", f"DCGM_FI_DEV_FB_FREE{{{gpu}}}",
               f"{mib(g.critical_free_below_bytes) - 1}x20",
               {"exp_labels": {**expected["exp_labels"], "severity": "critical"}}),
    ])


@needs_promtool
def test_a_card_the_allocator_fills_is_watched_through_allocated_memory(make_input, tmp_path):
    profile = _profile(make_input, "fills")
    g = profile.alerts.gpu_memory
    job = 'instance="n1:9400",job="llama"'
    labels = {"profile": ODD_NAME, "instance": "n1:9400", "job": "llama"}
    metric = f"zlayout_gpu_max_memory_allocated_bytes{{{job}}}"
    _promtool_test(tmp_path, profile, [
        _fires("ZlayoutGpuMemoryFull", metric, f"{g.critical_allocated_above_bytes + 1}x20",
               {"exp_labels": {**labels, "severity": "critical"}}),
        _fires("ZlayoutGpuMemoryFull", metric, f"{g.peak_allocated_bytes}x20", {}),
        _fires("ZlayoutGpuAllocatedHigh", metric, f"{g.warn_allocated_above_bytes + 1}x20",
               {"exp_labels": {**labels, "severity": "warning"}}),
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
