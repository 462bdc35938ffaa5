"""`zlayout presets [gpus|models|links|profiles]` lists what is built in with its figures, the
flags' help points at it, and every flag of every subcommand says what it does."""

from __future__ import annotations

import argparse
import json
import textwrap
import tomllib
from pathlib import Path

import pytest

from zlayout import catalog
from zlayout.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_gpus_list_each_card_with_the_figures_its_file_holds(capsys):
    code, out, err = run(capsys, "presets", "gpus")
    assert code == 0 and err == ""
    rows = {line.split()[0]: line.split() for line in out.splitlines()[3:] if line and not line.startswith(("also", "a100 is"))}
    assert sorted(rows) == catalog.list_presets("gpus")
    for name, cells in rows.items():
        table = tomllib.loads((ROOT / "presets" / "gpus" / f"{name}.toml").read_text())
        assert cells[1] == f"{table['memory_bytes'] / 2**30:,.1f}"  # memory, GiB
        assert cells[2] == f"{table['peak_bf16_flops'] / 1e12:,.0f}"  # dense BF16 TFLOP/s
        assert cells[5] == table.get("default_intra_link", "pcie4")
    assert "a100 is more than one card: give a100-40gb or a100-80gb" in out
    assert "also h100: h100-sxm, h100-sxm5, h100-80gb" in out


def test_models_list_their_shape_and_size(capsys):
    code, out, _ = run(capsys, "presets", "models")
    assert code == 0
    row = next(line.split() for line in out.splitlines() if line.startswith("llama3-8b "))
    assert row[:10] == ["llama3-8b", "llama3", "8.03B", "32", "4096", "32", "8", "14336", "128256", "-"]
    mixtral = next(line for line in out.splitlines() if line.startswith("mixtral-8x7b "))
    assert "8 (top 2)" in mixtral
    assert "families for --params SIZE --family F: gpt3, llama3, mistral, qwen2.5, reference-gpt" in out


def test_links_and_profiles_carry_their_figures(capsys):
    _, links, _ = run(capsys, "presets", "links")
    assert next(line for line in links.splitlines() if line.startswith("nvlink4 ")).split()[1:4] == ["450", "0.8", "3"]
    _, profiles, _ = run(capsys, "presets", "profiles")
    row = next(line for line in profiles.splitlines() if line.startswith("llama3-8b-8xh100 "))
    summary = tomllib.loads((ROOT / "presets" / "profiles" / "llama3-8b-8xh100" / "profile.toml").read_text())["summary"]
    assert summary["layout"] in row and summary["hardware"] in row
    assert f"{summary['gpu_device_used_gib']:.1f} of {summary['gpu_capacity_gib']:.1f}" in row
    assert f"{summary['step_time_s']:.2f}" in row.split()
    verified = "no" if summary["verdict"].startswith("unverified") else "yes"
    assert row.split()[-2:] == ["yes" if summary["fits"] else "no", verified]


def test_json_holds_every_preset_of_every_kind_in_plain_units(capsys):
    code, out, _ = run(capsys, "presets", "--json")
    data = json.loads(out)
    assert code == 0 and sorted(data) == ["gpus", "links", "models", "profiles"]
    for kind in data:
        assert [row["name"] for row in data[kind]] == catalog.list_presets(kind)
    h200 = next(row for row in data["gpus"] if row["name"] == "h200")
    assert h200["memory_bytes"] == catalog.load_gpu("h200").memory_bytes
    assert next(r for r in data["models"] if r["name"] == "llama3-70b")["params"] == 70_553_706_496
    _, one, _ = run(capsys, "presets", "Link", "--json")
    assert list(json.loads(one)) == ["links"]


def test_your_own_presets_are_listed_and_a_broken_one_says_why(tmp_path, capsys):
    (tmp_path / "gpus").mkdir()
    (tmp_path / "gpus" / "lab-card.toml").write_text(textwrap.dedent("""\
        description = "a lab's card"
        memory_bytes = 25769803776
        peak_bf16_flops = 100e12
        """))
    (tmp_path / "gpus" / "broken.toml").write_text("memory_bytes = \n")
    code, out, _ = run(capsys, "presets", "gpus", "--presets-dir", str(tmp_path))
    assert code == 0
    assert next(line for line in out.splitlines() if line.startswith("lab-card ")).split()[1:3] == ["24.0", "100"]
    assert f"broken: cannot be read: {tmp_path / 'gpus' / 'broken.toml'}: invalid TOML" in out


@pytest.mark.parametrize(("typed", "message"), [
    ("gpuz", "presets: 'gpuz' is not one of gpus, models, links, profiles (did you mean gpus?)"),
    ("modl", "(did you mean models?)"),
])
def test_an_unknown_kind_is_one_line_naming_the_kinds(capsys, typed, message):
    code, out, err = run(capsys, "presets", typed)
    assert code == 2 and out == "" and message in err.splitlines()[0]


def test_plan_help_points_at_the_presets_command_that_exists(capsys):
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "zlayout show --presets" not in text
    for kind in ("models", "gpus", "links"):
        assert f"`zlayout presets {kind}`" in text
    assert run(capsys, "presets", kind)[0] == 0


def _parsers(parser: argparse.ArgumentParser, name: str = "zlayout"):
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _parsers(sub, f"{name} {sub_name}")


def test_every_flag_of_every_subcommand_has_help_text():
    missing = []
    parsers = list(_parsers(build_parser()))
    assert {name for name, _ in parsers} >= {"zlayout plan", "zlayout breakeven", "zlayout presets",
                                             "zlayout export", "zlayout verify", "zlayout app"}
    for name, parser in parsers:
        for action in parser._actions:
            if not action.option_strings:
                continue
            if not action.help or action.help == argparse.SUPPRESS or not action.help.strip():
                missing.append(f"{name} {'/'.join(action.option_strings)}")
    assert missing == []


def test_the_old_show_presets_points_at_the_presets_command(capsys):
    """`zlayout show --presets` (what plan --help used to name) said only that PROFILE is missing."""
    code, out, err = run(capsys, "show", "--presets")
    assert code == 2 and out == ""
    assert err.splitlines()[0] == ("zlayout: error: unrecognized arguments: --presets "
                                   "(did you mean `zlayout presets [gpus|models|links|profiles]`?)")


def test_a_description_cannot_write_escape_sequences_to_the_terminal(tmp_path, capsys):
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "odd.toml").write_text(
        'description = "x\\u001b[2J\\nnext line"\nbandwidth_gbps = 10.0\n')
    code, out, _ = run(capsys, "presets", "links", "--presets-dir", str(tmp_path))
    row = next(line for line in out.splitlines() if line.startswith("odd "))
    assert code == 0 and "\x1b" not in out and row.endswith("x\\x1b[2J\\nnext line")


def test_a_broken_model_file_is_listed_with_its_error_not_a_traceback(tmp_path, capsys):
    # the families line read every model file again and raised on the one that cannot be read
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "bad.toml").write_text('layers = "two"\n')
    (tmp_path / "models" / "lab-7b.toml").write_text(textwrap.dedent("""\
        family = "lab"
        layers = 2
        hidden = 64
        heads = 4
        vocab = 100
        """))
    code, out, _ = run(capsys, "presets", "models", "--presets-dir", str(tmp_path))
    assert code == 0
    assert f"bad: cannot be read: {tmp_path / 'models' / 'bad.toml'}: invalid model preset" in out
    assert "families for --params SIZE --family F: gpt3, lab, llama3, mistral, qwen2.5, reference-gpt" in out
    code, out, _ = run(capsys, "presets", "--json", "--presets-dir", str(tmp_path))
    assert code == 0 and "invalid model preset" in json.loads(out)["models"][0]["error"]


def test_presets_help_says_what_the_command_lists_in_whole_sentences(capsys):
    with pytest.raises(SystemExit):
        main(["presets", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    # the description was the docstring's first line, cut mid-phrase: "(and in your preset"
    assert "what is built in (and in your preset directories), with the figures each preset carries." in out
