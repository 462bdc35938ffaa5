"""Launch the verification worker on this node, stream its output, collect the result.

The planning side of verification: it never imports torch or deepspeed. It writes the run
spec (the plan's inputs, the layout and its ds_config), starts one worker per GPU (or per
CPU process in CPU mode) through `python -m torch.distributed.run`, streams every output line
(rank lines prefixed `[rank N]`) to a callback, kills the whole process group on cancel,
and folds the ranks' reports into the result (`zlayout.verify.result`). The restart drill is
a second launch that resumes from the checkpoint the first one saved.

    result = run_verification(inp, layout, VerifyOptions(cpu=True, processes=2),
                              on_line=print, cancel=threading.Event())
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from zlayout.profile.ds_config import DEFAULT_NVME_PATH, ds_config
from zlayout.spec import Layout, PlanInput
from zlayout.verify import preflight
from zlayout.verify.result import build_result, restart_drill_result

WORKER_MODULE = "zlayout.verify.worker"
_TORCHRUN_PREFIX = re.compile(r"^\[(?:default)?(\d+)\]:")
KILL_GRACE_S = 5.0


@dataclass(frozen=True)
class VerifyOptions:
    """How to run a verification (the layout and the sizes come from the PlanInput)."""

    steps: int = 5
    restart_drill: bool = False
    save_at_step: int | None = None  # default: half-way through the steps (at least 1)
    cpu: bool = False
    processes: int | None = None  # default: the plan's GPUs per node; 1 in CPU mode
    out_dir: Path | None = None  # default: ./zlayout-verify/<time>-<layout key>
    checkpoint_dir: Path | None = None  # default: <out_dir>/checkpoint
    nvme_path: str = DEFAULT_NVME_PATH
    python: str = field(default_factory=lambda: sys.executable)
    seed: int = 1234
    timeout_s: float | None = None
    run_preflight: bool = True
    extra_env: dict[str, str] = field(default_factory=dict)
    ds_config: dict[str, Any] | None = None  # default: zlayout's ds_config(inp, layout)

    def drill_step(self) -> int:
        return self.save_at_step if self.save_at_step is not None else max(1, self.steps // 2)


class LaunchError(Exception):
    """The verification cannot start as asked (message says what to change)."""


def world_for(inp: PlanInput, options: VerifyOptions) -> int:
    if options.processes is not None:
        return options.processes
    if options.cpu:
        return 1
    return inp.hardware.gpus_per_node


def input_for_run(inp: PlanInput, processes: int) -> PlanInput:
    """The plan's input at the size this node runs: one node of `processes` GPUs.

    The prediction is recomputed for that world, so measured and predicted describe the same
    run (a ZeRO shard on 2 GPUs is not the shard on 16)."""
    hw = inp.hardware
    if hw.nodes == 1 and hw.gpus_per_node == processes:
        return inp
    return inp.model_copy(update={"hardware": hw.model_copy(update={"gpus_per_node": processes,
                                                                    "nodes": 1})})


def default_out_dir(layout: Layout) -> Path:
    """$XDG_CACHE_HOME/zlayout/verify/<time>-<layout> (checkpoints are large: not the work tree)."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-%f")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "zlayout" / "verify" / f"{stamp}-{layout.key}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_spec(inp: PlanInput, layout: Layout, options: VerifyOptions, checkpoint_dir: Path) -> dict:
    steps = options.steps
    save_at = options.drill_step() if options.restart_drill else None
    return {
        "version": 1,
        "inputs": inp.model_dump(mode="json"),
        "layout": layout.model_dump(mode="json"),
        "ds_config": _config_for_world(options.ds_config, inp) if options.ds_config
        else ds_config(inp, layout, nvme_path=options.nvme_path),
        "steps": steps,
        "resume_steps": max(1, steps - save_at) if save_at is not None else 0,
        "save_at_step": save_at,
        "device": "cpu" if options.cpu else "cuda",
        "seed": options.seed,
        "checkpoint_dir": str(checkpoint_dir.resolve()),
    }


def _config_for_world(config: dict[str, Any], inp: PlanInput) -> dict[str, Any]:
    """A given ds_config (a profile's) with its batch size restated for the world that runs."""
    config = json.loads(json.dumps(config))
    t = inp.training
    config["train_batch_size"] = t.micro_batch * t.grad_accum * inp.hardware.world
    return config


def launch_command(options: VerifyOptions, processes: int, spec_path: Path, out_path: Path,
                   log_dir: Path, resume: bool) -> list[str]:
    command = [options.python, "-m", "torch.distributed.run", "--nproc_per_node", str(processes),
               "--nnodes", "1", "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
               "--tee", "3", "--log-dir", str(log_dir),
               "-m", WORKER_MODULE, "--spec", str(spec_path), "--out", str(out_path)]
    if resume:
        command.append("--resume")
    return command


def worker_env(options: VerifyOptions, processes: int = 1) -> dict[str, str]:
    env = dict(os.environ)
    # torchrun pins OMP_NUM_THREADS to 1 when it starts several workers: DeepSpeed's CPU Adam
    # (optimizer offload) would then run on one core per rank, 4x slower than a real job's.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // max(1, processes))))
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), root) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
    if options.cpu:
        env["DS_ACCELERATOR"] = "cpu"
        env["CUDA_VISIBLE_DEVICES"] = ""
    env.update(options.extra_env)
    return env


@dataclass
class LaunchOutcome:
    returncode: int | None
    cancelled: bool
    timed_out: bool
    wall_s: float
    tail: list[str]
    events: list[dict[str, Any]]


def stream_process(command: list[str], env: dict[str, str], on_line: Callable[[str], None],
                   cancel: threading.Event, timeout_s: float | None) -> LaunchOutcome:
    """Run the launcher in its own process group; stream lines; kill the group on cancel."""
    started = time.time()
    tail: deque[str] = deque(maxlen=200)
    events: list[dict[str, Any]] = []
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True, bufsize=1, errors="replace",
                            start_new_session=True)

    def pump() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = normalise_line(raw.rstrip("\n"))
            tail.append(line)
            event = parse_event(line)
            if event is not None:
                events.append(event)
            try:
                on_line(line)
            except Exception:  # noqa: BLE001 - a display error must not stop the run
                pass

    reader = threading.Thread(target=pump, name="zlayout-verify-output", daemon=True)
    reader.start()
    cancelled = timed_out = False
    while proc.poll() is None:
        if cancel.is_set():
            cancelled = True
            kill_group(proc)
            break
        if timeout_s is not None and time.time() - started > timeout_s:
            timed_out = True
            tail.append(f"zlayout: verification exceeded its {timeout_s:.0f} s limit; ranks killed")
            kill_group(proc)
            break
        time.sleep(0.1)
    proc.wait()
    reader.join(timeout=5)
    return LaunchOutcome(proc.returncode, cancelled, timed_out, time.time() - started,
                         list(tail), events)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the launcher's whole process group (every rank), SIGKILL what outlives the grace."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        return
    for sig, wait_s in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, KILL_GRACE_S)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        # The launcher is gone; make sure no rank of its group lingers.
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return


def normalise_line(line: str) -> str:
    """torchrun's `[default3]:text` becomes `[rank 3] text`."""
    match = _TORCHRUN_PREFIX.match(line)
    if match:
        return f"[rank {match.group(1)}] {line[match.end():]}"
    return line


def parse_event(line: str) -> dict[str, Any] | None:
    text = line.split("] ", 1)[1] if line.startswith("[rank ") else line
    if not text.startswith("{"):
        return None
    try:
        event = json.loads(text)
    except json.JSONDecodeError:
        return None
    return event if isinstance(event, dict) and "event" in event else None


def read_reports(out_path: Path, processes: int) -> list[dict[str, Any]]:
    reports = []
    for rank in range(processes):
        path = out_path.with_name(f"{out_path.name}.rank{rank}.json")
        if path.exists():
            try:
                reports.append(json.loads(path.read_text()))
            except json.JSONDecodeError:
                continue
    return reports


def environment_facts(cpu: bool) -> dict[str, Any]:
    facts: dict[str, Any] = {"hostname": socket.gethostname()}
    if not cpu:
        gpus = preflight.query_gpus()
        if gpus:
            facts["driver"] = gpus[0].driver
            facts["gpu_count_visible"] = len(gpus)
    return facts


def run_verification(inp: PlanInput, layout: Layout, options: VerifyOptions | None = None,
                     on_line: Callable[[str], None] = lambda line: None,
                     cancel: threading.Event | None = None) -> dict[str, Any]:
    """Preflight, run, (drill a restart), compare. Returns the result dict (see result.py).

    Never raises for a failed or out-of-memory run: that is a result. Raises LaunchError only
    for requests that cannot be started (say, a multi-node plan without SLURM)."""
    options = options or VerifyOptions()
    cancel = cancel or threading.Event()
    if options.steps < 1:
        raise LaunchError("--steps must be at least 1")
    if options.restart_drill and options.drill_step() >= options.steps:
        raise LaunchError(f"the restart drill saves at step {options.drill_step()}, so it needs "
                          f"--steps {options.drill_step() + 1} or more")
    processes = world_for(inp, options)
    if processes < 1:
        raise LaunchError("--processes must be at least 1")
    run_inp = input_for_run(inp, processes)
    out_dir = (options.out_dir or default_out_dir(layout)).resolve()
    checkpoint_dir = (options.checkpoint_dir or out_dir / "checkpoint").resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    options = replace(options, out_dir=out_dir, checkpoint_dir=checkpoint_dir)

    extra: dict[str, Any] = {"out_dir": str(out_dir), "planned_world": inp.hardware.world,
                             "steps": options.steps}
    checks: list[preflight.Check] = []
    if options.run_preflight:
        checks = preflight.run_checks(run_inp, layout, options, processes)
        for check in checks:
            on_line(check.line())
        extra["preflight"] = [c.as_dict() for c in checks]
        blocking = [c for c in checks if not c.ok and c.blocking]
        if blocking:
            result = build_result(run_inp, layout, [], cpu=options.cpu, returncode=None,
                                  output_tail=[c.line() for c in blocking], cancelled=False,
                                  expected_ranks=processes, environment=environment_facts(True),
                                  extra=extra)
            result["status"] = "failed"
            result["cause"] = "preflight: " + "; ".join(f"{c.name}: {c.fix}" for c in blocking)
            return _write(result, out_dir)

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
    on_line(f"zlayout: running {layout.label} on {processes} {unit}, {options.steps} steps; "
            f"output in {out_dir}")
    first = stream_process(launch_command(options, processes, spec_path, out_path,
                                          out_dir / "logs-run", resume=False),
                           env, on_line, cancel, options.timeout_s)
    reports = read_reports(out_path, processes)
    tail = first.tail

    drill = None
    first_ok = (first.returncode == 0 and len(reports) == processes
                and all(r.get("status") == "ok" for r in reports))
    if options.restart_drill and first_ok and not first.cancelled:
        on_line(f"zlayout: restart drill: every rank stopped; resuming from the checkpoint "
                f"of step {options.drill_step()}")
        resume_path = out_dir / "resume.json"
        second = stream_process(launch_command(options, processes, spec_path, resume_path,
                                               out_dir / "logs-resume", resume=True),
                                env, on_line, cancel, options.timeout_s)
        resumed = read_reports(resume_path, processes)
        drill = restart_drill_result(reports, resumed, options.drill_step(), second.wall_s)
        if second.returncode != 0 and not second.cancelled:
            drill["resumed_ok"] = False
            drill["cause"] = "\n".join(second.tail[-20:])
        first = replace(first, cancelled=first.cancelled or second.cancelled)
        tail = first.tail + second.tail
    elif options.restart_drill:
        drill = {"resumed_ok": False, "resume_s": None, "step_before": options.drill_step(),
                 "step_after": None, "cause": "the first run did not complete"}

    if first.timed_out:
        extra["timed_out"] = True
    result = build_result(run_inp, layout, reports, cpu=options.cpu, returncode=first.returncode,
                          output_tail=tail, cancelled=first.cancelled, expected_ranks=processes,
                          restart_drill=drill, environment=environment_facts(options.cpu),
                          extra=extra)
    result["wall_s"] = round(first.wall_s, 2)
    return _write(result, out_dir)


def _write(result: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    path = out_dir / "result.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str))
    tmp.replace(path)
    result["result_path"] = str(path)
    return result
