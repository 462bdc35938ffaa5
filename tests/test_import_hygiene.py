"""The planner starts without torch or deepspeed: each planning module is imported in a fresh
interpreter and must leave both out of sys.modules (the verification worker is the only place
that may import them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

PLANNER_MODULES = [
    "zlayout.spec", "zlayout.catalog", "zlayout.core.memory", "zlayout.core.plan",
    "zlayout.core.breakeven", "zlayout.core.steptime", "zlayout.core.comm", "zlayout.core.recommend", "zlayout.core.layoutplan",
    "zlayout.profile.ds_config", "zlayout.cli", "zlayout.commands.plan", "zlayout.tui.app",
    "zlayout.hfconfig", "zlayout.cards", "zlayout.core.card",
    "zlayout.core.calibrate", "zlayout.profile.calibration", "zlayout.commands.calibrate",
]
CORE_MODULES = [m for m in PLANNER_MODULES if m.startswith(("zlayout.spec", "zlayout.core"))]


def modules_after_import(module: str, code: str = "") -> set[str]:
    probe = f"import sys, {module}\n{code}\nprint('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    return set(out.stdout.split())


@pytest.mark.parametrize("module", PLANNER_MODULES)
def test_planner_modules_do_not_import_torch_or_deepspeed(module):
    loaded = modules_after_import(module)
    assert "torch" not in loaded and "deepspeed" not in loaded and "transformers" not in loaded


@pytest.mark.parametrize("module", CORE_MODULES)
def test_the_core_does_not_import_textual(module):
    assert "textual" not in modules_after_import(module)


def test_a_whole_plan_run_stays_free_of_torch_and_deepspeed():
    code = ("from zlayout.cli import main\n"
            "import contextlib, io\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    main(['plan', '--preset', 'llama3-8b', '--gpus-per-node', '8', '--json'])\n")
    loaded = modules_after_import("zlayout", code)
    assert "torch" not in loaded and "deepspeed" not in loaded


def test_a_plan_imports_neither_the_profile_writer_nor_the_app():
    """`zlayout plan` registers its own flags only: the profile package (runbook, schema,
    launch scripts) and the Textual app are for the commands that use them."""
    code = ("import os\nos.environ.pop('PYDANTIC_DISABLE_PLUGINS', None)\n"
            "from zlayout.cli import main\n"
            "import contextlib, io\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    assert main(['plan', '--preset', 'llama3-8b', '--gpus-per-node', '8']) == 0\n")
    loaded = modules_after_import("zlayout", code)
    assert "zlayout.core.plan" in loaded  # it did plan
    assert not {m for m in loaded if m.startswith(("zlayout.profile", "zlayout.tui", "zlayout.verify",
                                                   "textual", "tomli_w"))}
    # nor pydantic's plugin discovery (zlayout/_pydantic_plugins.py): importlib.metadata and
    # a read of every installed package's metadata
    assert "importlib.metadata" not in loaded


def test_a_plan_loads_neither_break_even_nor_the_suggestions():
    """`zlayout plan` plans without break-even, and suggestions are made for bad input only:
    their modules load where they are used (a plan's start is most of its time)."""
    code = ("from zlayout.cli import main\n"
            "import contextlib, io\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    assert main(['plan', '--preset', 'llama3-8b', '--gpus-per-node', '8', '--json']) == 0\n")
    loaded = modules_after_import("zlayout", code)
    assert "zlayout.core.plan" in loaded
    assert not {"zlayout.core.breakeven", "zlayout.suggest", "difflib"} & loaded


def test_planning_from_a_config_json_stays_free_of_transformers():
    config = Path(__file__).resolve().parent / "hf" / "configs" / "published" / "Mixtral-8x7B-v0.1.json"
    code = ("from zlayout.cli import main\n"
            "import contextlib, io\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    assert main(['plan', '--hf-config', {str(config)!r}, '--json']) == 0\n")
    loaded = modules_after_import("zlayout", code)
    assert not {"torch", "deepspeed", "transformers"} & loaded


def test_the_app_module_leaves_the_planner_for_after_the_first_frame():
    """The app's first frame needs only the form: the planner (zlayout.core) is imported by
    the first planning worker, and pygments only when a layout's detail is opened."""
    loaded = modules_after_import("zlayout.tui.app")
    assert not {m for m in loaded if m.startswith("zlayout.core")}
    assert "pygments" not in loaded and "rich.syntax" not in loaded
