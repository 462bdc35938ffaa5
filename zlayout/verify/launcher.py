"""Launch the verification worker on this node, stream its output, read the ranks' reports.

The planning side of verification: it never imports torch or deepspeed, nor the preflight
(`zlayout.verify.runner` puts the two together). It writes the run spec (the plan's inputs,
the layout and its ds_config), starts one worker per GPU (or per CPU process in CPU mode)
through `python -m torch.distributed.run --standalone` (a c10d rendezvous on a port the
store itself picks, under a fresh id: two runs on one node never meet or collide), streams
every output line (rank lines prefixed `[rank N]`) to a callback and kills the whole process
group on cancel.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from zlayout.profile.ds_config import ds_config
from zlayout.spec import Layout, PlanInput
from zlayout.verify.environment import worker_env
from zlayout.verify.options import (LaunchError, VerifyOptions, default_out_dir, hf_config_to_build,
                                    input_for_run, world_for)

__all__ = ["LaunchError", "VerifyOptions", "default_out_dir", "input_for_run", "world_for",
           "worker_env", "launch_command", "stream_process", "read_reports", "run_spec"]

WORKER_MODULE = "zlayout.verify.worker"
_TORCHRUN_PREFIX = re.compile(r"^\[(?:default)?(\d+)\]:")
KILL_GRACE_S = 5.0


def free_port() -> int:
    """A port free now (for launchers that need one named; torchrun here picks its own)."""
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
        # rank 0 of this world on torch's fake process group (VerifyOptions.emulate)
        "emulate_world": inp.hardware.world if options.emulate else None,
        "seed": options.seed,
        "hf_config": hf_config_to_build(inp, options),
        "checkpoint_dir": str(checkpoint_dir.resolve()),
        "out_dir": str(options.out_dir) if options.out_dir else None,
        "nvme_path": options.nvme_path,
    }


def _config_for_world(config: dict[str, Any], inp: PlanInput) -> dict[str, Any]:
    """A given ds_config (a profile's) with its batch size restated for the world that runs."""
    config = json.loads(json.dumps(config))
    t = inp.training
    config["train_batch_size"] = t.micro_batch * t.grad_accum * inp.hardware.world
    return config


def launch_command(options: VerifyOptions, processes: int, spec_path: Path, out_path: Path,
                   log_dir: Path, resume: bool) -> list[str]:
    # -P here and PYTHONSAFEPATH=1 in worker_env (torchrun starts each rank as `python -u -m
    # zlayout.verify.worker`, without -P): a `zlayout/` folder in the current directory cannot
    # stand in for zlayout's worker.
    # --standalone: the rendezvous store binds port 0 and gets a random id, so no port is
    # picked here and then taken by someone else before torchrun binds it.
    command = [options.python, "-P", "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", str(processes), "--tee", "3", "--log-dir", str(log_dir),
               "-m", WORKER_MODULE, "--spec", str(spec_path), "--out", str(out_path)]
    if resume:
        command.append("--resume")
    return command


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
