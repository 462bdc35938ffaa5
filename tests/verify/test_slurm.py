"""Beyond one node: the SLURM batch script is valid bash that starts torchrun on every node
through srun with a c10d rendezvous on the first node; the hostfile command names the worker."""

from __future__ import annotations

import json
import subprocess

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
