"""A profile is a set: written as one, checked as one, and never replacing what is not a profile.

Through the real command line (zlayout.cli.main) and the app's own profile I/O.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest

from zlayout.cli import main
from zlayout.core.plan import make_plan
from zlayout.profile import load_profile, save_profile_dir
from zlayout.profile.alerts import derive_alerts
from zlayout.profile.store import TEMP_PREFIX
from zlayout.spec import Layout

TINY = ["export", "--layers", "2", "--hidden", "128", "--heads", "4", "--vocab", "1000", "--seq", "64",
        "--gpus-per-node", "2", "--gpu", "h200"]
STAGE2 = [*TINY, "--stage", "2", "--name", "two"]
STAGE3 = [*TINY, "--stage", "3", "--offload-optimizer", "cpu", "--name", "three"]
SET = ("ds_config.json", "launch_deepspeed.sh", "launch_torchrun.sh", "launch_slurm.sbatch",
       "RUNBOOK.md", "memory.svg", "alerts.yml")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line_error(err: str) -> bool:
    return err.startswith("zlayout: error: ") and err.count("\n") == 1


@pytest.fixture
def exported(tmp_path, capsys) -> Path:
    out = tmp_path / "p"
    assert run(capsys, *STAGE2, "--out", str(out))[0] == 0
    return out


# ---------------------------------------------------------------- the manifest

def test_manifest_holds_the_sha256_of_every_file_beside_it(exported):
    manifest = load_profile(exported).manifest
    assert sorted(manifest) == sorted(SET)
    for name, digest in manifest.items():
        assert digest == "sha256:" + hashlib.sha256((exported / name).read_bytes()).hexdigest()
    assert "[manifest]" in (exported / "profile.toml").read_text()


def _mixed(tmp_path: Path, capsys, keep_old: str) -> Path:
    """A set as a crash between the renames leaves it: new files, but `keep_old` from the old export."""
    old, new = tmp_path / "old", tmp_path / "new"
    assert run(capsys, *STAGE2, "--out", str(old))[0] == 0
    assert run(capsys, *STAGE3, "--out", str(new))[0] == 0
    shutil.copy(old / keep_old, new / keep_old)
    return new


@pytest.mark.parametrize("command", [["show"], ["show", "--json"], ["check"], ["diff", "OTHER"],
                                     ["verify", "--cpu", "--steps", "1"], ["verify", "--update-profile", "--cpu"]])
def test_a_half_swapped_set_is_refused_by_every_reader_naming_the_file(tmp_path, capsys, command):
    mixed = _mixed(tmp_path, capsys, keep_old="profile.toml")  # old profile.toml, new ds_config.json
    argv = [command[0], str(mixed), *command[1:]]
    if command[0] == "diff":
        argv = ["diff", str(tmp_path / "old"), str(mixed)]
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert one_line_error(err)
    assert f"{mixed}/ds_config.json" in err and "stage is 3" in err and "give 2" in err


def test_an_old_script_in_a_new_set_is_named(tmp_path, capsys):
    mixed = _mixed(tmp_path, capsys, keep_old="launch_torchrun.sh")
    code, _, err = run(capsys, "show", str(mixed))
    assert code == 2 and one_line_error(err) and "launch_torchrun.sh" in err and "manifest" in err


@pytest.mark.parametrize("text, words", [
    ("this is not JSON {", "not valid JSON"),
    ('{"train_micro_batch_size_per_gpu": 1}', "gradient_accumulation_steps is absent"),
])
def test_a_broken_or_edited_ds_config_is_refused(exported, capsys, text, words):
    (exported / "ds_config.json").write_text(text)
    for command in (["show", str(exported)], ["check", str(exported)], ["diff", str(exported), str(exported)],
                    ["verify", str(exported), "--update-profile", "--cpu"]):
        code, _, err = run(capsys, *command)
        assert code == 2 and one_line_error(err) and "ds_config.json" in err and words in err, command


def test_a_hand_edited_stage_in_ds_config_is_reported_as_such(exported, capsys):
    config = json.loads((exported / "ds_config.json").read_text())
    config["zero_optimization"]["stage"] = 3
    (exported / "ds_config.json").write_text(json.dumps(config))
    code, _, err = run(capsys, "show", str(exported))
    assert code == 2 and "changed after export" in err and "zero_optimization.stage is 3" in err


def test_a_hand_edited_layout_in_profile_toml_is_reported_as_such(exported, capsys):
    path = exported / "profile.toml"
    path.write_text(path.read_text().replace("[layout]\nstage = 2", "[layout]\nstage = 1"))
    code, _, err = run(capsys, "show", str(exported))
    assert code == 2 and f"{path}: edited after export" in err and "zero_optimization.stage is 2" in err


def test_reformatting_ds_config_is_harmless(exported, capsys):
    config = json.loads((exported / "ds_config.json").read_text())
    (exported / "ds_config.json").write_text(json.dumps(config, indent=8, sort_keys=True))
    code, out, _ = run(capsys, "show", str(exported))
    assert code == 0 and "two" in out


def test_a_removed_script_is_missing_not_mixed(exported, capsys):
    (exported / "launch_slurm.sbatch").unlink()
    code, out, _ = run(capsys, "show", str(exported))
    assert code == 0 and "MISSING: launch_slurm.sbatch" in out


# ---------------------------------------------------------------- temporaries

def test_leftover_temporaries_are_cleaned_by_the_next_write(exported, capsys):
    (exported / f"{TEMP_PREFIX}abc123").mkdir()
    (exported / f"{TEMP_PREFIX}abc123" / "ds_config.json").write_text("{}")
    (exported / ".profile.toml.x1y2.tmp").write_text("half")
    (exported / ".launch_deepspeed.sh.q.tmp").write_text("half")
    mine = [exported / ".gitignore", exported / "notes.tmp", exported / "train.py"]
    for path in mine:
        path.write_text("the team's")
    assert run(capsys, *STAGE3, "--out", str(exported), "--force")[0] == 0
    assert sorted(p.name for p in exported.iterdir()) == sorted([*SET, "profile.toml", *(p.name for p in mine)])
    assert all(p.read_text() == "the team's" for p in mine)


# ---------------------------------------------------------------- what export may replace

def test_export_never_replaces_a_file_that_is_not_a_profile(tmp_path, capsys):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "team"\n')
    for extra in ([], ["--force"]):
        code, _, err = run(capsys, *STAGE2, "--out", str(pyproject), *extra)
        assert code == 2 and one_line_error(err) and "not a zlayout profile" in err
    assert pyproject.read_text() == '[project]\nname = "team"\n'


def test_export_never_replaces_a_hand_written_ds_config(tmp_path, capsys):
    (tmp_path / "ds_config.json").write_text('{"zero_optimization": {"stage": 1}}')
    code, _, err = run(capsys, *STAGE2, "--out", str(tmp_path), "--force")
    assert code == 2 and one_line_error(err) and "holds no profile.toml" in err
    assert (tmp_path / "ds_config.json").read_text() == '{"zero_optimization": {"stage": 1}}'
    assert not (tmp_path / "profile.toml").exists()


@pytest.mark.parametrize("out", ["", "   "])
def test_export_to_an_empty_path_is_refused(tmp_path, capsys, monkeypatch, out):
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, *STAGE2, "--out", out)
    assert code == 2 and one_line_error(err) and "--out is empty" in err
    assert list(tmp_path.iterdir()) == []


def test_export_refuses_a_name_too_long_for_the_file_system(tmp_path, capsys):
    code, _, err = run(capsys, *STAGE2, "--out", str(tmp_path / ("x" * 300)))
    assert code == 2 and one_line_error(err) and "255" in err


def test_a_single_toml_file_profile_keeps_its_change_log(tmp_path, capsys):
    target = tmp_path / "team" / "layout.toml"
    assert run(capsys, *STAGE2, "--out", str(target))[0] == 0
    assert run(capsys, *STAGE3, "--out", str(target))[0] == 2  # needs --force
    assert run(capsys, *STAGE3, "--out", str(target), "--force", "--why", "more memory")[0] == 0
    profile = load_profile(target)
    assert [e.layout_after for e in profile.changelog] == ["ZeRO-2", "ZeRO-3 opt→cpu"]
    assert sorted(p.name for p in target.parent.iterdir()) == ["layout.toml"]
    code, out, _ = run(capsys, "show", str(target))
    assert code == 0 and "on its own" in out


# ---------------------------------------------------------------- the app's export: the same rules

@pytest.fixture
def app_io():
    from zlayout.tui.backends import default_profile_io

    io = default_profile_io()
    assert not isinstance(io, str), io
    return io


def _plan(make_input):
    return make_plan(make_input(gpus_per_node=2), with_breakeven=False)


def test_app_export_refuses_pyproject_and_a_hand_written_ds_config(app_io, make_input, tmp_path):
    from zlayout.profile import ProfileError

    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text("[project]\n")
    assert app_io.exists(str(pyproject)) is False  # it is no profile: the app must not offer to overwrite
    with pytest.raises(ProfileError, match="not a zlayout profile"):
        app_io.save(_plan(make_input), Layout(stage=2), str(pyproject))
    assert pyproject.read_text() == "[project]\n"
    (tmp_path / "ds_config.json").write_text("{}")
    with pytest.raises(ProfileError, match="holds no profile.toml"):
        app_io.save(_plan(make_input), Layout(stage=2), str(tmp_path))
    assert (tmp_path / "ds_config.json").read_text() == "{}"


def test_app_export_never_replaces_an_unreadable_profile(app_io, make_input, tmp_path, capsys):
    from zlayout.profile import ProfileError

    out = tmp_path / "p"
    assert run(capsys, *STAGE2, "--out", str(out))[0] == 0
    corrupt = (out / "profile.toml").read_bytes()[:700]
    (out / "profile.toml").write_bytes(corrupt)
    with pytest.raises(ProfileError, match="Not replacing a profile zlayout cannot read"):
        app_io.save(_plan(make_input), Layout(stage=3), str(out))
    assert (out / "profile.toml").read_bytes() == corrupt


def test_app_export_replaces_a_profile_keeping_its_change_log(app_io, make_input, tmp_path, capsys):
    out = tmp_path / "p"
    assert run(capsys, *STAGE2, "--out", str(out))[0] == 0
    assert app_io.exists(str(out)) is True  # the app asks before this
    app_io.save(_plan(make_input), Layout(stage=3), str(out))
    profile = load_profile(out)
    assert profile.layout.stage == 3 and len(profile.changelog) == 2
    assert run(capsys, "show", str(out))[0] == 0  # a whole, consistent set


# ---------------------------------------------------------------- stale content

def _edit_layers(out: Path, layers: int) -> None:
    path = out / "profile.toml"
    text = path.read_text()
    assert "layers = 2\n" in text
    path.write_text(text.replace("layers = 2\n", f"layers = {layers}\n", 1))


def test_show_flags_a_prediction_the_inputs_no_longer_give(exported, capsys):
    stored = load_profile(exported).prediction.gpu_peak_allocated_bytes
    _edit_layers(exported, 200)
    code, out, _ = run(capsys, "show", str(exported))
    assert code == 0
    assert out.startswith("STALE PREDICTION (this zlayout's model changed since export, or the inputs were edited)")
    assert "gpu_peak_allocated_bytes" in out
    code, out, _ = run(capsys, "show", "--json", str(exported))
    data = json.loads(out)
    assert data["prediction"]["gpu_peak_allocated_bytes"] == stored  # the file as it is ...
    assert data["stale_prediction"]["now"]["gpu_peak_allocated_bytes"] > stored  # ... and what it should say


def test_an_edited_host_side_is_stale_and_an_older_export_without_it_is_not(exported, capsys):
    # host_overhead_s decides a host-bound step's wider alert: a stored one is checked; a profile
    # exported before zlayout stored it is not stale for lacking it
    path = exported / "profile.toml"
    text = path.read_text()
    line = re.search(r"^host_overhead_s = .*\n", text, re.M)
    assert line
    path.write_text(text.replace(line.group(0), "host_overhead_s = 1.5\n", 1))
    out = run(capsys, "show", str(exported))[1]
    assert out.startswith("STALE PREDICTION") and "host_overhead_s" in out
    path.write_text(text.replace(line.group(0), "", 1))
    assert load_profile(exported).prediction.host_overhead_s is None
    assert "STALE" not in run(capsys, "show", str(exported))[1]


def test_diff_reports_the_effect_of_a_hand_edit(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    assert run(capsys, *STAGE2, "--out", str(a))[0] == 0
    assert run(capsys, *STAGE2, "--out", str(b))[0] == 0
    _edit_layers(b, 200)
    code, out, _ = run(capsys, "diff", str(a), str(b))
    assert code == 0
    assert "inputs.model.layers" in out and "Effect: none" not in out
    assert "gpu_peak_allocated_bytes (predicted)" in out and "B: STALE PREDICTION" in out


def test_a_prediction_from_another_planner_says_so(exported, capsys):
    # as another zlayout would have written it: its own prediction, and the alerts that prediction gives
    profile = load_profile(exported)
    halved = profile.prediction.model_copy(update={
        "planner": "zlayout 0.0.1-old", "gpu_peak_allocated_bytes": profile.prediction.gpu_peak_allocated_bytes // 2})
    older = profile.model_copy(update={"prediction": halved, "alerts": derive_alerts(
        profile.inputs, halved, profile.verification, checkpoint_dir=profile.run.checkpoint_dir)})
    save_profile_dir(older, exported)
    code, out, _ = run(capsys, "show", str(exported))
    assert code == 0 and "STALE PREDICTION (made by zlayout 0.0.1-" in out


def test_a_fresh_profile_is_not_stale(exported, capsys):
    code, out, _ = run(capsys, "show", str(exported))
    assert code == 0 and "STALE" not in out and "all match the manifest" in out


# ---------------------------------------------------------------- SIGKILL during export --force

def test_sigkill_during_export_never_leaves_an_accepted_mixed_profile():
    """A few tries of benchmarks/kill_export.py (500 there); each kill lands in the write phase."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "kill_export.py"
    spec = importlib.util.spec_from_file_location("kill_export", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    counts = module.run(tries=6, seed=3)
    assert counts["MIXED"] == 0 and counts["temporaries_not_cleaned"] == 0
    assert counts["accepted"] + counts["refused"] == 6


@pytest.mark.parametrize("value", ["1" + "0" * 30, "inf", "nan"])
def test_a_number_no_profile_holds_is_one_line(exported, capsys, value):
    """tomllib reads integers of any size (TOML's are 64-bit); a figure of 10^30 bytes once
    crashed `show` formatting it as GiB."""
    path = exported / "profile.toml"
    head, prediction = path.read_text().split("\n[prediction]\n", 1)
    prediction = re.sub(r"(?m)^gpu_peak_allocated_bytes = .*$", f"gpu_peak_allocated_bytes = {value}", prediction, 1)
    path.write_text(head + "\n[prediction]\n" + prediction)
    code, _, err = run(capsys, "show", str(exported))
    assert code == 2 and one_line_error(err) and "prediction.gpu_peak_allocated_bytes" in err and "line " in err
