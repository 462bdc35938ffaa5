"""Verification beyond one node: a SLURM batch script (srun + torchrun) and a deepspeed
--hostfile command that run the same worker, and the result collected from the ranks' files.

The job directory must be on a file system every node sees (the spec, the ranks' reports and
the restart drill's checkpoint live there). The script starts one torchrun per node through
srun; torchrun's c10d rendezvous meets on the first node of the allocation. In CPU mode
(login nodes, CI) the script asks SLURM for no GPUs and runs the ranks on gloo.

`submit_and_follow` follows the job through SLURM's own record (`scontrol show job`, which
works without accounting, unlike `sacct`) and folds its state into the verdict.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from zlayout.spec import Layout, PlanInput
from zlayout.verify.launcher import (WORKER_MODULE, VerifyOptions, default_out_dir,
                                     normalise_line, read_reports, run_spec)
from zlayout.verify.result import build_result, restart_drill_result

RENDEZVOUS_PORT = 29500
NCCL_ENV = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")
# SLURM job states after which the job never runs again (squeue's long names).
FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                "PREEMPTED", "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED")
CANCEL_WAIT_S = 60.0  # after scancel, how long to wait for SLURM to record CANCELLED
LOST_JOB_S = 60.0  # how long `scontrol` may not know the job (purged, controller restarting)
OK_STATUSES = ("validated", "cpu-ok")


class SubmitError(Exception):
    """sbatch refused the job or is missing (message says what to change)."""


@dataclass(frozen=True)
class Job:
    inp: PlanInput  # the plan at the size the job runs: nodes x processes per node
    layout: Layout
    options: VerifyOptions
    out_dir: Path
    spec_path: Path

    @property
    def nodes(self) -> int:
        return self.inp.hardware.nodes

    @property
    def processes_per_node(self) -> int:
        return self.inp.hardware.gpus_per_node

    @property
    def gpus_per_node(self) -> int:  # kept for callers of the GPU-only version
        return self.processes_per_node

    @property
    def cpu(self) -> bool:
        return self.options.cpu


def input_for_job(inp: PlanInput, processes_per_node: int) -> PlanInput:
    """The plan with `processes_per_node` ranks on each of its nodes (the prediction follows)."""
    hw = inp.hardware
    if hw.gpus_per_node == processes_per_node:
        return inp
    return inp.model_copy(update={"hardware": hw.model_copy(
        update={"gpus_per_node": processes_per_node})})


def prepare_job(inp: PlanInput, layout: Layout, options: VerifyOptions) -> Job:
    """Write the run spec for the job's full world (every node) into the job directory.

    Processes per node are `--processes` (default: the plan's GPUs per node, in CPU mode too:
    the job has the plan's shape)."""
    out_dir = (options.out_dir or default_out_dir(layout)).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    checkpoint_dir = (options.checkpoint_dir or out_dir / "checkpoint").resolve()
    options = replace(options, out_dir=out_dir, checkpoint_dir=checkpoint_dir)
    run_inp = input_for_job(inp, options.processes or inp.hardware.gpus_per_node)
    spec = run_spec(run_inp, layout, options, checkpoint_dir)
    spec_path = out_dir / "spec.json"
    spec_path.write_text(json.dumps(spec, indent=1))
    (out_dir / "ds_config.json").write_text(json.dumps(spec["ds_config"], indent=1))
    for stale in [*out_dir.glob("result.json.rank*.json"), *out_dir.glob("resume.json.rank*.json")]:
        stale.unlink()  # a resubmission in the same directory must not read an earlier job's ranks
    return Job(run_inp, layout, options, out_dir, spec_path)


def _torchrun(job: Job, out_name: str, resume: bool) -> str:
    q = shlex.quote
    parts = [q(job.options.python), "-P", "-m", "torch.distributed.run",
             "--nnodes", "$SLURM_NNODES", "--nproc_per_node", str(job.processes_per_node),
             "--rdzv_backend", "c10d", "--rdzv_id", f"$SLURM_JOB_ID-{out_name}",
             "--rdzv_endpoint", '"$MASTER_ADDR:$MASTER_PORT"',
             "--tee", "3", "--log-dir", q(str(job.out_dir / f"logs-{out_name}")) + '/"$SLURMD_NODENAME"',
             "-m", WORKER_MODULE, "--spec", q(str(job.spec_path)),
             "--out", q(str(job.out_dir / f"{out_name}.json"))]
    if resume:
        parts.append("--resume")
    return " ".join(parts)


def batch_script(job: Job, partition: str | None = None, account: str | None = None,
                 time_limit: str = "00:30:00", setup: str = "") -> str:
    """The sbatch script: one srun task per node, each a torchrun of processes_per_node workers.

    GPUs are requested only in GPU mode: a cluster without a `gpu` GRES refuses the request."""
    ppn = job.processes_per_node
    mode = "CPU processes (gloo)" if job.cpu else "GPUs"
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name=zlayout-verify-{job.layout.key}",
             f"#SBATCH --nodes={job.nodes}",
             "#SBATCH --ntasks-per-node=1"]
    if not job.cpu:
        lines.append(f"#SBATCH --gpus-per-node={ppn}")
    lines += [f"#SBATCH --time={time_limit}",
              f"#SBATCH --output={job.out_dir}/slurm-%j.out"]
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    if account:
        lines.append(f"#SBATCH --account={account}")
    step_cmd = _torchrun(job, "result", resume=False)
    lines += [
        "# Written by `zlayout verify --slurm`: runs the planned layout for a few steps on every",
        f"# node ({job.nodes} x {ppn} {mode}) and leaves each rank's report beside the spec. The job",
        "# directory must be on a file system every node sees. Collect the result with",
        f"# `zlayout verify --submit` or: python -m zlayout.verify.slurm {shlex.quote(str(job.out_dir))}",
        "set -euo pipefail",
        f"cd {shlex.quote(str(Path.cwd()))}",
        "# PYTHONSAFEPATH (Python's -P): a zlayout/ folder in this directory must not shadow zlayout",
        "export PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1 PYTHONWARNINGS=${PYTHONWARNINGS:-ignore::FutureWarning}",
        f"export PYTHONPATH={shlex.quote(str(Path(__file__).resolve().parents[2]))}"
        "${PYTHONPATH:+:$PYTHONPATH}",
        "# torchrun would pin OMP_NUM_THREADS to 1 (CPU Adam on one core): share the cores instead",
        f"export OMP_NUM_THREADS=${{OMP_NUM_THREADS:-$(( $(nproc) > {ppn} ? $(nproc) / {ppn} : 1 ))}}",
    ]
    if job.cpu:
        lines += ["# CPU mode: DeepSpeed's CPU accelerator and gloo, whatever GPUs the node has",
                  "export DS_ACCELERATOR=cpu CUDA_VISIBLE_DEVICES="]
    else:
        lines += [f"export {name}=${{{name}:-{'0' if name == 'NCCL_NVLS_ENABLE' else '1'}}}"
                  for name in NCCL_ENV]
    lines += [
        "# sed, not head: head would close the pipe early and pipefail would end the job",
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)',
        f"MASTER_PORT=${{MASTER_PORT:-{RENDEZVOUS_PORT}}}",
        "export MASTER_ADDR MASTER_PORT",
    ]
    if setup:
        lines.append(setup)
    lines += ['echo "zlayout: verification on $SLURM_NNODES nodes, rendezvous $MASTER_ADDR:$MASTER_PORT"',
              f"srun --kill-on-bad-exit=1 --ntasks-per-node=1 bash -c {shlex.quote(step_cmd)}"]
    if job.options.restart_drill:
        resume_cmd = _torchrun(job, "resume", resume=True)
        lines += ['echo "zlayout: restart drill: every rank stopped; resuming from the checkpoint"',
                  f"srun --kill-on-bad-exit=1 --ntasks-per-node=1 bash -c {shlex.quote(resume_cmd)}"]
    lines.append('echo "zlayout: job finished"')
    return "\n".join(lines) + "\n"


def deepspeed_hostfile_command(job: Job, hostfile: Path) -> str:
    """DeepSpeed's own multi-node launcher (pdsh/ssh to every host in HOSTFILE)."""
    first_host = _first_host(hostfile)
    q = shlex.quote
    parts = ["deepspeed", "--hostfile", q(str(hostfile)), "--num_nodes", str(job.nodes),
             "--num_gpus", str(job.processes_per_node)]
    if first_host:
        parts += ["--master_addr", first_host]
    parts += ["--master_port", str(RENDEZVOUS_PORT), "--module", WORKER_MODULE,
              "--spec", q(str(job.spec_path)), "--out", q(str(job.out_dir / "result.json"))]
    return " ".join(parts)


def _first_host(hostfile: Path) -> str | None:
    try:
        for line in hostfile.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                return line.split()[0]
    except OSError:
        return None
    return None


def collect_result(out_dir: Path, returncode: int | None = None,
                   output_tail: list[str] | None = None, cancelled: bool = False) -> dict[str, Any]:
    """Fold the ranks' reports of a (SLURM or hostfile) job directory into the result."""
    spec = json.loads((out_dir / "spec.json").read_text())
    inp = PlanInput.model_validate(spec["inputs"])
    layout = Layout.model_validate(spec["layout"])
    world = inp.hardware.world
    reports = read_reports(out_dir / "result.json", world)
    drill = None
    if spec.get("save_at_step"):
        resumed = read_reports(out_dir / "resume.json", world)
        drill = restart_drill_result(reports, resumed, int(spec["save_at_step"]), None)
    result = build_result(inp, layout, reports, cpu=spec["device"] == "cpu",
                          returncode=returncode if returncode is not None else
                          (0 if len(reports) == world else None),
                          output_tail=output_tail or [], cancelled=cancelled,
                          expected_ranks=world, restart_drill=drill,
                          extra={"out_dir": str(out_dir), "steps": spec["steps"]})
    _write(result, out_dir)
    return result


def _write(result: dict[str, Any], out_dir: Path) -> None:
    path = out_dir / "result.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str))
    tmp.replace(path)
    result["result_path"] = str(path)


# --- following a job through SLURM -------------------------------------------------------

@dataclass(frozen=True)
class JobState:
    """One line of `scontrol show job -o`: what SLURM says about the job now."""

    job_id: str
    state: str  # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, OUT_OF_MEMORY, ...
    reason: str | None  # why it is pending, or why it ended (None when SLURM says None)
    exit_code: int | None  # the batch script's exit status
    exit_signal: int | None  # the signal that ended it (0: none)
    nodes: str | None

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES

    def describe(self) -> str:
        text = f"SLURM job {self.job_id} {self.state}"
        if self.state == "PENDING" and self.reason:
            text += f" ({self.reason})"
        elif self.state == "RUNNING" and self.nodes:
            text += f" on {self.nodes}"
        elif self.final:
            text += f", exit code {self.exit_code}:{self.exit_signal}"
            if self.reason:
                text += f", reason {self.reason}"
        return text


def _field(text: str, key: str) -> str | None:
    match = re.search(rf"(?:^|\s){re.escape(key)}=(\S*)", text)
    if not match or match.group(1) in ("", "None", "(null)"):
        return None
    return match.group(1)


def parse_job_state(job_id: str, text: str) -> JobState | None:
    """`scontrol show job -o JOB` output -> JobState; None when SLURM no longer knows the job."""
    state = _field(text, "JobState")
    if state is None:
        return None
    exit_code = exit_signal = None
    code = _field(text, "ExitCode")
    if code and re.fullmatch(r"\d+:\d+", code):
        exit_code, exit_signal = (int(x) for x in code.split(":"))
    return JobState(job_id=job_id, state=state.split("+")[0], reason=_field(text, "Reason"),
                    exit_code=exit_code, exit_signal=exit_signal, nodes=_field(text, "NodeList"))


def query_job(job_id: str) -> JobState | None:
    try:
        proc = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_job_state(job_id, proc.stdout) if proc.returncode == 0 else None


def sbatch(script: Path, extra_args: tuple[str, ...] = ()) -> str:
    """Submit; the job id. Raises SubmitError with SLURM's own reason in one line."""
    try:
        proc = subprocess.run(["sbatch", "--parsable", *extra_args, str(script)],
                              capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise SubmitError("sbatch is not installed here: run this on the cluster's login node, "
                          f"or drop --submit and run `sbatch {script}` there") from None
    except subprocess.TimeoutExpired:
        raise SubmitError("sbatch did not answer in 120 s: is slurmctld up? (`scontrol ping`)") from None
    job_id = proc.stdout.strip().split(";")[0]
    if proc.returncode != 0 or not job_id.isdigit():
        reason = "; ".join(re.sub(r"^sbatch: error: ", "", line).strip()
                           for line in (proc.stderr or proc.stdout).splitlines() if line.strip())
        raise SubmitError(f"sbatch refused the job: {reason or f'exit code {proc.returncode}'} "
                          "(check --partition, --account and --time-limit against `sinfo`)")
    return job_id


def scancel(job_id: str) -> None:
    try:
        subprocess.run(["scancel", job_id], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        pass


def submit_and_follow(job: Job, script: Path, on_line: Callable[[str], None],
                      cancel: threading.Event, poll_s: float = 2.0,
                      sbatch_args: tuple[str, ...] = ()) -> dict[str, Any]:
    """sbatch the script, stream its output file and SLURM's state changes until the job
    ends, collect the ranks' reports and fold SLURM's final state into the verdict.

    Setting `cancel` runs `scancel` and waits for SLURM to record the cancellation."""
    job_id = sbatch(script, sbatch_args)
    output = job.out_dir / f"slurm-{job_id}.out"
    on_line(f"zlayout: submitted SLURM job {job_id}; following {output}")
    tail: list[str] = []
    position = 0

    def drain() -> None:
        nonlocal position
        if not output.exists():
            return
        with output.open(errors="replace") as f:
            f.seek(position)
            chunk = f.read()
            position = f.tell()
        for raw in chunk.splitlines():
            line = normalise_line(_strip_node_prefix(raw))
            tail.append(line)
            on_line(line)

    last: JobState | None = None
    described = None
    lost_since: float | None = None
    cancelled_at: float | None = None
    while True:
        if cancel.is_set() and cancelled_at is None:
            on_line(f"zlayout: cancelling: scancel {job_id}")
            scancel(job_id)
            cancelled_at = time.monotonic()
        state = query_job(job_id)  # before the output, so RUNNING is said before its lines
        drain()
        if state is None:
            lost_since = lost_since or time.monotonic()
            if time.monotonic() - lost_since > LOST_JOB_S:  # purged, or slurmctld is gone
                on_line(f"zlayout: SLURM no longer reports job {job_id}; collecting what it left")
                break
        else:
            lost_since, last = None, state
            if state.describe() != described:
                described = state.describe()
                on_line(f"zlayout: {described}")
            if state.final:
                break
        if cancelled_at is not None and time.monotonic() - cancelled_at > CANCEL_WAIT_S:
            break
        time.sleep(poll_s)
    drain()
    result = collect_result(job.out_dir, returncode=last.exit_code if last and last.final else None,
                            output_tail=tail[-200:],
                            cancelled=cancel.is_set() or (last is not None and last.state == "CANCELLED"))
    result = fold_job_state(result, last, job_id, cancelled_by_user=cancel.is_set())
    _write(result, job.out_dir)
    return result


_STATE_CAUSES = {
    "TIMEOUT": "reached its time limit: raise --time-limit or verify fewer --steps",
    "NODE_FAIL": "lost a node of its allocation: resubmit (SLURM drains the failed node)",
    "BOOT_FAIL": "could not boot a node of its allocation: resubmit",
    "PREEMPTED": "was preempted by a higher-priority job: resubmit, or use a partition without preemption",
    "DEADLINE": "missed its deadline before it could run",
    "OUT_OF_MEMORY": "exceeded its host memory limit (SLURM's cgroup killed it): ask for more "
                     "memory (#SBATCH --mem) or choose a layout with a smaller host peak",
}


def fold_job_state(result: dict[str, Any], state: JobState | None, job_id: str,
                   cancelled_by_user: bool = False) -> dict[str, Any]:
    """SLURM's final word on the job joins the verdict: a job SLURM did not record as
    COMPLETED never passes, and the cause names SLURM's state and exit code."""
    result["slurm"] = {"job_id": job_id, "state": state.state if state else "UNKNOWN",
                       "reason": state.reason if state else None,
                       "exit_code": f"{state.exit_code}:{state.exit_signal}"
                       if state and state.exit_code is not None else None,
                       "nodes": state.nodes if state else None}
    drill = result.get("restart_drill")
    if result["status"] in OK_STATUSES and drill and not drill.get("resumed_ok"):
        result["status"], result["cause"] = "failed", "the restart drill did not resume where the run stopped"
    if state is None:
        if result["status"] in OK_STATUSES:
            return result
        result["cause"] = f"SLURM job {job_id} (state unknown: no longer in `scontrol show job`): {result['cause']}"
        return result
    if state.state == "COMPLETED":
        return result
    where = f"SLURM job {job_id} {state.state} (exit code {state.exit_code}:{state.exit_signal})"
    if state.state == "CANCELLED":
        result["status"] = "cancelled"
        result["cause"] = (f"{where}: stopped by the user (scancel)" if cancelled_by_user else
                           f"{where}: cancelled outside zlayout (scancel, or an administrator)")
    elif state.state == "OUT_OF_MEMORY":
        result["status"] = "does-not-fit"
        result["cause"] = f"{where}: {_STATE_CAUSES['OUT_OF_MEMORY']}"
    elif state.state in _STATE_CAUSES:
        result["status"] = "failed"
        result["cause"] = f"{where}: {_STATE_CAUSES[state.state]}"
    else:
        if result["status"] in OK_STATUSES:  # every rank reported, yet SLURM says it failed
            result["status"] = "failed"
        prior = result.get("cause")
        result["cause"] = f"{where}: {prior}" if prior else where
    return result


def _strip_node_prefix(line: str) -> str:
    return re.sub(r"^\d+: ", "", line)


if __name__ == "__main__":
    import sys

    print(json.dumps(collect_result(Path(sys.argv[1]).resolve()), default=str))
