"""A model with learned absolute positions (GPT-2: 1,024 rows, n_positions) cannot run a longer
sequence: the position lookup indexes past its table, which a GPU run stops on. The plan took
--seq 4096 for GPT-2 and planned it; now it is refused in one line, and where --seq is not given
it defaults to the model's positions, said in a note."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from zlayout import hfconfig
from zlayout.spec import PlanInput

PUBLISHED = Path(__file__).resolve().parent.parent / "hf" / "configs" / "published"


def plan(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zlayout", "plan", "--stage", "1", "--gpu", "h200", *argv],
                          capture_output=True, text=True, timeout=120)


def test_a_sequence_past_gpt2s_positions_is_one_line():
    proc = plan("--hf-config", str(PUBLISHED / "gpt2.json"), "--seq", "4096")
    assert proc.returncode == 2 and not proc.stdout
    assert proc.stderr.strip().splitlines() == [
        "zlayout: error: gpt2 has 1,024 learned positions (n_positions): a sequence of 4,096 tokens runs "
        "past them; use --seq 1024 or less"]


def test_without_seq_gpt2_is_planned_at_its_positions_and_says_so():
    proc = plan("--hf-config", str(PUBLISHED / "gpt2.json"))
    assert proc.returncode == 0, proc.stderr
    assert ", seq 1024, " in proc.stdout.splitlines()[1]
    assert "--seq defaults to 1024, gpt2's learned positions" in proc.stderr


def test_a_rotary_model_keeps_the_default_and_any_length():
    proc = plan("--hf-config", str(PUBLISHED / "Qwen3-8B.json"))
    assert ", seq 2048, " in proc.stdout.splitlines()[1] and "--seq defaults" not in proc.stderr
    assert plan("--hf-config", str(PUBLISHED / "Qwen3-8B.json"), "--seq", "65536").returncode == 0


def test_a_profile_or_json_input_past_the_positions_is_refused():
    from zlayout.cli import build_parser, plan_input_from_args

    inp = plan_input_from_args(build_parser().parse_args(
        ["plan", "--hf-config", str(PUBLISHED / "gpt2.json"), "--seq", "1024", "--gpu", "h200"]))
    data = inp.model_dump(mode="json")
    data["training"]["seq"] = 1025
    with pytest.raises(ValidationError, match="1,024 learned positions"):
        PlanInput.model_validate(data)
    assert hfconfig.load(str(PUBLISHED / "gpt2.json")).position_embeddings == 1024
