"""The ranks' environment: TORCH_CUDA_ARCH_LIST values DeepSpeed 0.19.8 cannot parse (Hopper
images set `9.0a`) are corrected with a note, proven end to end on this CPU machine: the
environment built for the ranks, the preflight line, and DeepSpeed's own
`compute_capability_args` run (in the preflight's probe) on the corrected value."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from zlayout.spec import Layout
from zlayout.verify import preflight
from zlayout.verify.environment import deepspeed_arch_list, worker_env, worker_env_notes
from zlayout.verify.options import VerifyOptions
from zlayout.verify.runner import announce

from .conftest import tiny_input


@pytest.mark.parametrize("value, corrected", [
    ("9.0a", "9.0"), ("8.0;9.0a+PTX", "8.0;9.0+PTX"), ("8.0 9.0a", "8.0;9.0"),
    ("Hopper", "9.0+PTX"), ("9.0a;9.0", "9.0"), ("10.0f+PTX", "10.0+PTX"),
])
def test_values_deepspeed_cannot_parse_are_rewritten(value, corrected):
    fixed, changes = deepspeed_arch_list(value)
    assert fixed == corrected and changes


@pytest.mark.parametrize("value", ["9.0", "8.0;9.0+PTX", "7.5 8.0 8.6+PTX", "10.0;12.0"])
def test_values_deepspeed_parses_are_left_alone(value):
    assert deepspeed_arch_list(value) == (value, [])


def test_nothing_parseable_left_unsets_it():
    assert deepspeed_arch_list("sm_90") == (None, ["sm_90 dropped"])
    env = worker_env(VerifyOptions(), base={"TORCH_CUDA_ARCH_LIST": "sm_90", "PATH": "/usr/bin"})
    assert "TORCH_CUDA_ARCH_LIST" not in env


def test_the_allocator_setting_passes_unchanged_and_the_pythons_bin_comes_first():
    conf = "expandable_segments:True,max_split_size_mb:512"
    python = "/opt/venv/bin/python"
    env = worker_env(VerifyOptions(python=python),
                     base={"PYTORCH_CUDA_ALLOC_CONF": conf, "PATH": "/usr/bin"})
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == conf
    assert env["PATH"].split(os.pathsep) == ["/opt/venv/bin", "/usr/bin"]  # pip's ninja is there


def test_a_bad_value_given_through_extra_env_is_corrected_too():
    env = worker_env(VerifyOptions(extra_env={"TORCH_CUDA_ARCH_LIST": "9.0a"}), base={})
    assert env["TORCH_CUDA_ARCH_LIST"] == "9.0"


def test_the_note_is_stated_before_the_run(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0a")
    options = VerifyOptions(cpu=True, out_dir=tmp_path, checkpoint_dir=tmp_path / "checkpoint")
    lines: list[str] = []
    announce(tiny_input(), Layout(stage=1), options, default_out=False, on_line=lines.append)
    assert lines[-1] == ("zlayout: note: TORCH_CUDA_ARCH_LIST=9.0a is not parsed by DeepSpeed "
                         "0.19.8's op builder (9.0a -> 9.0); the ranks run with "
                         "TORCH_CUDA_ARCH_LIST=9.0")
    assert worker_env_notes(options) == [lines[-1].removeprefix("zlayout: note: ")]


@pytest.mark.parametrize("value, corrected, deepspeed_reads", [
    ("9.0a", "9.0", "9.0+PTX"),  # JIT mode adds +PTX to the highest architecture itself
    ("8.0;9.0a+PTX", "8.0;9.0+PTX", "8.0;9.0+PTX"),
])
def test_arch_list_end_to_end_through_deepspeeds_parser(monkeypatch, tmp_path, value, corrected,
                                                        deepspeed_reads):
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", value)
    options = VerifyOptions(cpu=True, out_dir=tmp_path)
    env = worker_env(options)
    assert env["TORCH_CUDA_ARCH_LIST"] == corrected

    checks = preflight.run_checks(tiny_input(), Layout(stage=1), options, 1)
    arch = next(c for c in checks if c.name == "TORCH_CUDA_ARCH_LIST")
    assert not arch.ok and not arch.blocking  # a WARN: corrected, the run goes ahead
    assert f"the ranks run with TORCH_CUDA_ARCH_LIST={corrected}" in arch.detail
    assert f"DeepSpeed reads {corrected} as {deepspeed_reads}" in arch.detail
    assert not [c for c in checks if not c.ok and c.blocking], [c.line() for c in checks]

    # The uncorrected value fails in DeepSpeed's parser exactly as it did on the H200 node.
    facts, failure = preflight.probe(sys.executable, {**env, "TORCH_CUDA_ARCH_LIST": value}, [])
    assert failure is None
    assert not facts["arch"]["ok"]
    assert "invalid literal for int() with base 10: '0a'" in facts["arch"]["error"]
    assert Path(tmp_path).exists() and list(Path(tmp_path).iterdir()) == []
