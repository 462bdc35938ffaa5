"""The calibration fit: it finds a systematic factor, and it never leaves a measured row worse."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zlayout.core.calibrate import GROUPS, MeasuredStep, fit_calibration, group_parts_s, predict_step
from zlayout.spec import Layout, PlanInput, StepTimeCalibration

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "measurements" / "verify-h200-2026-11-30.jsonl"


def real_rows() -> list[MeasuredStep]:
    """The eight H200 verification results in the repository, as the calibration reads them."""
    rows = []
    for line in RESULTS.read_text().splitlines():
        result = json.loads(line)
        inp = PlanInput.model_validate(result["inputs"])
        inp = inp.model_copy(update={"hardware": inp.hardware.model_copy(update={"host_cores": 32})})
        lay = result["layout"]
        layout = Layout(stage=lay["stage"], offload_optimizer=lay["offload_optimizer"],
                        offload_param=lay["offload_param"])
        threads = 32 // inp.hardware.gpus_per_node
        rows.append(MeasuredStep(label=layout.label, inp=inp, layout=layout, cpu_threads_per_rank=threads,
                                 measured_step_s=result["measured"]["step_time_s"]))
    return rows


def with_measured(rows: list[MeasuredStep], factors: dict[str, float]) -> list[MeasuredStep]:
    """The same runs on a host whose parts are `factors` times the model's: the model's own step
    under those factors (overlaps and all: a slower GPU hides more of ZeRO-3's hooks, so the step
    is not the parts' scaled sum)."""
    calibration = StepTimeCalibration(**{f"{g}_factor": f for g, f in factors.items()})
    return [MeasuredStep(r.label, r.inp, r.layout, predict_step(r, calibration).step_time_s, r.cpu_threads_per_rank)
            for r in rows]


def test_a_slower_host_cpu_is_found():
    rows = with_measured(real_rows(), {"cpu_optimizer": 1.6, "gpu": 1.05})
    fit = fit_calibration(rows, source="test")
    assert fit.calibration.cpu_optimizer_factor == pytest.approx(1.6, rel=0.03)
    assert fit.calibration.gpu_factor == pytest.approx(1.05, rel=0.03)
    assert fit.after[1] < 0.02 < fit.before[1]
    assert fit.calibration.source == "test"


def test_measurements_the_model_already_matches_change_nothing():
    fit = fit_calibration(with_measured(real_rows(), {}))
    assert all(getattr(fit.calibration, f"{g}_factor") == pytest.approx(1.0) for g in GROUPS)


def test_a_group_no_row_spends_time_in_is_not_fitted():
    gpu_resident = [r for r in real_rows() if r.layout.offload_optimizer == "gpu"]
    fit = fit_calibration(with_measured(gpu_resident, {"gpu": 1.2}))
    assert "cpu_optimizer" not in fit.fitted_groups
    assert fit.calibration.cpu_optimizer_factor == 1.0
    assert fit.calibration.gpu_factor == pytest.approx(1.2, rel=0.05)


@settings(max_examples=40, deadline=None)
@given(noise=st.lists(st.floats(0.4, 2.5), min_size=8, max_size=8),
       subset=st.lists(st.booleans(), min_size=8, max_size=8).filter(any))
def test_no_row_is_ever_left_worse(noise, subset):
    base = [r for r, keep in zip(real_rows(), subset) if keep]
    rows = [MeasuredStep(r.label, r.inp, r.layout, r.measured_step_s * k, r.cpu_threads_per_rank)
            for r, k in zip(base, noise)]
    fit = fit_calibration(rows)
    for row in fit.rows:
        assert abs(row.error_after) <= abs(row.error_before) + 1e-9, row.row.label
        # and the recorded 'after' is what the planner computes with the fitted calibration
        assert row.after_s == pytest.approx(predict_step(row.row, fit.calibration).step_time_s)


def test_no_rows_is_an_error():
    with pytest.raises(ValueError, match="no measured step times"):
        fit_calibration([])


def test_a_group_moves_the_step_by_what_it_does_not_hide():
    """A pass is a smooth maximum of its kernels and its host side (homogeneous: the groups'
    sensitivities add up to the step), so the GPU factor moves a row by less than its kernels'
    seconds, the more so where the host side is long; groups outside the passes move it by theirs.
    A ZeRO-3 pass bound by its hooks hides most of its kernels."""
    from zlayout.core.calibrate import group_sensitivities

    rows = {r.label: r for r in real_rows()}
    stage0 = rows["ZeRO-0"]
    est = predict_step(stage0)
    sens, parts = group_sensitivities(stage0, est), group_parts_s(est)
    assert parts["gpu"] / stage0.measured_step_s * 0.9 < sens["gpu"] < parts["gpu"] / stage0.measured_step_s
    assert sens["transfer"] == pytest.approx(parts["transfer"] / stage0.measured_step_s, rel=1e-6, abs=1e-9)
    assert sum(sens.values()) == pytest.approx(est.step_time_s / stage0.measured_step_s, rel=1e-3)
    # the same ZeRO-3 run on a short sequence: its hooks outlast its kernels
    z3 = rows["ZeRO-3"]
    short = z3.inp.model_copy(update={"training": z3.inp.training.model_copy(update={"seq": 256, "micro_batch": 1})})
    row = MeasuredStep(z3.label, short, z3.layout, 0.1, z3.cpu_threads_per_rank)
    est = predict_step(row)
    assert est.host_overhead_s > 0
    sens, parts = group_sensitivities(row, est), group_parts_s(est)
    assert sens["gpu"] < parts["gpu"] / row.measured_step_s - 0.01
    assert sum(sens.values()) == pytest.approx(est.step_time_s / row.measured_step_s, rel=1e-3)


def test_runs_of_one_layout_are_fitted_as_their_median():
    """Three runs of one layout stand as one row at their median run; other layouts stay as they are."""
    from dataclasses import replace

    from zlayout.core.calibrate import merge_repeats

    rows = real_rows()
    first = rows[0]
    repeats = [replace(first, measured_step_s=first.measured_step_s * f) for f in (1.5, 1.0, 0.9)]
    merged = merge_repeats([*repeats, *rows[1:]])
    assert len(merged) == len(rows)
    median = next(r for r in merged if r.runs == 3)
    assert median.measured_step_s == first.measured_step_s and "median of 3 runs" in median.label
    assert [r for r in merged if r.runs == 1] == rows[1:]
    # other threads are another layout's runs, not repeats
    assert len(merge_repeats([first, replace(first, cpu_threads_per_rank=1)])) == 2
