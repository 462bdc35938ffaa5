"""`zlayout export --ds-config THEIRS.json`: the team's optimizer, scheduler and other keys kept,
zlayout's ZeRO, batch and precision keys set and listed, memory-changing keys refused with the
reason; later hand edits of keys that change no memory accepted by show, check, diff and verify
and recorded in the change log by the next write."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from zlayout.cli import main
from zlayout.profile import load_profile

TINY = ["export", "--layers", "2", "--hidden", "128", "--heads", "4", "--vocab", "1000", "--seq", "64",
        "--gpus-per-node", "2", "--gpu", "h200", "--stage", "2"]
THEIRS = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 1},
          "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "weight_decay": 0.1}},
          "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 2000, "total_num_steps": 100000}},
          "bf16": {"enabled": True}, "wandb": {"enabled": True, "project": "llama"}, "steps_per_print": 10}


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def exported(tmp_path, capsys) -> Path:
    theirs = tmp_path / "theirs.json"
    theirs.write_text(json.dumps(THEIRS))
    out = tmp_path / "p"
    code, printed, err = run(capsys, *TINY, "--out", str(out), "--ds-config", str(theirs))
    assert code == 0, err
    assert "kept yours: optimizer, scheduler, wandb, steps_per_print" in printed
    assert "zlayout replaced train_micro_batch_size_per_gpu: yours 8, zlayout's 1" in printed
    assert "zlayout replaced zero_optimization" in printed
    return out


def test_their_keys_are_kept_and_zlayouts_set(exported):
    config = json.loads((exported / "ds_config.json").read_text())
    for key in ("optimizer", "scheduler", "wandb", "steps_per_print"):
        assert config[key] == THEIRS[key]
    assert config["zero_optimization"]["stage"] == 2 and config["train_micro_batch_size_per_gpu"] == 1
    assert config["train_batch_size"] == 2 and config["bf16"] == {"enabled": True}
    assert load_profile(exported).ds_config_team["scheduler"] == THEIRS["scheduler"]


@pytest.mark.parametrize("theirs, refused", [
    ({"optimizer": {"type": "Lion", "params": {"lr": 1e-4}}}, "optimizer.type 'Lion'"),
    ({"optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "amsgrad": True}}}, "amsgrad"),
    ({"optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "optim_bits": 8}}}, "optimizer.params.optim_bits"),
    ({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}, "--offload-optimizer cpu"),
    ({"data_types": {"grad_accum_dtype": "fp32"}}, "data_types"),
    ({"some_new_key": 1}, "zlayout does not know whether this key changes memory"),
    ({"scheduler": None}, "scheduler is null"),
])
def test_a_key_that_changes_memory_is_refused_with_its_reason(tmp_path, capsys, theirs, refused):
    path = tmp_path / "theirs.json"
    path.write_text(json.dumps(theirs))
    code, _, err = run(capsys, *TINY, "--out", str(tmp_path / "p"), "--ds-config", str(path))
    assert code == 2 and refused in err and err.count("\n") == 1
    assert not (tmp_path / "p").exists()


def _edit_config(directory: Path, edit) -> None:
    path = directory / "ds_config.json"
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config, indent=2))


def test_a_hand_edited_learning_rate_is_accepted_and_recorded(exported, capsys, tmp_path):
    def lr(config):
        config["optimizer"]["params"]["lr"] = 1e-3
        config["scheduler"]["params"]["warmup_num_steps"] = 500
    _edit_config(exported, lr)
    for argv in (["show", str(exported)], ["diff", str(exported), str(exported)]):
        code, out, err = run(capsys, *argv)
        assert code == 0, err
        assert "edited by hand, no effect on memory (accepted): optimizer.params.lr 0.0003 -> 0.001" in out
    code, out, _ = run(capsys, "check", str(exported), "--json")
    assert "optimizer.params.lr" in json.loads(out)["hand_edits"]
    # verify reads it (a preflight that fails: the run never starts, the profile is still rewritten)
    done = subprocess.run([sys.executable, "-m", "zlayout", "verify", str(exported), "--cpu", "--processes", "1",
                           "--python", "/bin/false", "--update-profile", "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "never started" in done.stderr, done.stderr
    profile = load_profile(exported)
    assert profile.ds_config_team["optimizer"]["params"]["lr"] == 1e-3
    assert any("optimizer.params.lr 0.0003 -> 0.001" in e.why for e in profile.changelog)
    assert json.loads((exported / "ds_config.json").read_text())["optimizer"]["params"]["lr"] == 1e-3
    assert "(accepted)" not in run(capsys, "show", str(exported))[1]  # recorded: no longer an edit


def test_export_force_keeps_the_hand_edits(exported, capsys):
    _edit_config(exported, lambda c: c["optimizer"]["params"].update(lr=2e-4))
    code, out, _ = run(capsys, *TINY[:-1], "3", "--out", str(exported), "--force")
    assert code == 0 and "kept your hand edits: optimizer.params.lr 0.0003 -> 0.0002" in out
    assert json.loads((exported / "ds_config.json").read_text())["optimizer"]["params"]["lr"] == 2e-4
    assert "keeping ds_config.json's hand edits" in load_profile(exported).changelog[-1].why


@pytest.mark.parametrize("edit, refused", [
    (lambda c: c["optimizer"].update(type="Lion"), "optimizer.type 'Lion'"),
    (lambda c: c["zero_optimization"].update(stage=3), "zero_optimization.stage"),
    (lambda c: c.update(train_micro_batch_size_per_gpu=4), "train_micro_batch_size_per_gpu"),
])
def test_a_hand_edit_that_changes_memory_is_still_refused(exported, capsys, edit, refused):
    _edit_config(exported, edit)
    code, _, err = run(capsys, "show", str(exported))
    assert code == 2 and refused in err and err.count("\n") == 1
