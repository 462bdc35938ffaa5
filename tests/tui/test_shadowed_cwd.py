"""A `zlayout/` folder in the current directory must not run in place of zlayout when the app
(verify, its SLURM script) or `zlayout serve` (each browser tab) starts zlayout again: every
such command is `python -P -m zlayout` (Python's -P keeps the current directory off sys.path;
PYTHONPATH still counts). Real subprocesses from a shadowed directory."""

from __future__ import annotations

import os
import shlex
import subprocess
import threading
import types
from pathlib import Path

import pytest

from zlayout.commands.serve import app_command
from zlayout.install import zlayout_argv
from zlayout.spec import Layout
from zlayout.tui import backends
from zlayout.tui.actions import verify_flags

from tests.verify.conftest import tiny_input

MARKER = "SHADOW-ZLAYOUT-RAN"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def shadowed_cwd(tmp_path, monkeypatch):
    """A directory holding a `zlayout` package that prints MARKER, made the current one."""
    pkg = tmp_path / "zlayout"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(f"print({MARKER!r})\n")
    (pkg / "__main__.py").write_text(f"print({MARKER!r})\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # a source checkout: zlayout from PYTHONPATH
    return tmp_path


def run_here(command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL, env=dict(os.environ))


def test_the_shadow_runs_with_a_plain_python_m(shadowed_cwd):
    """The trap is real: without -P the folder in the current directory wins."""
    done = run_here([zlayout_argv()[0], "-m", "zlayout", "verify", "--help"])
    assert MARKER in done.stdout


def test_the_apps_verify_command_runs_zlayout_not_the_shadow(shadowed_cwd, monkeypatch):
    started: list[list[str]] = []

    class Recorder:
        def __init__(self, command, **kwargs):
            started.append(command)
            raise OSError("recorded, not started")

    fake = types.SimpleNamespace(**vars(subprocess))
    fake.Popen = Recorder
    monkeypatch.setattr(backends, "subprocess", fake)
    lines = backends.cli_verifier(tiny_input(), Layout(stage=2), threading.Event())
    with pytest.raises(OSError):
        list(lines)
    command = started[0]
    assert command[:5] == [*zlayout_argv(), "verify"] and "-P" in command
    done = run_here([*command[:5], "--help"])  # the same interpreter, flags and module
    assert MARKER not in done.stdout + done.stderr
    assert done.returncode == 0 and "usage: zlayout verify" in done.stdout


def test_the_apps_slurm_command_runs_zlayout_not_the_shadow(shadowed_cwd, tmp_path):
    inp, layout = tiny_input(), Layout(stage=2)
    script = tmp_path / "v.sbatch"
    command = [*zlayout_argv(), "verify", *verify_flags(inp, layout), "--cpu", "--slurm", str(script)]
    done = run_here(command)
    assert MARKER not in done.stdout + done.stderr
    assert done.returncode == 0, done.stderr
    assert "export PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1" in script.read_text()


def test_serves_per_tab_command_runs_zlayout_not_the_shadow(shadowed_cwd):
    command = shlex.split(app_command())
    assert command == zlayout_argv()
    done = run_here([*command, "--help"])
    assert MARKER not in done.stdout + done.stderr
    assert done.returncode == 0 and "usage: zlayout" in done.stdout
