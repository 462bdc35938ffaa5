"""Verification beyond one node: a SLURM batch script (srun + torchrun) and a deepspeed
--hostfile command that run the same worker, and the result collected from the ranks' files.

The job directory must be on a file system every node sees (the spec, the ranks' reports and
the restart drill's checkpoint live there). The script starts one torchrun per node through
srun; torchrun's c10d rendezvous meets on the first node of the allocation.
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


@dataclass(frozen=True)
class Job:
    inp: PlanInput
    layout: Layout
    options: VerifyOptions
    out_dir: Path
    spec_path: Path

    @property
    def nodes(self) -> int:
        return self.inp.hardware.nodes

    @property
    def gpus_per_node(self) -> int:
        return self.inp.hardware.gpus_per_node


def prepare_job(inp: PlanInput, layout: Layout, options: VerifyOptions) -> Job:
    """Write the run spec for the plan's full world (every node) into the job directory."""
    out_dir = (options.out_dir or default_out_dir(layout)).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    checkpoint_dir = (options.checkpoint_dir or out_dir / "checkpoint").resolve()
    options = replace(options, out_dir=out_dir, checkpoint_dir=checkpoint_dir)
    spec = run_spec(inp, layout, options, checkpoint_dir)
    spec_path = out_dir / "spec.json"
    spec_path.write_text(json.dumps(spec, indent=1))
    (out_dir / "ds_config.json").write_text(json.dumps(spec["ds_config"], indent=1))
    return Job(inp, layout, options, out_dir, spec_path)


def _torchrun(job: Job, out_name: str, resume: bool) -> str:
    q = shlex.quote
    parts = [q(job.options.python), "-m", "torch.distributed.run",
             "--nnodes", "$SLURM_NNODES", "--nproc_per_node", str(job.gpus_per_node),
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
    """The sbatch script: one srun task per node, each a torchrun of gpus_per_node workers."""
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name=zlayout-verify-{job.layout.key}",
             f"#SBATCH --nodes={job.nodes}",
             "#SBATCH --ntasks-per-node=1",
             f"#SBATCH --gpus-per-node={job.gpus_per_node}",
             f"#SBATCH --time={time_limit}",
             f"#SBATCH --output={job.out_dir}/slurm-%j.out"]
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    if account:
        lines.append(f"#SBATCH --account={account}")
    step_cmd = _torchrun(job, "result", resume=False)
    lines += [
        "# Written by `zlayout verify --slurm`: runs the planned layout for a few steps on every",
        "# node and leaves each rank's report beside the spec. The job directory must be on a",
        "# file system every node sees. Collect the result with `zlayout verify --submit` or",
        f"# python -m zlayout.verify.slurm {job.out_dir}",
        "set -euo pipefail",
        f"cd {shlex.quote(str(Path.cwd()))}",
        "export PYTHONUNBUFFERED=1",
        f"export PYTHONPATH={shlex.quote(str(Path(__file__).resolve().parents[2]))}"
        "${PYTHONPATH:+:$PYTHONPATH}",
        "# torchrun would pin OMP_NUM_THREADS to 1 (CPU Adam on one core): share the cores instead",
        f"export OMP_NUM_THREADS=${{OMP_NUM_THREADS:-$(( $(nproc) > {job.gpus_per_node} "
        f"? $(nproc) / {job.gpus_per_node} : 1 ))}}",
        *(f"export {name}=${{{name}:-{'0' if name == 'NCCL_NVLS_ENABLE' else '1'}}}"
          for name in NCCL_ENV),
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"MASTER_PORT={RENDEZVOUS_PORT}",
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
             "--num_gpus", str(job.gpus_per_node)]
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
    (out_dir / "result.json").write_text(json.dumps(result, indent=1, default=str))
    result["result_path"] = str(out_dir / "result.json")
    return result


def submit_and_follow(job: Job, script: Path, on_line: Callable[[str], None],
                      cancel: threading.Event, poll_s: float = 2.0) -> dict[str, Any]:
    """sbatch the script, stream its output file until the job leaves the queue, collect."""
    proc = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"sbatch failed: {proc.stderr.strip() or proc.stdout.strip()}")
    job_id = proc.stdout.strip().split(";")[0]
    on_line(f"zlayout: submitted SLURM job {job_id}; following {job.out_dir}/slurm-{job_id}.out")
    output = job.out_dir / f"slurm-{job_id}.out"
    tail: list[str] = []
    position = 0
    while True:
        if cancel.is_set():
            subprocess.run(["scancel", job_id], capture_output=True)
            break
        if output.exists():
            with output.open(errors="replace") as f:
                f.seek(position)
                chunk = f.read()
                position = f.tell()
            for raw in chunk.splitlines():
                line = normalise_line(_strip_node_prefix(raw))
                tail.append(line)
                on_line(line)
        if not _in_queue(job_id):
            break
        time.sleep(poll_s)
    return collect_result(job.out_dir, output_tail=tail[-200:], cancelled=cancel.is_set())


def _strip_node_prefix(line: str) -> str:
    return re.sub(r"^\d+: ", "", line)


def _in_queue(job_id: str) -> bool:
    proc = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True)
    return proc.returncode == 0 and bool(proc.stdout.strip())


if __name__ == "__main__":
    import sys

    print(json.dumps(collect_result(Path(sys.argv[1]).resolve()), default=str))
