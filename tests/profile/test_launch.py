"""Launch scripts: valid bash, executable, and they run the launcher with the profile's shape.

The scripts are run for real with stand-ins for deepspeed, torchrun, srun and scontrol on PATH
that record the command line they were given.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from zlayout.profile import RunSettings, build_profile, save_profile_dir
from zlayout.spec import Layout

SCRIPTS = ("launch_deepspeed.sh", "launch_torchrun.sh", "launch_slurm.sbatch")
BASH = shutil.which("bash")


def _fake_bin(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("deepspeed", "torchrun", "srun"):
        tool = bin_dir / name
        tool.write_text(f'#!/bin/sh\nprintf "%s\\n" "{name}" "$@" > "$ARGS_OUT"\n')
        tool.chmod(0o755)
    scontrol = bin_dir / "scontrol"
    # many nodes: a reader that stops early would kill scontrol with SIGPIPE under pipefail
    scontrol.write_text('#!/bin/sh\necho node-a\ni=0\nwhile [ $i -lt 5000 ]; do echo node-$i; i=$((i+1)); done\n')
    scontrol.chmod(0o755)
    return bin_dir


def _run(script: Path, tmp_path: Path, cwd: Path, extra_env: dict | None = None, args=()) -> list[str]:
    out = tmp_path / "args.txt"
    env = {"PATH": f"{_fake_bin(tmp_path)}{os.pathsep}{os.environ['PATH']}", "ARGS_OUT": str(out),
           "HOME": str(tmp_path)}
    env.update(extra_env or {})
    subprocess.run([BASH, str(script), *args], cwd=cwd, env=env, check=True, timeout=30)
    return out.read_text().splitlines()


@pytest.fixture
def single_node(make_input, tmp_path):
    profile = build_profile(make_input(), Layout(stage=2), run=RunSettings(train_script="my train.py"))
    d = tmp_path / "single"
    save_profile_dir(profile, d)
    return d


@pytest.fixture
def multi_node(make_input, tmp_path):
    profile = build_profile(make_input(model="llama3-70b", nodes=8), Layout(stage=3))
    d = tmp_path / "multi"
    save_profile_dir(profile, d)
    return d


@pytest.mark.parametrize("name", SCRIPTS)
def test_scripts_are_executable_valid_bash_and_say_what_they_run(single_node, multi_node, name):
    for d in (single_node, multi_node):
        path = d / name
        assert path.stat().st_mode & stat.S_IXUSR
        subprocess.run([BASH, "-n", str(path)], check=True)
        text = path.read_text()
        assert text.startswith("#!/usr/bin/env bash\n")
        assert "TRAIN_SCRIPT" in text and "--deepspeed_config" in text and "ds_config.json" in text
        assert "# It runs YOUR training script" in text


def test_deepspeed_single_node(single_node, tmp_path):
    args = _run(single_node / "launch_deepspeed.sh", tmp_path, cwd=tmp_path, args=["--lr", "3e-4"])
    assert args == ["deepspeed", "--num_gpus", "8", "--master_port", "29500", "my train.py",
                    "--deepspeed_config", str(single_node / "ds_config.json"), "--lr", "3e-4"]


def test_deepspeed_multi_node_uses_a_hostfile(multi_node, tmp_path):
    args = _run(multi_node / "launch_deepspeed.sh", tmp_path, cwd=tmp_path,
                extra_env={"TRAIN_SCRIPT": "pretrain.py", "HOSTFILE": "/etc/hosts.ds"})
    assert args[:7] == ["deepspeed", "--hostfile", "/etc/hosts.ds", "--num_nodes", "8", "--num_gpus", "8"]
    assert args[-3:] == ["pretrain.py", "--deepspeed_config", str(multi_node / "ds_config.json")]


def test_torchrun_single_node(single_node, tmp_path):
    args = _run(single_node / "launch_torchrun.sh", tmp_path, cwd=tmp_path)
    assert args == ["torchrun", "--standalone", "--nproc_per_node", "8", "my train.py",
                    "--deepspeed_config", str(single_node / "ds_config.json")]


def test_torchrun_multi_node_needs_rank_and_master(multi_node, tmp_path):
    script = multi_node / "launch_torchrun.sh"
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    missing = subprocess.run([BASH, str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert missing.returncode != 0 and "NODE_RANK" in missing.stderr
    args = _run(script, tmp_path, cwd=tmp_path, extra_env={"NODE_RANK": "3", "MASTER_ADDR": "10.0.0.1"})
    assert args[:7] == ["torchrun", "--nnodes", "8", "--nproc_per_node", "8", "--node_rank", "3"]
    assert "10.0.0.1:29500" in args


def test_slurm_one_torchrun_per_node(multi_node, tmp_path):
    text = (multi_node / "launch_slurm.sbatch").read_text()
    assert "#SBATCH --nodes=8\n" in text and "#SBATCH --ntasks-per-node=1\n" in text
    assert "#SBATCH --gpus-per-node=8\n" in text
    # every #SBATCH line comes before the first command, or sbatch ignores it
    lines = text.splitlines()
    first_command = next(i for i, line in enumerate(lines) if line and not line.startswith("#"))
    assert all(i < first_command for i, line in enumerate(lines) if line.startswith("#SBATCH"))
    args = _run(multi_node / "launch_slurm.sbatch", tmp_path, cwd=tmp_path,
                extra_env={"SLURM_SUBMIT_DIR": str(multi_node), "SLURM_JOB_NODELIST": "node-[a-b]",
                           "SLURM_NNODES": "8", "SLURM_JOB_ID": "4242"})
    assert args[:3] == ["srun", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    assert args[3:9] == ["torchrun", "--nnodes", "8", "--nproc_per_node", "8", "--rdzv_backend"]
    assert "node-a:29500" in args and "4242" in args
    assert args[-3:] == ["train.py", "--deepspeed_config", str(multi_node / "ds_config.json")]


def test_nvme_layouts_warn_about_the_path(make_input, tmp_path):
    layout = Layout(stage=3, offload_optimizer="nvme", offload_param="nvme")
    profile = build_profile(make_input(nvme_gib=4096), layout, run=RunSettings(nvme_path="/nvme0"))
    save_profile_dir(profile, tmp_path)
    assert "/nvme0 must exist and be writable on every node" in (tmp_path / "launch_deepspeed.sh").read_text()


def test_odd_script_names_survive_quoting(make_input, tmp_path):
    name = 'dir with space/tr"ain$x`y`.py'
    profile = build_profile(make_input(gpus_per_node=2), Layout(stage=1), run=RunSettings(train_script=name))
    save_profile_dir(profile, tmp_path / "p")
    for script, launcher in (("launch_deepspeed.sh", "deepspeed"), ("launch_torchrun.sh", "torchrun")):
        out = tmp_path / f"{launcher}.txt"
        bin_dir = tmp_path / f"bin-{launcher}"
        bin_dir.mkdir()
        (bin_dir / launcher).write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "{out}"\n')
        (bin_dir / launcher).chmod(0o755)
        subprocess.run([BASH, str(tmp_path / "p" / script)], check=True, timeout=30,
                       env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
        assert name in out.read_text().splitlines()


def test_expandable_segments_reach_every_launcher_and_keep_the_callers_options(make_input, tmp_path):
    """A plan judged on the expandable allocator must run on it: each script exports it, after
    any options the caller already set; a default-allocator plan leaves the variable alone."""
    inp = make_input()
    inp = inp.model_copy(update={"training": inp.training.model_copy(update={"allocator": "expandable"})})
    d = tmp_path / "expandable"
    save_profile_dir(build_profile(inp, Layout(stage=2)), d)
    for name in ("launch_deepspeed.sh", "launch_torchrun.sh"):
        script = d / name
        script.write_text(script.read_text().replace("exec ", 'echo "$PYTORCH_CUDA_ALLOC_CONF" > "$ALLOC_OUT"; exec ', 1))
        alloc_out = tmp_path / f"{name}.alloc"
        (tmp_path / name).mkdir()
        _run(script, tmp_path / name, d, {"ALLOC_OUT": str(alloc_out),
                                          "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"})
        assert alloc_out.read_text().strip() == "max_split_size_mb:512,expandable_segments:True"
    assert "expandable_segments:True" in (d / "launch_slurm.sbatch").read_text()
    plain = tmp_path / "plain"
    save_profile_dir(build_profile(make_input(), Layout(stage=2)), plain)
    assert all("PYTORCH_CUDA_ALLOC_CONF" not in (plain / n).read_text() for n in SCRIPTS)


def test_an_offloaded_layout_runs_on_huge_host_pages_as_verify_did(make_input, tmp_path):
    """Verify runs an offloaded layout with THP_MEM_ALLOC_ENABLE=1 (its step's fresh host copies
    on 2 MiB pages): each launcher exports the same, unless the caller chose; a layout that keeps
    everything on the GPU leaves the variable alone."""
    d = tmp_path / "offloaded"
    save_profile_dir(build_profile(make_input(), Layout(stage=3, offload_optimizer="cpu")), d)
    for name in ("launch_deepspeed.sh", "launch_torchrun.sh"):
        script = d / name
        script.write_text(script.read_text().replace("exec ", 'echo "$THP_MEM_ALLOC_ENABLE" > "$THP_OUT"; exec ', 1))
        for given, expected in ((None, "1"), ("0", "0")):
            thp_out = tmp_path / f"{name}.{given}.thp"
            (tmp_path / f"{name}.{given}").mkdir()
            env = {"THP_OUT": str(thp_out), **({"THP_MEM_ALLOC_ENABLE": given} if given else {})}
            _run(script, tmp_path / f"{name}.{given}", d, env)
            assert thp_out.read_text().strip() == expected
    assert 'export THP_MEM_ALLOC_ENABLE="${THP_MEM_ALLOC_ENABLE:-1}"' in (d / "launch_slurm.sbatch").read_text()
    plain = tmp_path / "plain"
    save_profile_dir(build_profile(make_input(), Layout(stage=2)), plain)
    assert all("THP_MEM_ALLOC_ENABLE" not in (plain / n).read_text() for n in SCRIPTS)
