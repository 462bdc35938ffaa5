"""`zlayout calibrate` reads every line on its own: a bad line is reported by number and the rest
used; times that are not seconds of a real step (booleans, nan, microseconds) are bad lines; a fit
that stays absurd is refused; `--calibration` files get the profiles' size, depth and key limits."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from zlayout.cli import main

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "measurements" / "verify-h200-2026-11-30.jsonl"
PLAN = ["plan", "--layers", "2", "--hidden", "128", "--heads", "4", "--vocab", "1000", "--seq", "64",
        "--stage", "2", "--json"]


def _results(tmp_path: Path, edit=None, extra_lines: tuple[str, ...] = ()) -> Path:
    lines = [json.loads(line) for line in RESULTS.read_text().splitlines() if line.strip()]
    if edit is not None:
        for result in lines:
            edit(result)
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines) + "".join(f"{x}\n" for x in extra_lines))
    return path


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_garbage_line_is_reported_by_number_and_the_rest_used(tmp_path, capsys):
    good = len([line for line in RESULTS.read_text().splitlines() if line.strip()])
    results = _results(tmp_path, extra_lines=("{not json", '{"status": "validated", "mode": "gpu"}'))
    code, out, err = run(capsys, "calibrate", str(results), "--out", str(tmp_path / "c.toml"))
    assert code == 0, err
    assert f"skipped results.jsonl:{good + 1}: not JSON" in out
    assert f"skipped results.jsonl:{good + 2}: not a zlayout verify result" in out
    assert f"{good} rows" in out


@pytest.mark.parametrize("bad, shown", [(True, "true"), ("0.5", '"0.5"'), (float("nan"), "nan"), (-0.2, "-0.2"),
                                        (1e9, "1000000000.0")])
def test_a_step_time_that_is_not_seconds_is_a_bad_line(tmp_path, capsys, bad, shown):
    def edit(result):
        if result["status"] == "validated":
            result["measured"]["step_times_s"] = [0.5, bad, 0.5]
    results = _results(tmp_path, edit)
    code, out, err = run(capsys, "calibrate", str(results), "--out", str(tmp_path / "c.toml"))
    assert code == 2 and not (tmp_path / "c.toml").exists()
    assert err.count("\n") == 1 and "no complete GPU verification" in err
    assert f"measured.step_times_s holds {shown}, not a time in seconds" in err


def test_times_in_microseconds_are_refused_not_fitted_to_a_5x_faster_clamp(tmp_path, capsys):
    # every figure scaled by 1e-6: implausible lines; and a fit of rows still far off is refused
    def micro(result):
        m = result["measured"]
        for key in ("step_time_s",):
            if isinstance(m.get(key), (int, float)):
                m[key] *= 1e-6
        for key in ("step_times_s", "forward_times_s", "backward_times_s", "optimizer_times_s"):
            if isinstance(m.get(key), list):
                m[key] = [x * 1e-6 for x in m[key]]
    code, _, err = run(capsys, "calibrate", str(_results(tmp_path, micro)), "--out", str(tmp_path / "c.toml"))
    assert code == 2 and "not a time in seconds" in err and not (tmp_path / "c.toml").exists()


def test_a_fit_that_stays_absurd_is_refused(tmp_path, capsys):
    # 20x slower steps than the model: within the plausible range, but no factor within its
    # limits brings the rows near: a calibration from them would be wrong for every plan
    def slower(result):
        m = result["measured"]
        if isinstance(m.get("step_times_s"), list):
            m["step_times_s"] = [min(3000.0, x * 20) for x in m["step_times_s"]]
        for key in ("forward_times_s", "backward_times_s", "optimizer_times_s"):
            m.pop(key, None)
    code, _, err = run(capsys, "calibrate", str(_results(tmp_path, slower)), "--out", str(tmp_path / "c.toml"))
    assert code == 2 and err.count("\n") == 1 and "not writing" in err and "off on average after fitting" in err
    assert not (tmp_path / "c.toml").exists()


def test_calibration_files_get_the_profiles_limits(tmp_path, capsys):
    deep = tmp_path / "deep.toml"
    deep.write_text('schema = "zlayout-calibration/1"\n' + "a" + ".a" * 25_000 + " = 1\n[factors]\ngpu = 1.0\n")
    started = time.perf_counter()
    code, _, err = run(capsys, *PLAN, "--calibration", str(deep))
    assert code == 2 and "dotted key of more than 32 parts" in err and err.count("\n") == 1
    assert time.perf_counter() - started < 5  # tomllib took 8.4 s and 3.7 GB on this file
    code, _, err = run(capsys, *PLAN, "--calibration", "/dev/zero")
    assert code == 2 and "is not a file" in err
    big = tmp_path / "big.toml"
    big.write_text("# x\n" * 300_000)
    code, _, err = run(capsys, *PLAN, "--calibration", str(big))
    assert code == 2 and "bytes" in err


def test_calibrate_refuses_a_device_in_one_line(tmp_path, capsys):
    """calibrate's input is a regular file of bounded size (QA: `zlayout calibrate /dev/zero` hung)."""
    code = main(["calibrate", "/dev/zero", "--out", str(tmp_path / "c.toml")])
    err = capsys.readouterr().err
    assert code == 2 and "/dev/zero: not a file" in err
    assert not (tmp_path / "c.toml").exists()


def test_a_result_whose_model_card_is_not_here_says_so(tmp_path, capsys, monkeypatch):
    """A result planned from a learned card names the card by key; where this machine has no such card
    the line is skipped with the reason (which card, where it was looked for), not pydantic's
    "1 validation error for PlanInput"."""
    monkeypatch.setenv("ZLAYOUT_CARDS_DIR", str(tmp_path / "no-cards"))

    def edit(result):
        result["inputs"]["model"]["card"] = "0123456789abcdef"
    results = _results(tmp_path, edit)
    code, out, err = run(capsys, "calibrate", str(results), "--out", str(tmp_path / "c.toml"))
    assert code == 2 and not (tmp_path / "c.toml").exists()
    assert "results.jsonl:1: inputs unreadable (model.card: model card 0123456789abcdef is in neither" in err
    assert "validation error for" not in err
