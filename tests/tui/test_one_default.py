"""One default per input, whichever door opens the app: plain `zlayout`, `zlayout app`,
`zlayout app --preset llama3-8b` and `zlayout plan --preset llama3-8b` plan the same input
(`zlayout` opened at seq 4096 while the others said 2048: one preset, two sets of figures)."""

from __future__ import annotations

import pytest

from zlayout import cli
from zlayout.tui.app import ZLayoutApp


def app_input(monkeypatch, argv: list[str]):
    """The input the app would open on for `zlayout ARGV` (through cli.main and run_app)."""
    built: list[ZLayoutApp] = []
    monkeypatch.setenv("TEXTUAL_DRIVER", "test")  # run_app's "a screen is there"
    monkeypatch.setattr(ZLayoutApp, "run", lambda self, *a, **k: built.append(self))
    assert cli.main(argv) == 0
    app, = built
    return app._base_input


def plan_input(argv: list[str]):
    return cli.plan_input_from_args(cli.build_parser().parse_args(["plan", *argv]))


@pytest.mark.parametrize("argv", [[], ["app"], ["app", "--preset", "llama3-8b"],
                                  ["app", "--gpu", "h200"]],
                         ids=["zlayout", "zlayout app", "app --preset", "app --gpu"])
def test_every_door_opens_on_the_plan_commands_defaults(monkeypatch, argv):
    assert app_input(monkeypatch, argv) == plan_input(["--preset", "llama3-8b"])


def test_a_flag_given_to_the_app_is_the_plan_commands_flag(monkeypatch):
    flags = ["--preset", "llama3-70b", "--gpu", "h100", "--nodes", "4", "--seq", "8192"]
    opened = app_input(monkeypatch, ["app", *flags])
    assert opened == plan_input(flags)
    assert opened.training.seq == 8192 and opened.hardware.nodes == 4
