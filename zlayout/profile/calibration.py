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
from zlayout.profile.errors import describe_validation_error
from zlayout import tomlsafe
from zlayout.smallfile import NotARegularFile, TooLarge, read_small_file
from zlayout.messages import type_error_text
from zlayout.spec import Layout, PlanInput, StepTimeCalibration, recorded_inputs

SCHEMA = "zlayout-calibration/1"
USABLE_STATUSES = ("validated", "mismatch")  # complete GPU runs: their step time is real


class CalibrationError(ValueError):
    """A results or calibration file zlayout cannot use; the message says what to give instead."""


# A step of a real GPU run takes between these (a tiny model's step is milliseconds; a stage-3
# NVMe step of a large model minutes): outside, the figure is in other units or corrupt.
PLAUSIBLE_STEP_S = (1e-4, 3600.0)
# A fit whose rows stay this far off after fitting (mean |error|), or that pins a factor at its
# limit (core.calibrate.FACTOR_MIN/MAX), describes the results' units, not the cluster.
ABSURD_MEAN_ERROR = 0.5


MAX_RESULTS_BYTES = 64 * 2**20  # a results.jsonl of thousands of runs is a few MiB


def _result_dicts(path: Path) -> list[tuple[str, Any]]:
    """(where, parsed object) for a result.json, each line of a results.jsonl, or a folder's files.
    A line of a results.jsonl that is not JSON is ("file:N", CalibrationError): reported by number,
    the other lines still read."""
    if path.is_dir():
        found = sorted(path.glob("result.json")) + sorted(path.glob("results.jsonl"))
        found = found or sorted(path.glob("*/result.json"))
        if not found:
            raise CalibrationError(f"{path}: no result.json or results.jsonl in this folder")
        return [item for p in found for item in _result_dicts(p)]
    try:  # a device or a pipe (/dev/zero) never ends: only a regular file, read up to a limit
        text = read_small_file(path, MAX_RESULTS_BYTES).decode("utf-8")
    except NotARegularFile:
        raise CalibrationError(f"{path}: not a file; give zlayout verify's result.json, a batch's "
                               "results.jsonl or a folder of them") from None
    except TooLarge:
        raise CalibrationError(f"{path}: larger than {MAX_RESULTS_BYTES // 2**20} MiB, not verify's results") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CalibrationError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if path.suffix == ".jsonl":
        out: list[tuple[str, Any]] = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                out.append((f"{path.name}:{n}", json.loads(line)))
            except (json.JSONDecodeError, RecursionError) as exc:
                out.append((f"{path.name}:{n}", CalibrationError(f"not JSON ({' '.join(str(exc).split())[:80]})")))
        return out
    try:
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


def _time(value: Any) -> bool:
    """A time in seconds as a real run records it: a number (not a boolean), finite, in range."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and PLAUSIBLE_STEP_S[0] <= value <= PLAUSIBLE_STEP_S[1])


def bad_times(measured: dict[str, Any]) -> str | None:
    """What is wrong with a result's step and phase times (None: nothing): every figure a fit reads
    must be a plausible time in seconds; true, a string, nan or a time in microseconds is not."""
    for key in ("step_time_s", "step_times_s", "forward_times_s", "backward_times_s", "optimizer_times_s"):
        if key not in measured or measured[key] is None:
            continue
        values = measured[key] if key.endswith("times_s") else [measured[key]]
        if not isinstance(values, list) or not values:
            return f"measured.{key} is {_shown(values)}, not a list of times in seconds"
        bad = next((v for v in values if not _time(v)), _OK)
        if bad is not _OK:
            return (f"measured.{key} holds {_shown(bad)}, not a time in seconds from "
                    f"{PLAUSIBLE_STEP_S[0]:g} to {PLAUSIBLE_STEP_S[1]:g}")
    return None


_OK = object()


def _shown(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, float) or math.isfinite(value) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


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
            if isinstance(result, CalibrationError):
                skipped.append(f"{where}: {result}")
                continue
            if not isinstance(result, dict) or "inputs" not in result or "layout" not in result:
                skipped.append(f"{where}: not a zlayout verify result")
                continue
            status, mode = result.get("status"), result.get("mode")
            measured = result.get("measured") if isinstance(result.get("measured"), dict) else {}
            problem = bad_times(measured) if status in USABLE_STATUSES and mode == "gpu" else None
            if problem is not None:
                skipped.append(f"{where}: {problem}")
                continue
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
                inp = PlanInput.model_validate(recorded_inputs(result["inputs"]))
                lay = result["layout"]
                layout = Layout(stage=lay["stage"], offload_optimizer=lay["offload_optimizer"],
                                offload_param=lay["offload_param"])
            except ValidationError as exc:  # what is wrong, not pydantic's "1 validation error for PlanInput"
                skipped.append(f"{where}: inputs unreadable ({describe_validation_error(exc)})")
                continue
            except (KeyError, TypeError) as exc:
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


def absurd_fit(fit: CalibrationFit) -> str | None:
    """Why a fit must not be written (None: it may): rows still far off after fitting, or a factor
    pinned at its limit, say the results are in other units or the model does not describe them;
    a calibration from them would make every plan that much off."""
    from zlayout.core.calibrate import FACTOR_MAX, FACTOR_MIN

    cal = fit.calibration
    pinned = [g for g in fit.fitted_groups
              if math.isclose(getattr(cal, f"{g}_factor"), FACTOR_MIN) or
              math.isclose(getattr(cal, f"{g}_factor"), FACTOR_MAX)]
    mean_after, max_after = fit.after
    if pinned:
        factor = getattr(cal, f"{pinned[0]}_factor")
        return (f"the {pinned[0]} factor ends at its limit ({factor:g}; the fit keeps factors within "
                f"{FACTOR_MIN:g}-{FACTOR_MAX:g}) with the rows {mean_after:.0%} off on average after fitting")
    if mean_after > ABSURD_MEAN_ERROR:
        return f"the rows are still {mean_after:.0%} off on average after fitting (at most {max_after:.0%})"
    return None


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
                  **({"runs": r.row.runs} if r.row.runs > 1 else {}),  # the median run of these (merge_repeats)
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
        try:  # /dev/zero, a FIFO or a directory would be read without end, or fail oddly
            data = read_small_file(p, tomlsafe.MAX_TOML_BYTES)
        except NotARegularFile:
            raise CalibrationError(f"--calibration {p} is not a file: give the TOML `zlayout calibrate` wrote") from None
        except TooLarge:
            raise CalibrationError(f"--calibration {p} is over {tomlsafe.MAX_TOML_BYTES:,} bytes: not a zlayout "
                                   "calibration") from None
        # the profiles' limits: a 25,000-part dotted key took tomllib 8.4 s and 3.7 GB
        doc = tomlsafe.loads(data.decode("utf-8"), f"--calibration {p}")
    except OSError as exc:
        raise CalibrationError(f"cannot read --calibration {p}: {exc.strerror}") from None
    except tomlsafe.TomlLimitError as exc:
        raise CalibrationError(f"{exc}: not a zlayout calibration") from None
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
