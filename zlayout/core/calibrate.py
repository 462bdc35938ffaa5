"""Fit the step-time model's four factors to a cluster's own measured steps.

The model's parts fall into four groups, each with a factor in `StepTimeCalibration`: GPU
kernels (compute, the loss, the GPU optimizer), Python overheads (per step, stage-3 hooks),
the CPU optimizer, and exposed transfers (network, PCIe, NVMe). A group is fitted only when
some measured row spends at least `MIN_GROUP_SHARE` of its time in it; the others stay 1.

The fit minimises the squared relative errors subject to one rule: no row may end up further
from its measurement than the shipped model put it. Each row's error is (nearly) linear in
the factors, so the rule is a set of linear bounds; coordinate descent inside them finds the
factors, and the real model then checks every row, shrinking the step towards the shipped
factors if the overlap terms (not exactly linear) moved a row the wrong way. A row's share of a
group is the model's own sensitivity to that group's factor, not the group's seconds: where
something overlaps (ZeRO-3's hooks run ahead of the kernels, gradient reductions hide behind the
backward) a hidden second does not move the step. Without overlap the two are the same.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from zlayout.core.comm import estimate_comm
from zlayout.core.steptime import StepTimeEstimate, estimate_step_time
from zlayout.spec import Layout, PlanInput, StepTimeCalibration

GROUPS = ("gpu", "overhead", "cpu_optimizer", "transfer")
FACTOR_MIN, FACTOR_MAX = 0.2, 5.0  # a factor outside this says the model, not the constants, is wrong
MIN_GROUP_SHARE = 0.05
_SWEEPS = 200
_SHRINK_STEPS = 30
_SENSITIVITY_STEP = 1e-3  # a factor's relative nudge to read the model's sensitivity to it


@dataclass(frozen=True, slots=True)
class MeasuredStep:
    """One measured layout: what it ran, with how many CPU threads per rank, how long a step took."""

    label: str
    inp: PlanInput
    layout: Layout
    measured_step_s: float
    cpu_threads_per_rank: int | None = None
    source: str = ""
    # the steady forward, backward and optimizer times, where the run timed them apart
    phases_s: tuple[float, float, float] | None = None
    alloc_retries: int | None = None  # the caching allocator's flush-and-retry count, where recorded
    runs: int = 1  # runs of this layout the row stands for (merge_repeats: their median)


@dataclass(frozen=True, slots=True)
class RowFit:
    row: MeasuredStep
    before_s: float
    after_s: float

    @property
    def error_before(self) -> float:
        return (self.before_s - self.row.measured_step_s) / self.row.measured_step_s

    @property
    def error_after(self) -> float:
        return (self.after_s - self.row.measured_step_s) / self.row.measured_step_s


@dataclass(frozen=True, slots=True)
class CalibrationFit:
    calibration: StepTimeCalibration
    fitted_groups: tuple[str, ...]
    rows: tuple[RowFit, ...]

    @staticmethod
    def _stats(errors: list[float]) -> tuple[float, float]:
        magnitudes = [abs(e) for e in errors]
        return (sum(magnitudes) / len(magnitudes), max(magnitudes)) if magnitudes else (0.0, 0.0)

    @property
    def before(self) -> tuple[float, float]:
        """Mean and max absolute relative error of the shipped model on the rows."""
        return self._stats([r.error_before for r in self.rows])

    @property
    def after(self) -> tuple[float, float]:
        return self._stats([r.error_after for r in self.rows])


def merge_repeats(rows: list[MeasuredStep]) -> list[MeasuredStep]:
    """Several runs of one layout (the same inputs, layout and threads) as one row at their median
    step: a host-bound step varies from process to process (Qwen3-0.6B at ZeRO-3 on one H200: 0.438,
    0.484 and 0.686 s in three processes), and the fit's rule (no row further from its measurement)
    would otherwise be held by whichever run lies furthest from the others."""
    groups: dict[tuple[str, str, int | None], list[MeasuredStep]] = {}
    for row in rows:
        key = (row.inp.model_dump_json(), row.layout.key, row.cpu_threads_per_rank)
        groups.setdefault(key, []).append(row)
    merged = []
    for runs in groups.values():
        if len(runs) == 1:
            merged.append(runs[0])
            continue
        ordered = sorted(runs, key=lambda r: r.measured_step_s)
        middle = ordered[(len(ordered) - 1) // 2]  # the lower median: a measured run, phases and all
        merged.append(replace(middle, label=f"{middle.label} (median of {len(runs)} runs)", runs=len(runs)))
    return merged


def group_parts_s(est: StepTimeEstimate) -> dict[str, float]:
    """A step estimate's seconds per factor group (they add up to the step time)."""
    return {
        "gpu": est.compute_s + est.gpu_optimizer_s,
        "overhead": est.step_overhead_s + est.host_overhead_s + est.launch_overhead_s,
        "cpu_optimizer": est.cpu_optimizer_s,
        "transfer": est.comm_s + est.pcie_s + est.nvme_s,
    }


def group_sensitivities(row: MeasuredStep, shipped: StepTimeEstimate) -> dict[str, float]:
    """Per group, how much of the row's measured step its factor moves: d step / d factor over the
    measured step, at the shipped factors (a forward difference). Equal to the group's seconds
    (group_parts_s) over the measured step where nothing overlaps; less where part of it hides
    behind another group (a pass's kernels and its host side, each partly behind the other:
    steptime.pass_s)."""
    out = {}
    for g in GROUPS:
        nudged = _calibration({h: 1.0 + (_SENSITIVITY_STEP if h == g else 0.0) for h in GROUPS}, None)
        moved_s = predict_step(row, nudged).step_time_s - shipped.step_time_s
        out[g] = moved_s / _SENSITIVITY_STEP / row.measured_step_s
    return out


def predict_step(row: MeasuredStep, calibration: StepTimeCalibration | None = None) -> StepTimeEstimate:
    inp = row.inp.model_copy(update={"calibration": calibration or StepTimeCalibration()})
    return estimate_step_time(inp, row.layout, estimate_comm(inp, row.layout),
                              cpu_threads_per_rank=row.cpu_threads_per_rank)


def _calibration(factors: dict[str, float], source: str | None) -> StepTimeCalibration:
    return StepTimeCalibration(source=source, **{f"{g}_factor": factors[g] for g in GROUPS})


def fit_calibration(rows: list[MeasuredStep], source: str | None = None) -> CalibrationFit:
    """The factors that bring `rows` closest to their measurements without leaving one worse."""
    if not rows:
        raise ValueError("no measured step times to calibrate on")
    shipped = [predict_step(r) for r in rows]
    # c[r][g]: the group's share of the measured time (what a factor moves); b[r]: the row's error bound
    c = [group_sensitivities(r, est) for r, est in zip(rows, shipped)]
    b = [abs(est.step_time_s - r.measured_step_s) / r.measured_step_s for r, est in zip(rows, shipped)]
    fitted = tuple(g for g in GROUPS if max(ci[g] for ci in c) >= MIN_GROUP_SHARE)
    factors = {g: 1.0 for g in GROUPS}

    def error(i: int, f: dict[str, float]) -> float:
        return sum(f[g] * c[i][g] for g in GROUPS) - 1.0

    for _ in range(_SWEEPS):
        moved = 0.0
        for g in fitted:
            low, high = FACTOR_MIN, FACTOR_MAX
            num = den = 0.0
            for i in range(len(rows)):
                if c[i][g] <= 0:
                    continue
                rest = error(i, factors) - factors[g] * c[i][g]
                low = max(low, (-b[i] - rest) / c[i][g])
                high = min(high, (b[i] - rest) / c[i][g])
                num -= rest * c[i][g]
                den += c[i][g] ** 2
            if den == 0 or low > high:  # float noise at a bound: stay where we are
                continue
            new = min(high, max(low, num / den))
            moved = max(moved, abs(new - factors[g]))
            factors[g] = new
        if moved < 1e-12:
            break

    # The real model, overlap and all: shrink towards the shipped factors until no row is worse.
    scale = 1.0
    for _ in range(_SHRINK_STEPS):
        trial = {g: 1.0 + scale * (factors[g] - 1.0) for g in GROUPS}
        calibration = _calibration(trial, source)
        after = [predict_step(r, calibration).step_time_s for r in rows]
        if all(abs(a - r.measured_step_s) <= abs(s.step_time_s - r.measured_step_s) * (1 + 1e-9) + 1e-12
               for a, r, s in zip(after, rows, shipped)):
            break
        scale /= 2
    else:
        calibration = _calibration({g: 1.0 for g in GROUPS}, source)
        after = [s.step_time_s for s in shipped]
    return CalibrationFit(calibration=calibration, fitted_groups=fitted,
                          rows=tuple(RowFit(r, s.step_time_s, a) for r, s, a in zip(rows, shipped, after)))
