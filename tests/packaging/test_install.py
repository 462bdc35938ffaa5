"""`pip install -e .` gives `zlayout serve`; install hints name a command that works from here."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

from zlayout.cli import main
from zlayout.install import pip_install_command, source_checkout

ROOT = Path(__file__).resolve().parents[2]


def test_textual_serve_is_a_base_dependency():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert any(dep.startswith("textual-serve") for dep in project["dependencies"])
    assert project["optional-dependencies"]["serve"] == []  # the old extra still installs


def test_hints_from_a_clone_install_the_clone_into_this_python():
    assert source_checkout() == ROOT
    assert pip_install_command("verify") == f"{sys.executable} -m pip install -e '{ROOT}[verify]'"
    assert pip_install_command() == f"{sys.executable} -m pip install -e {ROOT}"


def test_serve_without_textual_serve_prints_the_reinstall_command(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "textual_serve", None)  # import now fails
    monkeypatch.setitem(sys.modules, "textual_serve.server", None)
    assert main(["serve"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"zlayout: error: textual-serve is missing from this Python; reinstall zlayout: "
                   f"{sys.executable} -m pip install -e {ROOT}"]


def test_profiles_written_inside_a_clone_are_git_ignored():
    assert "/profiles/" in (ROOT / ".gitignore").read_text().splitlines()
