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
import math
import re
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from zlayout.core.memory import estimate_memory
from zlayout.spec import Layout, PlanInput
from zlayout.verify import guard
from zlayout.verify.node import SHUTDOWN_NOTE
from zlayout.verify.launcher import (WORKER_MODULE, VerifyOptions, default_out_dir, free_port,
                                     normalise_line, read_reports, run_spec)
from zlayout.verify.options import LaunchError
from zlayout.verify.result import build_result, restart_drill_result

NODE_MODULE = "zlayout.verify.node"

NCCL_ENV = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")
# SLURM job states after which the job never runs again (squeue's long names).
FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                "PREEMPTED", "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED")
CANCEL_WAIT_S = 60.0  # after scancel, how long to wait for SLURM to record CANCELLED
LOST_JOB_S = 60.0  # how long `scontrol` may not know the job (purged, controller restarting)
CONTROLLER_RETRY_MAX_S = 30.0  # the longest wait between two questions to an unreachable slurmctld
OK_STATUSES = ("validated", "cpu-ok")
JOB_EXIT = "job-exit"  # the batch script's own exit status, written by its EXIT trap
JOB_RECORD = "job.json"  # the submitted job's id, for re-collection
# A chosen-free port on the node the batch script runs on (SLURM runs it on the allocation's
# first node, where the rendezvous meets): each job and each step its own, never 29500 for
# all (two jobs on one node joined each other's store).
FREE_PORT = 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'
HOST_MEMORY_MARGIN = 1.2  # --mem over the plan's host peak: the plan's error, page cache, srun


class SubmitError(Exception):
    """sbatch refused the job or is missing (message says what to change)."""


@dataclass(frozen=True)
class Resources:
    """What the batch script asks SLURM for, beyond nodes and GPUs (validated by `checked`)."""

    partition: str | None = None
    account: str | None = None
    time_limit: str = "00:30:00"
    cpus_per_task: int | None = None  # None: the whole node (#SBATCH --exclusive)
    mem: str | None = None  # None: from the plan's host peak

    def checked(self, job_cpu: bool = False, processes_per_node: int | None = None) -> "Resources":
        """Refuse (LaunchError, one line) what would break the script or cannot run."""
        if self.partition is not None:
            guard.slurm_name("--partition", self.partition)
        if self.account is not None:
            guard.slurm_name("--account", self.account)
        guard.time_limit(self.time_limit)
        mem = guard.memory(self.mem) if self.mem is not None else None
        if self.cpus_per_task is not None:
            if self.cpus_per_task < 1:
                raise LaunchError(f"--cpus-per-task {self.cpus_per_task}: give 1 or more (or leave "
                                  "it out for the whole node)")
            if job_cpu and processes_per_node and processes_per_node > self.cpus_per_task:
                raise LaunchError(f"--cpus-per-task {self.cpus_per_task} for {processes_per_node} "
                                  "CPU processes per node: CPU mode runs one process per core; use "
                                  f"--cpus-per-task {processes_per_node} or more")
        return replace(self, mem=mem)


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
    the job has the plan's shape). The directories are refused where they hold files zlayout
    did not write (guard.claim_dir); the values that reach the script are checked here."""
    guard.path_value("--python", options.python)
    out_dir = guard.claim_dir("--out", options.out_dir or default_out_dir(layout))
    checkpoint_dir = options.checkpoint_dir or out_dir / "checkpoint"
    if options.restart_drill:
        checkpoint_dir = guard.claim_dir("--checkpoint-dir", checkpoint_dir, names=())
    checkpoint_dir = guard.path_value("--checkpoint-dir", Path(checkpoint_dir).resolve())
    guard.path_value("the current directory", Path.cwd())
    options = replace(options, out_dir=out_dir, checkpoint_dir=checkpoint_dir)
    run_inp = input_for_job(inp, options.processes or inp.hardware.gpus_per_node)
    spec = run_spec(run_inp, layout, options, checkpoint_dir)
    spec_path = out_dir / "spec.json"
    spec_path.write_text(json.dumps(spec, indent=1))
    (out_dir / "ds_config.json").write_text(json.dumps(spec["ds_config"], indent=1))
    # A resubmission in the same directory must not read an earlier job's ranks or exit status.
    for stale in [*out_dir.glob("result.json.rank*.json"), *out_dir.glob("resume.json.rank*.json"),
                  out_dir / JOB_EXIT, out_dir / JOB_RECORD]:
        stale.unlink(missing_ok=True)
    return Job(run_inp, layout, options, out_dir, spec_path)


def job_memory_mib(job: Job) -> int:
    """Host memory per node the job asks for: the plan's host peak per node (in CPU mode with
    the ranks' device memory, which is host memory there), with HOST_MEMORY_MARGIN."""
    mem = estimate_memory(job.inp, job.layout)
    need = mem.host_peak_bytes + (job.processes_per_node * mem.gpu_peak_allocated_bytes
                                  if job.cpu else 0)
    return max(1024, math.ceil(need * HOST_MEMORY_MARGIN / 2**20))


def _node_step(job: Job, out_name: str, resume: bool) -> str:
    """One node's torchrun, started through `zlayout.verify.node exec`: the ranks get the
    environment the local path gives them."""
    q = shlex.quote
    python = q(job.options.python)
    parts = [python, "-P", "-m", NODE_MODULE, "exec", "--spec", q(str(job.spec_path)),
             "--processes", str(job.processes_per_node), "--",
             python, "-P", "-m", "torch.distributed.run",
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
                 time_limit: str = "00:30:00", setup: str = "",
                 resources: Resources | None = None) -> str:
    """The sbatch script: a preflight step on every node, then one srun task per node, each a
    torchrun of processes_per_node workers (and a second for the restart drill).

    It asks for what the run needs: the whole node (--exclusive) or --cpus-per-task, host
    memory from the plan, GPUs only in GPU mode (a cluster without a `gpu` GRES refuses the
    request). Every value from the command line is checked (Resources.checked) and quoted."""
    res = (resources or Resources(partition, account, time_limit)).checked(
        job.cpu, job.processes_per_node)
    q = shlex.quote
    ppn = job.processes_per_node
    mode = "CPU processes (gloo)" if job.cpu else "GPUs"
    mem = res.mem or f"{job_memory_mib(job)}M"
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name=zlayout-verify-{job.layout.key}",
             f"#SBATCH --nodes={job.nodes}",
             "#SBATCH --ntasks-per-node=1"]
    if res.cpus_per_task is None:
        lines.append("#SBATCH --exclusive")
    else:
        lines.append(f"#SBATCH --cpus-per-task={res.cpus_per_task}")
    lines.append(f"#SBATCH --mem={mem}")
    if not job.cpu:
        lines.append(f"#SBATCH --gpus-per-node={ppn}")
    lines += [f"#SBATCH --time={res.time_limit}",
              f"#SBATCH --output={q(str(job.out_dir / 'slurm-%j.out'))}"]
    if res.partition:
        lines.append(f"#SBATCH --partition={res.partition}")
    if res.account:
        lines.append(f"#SBATCH --account={res.account}")
    # srun steps get only what they ask for (SLURM 21.08+): the whole node, or the task's CPUs.
    step_cpus = "--whole" if res.cpus_per_task is None else f"--cpus-per-task={res.cpus_per_task}"
    srun = f"srun --kill-on-bad-exit=1 --ntasks-per-node=1 {step_cpus}"
    python = q(job.options.python)
    exit_file = q(str(job.out_dir / JOB_EXIT))

    def settled(out_name: str) -> str:
        return (f"{python} -P -m {NODE_MODULE} settled --spec {q(str(job.spec_path))} "
                f"--out {q(str(job.out_dir / f'{out_name}.json'))}")

    lines += [
        f"{guard.SCRIPT_MARKER}: runs the planned layout for a few steps on every",
        f"# node ({job.nodes} x {ppn} {mode}) and leaves each rank's report beside the spec. The job",
        "# directory must be on a file system every node sees. Collect the result with",
        f"# `zlayout verify --submit` or: python -m zlayout.verify.slurm {q(str(job.out_dir))}",
        "set -euo pipefail",
        "# the script's own exit status, for a verdict when SLURM's controller cannot answer",
        f"trap {q(f'echo $? > {exit_file}')} EXIT",
        f"cd {q(str(Path.cwd()))}",
        "# PYTHONSAFEPATH (Python's -P): a zlayout/ folder in this directory must not shadow zlayout",
        "export PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1 PYTHONWARNINGS=${PYTHONWARNINGS:-ignore::FutureWarning}",
        f"export PYTHONPATH={q(str(Path(__file__).resolve().parents[2]))}"
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
        "export MASTER_ADDR",
    ]
    if setup:
        lines.append(setup)
    lines += [
        "# preflight on every node before any rank: stale op-build locks, the ops built once,",
        "# TORCH_CUDA_ARCH_LIST, GPUs, memory, directories (the local path's checks)",
        f"{srun} {python} -P -m {NODE_MODULE} preflight --spec {q(str(job.spec_path))}",
        f"export MASTER_PORT=$({python} -c {q(FREE_PORT)})",
        'echo "zlayout: verification on $SLURM_NNODES nodes, rendezvous $MASTER_ADDR:$MASTER_PORT"',
        "# a step failed only by a rank aborting at shutdown, after every rank's figures: go on",
        f"{srun} bash -c {q(_node_step(job, 'result', resume=False))} || {settled('result')}"]
    if job.options.restart_drill:
        lines += [f"export MASTER_PORT=$({python} -c {q(FREE_PORT)})",
                  'echo "zlayout: restart drill: every rank stopped; resuming from the checkpoint, '
                  'rendezvous $MASTER_ADDR:$MASTER_PORT"',
                  f"{srun} bash -c {q(_node_step(job, 'resume', resume=True))} || {settled('resume')}"]
    lines.append('echo "zlayout: job finished"')
    return "\n".join(lines) + "\n"


def deepspeed_hostfile_command(job: Job, hostfile: Path) -> str:
    """DeepSpeed's own multi-node launcher (pdsh/ssh to every host in HOSTFILE), quoted: the
    first host comes from a file and is shown to be pasted into a shell."""
    first_host = _first_host(hostfile)
    q = shlex.quote
    parts = ["deepspeed", "--hostfile", q(str(hostfile)), "--num_nodes", str(job.nodes),
             "--num_gpus", str(job.processes_per_node)]
    if first_host:
        parts += ["--master_addr", q(first_host)]
    port = free_port()  # deepspeed's launcher needs one named: one free now, not always 29500
    parts += ["--master_port", str(port), "--module", WORKER_MODULE,
              "--spec", q(str(job.spec_path)), "--out", q(str(job.out_dir / "result.json"))]
    return " ".join(parts)


def _first_host(hostfile: Path) -> str | None:
    try:
        for line in hostfile.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                host = line.split()[0]
                guard.no_control_characters(f"--hostfile {hostfile}: host", host,
                                            "fix the hostfile's first line")
                return host
    except OSError:
        return None
    return None


def rank_core_warnings(reports: list[dict[str, Any]]) -> list[str]:
    """Ranks that shared fewer cores than there were ranks on their node: SLURM pinned the job
    to what it asked for (NumCPUs=1 pinned 2 ranks and the CPU optimizer to one core)."""
    per_host: dict[str, list[dict[str, Any]]] = {}
    for report in reports:
        per_host.setdefault(str(report.get("hostname")), []).append(report)
    warnings = []
    for host, ranks in sorted(per_host.items()):
        cores = min((r.get("host_cores_usable") or 0 for r in ranks), default=0)
        if cores and cores < len(ranks):
            warnings.append(f"{len(ranks)} ranks on {host} ran on {cores} core(s): step time and "
                            "the CPU optimizer are not what the run will see; ask for the whole "
                            "node (leave out --cpus-per-task) or --cpus-per-task "
                            f"{len(ranks)} or more")
    return warnings


def collect_result(out_dir: Path, returncode: int | None = None,
                   output_tail: list[str] | None = None, cancelled: bool = False,
                   write_to: Path | None = None) -> dict[str, Any]:
    """Fold the ranks' reports of a (SLURM or hostfile) job directory into the result, written
    to `write_to` (default OUT/result.json). Without a return code, the batch script's own
    (JOB_EXIT) stands in, then whether every rank reported."""
    spec = json.loads((out_dir / "spec.json").read_text())
    inp = PlanInput.model_validate(spec["inputs"])
    layout = Layout.model_validate(spec["layout"])
    world = inp.hardware.world
    reports = read_reports(out_dir / "result.json", world)
    drill = None
    if spec.get("save_at_step"):
        resumed = read_reports(out_dir / "resume.json", world)
        drill = restart_drill_result(reports, resumed, int(spec["save_at_step"]), None)
    if returncode is None:
        returncode = job_exit_status(out_dir)
    if returncode is None and len(reports) == world:
        returncode = 0
    warnings = rank_core_warnings(reports)
    if any(SHUTDOWN_NOTE in line for line in output_tail or []):
        warnings.append(f"{SHUTDOWN_NOTE}: the figures stand; see the job's output")
    result = build_result(inp, layout, reports, cpu=spec["device"] == "cpu",
                          returncode=returncode, output_tail=output_tail or [],
                          cancelled=cancelled, expected_ranks=world, restart_drill=drill,
                          extra={"out_dir": str(out_dir), "steps": spec["steps"],
                                 "warnings": warnings})
    _write(result, write_to or out_dir / "result.json")
    return result


def job_exit_status(out_dir: Path) -> int | None:
    """The batch script's exit status from its EXIT trap; None before it ended."""
    try:
        text = (out_dir / JOB_EXIT).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _write(result: dict[str, Any], path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
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
    partition: str | None = None

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
                    exit_code=exit_code, exit_signal=exit_signal, nodes=_field(text, "NodeList"),
                    partition=_field(text, "Partition"))


class ControllerUnreachable(Exception):
    """scontrol could not ask slurmctld (down, restarting, or the network): ask again later."""


def query_job(job_id: str) -> JobState | None:
    """SLURM's record of the job; None when SLURM no longer knows it. Raises
    ControllerUnreachable when scontrol itself fails (the controller may be back soon)."""
    try:
        proc = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True,
                              text=True, timeout=30)
    except subprocess.TimeoutExpired:
        raise ControllerUnreachable("scontrol did not answer in 30 s") from None
    except OSError as exc:
        raise ControllerUnreachable(f"scontrol: {exc.strerror or exc}") from None
    if proc.returncode == 0:
        return parse_job_state(job_id, proc.stdout)
    message = " ".join((proc.stderr or proc.stdout).split())
    if "invalid job id" in message.lower():
        return None
    raise ControllerUnreachable(message[:200] or f"scontrol exit code {proc.returncode}")


# Pending reasons SLURM never clears by itself: the job waits until its time limit would
# (never) fit, or for nodes the partition does not have.
HOPELESS_PENDING = {
    "PartitionTimeLimit": "--time-limit is above the partition's MaxTime: lower --time-limit "
                          "(sinfo -o '%P %l' lists each partition's limit)",
    "PartitionNodeLimit": "the job asks for more nodes than the partition allows: verify on "
                          "fewer nodes (--nodes) or pick another --partition",
    "PartitionConfig": "the partition cannot run the job as asked (its time limit, nodes, GPUs, "
                       "CPUs or memory): check --time-limit, --partition, --cpus-per-task and "
                       "--mem against `sinfo -o '%P %l %D %c %m %G'`",
    "AccountNotAllowed": "the account may not use this partition: pick another --account or "
                         "--partition",
    "InvalidAccount": "the account is not valid: check --account (`sacctmgr show assoc`)",
    "InvalidQOS": "the job's QOS is not valid for this account or partition",
}
_DOWN_NODE_STATES = ("down", "drain", "drained", "draining", "fail", "failing", "maint",
                     "not_responding", "inval", "future", "unknown")


def partition_nodes_all_down(partition: str | None) -> bool:
    """Whether every node of the partition is down, drained or failed (sinfo)."""
    command = ["sinfo", "-h", "-N", "-o", "%T"] + (["-p", partition] if partition else [])
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    states = [line.strip().rstrip("*~#$@+-!%").lower() for line in proc.stdout.splitlines()
              if line.strip()]
    return proc.returncode == 0 and bool(states) and all(
        any(state.startswith(down) for down in _DOWN_NODE_STATES) for state in states)


def hopeless_pending(state: JobState) -> str | None:
    """Why a PENDING job will never start, or None while it may."""
    if state.state != "PENDING" or not state.reason:
        return None
    reason = state.reason.split(",")[0]
    if reason in HOPELESS_PENDING:
        return HOPELESS_PENDING[reason]
    if reason == "ReqNodeNotAvail" and partition_nodes_all_down(state.partition):
        return ("every node of the partition is down or drained (sinfo -R says why): pick "
                "another --partition, or ask the administrators")
    return None


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
                      sbatch_args: tuple[str, ...] = (),
                      timeout_s: float | None = None) -> dict[str, Any]:
    """sbatch the script, stream its output file and SLURM's state changes until the job
    ends, collect the ranks' reports and fold SLURM's final state into the verdict.

    `timeout_s` covers the whole job, pending included: past it the job is cancelled. A job
    pending for a reason SLURM never clears (HOPELESS_PENDING) is cancelled at once. Setting
    `cancel` runs `scancel` and waits for SLURM to record the cancellation. While scontrol
    cannot reach the controller the question is asked again with backoff (up to
    CONTROLLER_RETRY_MAX_S apart); the job's own exit file (JOB_EXIT) says when it ended."""
    started = time.monotonic()
    job_id = sbatch(script, sbatch_args)
    (job.out_dir / JOB_RECORD).write_text(json.dumps({"job_id": job_id, "script": str(script)}))
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
    unreachable_since: float | None = None
    cancelled_at: float | None = None
    stopped: str | None = None  # why zlayout cancelled the job (time-out, hopeless pending)
    wait_s = poll_s
    while True:
        if cancel.is_set() and cancelled_at is None:
            on_line(f"zlayout: cancelling: scancel {job_id}")
            scancel(job_id)
            cancelled_at = time.monotonic()
        try:
            state = query_job(job_id)  # before the output, so RUNNING is said before its lines
        except ControllerUnreachable as exc:
            drain()
            if unreachable_since is None:
                unreachable_since = time.monotonic()
                on_line(f"zlayout: SLURM's controller does not answer ({exc}); asking again, "
                        "and reading the job's own files meanwhile")
            wait_s = min(CONTROLLER_RETRY_MAX_S, wait_s * 2)
            if job_exit_status(job.out_dir) is not None:
                on_line(f"zlayout: job {job_id} ended (its exit file says "
                        f"{job_exit_status(job.out_dir)}); the verdict comes from its files")
                last = None  # a RUNNING seen before is not how it ended
                break
        else:
            if unreachable_since is not None:
                on_line(f"zlayout: SLURM's controller answers again after "
                        f"{time.monotonic() - unreachable_since:.0f} s")
                unreachable_since, wait_s = None, poll_s
            drain()
            if state is None:
                lost_since = lost_since or time.monotonic()
                if time.monotonic() - lost_since > LOST_JOB_S or job_exit_status(job.out_dir) is not None:
                    on_line(f"zlayout: SLURM no longer reports job {job_id}; collecting what it left")
                    last = None
                    break
            else:
                lost_since, last = None, state
                if state.describe() != described:
                    described = state.describe()
                    on_line(f"zlayout: {described}")
                if state.final:
                    break
                hopeless = hopeless_pending(state) if stopped is None else None
                if hopeless and cancelled_at is None:
                    stopped = f"SLURM job {job_id} PENDING ({state.reason}) will never start: {hopeless}"
                    on_line(f"zlayout: {stopped}; scancel {job_id}")
                    scancel(job_id)
                    cancelled_at = time.monotonic()
        if (timeout_s is not None and cancelled_at is None
                and time.monotonic() - started > timeout_s):
            where = (f"still PENDING ({last.reason})" if last and last.state == "PENDING"
                     else "not finished")
            stopped = (f"SLURM job {job_id} {where} after the {timeout_s:g} s --timeout, which "
                       "covers pending too: cancelled; raise --timeout or pick a less busy --partition")
            on_line(f"zlayout: {stopped}; scancel {job_id}")
            scancel(job_id)
            cancelled_at = time.monotonic()
        if cancelled_at is not None and time.monotonic() - cancelled_at > CANCEL_WAIT_S:
            break
        time.sleep(wait_s)
    drain()
    result = collect_result(job.out_dir, returncode=last.exit_code if last and last.final else None,
                            output_tail=tail[-200:],
                            cancelled=cancel.is_set() or (last is not None and last.state == "CANCELLED"))
    result = fold_job_state(result, last if last and last.final else None, job_id,
                            cancelled_by_user=cancel.is_set(), stopped=stopped,
                            job_exit=job_exit_status(job.out_dir))
    _write(result, job.out_dir / "result.json")
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
                   cancelled_by_user: bool = False, stopped: str | None = None,
                   job_exit: int | None = None) -> dict[str, Any]:
    """SLURM's final word on the job joins the verdict: a job SLURM did not record as
    COMPLETED never passes, and the cause names SLURM's state and exit code. `state` None:
    SLURM could not say (controller unreachable, job purged); the job's own files decide,
    and the cause says so. `stopped`: zlayout cancelled the job, and why (one line)."""
    result["slurm"] = {"job_id": job_id, "state": state.state if state else "UNKNOWN",
                       "reason": state.reason if state else None,
                       "exit_code": f"{state.exit_code}:{state.exit_signal}"
                       if state and state.exit_code is not None else None,
                       "nodes": state.nodes if state else None}
    drill = result.get("restart_drill")
    if result["status"] in OK_STATUSES and drill and not drill.get("resumed_ok"):
        result["status"], result["cause"] = "failed", "the restart drill did not resume where the run stopped"
    if stopped is not None:
        result["status"], result["cause"] = "failed", stopped
        return result
    if state is None:
        own = (f"the batch script exited {job_exit}" if job_exit is not None
               else "the batch script left no exit status")
        note = (f"SLURM job {job_id}: SLURM could not say how it ended (controller unreachable "
                f"or the job purged); verdict from the job's own files ({own})")
        if result["status"] in OK_STATUSES:
            if job_exit not in (0, None):
                result["status"] = "failed"
                result["cause"] = note
            else:
                result.setdefault("warnings", []).append(note)
            return result
        result["cause"] = f"{note}: {result['cause']}"
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
        prior = preflight_failure(result.get("output_tail") or []) or result.get("cause")
        result["cause"] = f"{where}: {prior}" if prior else where
    return result


def preflight_failure(tail: list[str]) -> str | None:
    """The node preflight's FAIL lines, where the job stopped there."""
    fails = [line.split("zlayout: ", 1)[-1] for line in tail if "preflight FAIL" in line]
    return "; ".join(fails[:3]) if fails else None


def recollect(out_dir: Path, now: str | None = None) -> tuple[dict[str, Any], Path]:
    """Collect a finished job's result again (`python -m zlayout.verify.slurm DIR`): SLURM's
    recorded state folds in as at the end of `--submit`, and the result goes to a new file
    beside the old one (result.json stays as it was). Raises LaunchError for a job that is
    still pending or running, or a directory that is not a verification's."""
    out_dir = out_dir.resolve()
    if not (out_dir / "spec.json").is_file() or not guard.ours(out_dir):
        raise LaunchError(f"{guard.shown(out_dir)} is not a zlayout verification directory "
                          "(no spec.json and marker): give the --out DIR of a SLURM verification")
    job_id = _recorded_job_id(out_dir)
    state = None
    if job_id is not None:
        try:
            state = query_job(job_id)
        except ControllerUnreachable:
            state = None
        if state is not None and not state.final:
            raise LaunchError(f"SLURM job {job_id} is {state.state}: collect it after it ends "
                              f"(squeue -j {job_id})")
    stamp = now or time.strftime("%Y%m%d-%H%M%S")
    path = out_dir / f"result-recollected-{stamp}.json"
    tail: list[str] = []
    if job_id is not None and (out_dir / f"slurm-{job_id}.out").exists():
        tail = [normalise_line(_strip_node_prefix(line)) for line in
                (out_dir / f"slurm-{job_id}.out").read_text(errors="replace").splitlines()[-200:]]
    result = collect_result(out_dir, returncode=state.exit_code if state else None,
                            output_tail=tail, cancelled=bool(state and state.state == "CANCELLED"),
                            write_to=path)
    if job_id is not None:
        result = fold_job_state(result, state, job_id, job_exit=job_exit_status(out_dir))
    _write(result, path)
    return result, path


def _recorded_job_id(out_dir: Path) -> str | None:
    try:
        job_id = str(json.loads((out_dir / JOB_RECORD).read_text())["job_id"])
        return job_id if job_id.isdigit() else None
    except (OSError, ValueError, KeyError, TypeError):
        pass
    outputs = sorted(out_dir.glob("slurm-*.out"), key=lambda p: p.stat().st_mtime)
    ids = [p.stem.split("-", 1)[1] for p in outputs]
    ids = [i for i in ids if i.isdigit()]
    return ids[-1] if ids else None


def _strip_node_prefix(line: str) -> str:
    return re.sub(r"^\d+: ", "", line)


def main(argv: list[str] | None = None) -> int:
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m zlayout.verify.slurm DIR  (the --out DIR of a SLURM verification)",
              file=sys.stderr)
        return 2
    try:
        result, path = recollect(Path(args[0]))
    except LaunchError as exc:
        print(f"zlayout: error: {exc}", file=sys.stderr)
        return 2
    print(f"zlayout: result written to {path} (the earlier result.json is kept)", file=sys.stderr)
    print(json.dumps(result, default=str))
    return 0 if result["status"] in OK_STATUSES else 1


if __name__ == "__main__":
    raise SystemExit(main())
