"""Beyond one node: the SLURM batch script is valid bash that starts torchrun on every node
through srun with a c10d rendezvous on the first node; the hostfile command names the worker."""

from __future__ import annotations

import json
import subprocess

import pytest

from zlayout.spec import Layout
from zlayout.verify import slurm
from zlayout.verify.launcher import VerifyOptions

from .conftest import NVLINK, tiny_input


def two_node_input():
    inp = tiny_input(gpus=8)
    hw = inp.hardware.model_copy(update={"nodes": 2, "inter_link": NVLINK})
    return inp.model_copy(update={"hardware": hw})


def test_batch_script_is_valid_bash_with_srun_and_rendezvous(tmp_path):
    job = slurm.prepare_job(two_node_input(), Layout(stage=3), VerifyOptions(out_dir=tmp_path / "job"))
    script = slurm.batch_script(job, partition="gpu", account="proj", time_limit="00:20:00")
    path = tmp_path / "verify.sbatch"
    path.write_text(script)
    check = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    assert "#SBATCH --nodes=2" in script and "#SBATCH --gpus-per-node=8" in script
    assert "#SBATCH --partition=gpu" in script and "#SBATCH --account=proj" in script
    # the node preflight, then the ranks
    assert script.count("srun ") == 2 and "--resume" not in script
    assert script.index("zlayout.verify.node preflight") < script.index("torch.distributed.run")
    assert "--rdzv_backend c10d" in script and "scontrol show hostnames" in script
    assert "--nproc_per_node 8" in script and "-m zlayout.verify.worker" in script
    spec = json.loads(job.spec_path.read_text())
    assert spec["ds_config"]["train_batch_size"] == 2 * 16  # micro-batch x 16 GPUs
    assert spec["ds_config"]["zero_optimization"]["stage"] == 3


def test_restart_drill_adds_a_resumed_second_step(tmp_path):
    job = slurm.prepare_job(two_node_input(), Layout(stage=1),
                            VerifyOptions(out_dir=tmp_path, restart_drill=True, steps=4))
    script = slurm.batch_script(job)
    assert script.count("srun ") == 3 and "--resume" in script
    path = tmp_path / "s.sh"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0


def test_hostfile_command_uses_the_first_host(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# nodes\nworker-1 slots=8\nworker-2 slots=8\n")
    job = slurm.prepare_job(two_node_input(), Layout(stage=2), VerifyOptions(out_dir=tmp_path / "j"))
    command = slurm.deepspeed_hostfile_command(job, hostfile)
    assert command.startswith(f"deepspeed --hostfile {hostfile} --num_nodes 2 --num_gpus 8")
    assert "--master_addr worker-1" in command and "--module zlayout.verify.worker" in command


def test_collect_result_reads_the_ranks_reports(tmp_path):
    job = slurm.prepare_job(two_node_input(), Layout(stage=2), VerifyOptions(out_dir=tmp_path))
    for rank in range(16):
        (tmp_path / f"result.json.rank{rank}.json").write_text(json.dumps({
            "rank": rank, "hostname": f"n{rank // 8}", "status": "oom" if rank == 9 else "ok",
            "phase": "train", "error": "CUDA out of memory", "host_maxrss_bytes": 1,
            "steps_run": [], "losses": [], "step_s": [], "peak_allocated_bytes": []}))
    result = slurm.collect_result(job.out_dir)
    assert result["status"] == "does-not-fit" and "rank 9" in result["cause"]
    assert (tmp_path / "result.json").exists()


def test_the_job_asks_for_the_whole_node_and_the_plans_memory_by_default(tmp_path):
    job = slurm.prepare_job(two_node_input(), Layout(stage=3), VerifyOptions(out_dir=tmp_path / "j"))
    script = slurm.batch_script(job)
    assert "#SBATCH --exclusive" in script and "--whole" in script
    assert f"#SBATCH --mem={slurm.job_memory_mib(job)}M" in script
    assert "29500" not in script and "MASTER_PORT=$(" in script
    from zlayout.core.memory import estimate_memory

    host_peak = estimate_memory(job.inp, job.layout).host_peak_bytes
    assert slurm.job_memory_mib(job) * 2**20 >= host_peak * slurm.HOST_MEMORY_MARGIN


def test_cpus_and_memory_flags_change_the_request(tmp_path):
    job = slurm.prepare_job(two_node_input(), Layout(stage=3), VerifyOptions(
        out_dir=tmp_path / "j", cpu=True, processes=2))
    script = slurm.batch_script(job, resources=slurm.Resources(cpus_per_task=8, mem="64g"))
    assert "#SBATCH --cpus-per-task=8" in script and "--exclusive" not in script
    assert "srun --kill-on-bad-exit=1 --ntasks-per-node=1 --cpus-per-task=8" in script
    assert "#SBATCH --mem=64G" in script and "--gpus-per-node" not in script


def zlayout_verify(capsys, *flags):
    from zlayout.cli import main

    code = main(["verify", "--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "128",
                 "--seq", "32", "--gpus-per-node", "2", "--stage", "2", *flags])
    return code, capsys.readouterr().err


def test_processes_with_slurm_are_the_job_nodes_not_this_machines(capsys, tmp_path):
    """--processes 64 --cpu: this machine has fewer cores, the job's nodes may not."""
    script = tmp_path / "v.sbatch"
    code, err = zlayout_verify(capsys, "--cpu", "--processes", "64", "--out", str(tmp_path / "j"),
                               "--slurm", str(script))
    assert code == 0, err
    assert "--nproc_per_node 64" in script.read_text()


@pytest.mark.parametrize("flags, wanted", [
    (["--preflight-only"], "a --slurm job runs the same preflight on every node"),
    (["--update-profile"], "--update-profile needs a PROFILE"),
    (["--cpus-per-task", "4", "--no-slurm"], "--cpus-per-task is what a SLURM job asks for"),
    (["--mem", "8G", "--no-slurm"], "--mem is what a SLURM job asks for"),
    (["--timeout", "0"], "--timeout 0: give seconds above 0"),
])
def test_flags_mean_with_slurm_what_they_mean_without_or_are_refused(capsys, tmp_path, flags, wanted):
    slurm_flags = [] if "--no-slurm" in flags else ["--slurm", str(tmp_path / "v.sbatch")]
    flags = [f for f in flags if f != "--no-slurm"]
    code, err = zlayout_verify(capsys, "--cpu", "--processes", "2", "--out", str(tmp_path / "j"),
                               *flags, *slurm_flags)
    errors = [line for line in err.splitlines() if line.startswith("zlayout: error:")]
    assert code == 2 and len(errors) == 1 and wanted in errors[0], err
    assert not (tmp_path / "v.sbatch").exists()


def test_update_profile_with_slurm_needs_submit(capsys, tmp_path):
    from zlayout.cli import main

    profile = tmp_path / "profile"
    assert main(["export", "--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "128",
                 "--seq", "32", "--gpus-per-node", "2", "--stage", "2", "--out", str(profile)]) == 0
    capsys.readouterr()
    code = main(["verify", str(profile), "--cpu", "--update-profile", "--out", str(tmp_path / "j"),
                 "--slurm", str(tmp_path / "v.sbatch")])
    err = capsys.readouterr().err
    assert code == 2 and "add --slurm FILE --submit" in err and not (tmp_path / "v.sbatch").exists()


@pytest.mark.parametrize("reported, exit_status", [(2, 0), (1, 1)])
def test_a_step_that_fails_only_at_shutdown_goes_on(tmp_path, reported, exit_status):
    """srun reports a failed step (a rank aborted in gloo's destructors on its way out): with
    every rank's figures in, the script goes on and says so; with one missing, it stops."""
    import sys

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/bash\nfor a in "$@"; do [ "$a" = bash ] && exit 1; done\nexit 0\n')
    (bin_dir / "scontrol").write_text("#!/bin/bash\necho node-1\n")
    for tool in ("srun", "scontrol"):
        (bin_dir / tool).chmod(0o755)
    job = slurm.prepare_job(tiny_input(gpus=2), Layout(stage=2), VerifyOptions(
        out_dir=tmp_path / "job", cpu=True, processes=2, steps=2, python=sys.executable))
    for rank in range(reported):
        (job.out_dir / f"result.json.rank{rank}.json").write_text(json.dumps({"rank": rank, "status": "ok"}))
    script = tmp_path / "v.sbatch"
    script.write_text(slurm.batch_script(job))
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "5", "SLURM_NNODES": "1",
           "SLURM_JOB_NODELIST": "node-1", "HOME": str(tmp_path)}
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env)
    assert proc.returncode == exit_status, proc.stderr
    assert (job.out_dir / slurm.JOB_EXIT).read_text().strip() == str(exit_status)
    going_on = f"zlayout: {slurm.SHUTDOWN_NOTE}" in proc.stdout
    assert going_on == (exit_status == 0) and ("job finished" in proc.stdout) == going_on
    if going_on:
        result = slurm.collect_result(job.out_dir, output_tail=proc.stdout.splitlines())
        assert any(slurm.SHUTDOWN_NOTE in w for w in result["warnings"])
