"""Error messages quote what the user typed exactly (balanced quotes, escapes visible) and say
what is expected; a fraction given as a percentage gets "did you mean 0.05 (5%)?".

Run through the installed entry point (`python -m zlayout`), as a user runs it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from zlayout.messages import exception_text, quoted

ARCH = ["--layers", "2", "--hidden", "128", "--heads", "4", "--vocab", "1000"]


def zlayout(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zlayout", *argv], capture_output=True, text=True,
                          timeout=120)


def error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert 1 <= len(lines) <= 2 and lines[0].startswith("zlayout: error: "), lines
    return lines[0].removeprefix("zlayout: error: ")


def test_a_message_that_ends_by_quoting_a_value_keeps_its_closing_quote(tmp_path):
    """The CLI stripped quotes off both ends of every ValueError it reported (meant for
    KeyError's own quotes), so "..., got '32'" printed as "got '32"."""
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": 2, "hidden_size": "32", "num_attention_heads": 4,
        "vocab_size": 1000, "intermediate_size": 64}))
    line = error_line(zlayout("plan", "--hf-config", str(tmp_path), "--stage", "1"))
    assert line == f"{tmp_path / 'config.json'}: 'hidden_size' must be a whole number, got '32'"


def test_exception_text_unwraps_key_errors_and_keeps_every_other_quote():
    assert exception_text(ValueError("got '32'")) == "got '32'"
    assert exception_text(ValueError('"quoted" at both ends"')) == '"quoted" at both ends"'
    assert exception_text(KeyError("unknown GPU 'x'")) == "unknown GPU 'x'"
    assert exception_text(ValueError("")) == "ValueError"


@pytest.mark.parametrize(("flags", "message"), [
    (["--layers", "32x"], "--layers: '32x' is not a whole number (expected a whole number from 1 to 1,000)"),
    (["--hidden", "'32"], "--hidden: \"'32\" is not a whole number (expected a whole number from 1 to 262,144, "
                              "or with k = 1,024, e.g. 4k)"),
    (["--nodes", "1.5"], "--nodes: '1.5' is not a whole number (expected a whole number from 1 to 65,536)"),
    (["--micro-batch", "-"], "--micro-batch: '-' is not a whole number (expected a whole number from 1 to 4,096)"),
    (["--headroom", "abc"], "--headroom: 'abc' is not a number (expected a number from 0 to 0.9)"),
    (["--nvme-gib", "inf"], "--nvme-gib: 'inf' is not a finite number (expected a number from 0 GiB to 1,048,576 GiB)"),
    (["--stage", "x"], "--stage: 'x' is not one of 0, 1, 2, 3"),
    (["--stage", "1.0"], "--stage: '1.0' is not one of 0, 1, 2, 3"),
    # a count of elements typed as a float was truncated: 0.5 said "(got 0)"
    (["--reduce-bucket-size", "0.5"], "--reduce-bucket-size: '0.5' is not a whole number of elements "
                                      "(expected a whole number from 1 to 1,000,000,000,000)"),
    # ... and 1e40 came back as pydantic's "Unable to parse input string as an integer"
    (["--reduce-bucket-size", "1e40"], "--reduce-bucket-size: must be from 1 to 1,000,000,000,000 (got 1e40)"),
    (["--layers", "x" * 60], "--layers: '" + "x" * 40 + "'... (60 characters) is not a whole number"),
    (["--gpus-per-node", "0"], "--gpus-per-node: must be from 1 to 128 (got 0)"),
])
def test_a_bad_number_is_quoted_exactly_with_what_is_expected(flags, message):
    line = error_line(zlayout("plan", *ARCH, *flags))
    assert line.startswith(message), line


def test_an_element_count_still_reads_an_exponent():
    proc = zlayout("plan", *ARCH, "--stage", "3", "--reduce-bucket-size", "5e8",
                   "--prefetch-bucket-size", "50_000_000", "--json")
    assert proc.returncode == 0, proc.stderr


def test_quoted_is_balanced_and_marks_a_cut():
    assert quoted("'32") == "\"'32\""
    assert quoted("a\nb") == "'a\\nb'"
    assert quoted("y" * 41) == "'" + "y" * 40 + "'... (41 characters)"


@pytest.mark.parametrize(("value", "hint"), [
    ("5", "did you mean 0.05 (5%)?"),
    ("1", "did you mean 0.01 (1%)?"),
    ("50", "did you mean 0.5 (50%)?"),
])
def test_headroom_given_as_a_percentage_asks_for_the_fraction(value, hint):
    line = error_line(zlayout("plan", *ARCH, "--headroom", value))
    assert line == f"--headroom: must be from 0 to 0.9 (got {value}); it is a fraction: {hint}"


def test_headroom_with_a_percent_sign_is_that_fraction():
    with_sign = zlayout("plan", *ARCH, "--stage", "1", "--headroom", "5%", "--json")
    fraction = zlayout("plan", *ARCH, "--stage", "1", "--headroom", "0.05", "--json")
    assert with_sign.returncode == 0 and with_sign.stdout == fraction.stdout
    assert error_line(zlayout("plan", *ARCH, "--headroom", "x%")).startswith(
        "--headroom: 'x%' is not a percentage (expected a fraction from 0 to 0.9)")


def test_a_link_preset_efficiency_given_as_a_percentage_asks_for_the_fraction(tmp_path):
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "lab-link.toml").write_text("bandwidth_gbps = 100.0\nlatency_us = 2.0\n"
                                                       "efficiency = 80\n")
    line = error_line(zlayout("plan", *ARCH, "--intra-link", "lab-link", "--presets-dir", str(tmp_path)))
    assert "lab-link.toml" in line and "efficiency: must be from more than 0 to 1 (got 80)" in line
    assert line.endswith("did you mean 0.8 (80%)?")
