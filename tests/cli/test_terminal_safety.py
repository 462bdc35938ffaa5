"""Nothing a user typed or a file held reaches the terminal as a control character: error
lines escape them, and a model's name (from config.json's `_name_or_path`, the folder holding
it, a preset) is one line of printable text in every header."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zlayout.cli import main
from zlayout.spec import ModelSpec

ESCAPES = "\x1b[2J\x1b[31mRED\x07"
SMALL_LLAMA = {"model_type": "llama", "hidden_size": 512, "num_hidden_layers": 2,
               "num_attention_heads": 8, "intermediate_size": 1024, "vocab_size": 1000}


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def no_control_characters(text: str) -> bool:
    return all(c.isprintable() or c == "\n" for c in text)


def write_config(folder: Path, **extra: object) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({**SMALL_LLAMA, **extra}))
    return folder


@pytest.mark.parametrize("argv", [
    ("plan", "--hf-config", "{tmp}/x" + ESCAPES + "/config.json"),  # a path: no such file
    ("plan", "--preset", "llama3-8b", "--s" + ESCAPES + "eq", "4"),  # an unknown flag
    ("plan", "--preset", "llama3-8b", "--seq", "4" + ESCAPES),  # a bad number
])
def test_an_error_line_escapes_what_a_terminal_would_act_on(tmp_path, capsys, argv):
    code, out, err = run(capsys, *(a.replace("{tmp}", str(tmp_path)) for a in argv))
    assert code == 2 and out == ""
    assert no_control_characters(err), err
    assert "\\x1b[2J\\x1b[31mRED\\x07" in err.splitlines()[0]


def test_a_preset_file_named_with_escape_codes_is_named_escaped(tmp_path, capsys):
    (tmp_path / "gpus").mkdir()
    (tmp_path / "gpus" / "lab.toml").write_text('name = "lab\\u001b[2J"\nmemory_bytes = 85899345920\n'
                                                'peak_bf16_flops = 1e15\n')
    code, _, err = run(capsys, "plan", "--preset", "llama3-8b", "--gpu", "lab", "--presets-dir", str(tmp_path))
    assert code == 2 and no_control_characters(err) and "lab\\x1b[2J" in err


@pytest.mark.parametrize("command", ["plan", "breakeven"])
def test_a_folder_named_with_escape_codes_names_the_model_in_printable_text(tmp_path, capsys, command):
    # no _name_or_path: the model goes by the folder's name, which held the escape codes raw
    folder = write_config(tmp_path / ("model" + ESCAPES))
    code, out, _ = run(capsys, command, "--hf-config", str(folder), "--stage", "3")
    assert code == 0 and no_control_characters(out)
    assert out.startswith("model [2J [31mRED: 6.27M params")


def test_a_name_or_path_with_line_breaks_is_one_line_in_the_header_and_the_json(tmp_path, capsys):
    folder = write_config(tmp_path / "m", _name_or_path="org/line1\nzlayout: error: fake\r\x00")
    code, out, _ = run(capsys, "plan", "--hf-config", str(folder), "--stage", "3")
    assert code == 0 and no_control_characters(out)
    assert out.splitlines()[0].startswith("line1 zlayout: error: fake: 6.27M params")
    code, out, _ = run(capsys, "plan", "--hf-config", str(folder), "--stage", "3", "--json")
    assert json.loads(out)["model"]["name"] == "line1 zlayout: error: fake"


def test_a_model_spec_keeps_a_printable_name_as_written():
    shape = dict(layers=2, hidden=64, heads=4, vocab=100)
    assert ModelSpec(name="Llama-3 8B (ours) ★", **shape).name == "Llama-3 8B (ours) ★"
    assert ModelSpec(name="a\tb\x1b[0m", family="fam\x07", **shape).model_dump()["name"] == "a b [0m"
    assert ModelSpec(family="fam\x07ily", **shape).family == "fam ily"
