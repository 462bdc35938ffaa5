"""A SLURM verification's steps on each node (`python -m zlayout.verify.node`; no torch here).

The batch script runs, through srun, one task per node:
- `preflight --spec SPEC`: the local path's preflight on the node itself, before any rank:
  stale op-build locks removed, DeepSpeed's ops built once into the node's op cache (not by
  every rank at once), TORCH_CUDA_ARCH_LIST checked as corrected, GPUs, host memory and the
  directories. A blocking failure ends the job (exit 1) with its FAIL lines in the output.
- `exec --spec SPEC --processes N -- COMMAND...`: COMMAND (torchrun) with the ranks'
  environment (environment.worker_env: the arch list corrected, the interpreter's bin
  directory on PATH, zlayout importable), the same environment the local path gives them.
- `settled --spec SPEC --out RESULT`: after a step that failed, whether every rank of the
  world had reported its figures (a rank that aborts in gloo's or NCCL's destructors at
  shutdown, after every step, fails the step): exit 0 with SHUTDOWN_NOTE, and the job goes on
  (the local path makes the same call, runner.completed_at_shutdown); else exit 1.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

from zlayout.spec import Layout, PlanInput
from zlayout.verify.environment import worker_env, worker_env_notes
from zlayout.verify.launcher import read_reports
from zlayout.verify.options import VerifyOptions, input_for_run


SHUTDOWN_NOTE = ("every rank reported its figures, but the step ended with an error at shutdown "
                 "(a rank aborted on its way out)")


def settled(spec: dict[str, Any], out: Path) -> int:
    world = PlanInput.model_validate(spec["inputs"]).hardware.world
    reports = read_reports(out, world)
    if len(reports) == world and all(r.get("status") == "ok" for r in reports):
        print(f"zlayout: {SHUTDOWN_NOTE}; going on", flush=True)
        return 0
    return 1


def options_from_spec(spec: dict[str, Any]) -> VerifyOptions:
    kwargs: dict[str, Any] = dict(
        cpu=spec["device"] == "cpu", python=sys.executable, steps=int(spec["steps"]),
        restart_drill=spec.get("save_at_step") is not None, save_at_step=spec.get("save_at_step"),
        checkpoint_dir=Path(spec["checkpoint_dir"]))
    if spec.get("out_dir"):
        kwargs["out_dir"] = Path(spec["out_dir"])
    if spec.get("nvme_path"):
        kwargs["nvme_path"] = spec["nvme_path"]
    return VerifyOptions(**kwargs)


def node_preflight(spec: dict[str, Any]) -> int:
    from zlayout.verify import preflight

    inp = PlanInput.model_validate(spec["inputs"])
    layout = Layout.model_validate(spec["layout"])
    options = options_from_spec(spec)
    processes = inp.hardware.gpus_per_node
    host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()  # SLURM's name for the node

    def say(line: str) -> None:
        print(f"zlayout: {host}: {line}", flush=True)

    for note in worker_env_notes(options):
        say(f"note: {note}")
    checks = preflight.run_checks(input_for_run(inp, processes), layout, options, processes,
                                  on_line=say)
    for check in checks:
        say(check.line())
    return 1 if any(not c.ok and c.blocking for c in checks) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zlayout.verify.node")
    parser.add_argument("step", choices=("preflight", "exec", "settled"))
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--spec", required=True, type=Path)
    parser.add_argument("--processes", type=int, default=1)
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    command = argv[split + 1:]
    spec = json.loads(args.spec.read_text())
    if args.step == "preflight":
        return node_preflight(spec)
    if args.step == "settled":
        return settled(spec, args.out)
    if not command:
        parser.error("exec needs a command after --")
    env = worker_env(options_from_spec(spec), args.processes)
    os.execvpe(command[0], command, env)
    return 127  # pragma: no cover - execvpe does not return


if __name__ == "__main__":
    sys.exit(main())
