"""The planning side of verification never imports torch or deepspeed (the planner, the TUI
and `zlayout verify`'s own process start without them); only the worker does."""

from __future__ import annotations

import subprocess
import sys

import pytest

PLANNING_MODULES = ["zlayout.verify.launcher", "zlayout.verify.result", "zlayout.verify.preflight",
                    "zlayout.verify.options", "zlayout.verify.environment",
                    "zlayout.verify.runner", "zlayout.verify.slurm", "zlayout.commands.verify"]


def test_launcher_and_preflight_do_not_import_each_other():
    for module, other in (("launcher", "preflight"), ("preflight", "launcher")):
        code = (f"import sys, zlayout.verify.{module}; "
                f"print('zlayout.verify.{other}' in sys.modules)")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        assert out.stdout.strip() == "False", (module, other)


@pytest.mark.parametrize("module", PLANNING_MODULES)
def test_planning_modules_do_not_import_torch(module):
    code = (f"import sys, {module}; "
            "print(sorted(m for m in ('torch', 'deepspeed') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_verify_help_does_not_import_torch():
    code = ("import sys\nfrom zlayout.cli import build_parser\n"
            "try:\n    build_parser().parse_args(['verify', '--help'])\nexcept SystemExit:\n    pass\n"
            "print('LOADED', sorted(m for m in ('torch', 'deepspeed') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "LOADED []" in out.stdout
    assert "--restart-drill" in out.stdout and "--cpu" in out.stdout
