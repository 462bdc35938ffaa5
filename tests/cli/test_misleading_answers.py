"""Answers that misled: a layout flag on a command that compares every layout (breakeven, the
app) says what the command does instead, never a flag of another meaning found by spelling;
a negative count is out of range, not "not a whole number"."""

from __future__ import annotations

import dataclasses

import pytest

from zlayout.cli import main


@pytest.mark.parametrize(("argv", "hint"), [
    # by spelling these read 'did you mean --params?' (the model's size) and nothing at all
    (("breakeven", "--preset", "llama3-8b", "--offload-param", "cpu"),
     "--offload-param cpu (this command compares every offload choice of each stage: --stage N narrows it to one stage)"),
    (("breakeven", "--preset", "llama3-8b", "--offload-optimizer", "nvme"),
     "--offload-optimizer nvme (this command compares every offload choice of each stage"),
    (("breakeven", "--preset", "llama3-8b", "--cpu-offload"),
     "--cpu-offload (this command compares every offload choice of each stage"),
    # the app: 'did you mean --seq?' (its PROFILE argument takes the 3)
    (("app", "--preset", "llama3-8b", "--stage", "3"),
     "--stage (this command compares every layout: it takes no --stage or offload flags)"),
    (("app", "--preset", "llama3-8b", "--zero_stage", "3"),
     "--zero_stage (this command compares every layout: it takes no --stage or offload flags)"),
])
def test_a_layout_flag_where_every_layout_is_compared_says_so(capsys, argv, hint):
    assert main(list(argv)) == 2
    out, err = capsys.readouterr()
    assert out == "" and f"zlayout: error: unrecognized arguments: {hint}" in err.splitlines()[0]


def test_commands_that_take_the_layout_keep_their_suggestions(capsys):
    assert main(["plan", "--preset", "llama3-8b", "--zero_stage", "3"]) == 2
    assert "(did you mean --stage?)" in capsys.readouterr().err
    assert main(["export", "--preset", "llama3-8b", "--offload-params", "cpu", "--out", "x"]) == 2
    assert "(did you mean --offload-param?)" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--seq", "--hidden", "--ffn", "--vocab", "--expert-ffn"])
def test_a_negative_count_is_out_of_range_not_a_non_number(capsys, flag):
    # '-1' read "'-1' is not a whole number" on the flags that take k and M
    assert main(["plan", "--preset", "mixtral-8x7b", flag, "-1"]) == 2
    assert f"zlayout: error: {flag}: must be from 1 to " in capsys.readouterr().err


@pytest.mark.parametrize(("missing", "shown"), [(26_665_287, "no (gpu +25 MiB)"), (1, "no (gpu +1 MiB)"),
                                                (60_000_000, "no (gpu +0.1 GiB)"),
                                                (int(82.3 * 2**30), "no (gpu +82.3 GiB)")])
def test_a_layout_short_by_a_few_mib_says_how_many(missing, shown):
    # llama3-70b on 64 H100s at ZeRO-3 missed by 26,665,287 bytes and read 'no (gpu +0.0 GiB)'
    from zlayout.cli import build_parser, plan_input_from_args
    from zlayout.commands.plan import fits_text
    from zlayout.core.plan import plan_layout
    from zlayout.spec import Layout

    args = build_parser(only="plan").parse_args(["plan", "--preset", "llama3-8b", "--stage", "3"])
    memory = plan_layout(plan_input_from_args(args), Layout(stage=3), with_breakeven=False).memory
    short = dataclasses.replace(memory, gpu_needed_bytes=memory.gpu_usable_bytes + missing)
    assert fits_text(short) == shown


@pytest.mark.parametrize(("flags", "line"), [
    # by spelling: 'did you mean nvlink5?' for an H100's nvlink4, nothing for ib
    (("--intra-link", "nvlink"), "link 'nvlink' is more than one link: nvlink3, nvlink4 or nvlink5? give its full name"),
    (("--nodes", "2", "--inter-link", "ib"), "link 'ib' is more than one link: ib-hdr or ib-ndr? give its full name"),
    (("--preset", "llama3"), "model 'llama3' is more than one model: llama3-405b, llama3-70b or llama3-8b?"),
])
def test_the_start_of_several_names_asks_which(capsys, flags, line):
    argv = ["plan", *flags] if "--preset" in flags else ["plan", "--preset", "llama3-8b", *flags]
    assert main(argv) == 2
    assert capsys.readouterr().err.splitlines()[0].startswith(f"zlayout: error: {line}")


def test_the_learn_command_a_note_prints_is_quoted_for_the_shell(tmp_path, capsys):
    folder = tmp_path / "it's \"q\""
    folder.mkdir()
    (folder / "config.json").write_text(
        '{"model_type": "llama", "hidden_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8, '
        '"intermediate_size": 1024, "vocab_size": 1000}')
    assert main(["plan", "--hf-config", str(folder), "--stage", "3"]) == 0
    note = capsys.readouterr().err
    quoted_path = "'" + str(folder).replace("'", "'\"'\"'") + "'"
    assert f"`zlayout learn --hf-config {quoted_path}`" in note


def test_nvme_bandwidth_help_gives_its_default_and_range(capsys):
    # the only hardware flag whose help gave neither (a newcomer could not tell what was assumed)
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    assert "bandwidth per node, GB/s (default 6; from 0.1 to 1,000)" in " ".join(capsys.readouterr().out.split())
