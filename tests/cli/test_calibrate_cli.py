"""`zlayout calibrate` on real verify results, and `--calibration` / `--host-cores` in plan and export."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from zlayout.cli import main
from zlayout.core.calibrate import group_parts_s, predict_step
from zlayout.profile.calibration import read_results

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "measurements" / "verify-h200-2026-11-30.jsonl"
PLAN = ["plan", "--layers", "8", "--hidden", "4096", "--heads", "32", "--vocab", "32000", "--seq", "2048",
        "--micro-batch", "2", "--gpus-per-node", "1", "--stage", "2", "--offload-optimizer", "cpu", "--json"]


def slow_cpu_results(tmp_path: Path, cpu_factor: float = 1.7) -> Path:
    """The repository's H200 verify results as a 32-core host with a slower CPU would have
    measured them: each rank records its threads, the host its cores; the step time is the
    model's with the CPU optimizer `cpu_factor` times slower."""
    lines = []
    for line in RESULTS.read_text().splitlines():
        result = json.loads(line)
        world = result["inputs"]["hardware"]["gpus_per_node"]
        result["environment"]["host_cores"] = 32
        for rank in result["ranks"]:
            rank["omp_num_threads"] = str(32 // world)
        lines.append(result)
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    rows, _ = read_results([path])
    for result, row in zip(lines, rows):
        parts = group_parts_s(predict_step(row))
        result["measured"]["step_time_s"] = sum(parts.values()) + (cpu_factor - 1) * parts["cpu_optimizer"]
        result["measured"].pop("step_times_s", None)  # else the steady steps (third on) are read from it
    # plus a CPU-mode run and a failed one, which carry no GPU step time
    cpu_run = {**lines[0], "status": "cpu-ok", "mode": "cpu"}
    failed = {**lines[1], "status": "failed", "measured": {}}
    path.write_text("".join(json.dumps(r) + "\n" for r in [*lines, cpu_run, failed]))
    return path


def test_calibrate_writes_factors_rows_and_errors(tmp_path, capsys):
    results = slow_cpu_results(tmp_path)
    out = tmp_path / "cal" / "h200.toml"
    assert main(["calibrate", str(results), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "skipped results.jsonl:9: cpu-ok" in printed and "skipped results.jsonl:10: failed" in printed
    doc = tomllib.loads(out.read_text())
    assert doc["schema"] == "zlayout-calibration/1"
    assert doc["factors"]["cpu_optimizer"] == pytest.approx(1.7, rel=0.03)
    assert len(doc["rows"]) == 8
    for row in doc["rows"]:
        assert abs(row["error_after_pct"]) <= abs(row["error_before_pct"]) + 1e-9
        assert row["host_cores"] == 32
    assert doc["error"]["max_abs_after_pct"] < 2 < doc["error"]["max_abs_before_pct"]


def test_plan_and_export_load_the_calibration(tmp_path, capsys):
    out = tmp_path / "h200.toml"
    assert main(["calibrate", str(slow_cpu_results(tmp_path)), "--out", str(out)]) == 0
    capsys.readouterr()
    assert main([*PLAN, "--host-cores", "16"]) == 0
    shipped = json.loads(capsys.readouterr().out)
    assert main([*PLAN, "--host-cores", "16", "--calibration", str(out)]) == 0
    calibrated = json.loads(capsys.readouterr().out)
    assert shipped["calibration"] is None and calibrated["calibration"].startswith("h200.toml sha256:")
    assert calibrated["host_cores"] == 16 and calibrated["time"]["cpu_threads_per_rank"] == 16
    factor = tomllib.loads(out.read_text())["factors"]["cpu_optimizer"]
    assert calibrated["time"]["cpu_optimizer_s"] == pytest.approx(factor * shipped["time"]["cpu_optimizer_s"])
    assert calibrated["step_time_s"] > shipped["step_time_s"]

    profile = tmp_path / "profile"
    export = ["export", *PLAN[1:-1], "--host-cores", "16", "--calibration", str(out), "--out", str(profile)]
    assert main(export) == 0
    inputs = tomllib.loads((profile / "profile.toml").read_text())["inputs"]
    assert inputs["calibration"]["source"] == calibrated["calibration"]
    assert inputs["calibration"]["cpu_optimizer_factor"] == pytest.approx(factor)
    assert inputs["hardware"]["host_cores"] == 16


def test_more_host_cores_make_offload_faster(capsys):
    times = []
    for cores in ("4", "16", "64"):
        assert main([*PLAN, "--host-cores", cores]) == 0
        times.append(json.loads(capsys.readouterr().out)["time"]["cpu_optimizer_s"])
    assert times[0] > times[1] > times[2]


@pytest.mark.parametrize("args, message", [
    (["calibrate", "/nonexistent/results.jsonl"], "cannot read /nonexistent/results.jsonl"),
    (["calibrate", "README.md"], "not JSON"),
    (["calibrate", "benchmarks/measurements"], "no result.json or results.jsonl"),
    (["calibrate", str(RESULTS), "--host-cores", "0"], "--host-cores must be"),
    ([*PLAN, "--calibration", "/nonexistent/cal.toml"], "cannot read --calibration"),
    ([*PLAN, "--calibration", "pyproject.toml"], "is not a calibration file"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-m", "zlayout", *args], capture_output=True, text=True,
                          timeout=60, cwd=root)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_a_calibration_with_an_absurd_factor_is_refused(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('schema = "zlayout-calibration/1"\n[factors]\ngpu = -1.0\n')
    proc = subprocess.run([sys.executable, "-m", "zlayout", *PLAN, "--calibration", str(bad)],
                          capture_output=True, text=True, timeout=60)
    # names the key as the file spells it ([factors] gpu), not the spec's gpu_factor
    assert proc.returncode == 2 and "factors.gpu: must be from 0.01 to 100 (got -1)" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_results_without_a_gpu_run_are_refused(tmp_path, capsys):
    result = json.loads(RESULTS.read_text().splitlines()[0])
    only_cpu = tmp_path / "result.json"
    only_cpu.write_text(json.dumps({**result, "status": "cpu-ok", "mode": "cpu"}))
    assert main(["calibrate", str(tmp_path), "--out", str(tmp_path / "cal.toml")]) == 2
    err = capsys.readouterr().err
    assert "no complete GPU verification" in err and "cpu-ok" in err
    assert not (tmp_path / "cal.toml").exists()


def test_an_emulated_run_is_left_out_of_a_calibration_with_the_reason(tmp_path):
    # `verify --emulate` steps move no data (a fake process group): its step time is not the run's
    first = json.loads(RESULTS.read_text().splitlines()[0])
    emulated = {**first, "emulated_world": 8}
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(first) + "\n" + json.dumps(emulated) + "\n")
    rows, skipped = read_results([path])
    assert len(rows) == 1
    assert len(skipped) == 1 and "emulated (rank 0 of 8 on one GPU)" in skipped[0]


HOST_BOUND = Path(__file__).resolve().parents[2] / "benchmarks" / "measurements" / "h200-2026-12-15"


def test_host_bound_rows_are_named_and_repeats_fitted_at_their_median(tmp_path, capsys, monkeypatch):
    # h200-2026-12-15: Qwen3-0.6B at ZeRO-3 on one H200, host-bound, in three processes: 0.686, 0.484, 0.438 s.
    # Planned with the shipped cards, as those runs were (benchmarks/measurements.py points the cards
    # folder at an older batch's when a test before this one imported it)
    monkeypatch.setenv("ZLAYOUT_CARDS_DIR", str(tmp_path / "no-cards"))
    one_run = HOST_BOUND / "results" / "batch-calibrate-c-results.jsonl"
    assert main(["calibrate", str(one_run), "--out", str(tmp_path / "a.toml")]) == 0
    printed = capsys.readouterr().out
    # Qwen3-0.6B (its host side 59% of its step); granite-3.0-1b-a400m's was 26%, at the line, until
    # its attention dropout was priced (22%)
    assert "note: 1 of the 3 rows is host-bound and one run (" in printed
    repeats = HOST_BOUND / "results-call2" / "batch-repeat-g-results.jsonl"
    assert main(["calibrate", str(one_run), str(repeats), "--out", str(tmp_path / "b.toml"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["rows"]) == 3
    qwen = next(r for r in doc["rows"] if "median of 3 runs" in r["label"])
    assert qwen["measured_step_s"] == pytest.approx(0.484, abs=0.001) and qwen["runs"] == 3
    assert main(["plan", "--params", "1B", "--calibration", str(tmp_path / "b.toml")]) == 0  # it loads
    assert any("median of 3 runs" in label for label in doc["host_bound_rows"])


def test_a_host_bound_row_is_named_by_itself_not_by_its_label(tmp_path, monkeypatch):
    """A label names a layout's shape, not its model: Llama-3.2-1B (not host-bound) given
    Qwen3-0.6B's label is still not host-bound."""
    from dataclasses import replace

    from zlayout.commands.calibrate import host_bound_rows
    from zlayout.core.calibrate import fit_calibration

    monkeypatch.setenv("ZLAYOUT_CARDS_DIR", str(tmp_path / "no-cards"))
    rows, _ = read_results([HOST_BOUND / "results" / "batch-calibrate-c-results.jsonl"])
    granite, llama, qwen = rows
    fit = fit_calibration([granite, replace(llama, label=qwen.label), qwen])
    named = [r.row for r in host_bound_rows(fit)]
    assert qwen in named and not any(r.inp == llama.inp for r in named)
