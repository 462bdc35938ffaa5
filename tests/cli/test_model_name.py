"""The plan's header names the model it planned: a model given another depth with --layers alone
is still that model ("Qwen3-8B at 6 layers", once "custom"); any other change to its shape makes
a model of its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

QWEN3_8B = str(Path(__file__).resolve().parent.parent / "hf" / "configs" / "published" / "Qwen3-8B.json")


def header(*argv: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "zlayout", "plan", "--stage", "3", "--gpu", "h200", *argv],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()[0]


def test_another_depth_keeps_the_models_name():
    assert header("--hf-config", QWEN3_8B, "--layers", "6").startswith("Qwen3-8B at 6 layers: ")
    assert header("--preset", "llama3-8b", "--layers", "6").startswith("llama3-8b at 6 layers: ")


def test_its_own_depth_or_another_shape_is_named_as_before():
    assert header("--hf-config", QWEN3_8B, "--layers", "36").startswith("Qwen3-8B: ")
    assert header("--preset", "llama3-8b", "--layers", "6", "--hidden", "2048", "--heads", "16").startswith("custom: ")
