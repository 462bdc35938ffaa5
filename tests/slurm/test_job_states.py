"""SLURM's job record (`scontrol show job -o`) read into a state, and every final state
folded into the verdict: the states a CPU test cluster cannot produce on demand (timeout,
node failure, out of memory by cgroup, preemption) from lines in SLURM 22.05's format."""

from __future__ import annotations

import json
import subprocess

import pytest

from zlayout.spec import Layout
from zlayout.verify import slurm
from zlayout.verify.launcher import VerifyOptions

from ..verify.conftest import tiny_input

LINE = ("JobId=41 JobName=zlayout-verify-z2 UserId=root(0) GroupId=root(0) MCS_label=N/A "
        "Priority=4294901757 Nice=0 Account=(null) QOS=(null) JobState={state} Reason={reason} "
        "Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode={code} "
        "RunTime=00:00:41 TimeLimit=00:30:00 NodeList={nodes} BatchHost=vm NumNodes=1 "
        "Command=/tmp/a dir/v.sbatch WorkDir=/tmp/a dir")


def line(state: str, reason: str = "None", code: str = "0:0", nodes: str = "vm") -> str:
    return LINE.format(state=state, reason=reason, code=code, nodes=nodes)


def test_parse_pending_running_and_final_states():
    pending = slurm.parse_job_state("41", line("PENDING", "Resources", nodes="(null)"))
    assert pending.state == "PENDING" and not pending.final and pending.nodes is None
    assert pending.describe() == "SLURM job 41 PENDING (Resources)"
    running = slurm.parse_job_state("41", line("RUNNING"))
    assert running.describe() == "SLURM job 41 RUNNING on vm"
    failed = slurm.parse_job_state("41", line("FAILED", "NonZeroExitCode", "1:0"))
    assert failed.final and failed.exit_code == 1 and failed.exit_signal == 0
    assert failed.describe() == "SLURM job 41 FAILED, exit code 1:0, reason NonZeroExitCode"
    killed = slurm.parse_job_state("41", line("CANCELLED+", code="0:15"))
    assert killed.state == "CANCELLED" and killed.exit_signal == 15


def test_a_job_slurm_has_forgotten_is_none():
    assert slurm.parse_job_state("41", "slurm_load_jobs error: Invalid job id specified") is None
    assert slurm.parse_job_state("41", "") is None


@pytest.fixture
def finished_job(tmp_path):
    """A job directory whose two ranks both reported: what the result says before SLURM's word."""
    job = slurm.prepare_job(tiny_input(gpus=2), Layout(stage=2),
                            VerifyOptions(out_dir=tmp_path, cpu=True, processes=2, steps=2))
    for rank in range(2):
        (tmp_path / f"result.json.rank{rank}.json").write_text(json.dumps({
            "rank": rank, "hostname": "vm", "status": "ok", "phase": "done",
            "host_maxrss_bytes": 1, "steps_run": [1, 2], "losses": [5.0, 4.9],
            "step_s": [0.1, 0.1], "peak_allocated_bytes": [None, None]}))
    return job


@pytest.mark.parametrize("state, code, status, words", [
    ("COMPLETED", "0:0", "cpu-ok", None),
    ("TIMEOUT", "0:15", "failed", "raise --time-limit"),
    ("NODE_FAIL", "0:0", "failed", "lost a node"),
    ("OUT_OF_MEMORY", "0:125", "does-not-fit", "host memory limit"),
    ("PREEMPTED", "0:15", "failed", "preempted"),
    ("FAILED", "1:0", "failed", None),
    ("CANCELLED", "0:15", "cancelled", "outside zlayout"),
])
def test_slurms_final_state_decides_with_the_ranks(finished_job, state, code, status, words):
    result = slurm.collect_result(finished_job.out_dir, returncode=int(code.split(":")[0]))
    folded = slurm.fold_job_state(result, slurm.parse_job_state("41", line(state, code=code)), "41")
    assert folded["status"] == status
    assert folded["slurm"] == {"job_id": "41", "state": state, "reason": None,
                               "exit_code": code, "nodes": "vm"}
    if state != "COMPLETED":
        assert folded["cause"].startswith(f"SLURM job 41 {state} (exit code {code})")
    if words:
        assert words in folded["cause"]


def test_cancel_by_the_user_is_said_so(finished_job):
    result = slurm.collect_result(finished_job.out_dir, cancelled=True)
    folded = slurm.fold_job_state(result, slurm.parse_job_state("41", line("CANCELLED", code="0:15")),
                                  "41", cancelled_by_user=True)
    assert folded["status"] == "cancelled" and "stopped by the user (scancel)" in folded["cause"]


def test_cpu_ok_with_a_failed_restart_drill_does_not_pass(tmp_path):
    job = slurm.prepare_job(tiny_input(gpus=1), Layout(stage=1),
                            VerifyOptions(out_dir=tmp_path, cpu=True, steps=3, restart_drill=True))
    (tmp_path / "result.json.rank0.json").write_text(json.dumps({
        "rank": 0, "hostname": "vm", "status": "ok", "phase": "done", "host_maxrss_bytes": 1,
        "steps_run": [1, 2, 3], "losses": [5.0, 4.9, 4.8], "step_s": [0.1] * 3,
        "peak_allocated_bytes": [None] * 3}))
    result = slurm.collect_result(job.out_dir)  # no resume reports: the second srun never ran
    folded = slurm.fold_job_state(result, slurm.parse_job_state("41", line("COMPLETED")), "41")
    assert folded["status"] == "failed" and "restart drill" in folded["cause"]


def test_cpu_script_asks_for_no_gpus_and_runs_processes_per_node(tmp_path):
    inp = tiny_input(gpus=8)
    inp = inp.model_copy(update={"hardware": inp.hardware.model_copy(update={"nodes": 2})})
    cpu = slurm.prepare_job(inp, Layout(stage=3), VerifyOptions(out_dir=tmp_path / "c", cpu=True,
                                                                 processes=3))
    text = slurm.batch_script(cpu)
    assert "--gpus-per-node" not in text and "--nproc_per_node 3" in text
    assert "export DS_ACCELERATOR=cpu CUDA_VISIBLE_DEVICES=" in text and "NCCL_NVLS" not in text
    spec = json.loads(cpu.spec_path.read_text())
    assert spec["device"] == "cpu" and spec["ds_config"]["train_batch_size"] == 2 * 3 * 2
    gpu = slurm.prepare_job(inp, Layout(stage=3), VerifyOptions(out_dir=tmp_path / "g", processes=4))
    text = slurm.batch_script(gpu)
    assert "#SBATCH --gpus-per-node=4" in text and "--nproc_per_node 4" in text
    assert "DS_ACCELERATOR" not in text
    path = tmp_path / "g.sbatch"
    path.write_text(text)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0


def test_sbatch_missing_is_a_submit_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch on PATH
    with pytest.raises(slurm.SubmitError, match="sbatch is not installed here"):
        slurm.sbatch(tmp_path / "v.sbatch")
