"""Corrupted profiles: show, check and diff end in success or exit 2 with one line, never a traceback.

Hypothesis corrupts a real exported set (bytes of profile.toml, its values, deep nesting, long
dotted keys, truncation, ds_config.json, a script) and runs the real commands on it. Under CI
(tests/conftest.py) the draws are derandomized; `python benchmarks/fuzz_profiles.py` runs longer.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zlayout.cli import main

TINY = ["export", "--layers", "2", "--hidden", "128", "--heads", "4", "--vocab", "1000", "--seq", "64",
        "--gpus-per-node", "2", "--gpu", "h200", "--stage", "3", "--offload-optimizer", "cpu"]
FILES = ("profile.toml", "ds_config.json", "launch_torchrun.sh")
NASTY = [b"\x00", b"[", b"]", b"[[", b"=", b'"', b"'", b"\n", b"\r", b"\xff", b"\xe2\x80\xa8", b".", b"-", b"9" * 40,
         b"inf", b"nan", b"1e999", b"-1", b"0", b"true", b"{", b"}", b",", b"#", b"\\", b"\"\"\"", b"\t"]


KINDS = ("bytes", "truncate", "value", "nest", "dotted", "line", "huge")
# (file, kind, seed, piece, count): one to three corruptions, profile.toml most often
corruptions = st.lists(st.tuples(st.sampled_from(FILES + ("profile.toml",) * 3), st.sampled_from(KINDS),
                                 st.integers(0, 2**32 - 1), st.sampled_from(NASTY), st.integers(1, 200_000)),
                       min_size=1, max_size=3)


def corrupt(data: bytes, kind: str, seed: int, piece: bytes, count: int) -> bytes:
    import random

    rng = random.Random(seed)
    at = rng.randrange(len(data) + 1)
    if kind == "bytes":
        return data[:at] + piece + data[at + rng.randrange(0, 4):]
    if kind == "truncate":
        return data[:at]
    if kind == "value":  # a number or string value replaced by something odd
        values = [m for m in re.finditer(rb"= (.+)$", data, re.MULTILINE)]
        if not values:
            return data + piece
        m = rng.choice(values)
        return data[:m.start(1)] + rng.choice([piece, b"-" + m.group(1), m.group(1) * 3, b'"' + piece + b'"',
                                               b'"' + m.group(1) + b'"',  # a number in quotes
                                               b"1" + b"0" * rng.randrange(1, 400)]) + data[m.end(1):]
    if kind == "nest":  # deep brackets: tomllib and json recurse
        return data[:at] + b"x = " + b"[" * count + data[at:]
    if kind == "dotted":  # a key of many parts: tomllib takes seconds and gigabytes
        return b"a" + b".a" * count + b" = 1\n" + data
    if kind == "line":
        lines = data.split(b"\n")
        i = rng.randrange(len(lines))
        return b"\n".join(lines[:i] + [lines[i]] * rng.randrange(0, 3) + lines[i + 1:])
    return data + piece * min(count, 50_000)  # "huge"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fuzz") / "p"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main([*TINY, "--out", str(out)]) == 0
    return out


def run_quietly(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@settings(max_examples=int(os.environ.get("ZLAYOUT_FUZZ_EXAMPLES", "120")), deadline=None, suppress_health_check=list(HealthCheck))
@given(changes=corruptions)
def test_corrupted_profiles_end_in_success_or_one_line(pristine, tmp_path_factory, changes):
    work = tmp_path_factory.mktemp("case") / "p"
    shutil.copytree(pristine, work)
    for name, kind, seed, piece, count in changes:
        path = work / name
        path.write_bytes(corrupt(path.read_bytes(), kind, seed, piece, count))
    for argv, allowed in ((["show", str(work)], {0, 2}), (["show", "--json", str(work)], {0, 2}),
                          (["check", str(work)], {0, 1, 2}), (["diff", str(pristine), str(work)], {0, 2})):
        code, out, err = run_quietly(argv)  # an exception here fails the test: that is the point
        assert code in allowed, (argv, code, err)
        if code == 2:
            assert err.startswith("zlayout: error: ") and err.count("\n") == 1, (argv, err[:300])
            assert out == ""
