"""Requests a verification refuses (one line, exit 2, what to type instead), what it states
before it starts, and that a preflight writes nothing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from zlayout.spec import GiB, Layout
from zlayout.verify.options import (LaunchError, VerifyOptions, check_request, checkpoint_bytes,
                                    input_for_run, usable_cores, world_for)
from zlayout.verify.runner import announce

from .conftest import tiny_input

TINY_FLAGS = ["--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "128", "--seq", "32",
              "--micro-batch", "2", "--gpus-per-node", "1", "--stage", "1"]


def zlayout(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zlayout", *args], capture_output=True, text=True,
                          **kwargs)


@pytest.mark.parametrize("save_at, steps, wanted", [
    (-1, 5, "--save-at -1"), (0, 5, "--save-at 0"), (5, 5, "--steps 6"), (7, 5, "--steps 8"),
])
def test_a_drill_step_outside_the_run_is_refused(save_at, steps, wanted):
    options = VerifyOptions(steps=steps, restart_drill=True, save_at_step=save_at, cpu=True)
    with pytest.raises(LaunchError, match=wanted):
        check_request(tiny_input(), options)


def test_a_drill_step_inside_the_run_is_accepted():
    check_request(tiny_input(), VerifyOptions(steps=5, restart_drill=True, save_at_step=4, cpu=True))
    check_request(tiny_input(), VerifyOptions(steps=2, restart_drill=True, cpu=True))


def test_save_at_without_the_drill_is_refused():
    with pytest.raises(LaunchError, match="--restart-drill"):
        check_request(tiny_input(), VerifyOptions(steps=5, save_at_step=2, cpu=True))


def test_more_cpu_processes_than_cores_is_refused():
    cores = usable_cores()
    check_request(tiny_input(), VerifyOptions(cpu=True, processes=cores))
    with pytest.raises(LaunchError, match=f"use --processes {cores} or fewer"):
        check_request(tiny_input(), VerifyOptions(cpu=True, processes=cores + 1))


def test_more_gpu_processes_than_gpus_is_refused():
    check_request(tiny_input(gpus=8), VerifyOptions(processes=2), gpus_visible=2)
    with pytest.raises(LaunchError, match="this node has 2 GPUs; use --processes 2"):
        check_request(tiny_input(gpus=8), VerifyOptions(processes=8), gpus_visible=2)
    check_request(tiny_input(gpus=8), VerifyOptions(processes=8), gpus_visible=None)  # preflight's


@pytest.mark.parametrize("flags, wanted", [
    (["--restart-drill", "--save-at", "-1"], "--save-at -1"),
    (["--restart-drill", "--save-at", "0"], "--save-at 0"),
    (["--processes", "100000"], "--processes 100000"),
    (["--steps", "0"], "--steps must be at least 1"),
])
def test_the_command_line_refuses_in_one_line(tmp_path, flags, wanted):
    proc = zlayout("verify", *TINY_FLAGS, "--cpu", *flags, "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and wanted in lines[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


def test_the_run_states_where_its_output_and_checkpoint_go(tmp_path):
    inp = tiny_input(layers=32, hidden=4096, heads=32, vocab=128_256)
    options = VerifyOptions(restart_drill=True, out_dir=tmp_path, checkpoint_dir=tmp_path / "ckpt")
    lines: list[str] = []
    announce(inp, Layout(stage=3), options, default_out=True, on_line=lines.append)
    assert lines[0] == f"zlayout: output in {tmp_path} (the default; --out DIR puts it elsewhere)"
    size_gib = checkpoint_bytes(inp) / GiB
    assert size_gib > 50
    assert f"a checkpoint of about {size_gib:.1f} GiB to {tmp_path / 'ckpt'}" in lines[1]


def test_preflight_only_writes_nothing(tmp_path):
    cwd, cache, home = tmp_path / "cwd", tmp_path / "cache", tmp_path / "home"
    cwd.mkdir()
    home.mkdir()
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "HOME": str(home)}
    proc = zlayout("verify", *TINY_FLAGS, "--cpu", "--restart-drill", "--steps", "3",
                   "--preflight-only", cwd=cwd, env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"preflight PASS checkpoint dir: {cache}/zlayout/verify/" in proc.stdout
    assert list(cwd.iterdir()) == [] and not cache.exists() and list(home.iterdir()) == []


def test_emulation_runs_one_process_and_refuses_what_it_cannot_do():
    # --emulate: rank 0 of the plan's world as one process; a one-GPU plan has nothing to emulate,
    # more processes or a restart drill (only rank 0's checkpoint) cannot be honoured
    eight = tiny_input(gpus=8)
    check_request(eight, VerifyOptions(emulate=True), gpus_visible=1)
    assert world_for(eight, VerifyOptions(emulate=True)) == 1
    assert input_for_run(eight, 1, emulate=True) is eight  # the plan's own 8-GPU shards
    assert input_for_run(eight, 1).hardware.world == 1
    with pytest.raises(LaunchError, match="this plan has one GPU"):
        check_request(tiny_input(gpus=1), VerifyOptions(emulate=True))
    with pytest.raises(LaunchError, match="leave out --processes"):
        check_request(eight, VerifyOptions(emulate=True, processes=2))
    with pytest.raises(LaunchError, match="leave out --restart-drill"):
        check_request(eight, VerifyOptions(emulate=True, restart_drill=True, steps=4))


@pytest.mark.parametrize("flags, wanted", [
    (["--emulate", "--slurm", "verify.sbatch"], "leave out --slurm"),
    (["--emulate", "--processes", "2"], "leave out --processes"),
])
def test_the_command_line_refuses_an_emulation_it_cannot_run(tmp_path, flags, wanted):
    proc = zlayout("verify", *TINY_FLAGS, "--gpus-per-node", "4", "--cpu", *flags,
                   "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert wanted in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()
