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


@pytest.mark.parametrize("door", [["app"], []], ids=["zlayout app FLAGS", "zlayout FLAGS"])
def test_a_flag_given_to_the_app_is_the_plan_commands_flag(monkeypatch, door):
    """`zlayout --preset llama3-70b ...` is the app too (it said "unknown command 'llama3-70b'")."""
    flags = ["--preset", "llama3-70b", "--gpu", "h100", "--nodes", "4", "--seq", "8192"]
    opened = app_input(monkeypatch, [*door, *flags])
    assert opened == plan_input(flags)
    assert opened.training.seq == 8192 and opened.hardware.nodes == 4


@pytest.mark.parametrize("flags", [
    ["--preset", "llama3-70b", "--gpu", "h100", "--nodes", "4", "--seq", "8192"],
    ["--preset", "mixtral-8x7b", "--impl", "hf", "--allocator", "expandable", "--loop", "trainer",
     "--host-cores", "96", "--checkpointing", "full", "--precision", "fp16", "--headroom", "0.1",
     "--reduce-bucket-size", "2e8", "--no-overlap-comm", "--nvme-gib", "3500", "--init", "meta"],
    ["--layers", "4", "--hidden", "256", "--heads", "4", "--vocab", "1000", "--no-bias", "--qkv-bias",
     "--tie-embeddings", "--kv-heads", "2", "--ffn", "700", "--inter-link", "roce-200g"],
], ids=["70b-4-nodes", "moe-every-knob", "architecture"])
def test_the_verify_flags_the_app_writes_are_the_plan_it_shows(flags):
    """The SLURM script the app writes runs `zlayout verify` with these flags, later and
    elsewhere: read back by the CLI's parser they must give the very input on screen (model
    code, allocator, loop and host cores were left out: the job verified another plan)."""
    from zlayout.spec import Layout
    from zlayout.tui.backends import verify_flags

    shown = plan_input(flags)
    layout = Layout(stage=3, offload_optimizer="cpu", offload_param="cpu")
    args = cli.build_parser().parse_args(["verify", *verify_flags(shown, layout)])
    read_back = cli.plan_input_from_args(args)
    assert read_back.model.model_copy(update={"name": shown.model.name, "family": shown.model.family}) == shown.model
    assert read_back.model_copy(update={"model": shown.model}) == shown
    assert cli.layout_from_args(args) == layout
