"""Following a SLURM job through what a shared cluster does to it, with stand-in sbatch,
scontrol, scancel and sinfo on PATH (the states a test cluster cannot produce on demand): a
controller that stops answering, a job that can never start, re-collection afterwards."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from zlayout.spec import Layout
from zlayout.verify import slurm
from zlayout.verify.launcher import VerifyOptions

from .conftest import tiny_input

LINE = ("JobId=77 JobName=zlayout-verify-z2 UserId=u(1) JobState={state} Reason={reason} "
        "ExitCode={code} RunTime=00:00:41 TimeLimit=00:30:00 Partition=gpu NodeList={nodes} "
        "NumNodes=1")
UNREACHABLE = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"


def line(state: str, reason: str = "None", code: str = "0:0", nodes: str = "vm") -> str:
    return LINE.format(state=state, reason=reason, code=code, nodes=nodes)


class FakeSlurm:
    """sbatch answers job 77; scontrol prints `self.answer` (or fails like an unreachable
    controller); scancel records itself and makes the job CANCELLED; sinfo prints node states."""

    def __init__(self, directory: Path, monkeypatch):
        self.dir = directory
        directory.mkdir()
        self.set_answer(line("PENDING", "Priority", nodes="(null)"))
        self.set_nodes("idle")
        cancelled = line("CANCELLED", code="0:15")
        tools = {
            "sbatch": "echo 77",
            "scontrol": f'a=$(cat {directory}/answer)\nif [ "$a" = UNREACHABLE ]; then '
                        f'echo "{UNREACHABLE}" >&2; exit 1; fi\necho "$a"',
            "scancel": f'echo "$@" >> {directory}/scancel.calls\necho "{cancelled}" > {directory}/answer',
            "sinfo": f"cat {directory}/nodes",
        }
        for name, body in tools.items():
            path = directory / name
            path.write_text(f"#!/bin/bash\n{body}\n")
            path.chmod(path.stat().st_mode | stat.S_IXUSR)
        monkeypatch.setenv("PATH", f"{directory}:{__import__('os').environ['PATH']}")

    def set_answer(self, text: str) -> None:
        (self.dir / "answer").write_text(text + "\n")

    def set_nodes(self, text: str) -> None:
        (self.dir / "nodes").write_text(text + "\n")

    @property
    def cancels(self) -> list[str]:
        path = self.dir / "scancel.calls"
        return path.read_text().split() if path.exists() else []


@pytest.fixture
def fake(tmp_path, monkeypatch):
    monkeypatch.setattr(slurm, "CANCEL_WAIT_S", 5.0)
    return FakeSlurm(tmp_path / "bin", monkeypatch)


def job_for(tmp_path: Path, drill: bool = False) -> slurm.Job:
    return slurm.prepare_job(tiny_input(gpus=2), Layout(stage=2), VerifyOptions(
        out_dir=tmp_path / "job", cpu=True, processes=2, steps=2, restart_drill=drill))


def finish_ranks(job: slurm.Job, exit_status: int | None = 0) -> None:
    for rank in range(2):
        (job.out_dir / f"result.json.rank{rank}.json").write_text(json.dumps({
            "rank": rank, "hostname": "vm", "status": "ok", "phase": "done",
            "host_maxrss_bytes": 1, "host_cores_usable": 8, "steps_run": [1, 2],
            "losses": [5.0, 4.9], "step_s": [0.1, 0.1], "peak_allocated_bytes": [None, None]}))
    if exit_status is not None:
        (job.out_dir / slurm.JOB_EXIT).write_text(f"{exit_status}\n")


def follow(job: slurm.Job, lines: list[str], timeout_s: float | None = None) -> dict:
    return slurm.submit_and_follow(job, job.out_dir / "v.sbatch", lines.append, threading.Event(),
                                   poll_s=0.05, timeout_s=timeout_s)


@pytest.mark.parametrize("exit_status, status", [(0, "cpu-ok"), (1, "failed")])
def test_a_lost_controller_takes_the_verdict_from_the_jobs_own_files(fake, tmp_path,
                                                                     exit_status, status):
    """RUNNING, then scontrol fails while the job completes: no FAILED-with-RUNNING
    contradiction; the job's exit file and the ranks' reports decide, and the result says so."""
    job = job_for(tmp_path)
    fake.set_answer(line("RUNNING"))

    def outage() -> None:
        time.sleep(0.5)
        fake.set_answer("UNREACHABLE")
        time.sleep(0.3)
        finish_ranks(job, exit_status)

    threading.Thread(target=outage).start()
    lines: list[str] = []
    result = follow(job, lines)
    assert result["status"] == status
    assert result["slurm"]["state"] == "UNKNOWN"
    assert any("controller does not answer" in text for text in lines)
    note = f"verdict from the job's own files (the batch script exited {exit_status})"
    if status == "cpu-ok":
        assert any(note in w for w in result["warnings"])
    else:
        assert note in result["cause"] and "RUNNING" not in result["cause"]
    assert fake.cancels == []


@pytest.mark.parametrize("reason, words", [
    ("PartitionTimeLimit", "lower --time-limit"),
    ("PartitionNodeLimit", "more nodes than the partition allows"),
])
def test_a_job_that_can_never_start_is_cancelled_in_one_line(fake, tmp_path, reason, words):
    job = job_for(tmp_path)
    fake.set_answer(line("PENDING", reason, nodes="(null)"))
    lines: list[str] = []
    result = follow(job, lines)
    assert fake.cancels == ["77"]
    assert result["status"] == "failed" and "\n" not in result["cause"]
    assert result["cause"].startswith(f"SLURM job 77 PENDING ({reason}) will never start: ")
    assert words in result["cause"]


def test_req_node_not_avail_is_hopeless_only_when_every_node_is_down(fake):
    state = slurm.parse_job_state("77", line("PENDING", "ReqNodeNotAvail,_UnavailableNodes:vm",
                                             nodes="(null)"))
    fake.set_nodes("down*\ndrained\nidle")
    assert slurm.hopeless_pending(state) is None  # one node may still take it
    fake.set_nodes("down*\ndrained\nfail")
    assert "every node of the partition is down" in slurm.hopeless_pending(state)


def test_timeout_covers_pending(fake, tmp_path):
    job = job_for(tmp_path)
    fake.set_answer(line("PENDING", "Resources", nodes="(null)"))
    started = time.monotonic()
    result = follow(job, [], timeout_s=0.5)
    assert time.monotonic() - started < 10
    assert fake.cancels == ["77"] and result["status"] == "failed"
    assert result["cause"].startswith("SLURM job 77 still PENDING (Resources) after the 0.5 s "
                                      "--timeout, which covers pending too: cancelled")


def recollect(directory: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zlayout.verify.slurm", str(directory)],
                          capture_output=True, text=True)


def test_recollection_honours_slurms_state_and_keeps_the_old_result(fake, tmp_path):
    job = job_for(tmp_path)
    finish_ranks(job)
    (job.out_dir / slurm.JOB_RECORD).write_text(json.dumps({"job_id": "77"}))
    (job.out_dir / "result.json").write_text('{"earlier": true}')
    fake.set_answer(line("RUNNING"))
    proc = recollect(job.out_dir)
    assert proc.returncode == 2 and "SLURM job 77 is RUNNING: collect it after it ends" in proc.stderr
    fake.set_answer(line("TIMEOUT", "TimeLimit", "0:15"))
    proc = recollect(job.out_dir)
    assert proc.returncode == 1, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["status"] == "failed" and result["slurm"]["state"] == "TIMEOUT"
    assert "raise --time-limit" in result["cause"]
    written = list(job.out_dir.glob("result-recollected-*.json"))
    assert len(written) == 1 and json.loads(written[0].read_text())["status"] == "failed"
    assert (job.out_dir / "result.json").read_text() == '{"earlier": true}'


def test_recollection_refuses_a_directory_that_is_not_a_verifications(tmp_path):
    (tmp_path / "spec.json").write_text("{}")
    proc = recollect(tmp_path)
    assert proc.returncode == 2 and "not a zlayout verification directory" in proc.stderr
    assert proc.stderr.count("\n") == 1


def test_ranks_pinned_to_fewer_cores_than_ranks_are_warned_about(tmp_path):
    job = job_for(tmp_path)
    finish_ranks(job)
    for rank in range(2):  # SLURM gave the job one CPU: both ranks on one core
        path = job.out_dir / f"result.json.rank{rank}.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "host_cores_usable": 1}))
    result = slurm.collect_result(job.out_dir)
    assert result["status"] == "cpu-ok"
    assert any("2 ranks on vm ran on 1 core(s)" in w for w in result["warnings"])
