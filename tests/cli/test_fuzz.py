"""Fuzzing plan, breakeven and export: every command line ends in exit 0 or in exit 2 with a
one-line message (no traceback, no hang, no Infinity in JSON). Derandomized under CI; the
longer run is benchmarks/fuzz_cli.py."""

from __future__ import annotations

import os
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli_fuzz import command_lines, run_and_check

def fuzz(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


@fuzz(250)
@given(argv=command_lines(commands=("plan",)))
def test_plan_ends_in_success_or_one_line(argv):
    run_and_check(argv)


@fuzz(30)
@given(argv=command_lines(commands=("breakeven",)))
def test_breakeven_ends_in_success_or_one_line(argv):
    run_and_check(argv)


@fuzz(60)
@given(argv=command_lines(commands=("export",)), out=st.sampled_from(["p", "a/b", "x" * 300, ""]),
       force=st.booleans())
def test_export_ends_in_success_or_one_line(argv, out, force):
    with tempfile.TemporaryDirectory() as tmp:
        previous = os.getcwd()
        os.chdir(tmp)  # relative --out lands in the temporary directory
        try:
            run_and_check([*argv, "--out", out, *(["--force"] if force else [])])
        finally:
            os.chdir(previous)
