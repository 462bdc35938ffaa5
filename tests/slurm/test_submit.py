"""`zlayout verify --slurm FILE --submit` against a real SLURM: CPU-mode verifications run
through sbatch -> srun -> torchrun -> DeepSpeed (gloo), followed through `scontrol show job`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = ["--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "128", "--seq", "32",
        "--micro-batch", "2", "--gpus-per-node", "2"]


def zlayout(*args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "zlayout", *args], capture_output=True,
                          text=True, env=env, timeout=timeout_s, cwd=REPO)


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_zero2_cpu_job_completes_with_two_ranks(slurm_cluster, tmp_path):
    script = tmp_path / "verify.sbatch"
    proc = zlayout("verify", *TINY, "--stage", "2", "--cpu", "--processes", "2", "--steps", "3",
                   "--out", str(tmp_path / "job"), "--slurm", str(script), "--submit", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    assert result["status"] == "cpu-ok", result["cause"]
    assert result["slurm"]["state"] == "COMPLETED" and result["slurm"]["exit_code"] == "0:0"
    assert result["measured"]["world"] == 2 and len(result["ranks"]) == 2
    assert result["measured"]["steps_run"] == [1, 2, 3]
    text = script.read_text()
    assert "--gpus-per-node" not in text and "--nproc_per_node 2" in text
    assert "export DS_ACCELERATOR=cpu CUDA_VISIBLE_DEVICES=" in text
    job_id = result["slurm"]["job_id"]
    assert f"SLURM job {job_id} RUNNING" in proc.stderr
    assert f"SLURM job {job_id} COMPLETED, exit code 0:0" in proc.stderr
    assert "JobState=COMPLETED" in slurm_cluster.job(job_id)  # SLURM's record agrees
