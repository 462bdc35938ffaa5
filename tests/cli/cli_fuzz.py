"""Random command lines for plan, breakeven and export (shared by tests/cli/test_fuzz.py and
the longer run in benchmarks/fuzz_cli.py), and the rule every run must keep."""

from __future__ import annotations

import io
import json
import math
from contextlib import redirect_stderr, redirect_stdout

from hypothesis import strategies as st

from zlayout.cli import main

HOSTILE = ["", "-1", "0", "two", "inf", "-inf", "nan", "1e-320", "1e308", "10000000000",
           "1" * 60, "a\nb", "x\u2028y", "$(touch PWNED)", "`id`", "'\"", "{a}", "..", "/",
           "\x00", "é", "-", "--", "0x10", "1_000", "3.5"]
INT_FLAGS = {
    "--layers": [1, 2, 8, 1000, 1001], "--hidden": [64, 128, 4096, 262_144, 1_000_000_007],
    "--heads": [1, 3, 4, 32], "--kv-heads": [1, 2, 3, 8], "--ffn": [1, 256, 14336],
    "--vocab": [1, 1000, 32000, 10_000_001], "--seq": [0, 1, 64, 2048, 1_048_577],
    "--micro-batch": [0, 1, 2, 4096, 10**10], "--grad-accum": [1, 4, 65_537],
    "--gpus-per-node": [0, 1, 2, 8, 129], "--nodes": [1, 2, 65_536, 10**15],
}
FLOAT_FLAGS = {
    "--host-ram-gib": [0.5, 16, 2048], "--nvme-gib": [0, 100, 1e9], "--nvme-gbps": [0.05, 6, 1000],
    "--headroom": [0, 0.05, 0.9, 1, 5, "5%", "95%", "%"], "--reduce-bucket-size": [0, 0.5, 1, 5e8, 1e13, 1e40],
    "--prefetch-bucket-size": [0, 5e7], "--max-live-parameters": [0, 1e9],
    "--persistence-threshold": [0, 1e5], "--allgather-bucket-size": [1, 5e8],
}
CHOICE_FLAGS = {
    "--stage": ["0", "1", "2", "3", "4"], "--offload-optimizer": ["none", "CPU", "nvme", "cpuu"],
    "--offload-param": ["none", "cpu", "NVMe", "disk"], "--checkpointing": ["none", "FULL", "ful"],
    "--precision": ["bf16", "fp16", "FP32", "int8"], "--mlp": ["gelu", "SwiGLU", "relu"],
    "--norm": ["layernorm", "rmsnorm", "batchnorm"],
    "--gpu": ["h200", "H100", "a100", "h300", "mi300x"], "--intra-link": ["nvlink4", "pcie5", "nvlnk"],
    "--inter-link": ["ib-ndr", "roce-200g", "ib-nrd"],
    "--preset": ["llama3-8b", "lama3-70b", "reference-gpt", "qwen2.5-7b"],
    "--params": ["7B", "7b", "7", "350M", "1.5T", "13e9", "30T", "5M", "lots"],
    "--family": ["llama3", "qwen2.5", "lama"],
}
SWITCHES = ["--no-bias", "--tie-embeddings", "--no-overlap-comm", "--json"]
ARCH = ["--layers", "2", "--hidden", "128", "--heads", "4", "--vocab", "1000"]


def _value(pool: list) -> st.SearchStrategy[str]:
    # mostly values from the flag's own pool (in range, at the edges, just outside), so runs
    # get past the first flag; sometimes hostile text
    return st.integers(0, 9).flatmap(
        lambda roll: st.sampled_from([str(v) for v in pool]) if roll < 7
        else st.sampled_from(HOSTILE) if roll < 9 else st.text(max_size=12))


@st.composite
def command_lines(draw, commands=("plan", "breakeven", "export")) -> list[str]:
    command = draw(st.sampled_from(commands))
    argv = [command]
    if draw(st.integers(0, 3)):
        argv += ARCH  # a valid model most of the time, so runs get past the model to the rest
    if command != "breakeven" and draw(st.booleans()):
        argv += ["--stage", draw(st.sampled_from(["0", "1", "2", "3"]))]
    pools = {**INT_FLAGS, **FLOAT_FLAGS, **CHOICE_FLAGS}
    for flag in draw(st.lists(st.sampled_from(sorted(pools) + SWITCHES), max_size=6)):
        argv.append(flag)
        if flag not in SWITCHES:
            argv.append(draw(_value(pools[flag])))
    if draw(st.integers(0, 9)) == 0:
        argv.append(draw(st.sampled_from(HOSTILE + ["--nodez", "--stage=3", "-x"])))
    return argv


def _no_constant(name: str):
    raise AssertionError(f"JSON output holds {name}")


def run_and_check(argv: list[str]) -> tuple[int, str]:
    """Run one command line in-process; assert exit 0 (with valid JSON for --json) or exit 2
    with `zlayout: error: ...` and at most a hint line. Returns (exit code, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(argv)
    lines = err.getvalue().splitlines()
    if code == 2:
        assert out.getvalue() == "", argv
        assert 1 <= len(lines) <= 2 and lines[0].startswith("zlayout: error: "), (argv, lines)
        assert len(lines) == 1 or lines[1].startswith("zlayout: hint: "), (argv, lines)
    else:
        assert code == 0, (argv, code, lines)
        assert all(line.startswith(("zlayout: note: ", "zlayout: warning: ")) for line in lines), lines
        if "--json" in argv and argv[0] in ("plan", "breakeven"):
            data = json.loads(out.getvalue(), parse_constant=_no_constant)
            assert isinstance(data, dict) and math.isfinite(float(data["params"]))
    return code, err.getvalue()
