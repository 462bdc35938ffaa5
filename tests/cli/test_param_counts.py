"""Parameter counts print with a unit that fits them, from one formatter (catalog.format_params)
used by plan, breakeven, show, the profile's summary, the runbook, preflight and the app.

A 653K-parameter model printed as "0.00B params" (plan, show), "652,800" (breakeven) and
"653K" (the app): three formatters, and two of them wrong for small models.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from zlayout.catalog import format_params, parse_size

TINY = ["--layers", "2", "--hidden", "128", "--heads", "4", "--vocab", "1000"]  # 653K parameters


def zlayout(*argv: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "zlayout", *argv], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize(("count", "shown"), [
    (512, "512"), (1_000, "1K"), (1_500, "1.5K"), (950_000, "950K"), (653_056, "653K"),
    (999_999, "1M"), (17_700_000, "17.7M"), (350_000_000, "350M"), (999_960_000, "1B"),
    (1_200_000_000, "1.2B"), (8_030_261_248, "8.03B"), (70_553_706_496, "70.6B"),
    (176_729_321_472, "177B"), (1_500_000_000_000, "1.5T"), (20_000_000_000_000, "20T"),
])
def test_a_count_is_shown_with_the_unit_that_fits_it(count, shown):
    assert format_params(count) == shown


@pytest.mark.parametrize("count", [17_700_000, 350_000_000, 8_030_261_248, 1_500_000_000_000])
def test_what_is_shown_reads_back_as_a_size(count):
    assert abs(parse_size(format_params(count)) - count) / count < 0.01


def test_plan_shows_a_tiny_model_in_thousands():
    first = zlayout("plan", *TINY, "--stage", "1").splitlines()[0]
    assert first.startswith("custom: 653K params ("), first
    moe = zlayout("plan", *TINY, "--experts", "8", "--top-k", "2", "--stage", "1").splitlines()[0]
    assert moe.startswith("custom: 2.49M params (") and "top-2, 916K active)" in moe, moe


def test_breakeven_shows_the_same_count():
    assert zlayout("breakeven", *TINY).splitlines()[0].startswith("custom: 653K params now")


def test_show_the_summary_and_the_runbook_show_the_same_count(tmp_path):
    out = tmp_path / "tiny"
    zlayout("export", *TINY, "--gpus-per-node", "1", "--stage", "1", "--out", str(out))
    assert "  model     custom: 653K params, 2 layers" in zlayout("show", str(out))
    assert 'model = "custom: 653K parameters, 2 layers, hidden 128"' in (out / "profile.toml").read_text()
    runbook = (out / "RUNBOOK.md").read_text()
    assert "| Model | custom: 653K parameters, 2 layers, hidden 128 |" in runbook
    assert "This model has 653K." in runbook
    assert "0.00B" not in runbook + zlayout("show", str(out))
