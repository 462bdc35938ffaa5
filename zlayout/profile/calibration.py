"""Step-time calibration files: read verify results, write and load the fitted factors (TOML).

A calibration file holds the four factors `zlayout calibrate` fitted (`[factors]`), the rows it
used with their error before and after, and the mean/max errors. `load_calibration` turns it
into the `StepTimeCalibration` a `PlanInput` carries; its `source` names the file and the first
12 hex digits of its SHA-256, so a profile exported with it records which one it was.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
import tomllib
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

import tomli_w
from pydantic import ValidationError

from zlayout.core.calibrate import GROUPS, CalibrationFit, MeasuredStep
from zlayout.core.steptime import steady_step_s
from zlayout.messages import type_error_text
from zlayout.spec import Layout, PlanInput, StepTimeCalibration

SCHEMA = "zlayout-calibration/1"
USABLE_STATUSES = ("validated", "mismatch")  # complete GPU runs: their step time is real


class CalibrationError(ValueError):
    """A results or calibration file zlayout cannot use; the message says what to give instead."""


def _result_dicts(path: Path) -> list[tuple[str, Any]]:
    """(where, parsed object) for a result.json, each line of a results.jsonl, or a folder's files."""
    if path.is_dir():
        found = sorted(path.glob("result.json")) + sorted(path.glob("results.jsonl"))
        found = found or sorted(path.glob("*/result.json"))
        if not found:
            raise CalibrationError(f"{path}: no result.json or results.jsonl in this folder")
        return [item for p in found for item in _result_dicts(p)]
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CalibrationError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        if path.suffix == ".jsonl":
            return [(f"{path.name}:{n}", json.loads(line))
                    for n, line in enumerate(text.splitlines(), 1) if line.strip()]
        return [(path.name, json.loads(text))]
    except (json.JSONDecodeError, RecursionError) as exc:
        raise CalibrationError(f"{path}: not JSON ({exc}); give zlayout verify's result.json "
                               "or a batch's results.jsonl") from None


def _int_or_none(value: Any) -> int | None:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number > 0 else None


def measured_step_s(measured: dict[str, Any]) -> float | None:
    """The steady step of a verify result (core.steptime.steady_step_s), from its per-step
    times; results without them give verify's own figure."""
    steps = measured.get("step_times_s")
    if isinstance(steps, list) and steps and all(isinstance(x, (int, float)) for x in steps):
        return steady_step_s(steps)
    return measured.get("step_time_s")


def measured_phases_s(measured: dict[str, Any]) -> tuple[float, float, float] | None:
    """The steady forward, backward and optimizer times (core.steptime.steady_step_s of each
    phase's per-step times), where the worker timed the phases apart."""
    phases = []
    for name in ("forward", "backward", "optimizer"):
        times = measured.get(f"{name}_times_s")
        if not (isinstance(times, list) and times and all(isinstance(x, (int, float)) for x in times)):
            return None
        phases.append(steady_step_s(times))
    return phases[0], phases[1], phases[2]


def _threads(result: dict[str, Any]) -> int | None:
    """The CPU threads rank 0 ran its optimizer with, as the worker recorded them."""
    ranks = [r for r in result.get("ranks") or [] if isinstance(r, dict)]
    rank0 = next((r for r in ranks if r.get("rank") == 0), ranks[0] if ranks else {})
    return _int_or_none(rank0.get("omp_num_threads")) or _int_or_none(rank0.get("torch_threads"))


def _host_cores(result: dict[str, Any]) -> int | None:
    env = result.get("environment") if isinstance(result.get("environment"), dict) else {}
    ranks = [r for r in result.get("ranks") or [] if isinstance(r, dict)]
    for value in (env.get("host_cores"), env.get("cpu_count"), *(r.get("cpu_count") for r in ranks[:1])):
        if _int_or_none(value):
            return _int_or_none(value)
    return None


def _label(inp: PlanInput, layout: Layout) -> str:
    m, t = inp.model, inp.training
    extra = (" ckpt" if t.checkpointing == "full" else "") + (f" gas{t.grad_accum}" if t.grad_accum > 1 else "")
    return (f"{layout.label} w{inp.hardware.world} | L{m.layers} h{m.hidden} s{t.seq} "
            f"b{t.micro_batch}{extra}")


def read_results(paths: Iterable[str | os.PathLike[str]],
                 default_host_cores: int | None = None) -> tuple[list[MeasuredStep], list[str]]:
    """The complete GPU runs among the results, and one line per result left out (and why).

    A result that does not record its host's cores gets `default_host_cores` (None: the
    planner's default from the GPU preset)."""
    rows: list[MeasuredStep] = []
    skipped: list[str] = []
    for raw in paths:
        for where, result in _result_dicts(Path(raw)):
            if not isinstance(result, dict) or "inputs" not in result or "layout" not in result:
                skipped.append(f"{where}: not a zlayout verify result")
                continue
            status, mode = result.get("status"), result.get("mode")
            measured = result.get("measured") if isinstance(result.get("measured"), dict) else {}
            step_s = measured_step_s(measured)
            if result.get("emulated_world"):
                skipped.append(f"{where}: emulated (rank 0 of {result['emulated_world']} on one GPU): "
                               "its steps moved no data, no step time to fit")
                continue
            if status not in USABLE_STATUSES or mode != "gpu":
                skipped.append(f"{where}: {status} ({mode} mode): no GPU step time to fit")
                continue
            if not isinstance(step_s, (int, float)) or not math.isfinite(step_s) or step_s <= 0:
                skipped.append(f"{where}: no measured step time")
                continue
            try:
                inp = PlanInput.model_validate(result["inputs"])
                lay = result["layout"]
                layout = Layout(stage=lay["stage"], offload_optimizer=lay["offload_optimizer"],
                                offload_param=lay["offload_param"])
            except (ValidationError, KeyError, TypeError) as exc:
                skipped.append(f"{where}: inputs or layout unreadable ({str(exc).splitlines()[0]})")
                continue
            cores = _host_cores(result) or default_host_cores
            hardware_update: dict[str, Any] = {"host_cores": cores} if cores else {}
            # fit against the shipped model, whatever calibration the run was planned with
            inp = inp.model_copy(update={"calibration": StepTimeCalibration(),
                                         "hardware": inp.hardware.model_copy(update=hardware_update)})
            rows.append(MeasuredStep(label=_label(inp, layout), inp=inp, layout=layout,
                                     measured_step_s=float(step_s), cpu_threads_per_rank=_threads(result),
                                     source=where, phases_s=measured_phases_s(measured),
                                     alloc_retries=measured.get("alloc_retries")))
    return rows, skipped


def calibration_document(fit: CalibrationFit, version: str) -> dict[str, Any]:
    cal = fit.calibration
    (mean_before, max_before), (mean_after, max_after) = fit.before, fit.after
    return {
        "schema": SCHEMA,
        "created": datetime.now(timezone.utc).replace(microsecond=0),
        "zlayout_version": version,
        "factors": {g: round(getattr(cal, f"{g}_factor"), 6) for g in GROUPS},
        "fitted_groups": list(fit.fitted_groups),
        "error": {"rows": len(fit.rows),
                  "mean_abs_before_pct": round(100 * mean_before, 2), "max_abs_before_pct": round(100 * max_before, 2),
                  "mean_abs_after_pct": round(100 * mean_after, 2), "max_abs_after_pct": round(100 * max_after, 2)},
        "rows": [{"label": r.row.label, "source": r.row.source,
                  **({"cpu_threads_per_rank": r.row.cpu_threads_per_rank} if r.row.cpu_threads_per_rank else {}),
                  "host_cores": r.row.inp.hardware.node_host_cores,
                  "measured_step_s": round(r.row.measured_step_s, 6),
                  "predicted_before_s": round(r.before_s, 6), "predicted_after_s": round(r.after_s, 6),
                  "error_before_pct": round(100 * r.error_before, 2),
                  "error_after_pct": round(100 * r.error_after, 2)} for r in fit.rows],
    }


def write_calibration(path: str | os.PathLike[str], fit: CalibrationFit, version: str) -> Path:
    """Write atomically (a temporary file in the same folder, then rename): never half a file."""
    target = Path(path)
    text = ("# zlayout step-time calibration: factors on the model's parts, fitted by `zlayout calibrate`.\n"
            "# Use it with --calibration FILE (plan, breakeven, export, verify).\n"
            + tomli_w.dumps(calibration_document(fit, version)))
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def load_calibration(path: str | os.PathLike[str]) -> StepTimeCalibration:
    """The factors of a calibration file, with `source` naming the file and its content hash."""
    p = Path(path)
    try:
        data = p.read_bytes()
        doc = tomllib.loads(data.decode("utf-8"))
    except OSError as exc:
        raise CalibrationError(f"cannot read --calibration {p}: {exc.strerror}") from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError) as exc:
        raise CalibrationError(f"--calibration {p} is not a calibration TOML ({exc}); "
                               "write one with `zlayout calibrate RESULTS... --out FILE`") from None
    factors = doc.get("factors")
    if doc.get("schema") != SCHEMA or not isinstance(factors, dict):
        raise CalibrationError(f"--calibration {p} is not a calibration file (schema {SCHEMA!r} with "
                               "[factors]); write one with `zlayout calibrate RESULTS... --out FILE`")
    source = f"{p.name} sha256:{hashlib.sha256(data).hexdigest()[:12]}"
    try:
        return StepTimeCalibration.model_validate(
            {"source": source, **{f"{g}_factor": factors.get(g, 1.0) for g in GROUPS}}, strict=True)
    except ValidationError as exc:
        problems = []
        for e in exc.errors():
            key = str(e["loc"][-1]).removesuffix("_factor")  # the file's key: [factors] gpu = ...
            text = type_error_text({**e, "loc": (key,)}) or e["msg"].removeprefix("Value error, ")
            problems.append(f"factors.{key}: {text}")
        bad = "; ".join(problems)
        raise CalibrationError(f"--calibration {p}: {bad}") from None
