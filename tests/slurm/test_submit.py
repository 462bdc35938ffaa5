"""`zlayout verify --slurm FILE --submit` against a real SLURM: CPU-mode verifications run
through sbatch -> srun -> torchrun -> DeepSpeed (gloo), followed through `scontrol show job`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = ["--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "128", "--seq", "32",
        "--micro-batch", "2", "--gpus-per-node", "2"]


def zlayout(*args: str, timeout_s: float = 300,
            extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), **(extra_env or {})}
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


@pytest.mark.slow
def test_zero3_restart_drill_runs_a_second_srun(slurm_cluster, tmp_path):
    proc = zlayout("verify", *TINY, "--stage", "3", "--cpu", "--processes", "2", "--steps", "4",
                   "--restart-drill", "--out", str(tmp_path / "job"),
                   "--slurm", str(tmp_path / "v.sbatch"), "--submit", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    assert result["status"] == "cpu-ok" and result["slurm"]["state"] == "COMPLETED"
    drill = result["restart_drill"]
    assert drill["resumed_ok"] and drill["step_before"] == 2 and drill["step_after"] == 2
    assert drill["losses_compared"] == 2 * 2  # steps 3 and 4 on both ranks
    assert "restart drill: every rank stopped" in proc.stderr
    assert len(list((tmp_path / "job").glob("resume.json.rank*.json"))) == 2


@pytest.mark.slow
def test_a_layout_that_cannot_run_is_failed_with_slurms_state(slurm_cluster, tmp_path):
    # NVMe parameter offload into a directory that does not exist: every rank fails at start,
    # torchrun and srun exit non-zero, and SLURM records the job FAILED.
    proc = zlayout("verify", *TINY, "--stage", "3", "--offload-optimizer", "nvme", "--offload-param", "nvme",
                   "--nvme-path", str(tmp_path / "no-such-nvme"), "--cpu", "--processes", "2",
                   "--steps", "2", "--out", str(tmp_path / "job"),
                   "--slurm", str(tmp_path / "v.sbatch"), "--submit", "--json")
    assert proc.returncode == 1, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    job_id = result["slurm"]["job_id"]
    assert result["status"] == "failed"
    assert result["slurm"]["state"] == "FAILED" and result["slurm"]["exit_code"] != "0:0"
    assert result["cause"].startswith(f"SLURM job {job_id} FAILED (exit code ")
    assert "JobState=FAILED" in slurm_cluster.job(job_id)


def test_sbatch_refusal_is_one_line_with_slurms_reason(slurm_cluster, tmp_path):
    proc = zlayout("verify", *TINY, "--stage", "2", "--cpu", "--processes", "2",
                   "--partition", "no-such-partition", "--out", str(tmp_path / "job"),
                   "--slurm", str(tmp_path / "v.sbatch"), "--submit")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    error = [line for line in proc.stderr.splitlines() if line.startswith("zlayout: error:")]
    assert len(error) == 1 and "sbatch refused the job" in error[0]
    assert "invalid partition" in error[0].lower()


@pytest.mark.slow
def test_ctrl_c_cancels_the_slurm_job(slurm_cluster, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "MASTER_PORT": str(_free_port())}
    command = [sys.executable, "-m", "zlayout", "verify", *TINY, "--stage", "2", "--cpu",
               "--processes", "2", "--steps", "50", "--out", str(tmp_path / "job"),
               "--slurm", str(tmp_path / "v.sbatch"), "--submit", "--json"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=REPO)
    seen = []
    assert proc.stderr is not None
    for line in proc.stderr:  # wait until SLURM runs it, then press ctrl+c
        seen.append(line)
        if " RUNNING on " in line:
            proc.send_signal(signal.SIGINT)
            break
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, "".join(seen) + stderr
    result = last_json(stdout)
    job_id = result["slurm"]["job_id"]
    assert result["status"] == "cancelled" and result["slurm"]["state"] == "CANCELLED"
    assert f"scancel {job_id}" in stderr and "stopped by the user" in result["cause"]
    assert "JobState=CANCELLED" in slurm_cluster.job(job_id)


@pytest.mark.slow
def test_exported_profile_launch_slurm_sbatch_trains(slurm_cluster, tmp_path):
    """The profile's own launch_slurm.sbatch, as exported (it asks for 2 GPUs: the test
    cluster's node has 2 fake ones), runs the test's training script to completion."""
    profile = tmp_path / "profile"
    train = Path(__file__).with_name("train_tiny.py")
    proc = zlayout("export", *TINY, "--stage", "2", "--out", str(profile),
                   "--train-script", str(train))
    assert proc.returncode == 0, proc.stderr
    script = profile / "launch_slurm.sbatch"
    assert "#SBATCH --gpus-per-node=2" in script.read_text()
    reports = tmp_path / "reports"
    reports.mkdir()
    env = {**slurm_cluster.env(), "DS_ACCELERATOR": "cpu", "TINY_TRAIN_OUT": str(reports),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",  # torchrun
           "MASTER_PORT": str(_free_port())}
    submitted = subprocess.run(["sbatch", "--parsable", f"--output={tmp_path}/slurm-%j.out",
                                "launch_slurm.sbatch"], cwd=profile, env=env,
                               capture_output=True, text=True)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    line = slurm_cluster.wait_job(job_id)
    output = (tmp_path / f"slurm-{job_id}.out").read_text()
    assert "JobState=COMPLETED" in line and "ExitCode=0:0" in line, output[-3000:]
    ranks = sorted(json.loads(p.read_text())["rank"] for p in reports.glob("rank*.json"))
    assert ranks == [0, 1]
    report = json.loads((reports / "rank0.json").read_text())
    assert report["world"] == 2 and report["global_steps"] == 3 and report["zero_stage"] == 2
    assert "tiny-train rank 0: 3 steps" in output


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_update_profile_writes_the_jobs_result_into_the_profile(slurm_cluster, tmp_path):
    """--update-profile means with --slurm --submit what it means here: the job's verdict
    goes into PROFILE's [verification]."""
    from zlayout.profile import build_profile, load_profile
    from zlayout.profile.store import save_profile

    from ..verify.conftest import tiny_input
    from zlayout.spec import Layout

    path = save_profile(build_profile(tiny_input(gpus=2), Layout(stage=2)), tmp_path / "p")
    proc = zlayout("verify", str(path), "--cpu", "--processes", "2", "--steps", "2",
                   "--update-profile", "--out", str(tmp_path / "job"),
                   "--slurm", str(tmp_path / "v.sbatch"), "--submit", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert last_json(proc.stdout)["slurm"]["state"] == "COMPLETED"
    assert "verification written to" in proc.stderr
    assert load_profile(path).verification.status == "cpu-ok"
