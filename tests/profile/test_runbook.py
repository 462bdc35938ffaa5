"""The handoff pack: RUNBOOK.md, memory.svg and alerts.yml, generated from real profiles."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from zlayout import catalog
from zlayout.catalog import format_params
from zlayout.cli import main
from zlayout.profile import (RunSettings, attach_verification, build_profile, dumps_profile, load_profile,
                             save_profile, save_profile_dir)
from zlayout.profile.check import GpuInfo, run_checks
from zlayout.profile.memory_svg import BAR_PX
from zlayout.profile.prometheus import MiB, alerts_yaml, mib
from zlayout.profile.runbook import (ALERTS_FILE, MEMORY_SVG_FILE, RUNBOOK_FILE, SECTIONS, diff_markdown,
                                     extra_files, render_runbook)
from zlayout.spec import GiB, Layout, gib_figure

READY = ("llama3-8b-8xh100", "llama3-70b-64xh100", "llama3-8b-1xh200-offload")
FIXTURES = Path(__file__).parent / "fixtures"
DCGM_AND_NODE_METRICS = {"DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_UTIL",
                         "DCGM_FI_DEV_XID_ERRORS", "node_memory_MemAvailable_bytes",
                         "node_memory_MemTotal_bytes", "node_filesystem_avail_bytes"}
TRAINING_AND_PROCESS_METRICS = {"namedprocess_namegroup_memory_bytes", "zlayout_step_time_seconds",
                                "zlayout_gpu_max_memory_allocated_bytes", "zlayout_train_loss"}


def sections(text: str) -> dict[str, str]:
    """Level-2 heading -> its body."""
    parts = re.split(r"^(## .*)$", text, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def _walk(value, key=""):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _walk(v, str(k))
    elif isinstance(value, list):
        for v in value:
            yield from _walk(v, key)
    else:
        yield key, value


def profile_figures(profile) -> tuple[set[str], set[float], set[str]]:
    """Every GiB, seconds and parameter-count figure the profile holds, rounded as the runbook rounds."""
    gib, secs, params = set(), set(), {format_params(profile.inputs.model.params)}
    for key, value in _walk(profile.model_dump(mode="json")):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if key.endswith("bytes") or key.endswith("bytes_before") or key.endswith("bytes_after"):
            gib.add(gib_figure(value))
        elif key.endswith("_gib"):
            gib.add(gib_figure(value * GiB))
        elif (key.endswith("_s") or key.endswith("_s_before") or key.endswith("_s_after")) \
                and not key.endswith("per_s"):
            secs.add(float(f"{value:.3g}"))
        elif key.endswith("params"):
            params.add(format_params(value))
    return gib, secs, params


def assert_every_figure_is_the_profiles(profile, text: str) -> None:
    gib, secs, params = profile_figures(profile)
    # "What the training script must do" also gives the planner's figures for a script that departs
    # from the plan (test_the_script_contract_gives_the_planners_figures)
    text = re.sub(r"## What the training script must do\n.*?(?=\n## )", "", text, flags=re.S)
    # The profile's own sentences (a change's why, a term's explanation) quote figures their own way.
    quoted = {" ".join(v.split()).replace("|", "\\|") for _, v in _walk(profile.model_dump(mode="json"))
              if isinstance(v, str) and re.search(r"\d", v)}
    for sentence in sorted(quoted, key=len, reverse=True):
        text = text.replace(sentence, "")
    found_gib = re.findall(r"(?<![\w.,])(\d+(?:\.\d+)?) GiB", text)
    found_s = [float(x) for x in re.findall(r"(?<![\w.])(\d[\d.]*(?:e[+-]?\d+)?) s\b", text)]
    found_params = re.findall(r"\b(\d+(?:\.\d+)?[KMBT])\b(?! ?GiB)", text)
    assert found_gib and found_s
    assert not [x for x in found_gib if x not in gib], "GiB figures the profile does not hold"
    assert not [x for x in found_s if x not in secs], "seconds the profile does not hold"
    assert not [x for x in found_params if x not in params], "parameter counts the profile does not hold"


@pytest.fixture
def full_profile(make_input, make_verify_result, fixed_time, tmp_path):
    """Every part present: NVMe offload, a checkpoint directory, a verification with a restart drill."""
    inp = make_input(gpus_per_node=2, nvme_gib=2000)
    profile = build_profile(inp, Layout(stage=3, offload_optimizer="nvme", offload_param="nvme"), now=fixed_time,
                            run=RunSettings(checkpoint_dir=str(tmp_path / "ckpt"), nvme_path=str(tmp_path)))
    result = make_verify_result(profile)
    result["restart_drill"] |= {"save_s": 41.25, "restart_wall_s": 97.5}
    return attach_verification(profile, result, now=fixed_time)


# ------------------------------------------------------------------ the ready profiles

@pytest.mark.parametrize("name", READY)
def test_ready_profile_runbook_has_every_section_and_the_profiles_figures(name):
    directory = catalog.preset_path("profiles", name)
    profile = load_profile(directory)
    text = render_runbook(profile)
    assert [line for line in text.splitlines() if line.startswith("## ")] == list(SECTIONS)
    assert_every_figure_is_the_profiles(profile, text)

    body = sections(text)
    s = profile.summary()
    summary = body["## Summary"]
    pred = profile.prediction
    assert re.search(rf"\| GPU memory, peak allocated \(predicted\) \| {gib_figure(pred.gpu_peak_allocated_bytes)} GiB "
                     rf"of {gib_figure(s.gpu_capacity_bytes)} GiB per GPU \|", summary)
    assert (f"{gib_figure(s.host_peak_bytes)} GiB per node, of {gib_figure(s.host_capacity_bytes)} GiB (assumed"
            in summary)
    assert f"| Step time (predicted) | {s.step_time_s:.3g} s" in summary
    assert "**UNVERIFIED**" in summary
    for term in profile.prediction.terms:
        assert f"| {term.name} | {gib_figure(term.bytes)} GiB |" in body["## What lives where"]
    assert f"![Memory per GPU]({MEMORY_SVG_FILE})" in body["## What lives where"]
    limits = body["## Where it stops fitting"]
    assert f"**{format_params(profile.limits.max_params)}** parameters" in limits
    assert f"**{profile.limits.takes_over.label}** is the fastest layout" in limits
    assert f"micro-batch for this model with this layout: **{profile.limits.max_micro_batch}**" in limits
    assert len(re.findall(r"^\| (\*\*)?ZeRO-", limits, flags=re.M)) == len(profile.limits.layouts) == 13
    alerts = body["## Alerts"]
    assert f"> {gib_figure(profile.alerts.gpu_memory.warn_allocated_above_bytes)} GiB per GPU" in alerts
    assert f"DCGM_FI_DEV_FB_USED > {mib(profile.alerts.gpu_memory.warn_device_used_above_bytes)}" in alerts
    assert f"> {profile.alerts.step_time.warn_above_s:.3g} s" in alerts
    change_rows = [line for line in body["## Change log"].splitlines() if re.match(r"\| \d{4}-", line)]
    assert len(change_rows) == len(profile.changelog)


@pytest.mark.parametrize("name", READY)
def test_ready_profile_ships_its_pack(name):
    directory = catalog.preset_path("profiles", name)
    profile = load_profile(directory)
    for file_name, text in extra_files(profile).items():
        assert (directory / file_name).read_text() == text, file_name


# ------------------------------------------------------------------ every part of a full profile

def test_full_profile_runbook(full_profile, tmp_path):
    text = render_runbook(full_profile)
    assert [line for line in text.splitlines() if line.startswith("## ")] == list(SECTIONS)
    assert_every_figure_is_the_profiles(full_profile, text)
    body = sections(text)
    assert "**VALIDATED** on 2x NVIDIA H100 80GB HBM3 at 2026-11-30 01:02 UTC" in body["## Summary"]
    assert "(measured)" in body["## Summary"] and "Measured against predicted" in body["## Summary"]
    restart = body["## Restart procedure"]
    assert f"`{tmp_path / 'ckpt'}`" in restart
    assert "save 41.2 s" in restart and "restart to first resumed step 12.5 s" in restart
    assert "restart wall time 97.5 s" in restart and "identical" in restart
    assert "Not drilled yet" not in restart
    assert f"{gib_figure(full_profile.prediction.nvme_bytes)} GiB" in body["## What lives where"]
    assert "iostat" in body["## On-call notes"]
    assert "Checkpoint space" in body["## Alerts"]
    assert len([line for line in body["## Change log"].splitlines() if re.match(r"\| \d{4}-", line)]) == 2


def test_checklist_names_every_check_zlayout_check_runs(full_profile, tmp_path):
    ckpt = tmp_path / "ckpt" / "global_step2"
    ckpt.mkdir(parents=True)
    (ckpt / "mp_rank_00_model_states.pt").write_bytes(b"x" * 10)
    (tmp_path / "ckpt" / "latest").write_text("global_step2")
    gpus = [GpuInfo("NVIDIA H100 80GB HBM3", 85520809984, 85000000000, "560.35.03")] * 2
    items = run_checks(full_profile, gpus, meminfo={"MemAvailable": 2**41, "MemTotal": 2**41})
    names = {item.name for item in items}
    assert {"GPUs visible", "GPU model", "GPU free memory", "host memory", "driver", "NVMe offload path",
            "last checkpoint", "profile verified"} <= names
    checklist = sections(render_runbook(full_profile))["## Pre-run checklist"]
    for name in names:
        assert f"- [ ] **{name}**:" in checklist, name
    assert "driver_version 560.35.03" in checklist
    assert f"`df -h {tmp_path}`" in checklist


def test_unverified_profile_says_how_to_drill_and_verify(profile_8b):
    body = sections(render_runbook(profile_8b))
    assert "Not drilled yet: run `zlayout verify . --steps 5 --restart-drill`" in body["## Restart procedure"]
    assert "not named in the profile" in body["## Restart procedure"]
    assert "not needed: this layout keeps nothing on NVMe" in body["## Pre-run checklist"]
    assert "not applicable: this layout keeps nothing on NVMe" in body["## On-call notes"]


def test_text_from_the_profile_cannot_break_the_tables(profile_8b):
    odd = profile_8b.model_copy(update={"name": "a|b\nc", "description": "x | y"})
    text = render_runbook(odd)
    assert "# Runbook: a\\|b c" in text
    assert [line for line in text.splitlines() if line.startswith("## ")] == list(SECTIONS)


# ------------------------------------------------------------------ the files beside profile.toml

def test_export_writes_the_pack_and_verification_rewrites_it(profile_8b, make_verify_result, tmp_path):
    save_profile_dir(profile_8b, tmp_path)
    before = (tmp_path / RUNBOOK_FILE).read_text()
    assert before == render_runbook(load_profile(tmp_path))
    assert "**UNVERIFIED**" in before

    verified = attach_verification(load_profile(tmp_path), make_verify_result(profile_8b))
    save_profile(verified, tmp_path / "profile.toml")  # what verify --update-profile calls
    after = (tmp_path / RUNBOOK_FILE).read_text()
    loaded = load_profile(tmp_path)
    assert after == render_runbook(loaded) != before
    assert "**VALIDATED**" in after
    assert (tmp_path / ALERTS_FILE).read_text() == alerts_yaml(loaded)
    assert len([line for line in sections(after)["## Change log"].splitlines()
                if re.match(r"\| \d{4}-", line)]) == 2


def test_a_toml_of_another_name_gets_no_pack(profile_8b, tmp_path):
    save_profile(profile_8b, tmp_path / "mine.toml")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.toml"]


def test_alerts_yml_is_prometheus_rules_with_the_profiles_thresholds(full_profile):
    scoped = full_profile.model_copy(update={"run": full_profile.run.model_copy(
        update={"alert_labels": {"job": "llama", "cluster": "a"}})})
    rules_file = yaml.safe_load(alerts_yaml(scoped))
    [group] = rules_file["groups"]
    rules = {rule["alert"]: rule for rule in group["rules"]}
    # far from the card: no nearly-full rule (core.fit: only near the card; tests/profile/test_alert_rules.py)
    assert set(rules) == {"ZlayoutGpuMemoryHigh", "ZlayoutGpuAllocatedHigh",
                          "ZlayoutHostMemoryHigh", "ZlayoutStepTimeHigh", "ZlayoutLossSpike", "ZlayoutGpuIdle",
                          "ZlayoutGpuXid", "ZlayoutCheckpointSpaceLow"}
    a = full_profile.alerts
    job = '{job="llama",cluster="a"}'
    assert rules["ZlayoutGpuMemoryHigh"]["expr"] == \
        f"DCGM_FI_DEV_FB_USED{job} > {round(a.gpu_memory.warn_device_used_above_bytes / MiB)}"
    assert a.gpu_memory.critical_device_used_above_bytes is None
    # the job's own processes (the process exporter's group), not the node's memory
    assert rules["ZlayoutHostMemoryHigh"]["expr"] == (
        'sum by (instance, job, cluster) (namedprocess_namegroup_memory_bytes{groupname="zlayout-training",'
        'memtype="resident",'
        f'job="llama",cluster="a"}}) > {a.host_memory.warn_above_bytes}')
    assert rules["ZlayoutStepTimeHigh"]["expr"] == f"zlayout_step_time_seconds{job} > {a.step_time.warn_above_s}"
    assert rules["ZlayoutCheckpointSpaceLow"]["expr"] == (
        f'node_filesystem_avail_bytes{{mountpoint="{full_profile.run.checkpoint_dir}",job="llama",cluster="a"}} < '
        f"{2 * full_profile.prediction.checkpoint_bytes}")
    for rule in rules.values():
        metrics = set(re.findall(r"\b(?:DCGM_FI_DEV_\w+|node_\w+|namedprocess_\w+|zlayout_\w+)", rule["expr"]))
        assert metrics and metrics <= DCGM_AND_NODE_METRICS | TRAINING_AND_PROCESS_METRICS, rule["expr"]
        assert all(job[1:-1] in selector for selector in re.findall(r"\{[^}]*\}", rule["expr"])), rule["expr"]
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["labels"]["profile"] == full_profile.name
        assert re.fullmatch(r"\d+m", rule["for"])
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    # unscoped, the idle rule would fire for every idle GPU of the fleet: left out, and said so
    unscoped = alerts_yaml(full_profile)
    assert "UNSCOPED" in unscoped and "ZlayoutGpuIdle" not in unscoped


def test_alerts_yml_survives_odd_names(profile_8b):
    odd = profile_8b.model_copy(update={"name": 'x": y\n- z #', "description": "a\nb: c"})
    [group] = yaml.safe_load(alerts_yaml(odd))["groups"]
    assert group["rules"][0]["labels"]["profile"] == 'x": y - z #'


def test_memory_svg_draws_each_gpu_term_to_scale(profile_8b):
    svg = ET.fromstring(extra_files(profile_8b)[MEMORY_SVG_FILE])
    ns = {"s": "http://www.w3.org/2000/svg"}
    terms = svg.findall("s:g[@class='term']", ns)
    gpu_terms = [t for t in profile_8b.prediction.terms if t.where == "gpu"]
    assert [int(g.get("data-bytes")) for g in terms] == [t.bytes for t in gpu_terms]
    capacity = profile_8b.prediction.gpu_capacity_bytes
    for g, term in zip(terms, gpu_terms):
        width = float(g.find("s:rect", ns).get("width"))
        assert width == pytest.approx(term.bytes / capacity * BAR_PX, abs=0.06)
        assert g.find("s:text", ns).text == term.name
    totals = {g.find("s:text", ns).text: int(g.get("data-bytes")) for g in svg.findall("s:g[@class='total']", ns)}
    assert totals["GPU capacity"] == capacity
    assert totals["peak allocated (predicted)"] == profile_8b.prediction.gpu_peak_allocated_bytes


def test_memory_svg_escapes_text(profile_8b):
    terms = [t.model_copy(update={"explanation": "a <b> & \"c\""}) for t in profile_8b.prediction.terms]
    odd = profile_8b.model_copy(update={
        "name": "<&>", "prediction": profile_8b.prediction.model_copy(update={"terms": terms})})
    svg = ET.fromstring(extra_files(odd)[MEMORY_SVG_FILE])  # parses: nothing unescaped
    assert "<&>" in svg.find("{http://www.w3.org/2000/svg}title").text


# ------------------------------------------------------------------ schema 2 and the migration

@pytest.mark.parametrize("fixture", ["v1-llama3-70b-64xh100.toml", "v1-custom-verified.toml"])
def test_schema_1_files_load_and_migrate(fixture, tmp_path):
    import tomllib

    text = (FIXTURES / fixture).read_text()
    raw = tomllib.loads(text)
    assert raw["schema_version"] == 1 and "bandwidth_gbps" in text
    profile = load_profile(FIXTURES / fixture)
    assert profile.schema_version == 2
    assert profile.inputs.hardware.intra_link.bandwidth_gbps == raw["inputs"]["hardware"]["intra_link"]["bandwidth_gbps"]
    assert profile.inputs.hardware.gpu.peak_bf16_flops == raw["inputs"]["hardware"]["gpu"]["peak_bf16_flops"]
    assert profile.prediction.gpu_peak_allocated_bytes == raw["prediction"]["gpu_peak_allocated_bytes"]
    assert profile.changelog[0].why == raw["changelog"][0]["why"]
    assert profile.limits is None and profile.prediction.checkpoint_bytes is None
    written = dumps_profile(profile)
    assert written.startswith("schema_version = 2\n")
    assert "_gbps" not in written and "bandwidth_gb_per_s" in written and "peak_bf16_flop_per_s" in written
    # saved into a directory, it is written as a whole set: the file gains the set's manifest
    assert load_profile(save_profile(profile, tmp_path)).model_copy(update={"manifest": {}}) == profile

    text_md = render_runbook(profile)
    assert [line for line in text_md.splitlines() if line.startswith("## ")] == list(SECTIONS)
    assert "schema 1" in sections(text_md)["## Where it stops fitting"]
    assert_every_figure_is_the_profiles(profile, text_md)


def test_custom_model_family_is_empty(make_input, fixed_time, tmp_path):
    custom = catalog.load_model("llama3-8b").model_copy(update={"name": "custom", "layers": 24})
    assert custom.family == "llama3"
    profile = build_profile(make_input(model=custom), Layout(stage=2), now=fixed_time)
    assert profile.inputs.model.family is None
    assert profile.limits.scaling == "depth"
    model_table = dumps_profile(profile).split("[inputs.model]")[1].split("\n[")[0]
    assert "family" not in model_table
    assert load_profile(FIXTURES / "v1-custom-verified.toml").inputs.model.family is None
    named = build_profile(make_input(), Layout(stage=2), now=fixed_time)
    assert named.inputs.model.family == "llama3"  # a preset keeps its family


def test_units_are_in_every_key_name(profile_8b):
    """No key reads as another unit; every spec field survives the file's spelling."""
    import tomllib

    from zlayout.profile.schema import inputs_from_file, inputs_to_file

    data = tomllib.loads(dumps_profile(profile_8b))
    keys = {key for key, _ in _walk(data)}
    assert not [k for k in keys if k.endswith(("_gbps", "_flops"))]
    dumped = profile_8b.inputs.model_dump()
    assert inputs_from_file(inputs_to_file(dumped)) == dumped
    summary = data["summary"]
    for name in ("gpu_peak_allocated", "gpu_device_used", "gpu_capacity", "host_peak", "host_capacity", "nvme"):
        assert summary[f"{name}_gib"] == round(summary[f"{name}_bytes"] / GiB, 1)
    assert summary["gpu_peak_allocated_bytes"] == profile_8b.prediction.gpu_peak_allocated_bytes
    assert summary["step_time_s"] == float(f"{profile_8b.prediction.step_time_s:.3g}")


# ------------------------------------------------------------------ the commands

def test_show_markdown_prints_the_runbook(tmp_path, capsys):
    out = tmp_path / "p"
    assert main(["export", "--preset", "llama3-8b", "--gpu", "h100", "--gpus-per-node", "8", "--seq", "4096",
                 "--stage", "2", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["show", str(out), "--markdown"]) == 0
    assert capsys.readouterr().out == (out / RUNBOOK_FILE).read_text()
    assert main(["show", str(out), "--markdown", "--json"]) == 2
    assert "not both" in capsys.readouterr().err


def test_diff_markdown_gives_the_before_after_section(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    common = ["export", "--preset", "llama3-8b", "--gpu", "h100", "--gpus-per-node", "8", "--stage", "2"]
    assert main([*common, "--seq", "4096", "--out", str(a)]) == 0
    assert main([*common, "--seq", "8192", "--out", str(b)]) == 0
    capsys.readouterr()
    assert main(["diff", str(a), str(b), "--markdown"]) == 0
    text = capsys.readouterr().out
    pa, pb = load_profile(a), load_profile(b)
    assert text == diff_markdown(pa, pb)
    assert text.startswith(f"## Change: {pa.name} → {pb.name}\n")
    assert "| `inputs.training.seq` | 4096 | 8192 |" in text
    before, after = pa.prediction.gpu_peak_allocated_bytes, pb.prediction.gpu_peak_allocated_bytes
    assert (f"| gpu_peak_allocated_bytes | predicted | {gib_figure(before)} GiB | {gib_figure(after)} GiB | "
            f"+{gib_figure((after - before))} GiB ({(after - before) / before:+.1%}) |") in text
    assert main(["diff", str(a), str(b), "--markdown", "--json"]) == 2


def test_the_script_contract_gives_the_planners_figures(make_input, tmp_path):
    from zlayout.profile.build import predict

    inp = make_input(seq=4096, checkpointing="full")
    profile = build_profile(inp, Layout(stage=3), run=RunSettings())
    text = sections(render_runbook(profile))["## What the training script must do"]
    rows = [line for line in text.splitlines() if re.match(r"\| \d+ \|", line)]
    assert [row.split(" | ")[1].split()[0] for row in rows] == ["Build", "Use", "Feed", "Checkpoint", "Run", "Accept",
                                                                    "Leave"]

    def changed(**training):
        return predict(inp.model_copy(update={"training": inp.training.model_copy(update=training)}),
                       Layout(stage=3))
    fp32 = changed(init="fp32-cpu").host_peak_bytes
    plan = profile.prediction
    assert f"host peak {gib_figure(plan.host_peak_bytes)} GiB per node; built in fp32" in rows[0]
    assert f"it is {gib_figure(fp32)} GiB per node, {fp32 / plan.host_peak_bytes:.1f}x" in rows[0]
    assert fp32 > 5 * plan.host_peak_bytes  # the 9x of issue 30, on this 8B model 10x
    longer = changed(seq=8192).gpu_peak_allocated_bytes
    assert f"batches of 8,192 tokens need {gib_figure(longer)} GiB" in rows[2]
    unchecked = changed(checkpointing="none").gpu_peak_allocated_bytes
    assert f"without it {gib_figure(unchecked)} GiB" in rows[3]
    other = changed(loop="trainer").gpu_peak_allocated_bytes
    assert f"the trainer loop gives {gib_figure(other)} GiB" in rows[4]
    assert f"8 ranks on GPU 0 would need {gib_figure(8 * plan.gpu_peak_allocated_bytes)} GiB" in rows[5]
    assert "destroy_process_group()" in rows[6] and "FAILED" in rows[6]


def test_a_runbook_of_a_layout_that_does_not_fit_says_so(tmp_path):
    """QA: llama3-70b on 64 H100s at ZeRO-3 (short of the card) read 'The next size, 70.6B, runs out
    of GPU memory' (70.6B is this model) and 'largest that fits: 0'. (25 MiB short of the 5% headroom
    then; on the card the driver hands out it fits at 5%, and 79 and 80 layers need the same: 6%
    makes both short.)"""
    from zlayout.cli import main

    out = tmp_path / "p"
    assert main(["export", "--preset", "llama3-70b", "--gpu", "h100", "--gpus-per-node", "8", "--nodes", "8",
                 "--stage", "3", "--headroom", "0.06", "--out", str(out)]) == 0
    text = (out / "RUNBOOK.md").read_text()
    assert "The next size, 70.6B" not in text and "largest that fits: 0" not in text
    assert "runs out of GPU memory" in text
    # this model's own size, not the family size after the largest that fits (it read 69.7B)
    assert "This model, 70.6B, runs out of GPU memory" in text
    assert "none fits this model with this layout" in text


def test_a_layout_whose_cache_fills_the_card_reads_full_in_the_runbook_and_show_as_in_the_app():
    """70B ZeRO-3 on 4x8 H100 at seq 3584, micro-batch 3 (found at seq 4096 with ZeRO-3 param→cpu,
    which no longer fits the 5% headroom: it runs out on a card 5% smaller): the app's status says
    'the device will be full and the allocator flushes its cache about 2 times a step (needs ...)'
    and its Free column `full`; the runbook said 'Fits: yes' and '0.7 GiB to spare', show
    'headroom 0.7 GiB'."""
    from zlayout.core.plan import make_plan
    from zlayout.profile.summary import format_profile
    from zlayout.spec import HardwareSpec, PlanInput, TrainingSpec

    hw = HardwareSpec(gpu=catalog.load_gpu("h100"), gpus_per_node=8, nodes=4,
                      intra_link=catalog.load_link("nvlink4"), inter_link=catalog.load_link("ib-ndr"))
    inp = PlanInput(model=catalog.load_model("llama3-70b"), hardware=hw,
                    training=TrainingSpec(seq=3584, micro_batch=3, checkpointing="full"))
    layout = Layout(stage=3)
    fit = make_plan(inp).for_layout(layout).memory.gpu_fit
    assert fit.state == "fits-flushing" and fit.headroom_bytes > 0  # the case: a positive headroom, a full card
    profile = build_profile(inp, layout)
    text = render_runbook(profile)
    needs = f"needs {gib_figure(fit.needed_bytes)} GiB of {gib_figure(fit.capacity_bytes)} GiB per GPU"
    assert (f"| Fits | yes; the device will be full and the allocator flushes its cache about "
            f"{fit.flushes_per_step} times a step ({needs}) |") in text
    assert "to spare" not in text and f"its cache fills the card: flushed about {fit.flushes_per_step} times" in text
    shown = format_profile(profile)
    assert "headroom" not in shown and "its cache fills the card" in shown
    # a layout with room left keeps its figure
    roomy = render_runbook(build_profile(inp, Layout(stage=3, offload_optimizer="cpu", offload_param="cpu")))
    assert "| Fits | yes |" in roomy and " to spare." in roomy
