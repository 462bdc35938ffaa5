"""One verification from request to verdict, and a batch of them (no torch here).

Puts the pieces together so that they need not import each other: the request checked
(`options`), the output location and the drill's checkpoint size stated, the preflight
(`preflight`, which also builds the ops), the run and the restart drill (`launcher`), the
ranks' reports folded into a verdict (`result`), and the time of each phase printed.

    result = run_verification(inp, layout, VerifyOptions(cpu=True, processes=2),
                              on_line=print, cancel=threading.Event())
"""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from zlayout.spec import GiB, Layout, PlanInput
from zlayout.verify import guard, oplocks, preflight
from zlayout.verify.environment import worker_env, worker_env_notes
from zlayout.verify.launcher import (LaunchOutcome, launch_command, read_reports, run_spec,
                                     stream_process)
from zlayout.verify.options import (LaunchError, VerifyOptions, check_request, check_runnable, checkpoint_bytes,
                                    input_for_run, resolved_dirs, world_for)
from zlayout.verify.result import build_result, reference_row, restart_drill_result

PHASES = ("preflight", "op build", "init", "steps", "drill")
# What a rank that dies at shutdown leaves in torchrun's output: the lines worth showing.
_SHUTDOWN_CLUES = ("terminate called", "Signal", "signal", "exitcode", "Connection closed",
                   "Aborted", "core dumped", "Error")


def environment_facts(cpu: bool) -> dict[str, Any]:
    facts: dict[str, Any] = {"hostname": socket.gethostname()}
    if not cpu:
        gpus = preflight.query_gpus()
        if gpus:
            facts["driver"] = gpus[0].driver
            facts["gpu_count_visible"] = len(gpus)
    return facts


def announce(inp: PlanInput, layout: Layout, options: VerifyOptions, default_out: bool,
             on_line: Callable[[str], None]) -> None:
    """Before anything runs: where the output goes and what the drill will write there."""
    where = " (the default; --out DIR puts it elsewhere)" if default_out else ""
    on_line(f"zlayout: output in {options.out_dir}{where}")
    if options.restart_drill:
        on_line(f"zlayout: the restart drill writes a checkpoint of about "
                f"{checkpoint_bytes(inp) / GiB:.1f} GiB to {options.checkpoint_dir} "
                f"(--checkpoint-dir DIR to move it)")
    for note in worker_env_notes(options):
        on_line(f"zlayout: note: {note}")


def shutdown_cause(outcome: LaunchOutcome) -> str:
    """The lines of the output that say why a rank ended badly after its figures were in."""
    clues = [line for line in outcome.tail[-60:] if any(c in line for c in _SHUTDOWN_CLUES)]
    return "; ".join((clues or outcome.tail[-3:])[-3:])[:600]


def completed_at_shutdown(outcome: LaunchOutcome, reports: list[dict[str, Any]],
                          processes: int) -> bool:
    """Every rank reported its figures, yet the launcher failed: it died on the way out."""
    return (outcome.returncode not in (0, None) and not outcome.cancelled
            and not outcome.timed_out and len(reports) == processes
            and all(r.get("status") == "ok" for r in reports))


def claim_dirs(out_dir: Path, checkpoint_dir: Path, restart_drill: bool,
               write: bool = True) -> tuple[Path, Path]:
    """The output directory (and the drill's checkpoint directory) refused where they hold
    files zlayout did not write, then marked as zlayout's (guard.claim_dir). A checkpoint
    directory must be empty or zlayout's: the drill would rewrite a training run's `latest`."""
    out_dir = guard.claim_dir("--out", out_dir, write=write)
    if restart_drill:
        checkpoint_dir = guard.claim_dir("--checkpoint-dir", checkpoint_dir, names=(), write=write)
    return out_dir, checkpoint_dir


def run_verification(inp: PlanInput, layout: Layout, options: VerifyOptions | None = None,
                     on_line: Callable[[str], None] = lambda line: None,
                     cancel: threading.Event | None = None) -> dict[str, Any]:
    """Preflight, run, (drill a restart), compare. Returns the result dict (see result.py).

    Never raises for a failed or out-of-memory run: that is a result. Raises LaunchError only
    for requests that cannot be started (a drill with nowhere to resume, too many processes)."""
    options = options or VerifyOptions()
    cancel = cancel or threading.Event()
    check_request(inp, options)
    processes = world_for(inp, options)
    run_inp = input_for_run(inp, processes, options.emulate)
    # at the world this node runs (--processes 1 of an 8-GPU plan is ZeRO-3 on one GPU); the app's
    # verify too, which builds no command line
    check_runnable(run_inp, layout, options.cpu)
    out_dir, checkpoint_dir, default_out = resolved_dirs(layout, options)
    out_dir, checkpoint_dir = claim_dirs(out_dir, checkpoint_dir, options.restart_drill)
    options = replace(options, out_dir=out_dir, checkpoint_dir=checkpoint_dir)
    announce(run_inp, layout, options, default_out, on_line)
    started = time.time()
    phase_s: dict[str, float | None] = dict.fromkeys(PHASES)

    extra: dict[str, Any] = {"out_dir": str(out_dir), "planned_world": inp.hardware.world,
                             "steps": options.steps, "phase_s": phase_s, "warnings": []}
    if not options.run_preflight:  # preflight removes them otherwise (a check of its own)
        for note in oplocks.remove_stale_locks(worker_env(options, processes)):
            on_line(f"zlayout: note: {note}")
    if options.run_preflight:
        checks = preflight.run_checks(run_inp, layout, options, processes, on_line=on_line)
        phase_s["op build"] = sum(c.seconds or 0.0 for c in checks)
        phase_s["preflight"] = time.time() - started - phase_s["op build"]
        for check in checks:
            on_line(check.line())
        extra["preflight"] = [c.as_dict() for c in checks]
        blocking = [c for c in checks if not c.ok and c.blocking]
        if blocking:
            out_dir.mkdir(parents=True, exist_ok=True)
            result = build_result(run_inp, layout, [], cpu=options.cpu, returncode=None,
                                  output_tail=[c.line() for c in blocking], cancelled=False,
                                  expected_ranks=processes, environment=environment_facts(True),
                                  extra=extra)
            result["status"] = "failed"
            result["cause"] = "preflight: " + "; ".join(f"{c.name}: {c.fix}" for c in blocking)
            return _finish(result, out_dir, started, on_line)

    out_dir.mkdir(parents=True, exist_ok=True)
    spec = run_spec(run_inp, layout, options, checkpoint_dir)
    spec_path = out_dir / "spec.json"
    spec_path.write_text(json.dumps(spec, indent=1))
    (out_dir / "ds_config.json").write_text(json.dumps(spec["ds_config"], indent=1))
    out_path = out_dir / "result.json"
    for stale in [*out_dir.glob("result.json.rank*.json"), *out_dir.glob("resume.json.rank*.json")]:
        stale.unlink()  # a rerun in the same directory must not read an earlier run's ranks
    env = worker_env(options, processes)
    unit = ("CPU process" if options.cpu else "GPU") if processes == 1 else \
        ("CPU processes" if options.cpu else "GPUs")
    if options.emulate:
        on_line(f"zlayout: running {layout.label} as rank 0 of {run_inp.hardware.world} GPUs on 1 "
                f"{'CPU process' if options.cpu else 'GPU'} (emulated: DeepSpeed shards as on "
                f"{run_inp.hardware.world}, the collectives move nothing), {options.steps} steps")
    else:
        on_line(f"zlayout: running {layout.label} on {processes} {unit}, {options.steps} steps")
    first = stream_process(launch_command(options, processes, spec_path, out_path,
                                          out_dir / "logs-run", resume=False),
                           env, on_line, cancel, options.timeout_s)
    reports = read_reports(out_path, processes)
    returncode = first.returncode
    if completed_at_shutdown(first, reports, processes):
        extra["warnings"].append(f"a rank ended abnormally at shutdown, after every step "
                                 f"(exit code {first.returncode}): {shutdown_cause(first)}")
        returncode = 0
    phase_s["init"] = max((r["init_s"] for r in reports if r.get("init_s") is not None),
                          default=None)
    phase_s["steps"] = max((r["train_s"] for r in reports if r.get("train_s") is not None),
                           default=None)
    tail = first.tail

    drill = None
    first_ok = (returncode == 0 and len(reports) == processes
                and all(r.get("status") == "ok" for r in reports))
    cancelled = first.cancelled
    if options.restart_drill and first_ok and not cancelled:
        on_line(f"zlayout: restart drill: every rank stopped; resuming from the checkpoint "
                f"of step {options.drill_step()}")
        resume_path = out_dir / "resume.json"
        second = stream_process(launch_command(options, processes, spec_path, resume_path,
                                               out_dir / "logs-resume", resume=True),
                                env, on_line, cancel, options.timeout_s)
        phase_s["drill"] = second.wall_s
        resumed = read_reports(resume_path, processes)
        drill = restart_drill_result(reports, resumed, options.drill_step(), second.wall_s)
        if completed_at_shutdown(second, resumed, processes):
            extra["warnings"].append(f"a resumed rank ended abnormally at shutdown, after every "
                                     f"step (exit code {second.returncode}): "
                                     f"{shutdown_cause(second)}")
        elif second.returncode != 0 and not second.cancelled:
            drill["resumed_ok"] = False
            drill["cause"] = "\n".join(second.tail[-20:])
        cancelled = cancelled or second.cancelled
        tail = first.tail + second.tail
    elif options.restart_drill:
        drill = {"resumed_ok": False, "resume_s": None, "step_before": options.drill_step(),
                 "step_after": None, "cause": "the first run did not complete"}

    if first.timed_out:
        extra["timed_out"] = True
    result = build_result(run_inp, layout, reports, cpu=options.cpu, returncode=returncode,
                          output_tail=tail, cancelled=cancelled, expected_ranks=processes,
                          restart_drill=drill, environment=environment_facts(options.cpu),
                          extra=extra, emulated=options.emulate)
    result["wall_s"] = round(first.wall_s, 2)
    return _finish(result, out_dir, started, on_line)


def phase_line(phase_s: dict[str, float | None], total_s: float) -> str:
    shown = ", ".join(f"{name} {'-' if s is None else f'{s:.1f} s'}" for name, s in phase_s.items())
    return f"zlayout: time per phase: {shown}; verdict in {total_s:.1f} s"


def _finish(result: dict[str, Any], out_dir: Path, started: float,
            on_line: Callable[[str], None]) -> dict[str, Any]:
    result["total_s"] = round(time.time() - started, 2)
    phase_s = result.get("phase_s") or {}
    result["phase_s"] = {k: (round(v, 2) if v is not None else None) for k, v in phase_s.items()}
    on_line(phase_line(result["phase_s"], result["total_s"]))
    path = out_dir / "result.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str))
    tmp.replace(path)
    result["result_path"] = str(path)
    return result


@dataclass(frozen=True)
class BatchRun:
    """One line of a batch file: its flags and either the run they ask for or why not."""

    flags: list[str]
    inp: PlanInput | None = None
    layout: Layout | None = None
    options: VerifyOptions | None = None
    error: str | None = None


OK_STATUSES = ("validated", "cpu-ok")


def run_batch(runs: list[BatchRun], base: Path, deadline_s: float | None,
              on_line: Callable[[str], None], on_result: Callable[[dict[str, Any]], None],
              cancel: threading.Event,
              on_start: Callable[[BatchRun], None] = lambda run: None) -> int:
    """Several verifications one after another (a GPU node's time is scarce); results append
    to base/results.jsonl and, in the shared measurements' format, base/reference.jsonl.
    Preflight runs until one passes (the first line, on a node fit to run): a node that failed it
    (no GPU visible) ran the next lines unchecked, DeepSpeed falling back to its CPU accelerator.
    Returns 0 when every run was validated (or cpu-ok)."""
    base.mkdir(parents=True, exist_ok=True)
    started = time.time()
    worst = 0
    preflight_passed = False
    for index, run in enumerate(runs):
        joined = " ".join(run.flags)
        if cancel.is_set():
            on_line(f"zlayout: batch cancelled; skipped: {joined}")
            worst = 1
            continue
        if deadline_s is not None and time.time() - started > deadline_s:
            on_line(f"zlayout: batch deadline reached; skipped: {joined}")
            worst = 1
            continue
        if run.error is not None or run.options is None:
            on_line(f"zlayout: batch line {index + 1} skipped: {run.error}")
            worst = 1
            continue
        assert run.inp is not None and run.layout is not None
        world = (f"w{run.inp.hardware.world}-emulated" if run.options.emulate
                 else f"w{world_for(run.inp, run.options)}")
        options = replace(run.options, run_preflight=run.options.run_preflight and not preflight_passed,
                          out_dir=base / f"{index:02d}-{run.layout.key}-{world}")
        on_start(run)
        try:
            result = run_verification(run.inp, run.layout, options, on_line=on_line, cancel=cancel)
        except LaunchError as exc:
            on_line(f"zlayout: batch line {index + 1} skipped: {exc}")
            worst = 1
            continue
        on_result(result)
        # "preflight" is in a result whose run preflighted (`run_verification`'s extra)
        preflight_passed = preflight_passed or ("preflight" in result
                                                and not str(result.get("cause", "")).startswith("preflight:"))
        slim = {k: v for k, v in result.items() if k != "output_tail" or v}
        with (base / "results.jsonl").open("a") as f:
            f.write(json.dumps(slim, default=str) + "\n")
        row = reference_row(result)
        row["predicted_peak_gib"] = (round(result["predicted"]["gpu_peak_allocated_bytes"] / GiB, 4)
                                     if result["predicted"].get("gpu_peak_allocated_bytes") else None)
        row["predicted_step_s"] = result["predicted"].get("step_time_s")
        with (base / "reference.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")
        if result["status"] not in OK_STATUSES:
            worst = 1
    return worst
