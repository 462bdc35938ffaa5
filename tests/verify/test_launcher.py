"""The launcher's pure parts: rank prefixes, event parsing, the run spec, the world it runs,
the environment the ranks get, and the requests it refuses."""

from __future__ import annotations

import os

import pytest

from zlayout.spec import Layout
from zlayout.verify.launcher import (LaunchError, VerifyOptions, input_for_run, normalise_line,
                                     parse_event, run_spec, worker_env)
from zlayout.verify.runner import run_verification

from .conftest import tiny_input


def test_torchrun_prefixes_become_rank_prefixes():
    assert normalise_line('[default3]:{"event": "step"}') == '[rank 3] {"event": "step"}'
    assert normalise_line("plain text") == "plain text"


def test_events_are_json_lines_with_an_event_key():
    assert parse_event('[rank 1] {"event": "oom", "rank": 1}') == {"event": "oom", "rank": 1}
    assert parse_event('{"event": "done", "rank": 0}')["event"] == "done"
    assert parse_event('[rank 0] {"not": "an event"}') is None
    assert parse_event("[rank 0] {broken") is None


def test_the_prediction_is_for_the_world_that_runs():
    inp = tiny_input(gpus=8)
    assert input_for_run(inp, 8) is inp
    two = input_for_run(inp, 2)
    assert two.hardware.world == 2 and two.model == inp.model


def test_run_spec_saves_half_way_for_the_drill(tmp_path):
    options = VerifyOptions(steps=5, restart_drill=True)
    spec = run_spec(tiny_input(gpus=2), Layout(stage=3), options, tmp_path)
    assert spec["save_at_step"] == 2 and spec["resume_steps"] == 3
    assert spec["ds_config"]["train_batch_size"] == 4
    assert spec["device"] == "cuda" and spec["checkpoint_dir"] == str(tmp_path.resolve())
    assert run_spec(tiny_input(), Layout(stage=0), VerifyOptions(), tmp_path)["save_at_step"] is None


def test_ranks_share_the_cores_unless_told(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    env = worker_env(VerifyOptions(), processes=2)
    assert env["OMP_NUM_THREADS"] == str(max(1, (os.cpu_count() or 1) // 2))
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert worker_env(VerifyOptions(), processes=2)["OMP_NUM_THREADS"] == "3"
    cpu = worker_env(VerifyOptions(cpu=True))
    assert cpu["DS_ACCELERATOR"] == "cpu" and cpu["CUDA_VISIBLE_DEVICES"] == ""


def test_a_drill_needs_steps_after_the_checkpoint(tmp_path):
    with pytest.raises(LaunchError, match="--steps 3"):
        run_verification(tiny_input(), Layout(stage=1),
                         VerifyOptions(cpu=True, steps=2, save_at_step=2, restart_drill=True,
                                       out_dir=tmp_path))


def test_a_blocking_preflight_stops_before_any_rank(tmp_path):
    lines: list[str] = []
    result = run_verification(tiny_input(), Layout(stage=3, offload_optimizer="nvme", offload_param="nvme"),
                              VerifyOptions(cpu=True, out_dir=tmp_path,
                                            nvme_path=str(tmp_path / "no-nvme")),
                              on_line=lines.append)
    assert result["status"] == "failed"
    assert result["cause"].startswith("preflight: nvme path")
    assert any(line.startswith("preflight FAIL nvme path") for line in lines)
    assert not any(line.startswith("zlayout: running") for line in lines)


def test_a_zlayout_folder_in_the_current_directory_does_not_stand_in_for_the_worker(tmp_path,
                                                                                      monkeypatch):
    """torchrun starts each rank as `python -u -m zlayout.verify.worker` (no -P of its own):
    the launcher runs with -P and the ranks' environment carries PYTHONSAFEPATH=1, so a
    `zlayout/` package where the user stands is not imported. A real torchrun of one rank."""
    import subprocess
    import sys

    from zlayout.verify.launcher import WORKER_MODULE, launch_command

    marker = "SHADOW-WORKER-RAN"
    for name in ("zlayout/__init__.py", "zlayout/verify/__init__.py", "zlayout/verify/worker.py",
                 "zlayout/verify/probe.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(f"print({marker!r})\n")
    monkeypatch.chdir(tmp_path)
    options = VerifyOptions(cpu=True, processes=1, python=sys.executable)
    env = worker_env(options, 1)
    assert env["PYTHONSAFEPATH"] == "1"
    command = launch_command(options, 1, tmp_path / "spec.json", tmp_path / "out.json",
                             tmp_path / "logs", resume=False)
    command = command[:command.index(WORKER_MODULE) + 1] + ["--help"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)
    assert marker not in done.stdout + done.stderr
    assert done.returncode == 0 and "zlayout.verify.worker" in done.stdout + done.stderr
    probe = subprocess.run([sys.executable, "-P", "-m", "zlayout.verify.probe", "--help"], env=env,
                           capture_output=True, text=True, timeout=120)
    assert marker not in probe.stdout + probe.stderr and probe.returncode == 0
