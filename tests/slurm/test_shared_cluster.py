"""The cluster as a shared one runs it: two nodes, partitions with limits, several jobs at
once; and what the batch script asks of sbatch itself (its #SBATCH lines as sbatch parses
them)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from .test_submit import REPO, TINY, last_json, zlayout


def test_sbatch_reads_a_quoted_output_path(slurm_cluster, tmp_path):
    """The script quotes --output (a job directory may hold spaces or `$`): sbatch parses the
    quotes and writes the output where the path says."""
    out = tmp_path / "a dir $HOME" / "job"
    out.mkdir(parents=True)
    script = tmp_path / "s.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --output='" + str(out) + "/slurm-%j.out'\n"
                      "#SBATCH --time=1\necho quoted-output-ok\n")
    submitted = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True,
                               text=True, env=slurm_cluster.env(), cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    line = slurm_cluster.wait_job(job_id, timeout_s=60)
    assert "JobState=COMPLETED" in line, line
    assert (out / f"slurm-{job_id}.out").read_text().strip() == "quoted-output-ok"


def test_a_job_that_can_never_start_is_cancelled_with_slurms_reason(slurm_cluster, tmp_path):
    """--time-limit above the partition's MaxTime: SLURM keeps the job PENDING
    (PartitionTimeLimit) forever; zlayout ends it at once, in one line, and cancels it."""
    proc = zlayout("verify", *TINY, "--stage", "2", "--cpu", "--processes", "2",
                   "--partition", "short", "--time-limit", "00:10:00",
                   "--out", str(tmp_path / "job"), "--slurm", str(tmp_path / "v.sbatch"),
                   "--submit", "--json", timeout_s=120)
    assert proc.returncode == 1, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    job_id = result["slurm"]["job_id"]
    assert result["status"] == "failed"
    assert "\n" not in result["cause"]
    # SLURM 22.05 names it PartitionTimeLimit, or PartitionConfig for a whole-node job
    assert re.match(rf"SLURM job {job_id} PENDING \(Partition(TimeLimit|Config)\) will never "
                    "start: .*--time-limit", result["cause"]), result["cause"]
    assert f"scancel {job_id}" in proc.stderr
    assert "JobState=CANCELLED" in slurm_cluster.job(job_id)
    assert not list((tmp_path / "job").glob("result.json.rank*.json"))  # nothing ran


def test_timeout_covers_a_pending_job(slurm_cluster, tmp_path):
    """A job pending for a reason that may clear (its partition is down) past --timeout:
    cancelled, and the cause says it was still pending and why."""
    proc = zlayout("verify", *TINY, "--stage", "1", "--cpu", "--processes", "1",
                   "--partition", "closed", "--timeout", "3", "--out", str(tmp_path / "job"),
                   "--slurm", str(tmp_path / "v.sbatch"), "--submit", "--json", timeout_s=120)
    assert proc.returncode == 1, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    job_id = result["slurm"]["job_id"]
    assert result["status"] == "failed" and "\n" not in result["cause"]
    assert result["cause"].startswith(f"SLURM job {job_id} still PENDING (PartitionDown) after "
                                      "the 3 s --timeout"), proc.stderr
    assert "JobState=CANCELLED" in slurm_cluster.job(job_id)


@pytest.mark.slow
def test_two_node_zero3_verification_with_the_restart_drill(slurm_cluster, tmp_path):
    """Two slurmd, two nodes: one torchrun per node, a c10d rendezvous on the first node, ZeRO-3
    sharded over both, the drill's checkpoint saved and resumed across them."""
    if slurm_cluster.second is None:
        pytest.skip("this machine's name is `localhost`: no second name for a second node")
    proc = zlayout("verify", *[a for a in TINY], "--nodes", "2", "--stage", "3", "--cpu",
                   "--processes", "1", "--steps", "4", "--restart-drill", "--partition", "two",
                   "--out", str(tmp_path / "job"), "--slurm", str(tmp_path / "v.sbatch"),
                   "--submit", "--json", timeout_s=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = last_json(proc.stdout)
    assert result["status"] == "cpu-ok", result["cause"]
    assert result["slurm"]["state"] == "COMPLETED"
    assert result["measured"]["world"] == 2 and len(result["ranks"]) == 2
    job = tmp_path / "job"
    for node in slurm_cluster.nodes:  # one torchrun per node, each after its node's preflight
        assert (job / "logs-result" / node).is_dir() and (job / "logs-resume" / node).is_dir()
        assert f"zlayout: {node}: preflight PASS torch+deepspeed" in proc.stderr
    drill = result["restart_drill"]
    assert drill["resumed_ok"] and drill["step_before"] == 2 and drill["losses_compared"] == 2 * 2
    line = slurm_cluster.job(result["slurm"]["job_id"])
    assert "NumNodes=2" in line
    ports = re.findall(r"rendezvous \S+:(\d+)", proc.stderr)
    assert len(ports) == 2 and "29500" not in ports  # chosen for the run, and for the drill


@pytest.mark.slow
def test_two_jobs_on_one_node_both_pass(slurm_cluster, tmp_path):
    """Two verifications at once on one node, both with MASTER_PORT=29500 in the environment
    they were submitted from: each job meets on a port of its own, and both pass."""
    results: dict[str, subprocess.CompletedProcess] = {}

    def one(name: str) -> None:
        results[name] = zlayout("verify", *TINY, "--stage", "2", "--cpu", "--processes", "1",
                                "--cpus-per-task", "1", "--steps", "6",
                                "--out", str(tmp_path / name), "--slurm",
                                str(tmp_path / f"{name}.sbatch"), "--submit", "--json",
                                timeout_s=400, extra_env={"MASTER_PORT": "29500"})

    threads = [threading.Thread(target=one, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ports, spans = [], []
    for name, proc in sorted(results.items()):
        assert proc.returncode == 0, proc.stderr[-3000:]
        result = last_json(proc.stdout)
        assert result["status"] == "cpu-ok", result["cause"]
        ports += re.findall(r"rendezvous \S+:(\d+)", proc.stderr)
        line = slurm_cluster.job(result["slurm"]["job_id"])
        assert "NumCPUs=1" in line and f"NodeList={slurm_cluster.node}" in line
        spans.append(tuple(re.search(rf"{key}=(\S+)", line).group(1)
                           for key in ("StartTime", "EndTime")))
    assert len(set(ports)) == 2 and "29500" not in ports, ports
    (start_a, end_a), (start_b, end_b) = spans
    assert start_b < end_a and start_a < end_b, (spans, [p.stderr[:1500] for p in results.values()])  # they ran at the same time
