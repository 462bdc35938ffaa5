"""Nothing of the user's overwritten, nothing injected: the values that reach the batch script
or a printed command are refused with a control character and quoted otherwise, and the
generated script and command, run with stand-in launchers (fake srun, scontrol, python and
deepspeed on PATH), run no injected command and change no file of the user's."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from zlayout.cli import main
from zlayout.spec import Layout
from zlayout.verify import guard, slurm
from zlayout.verify.launcher import VerifyOptions
from zlayout.verify.options import LaunchError

from .conftest import tiny_input

TINY = ["--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "128", "--seq", "32",
        "--micro-batch", "2", "--gpus-per-node", "2", "--stage", "2", "--cpu", "--processes", "2"]


def verify(capsys, *flags: str) -> tuple[int, list[str]]:
    code = main(["verify", *TINY, *flags])
    return code, capsys.readouterr().err.splitlines()


def one_error(lines: list[str]) -> str:
    errors = [line for line in lines if line.startswith("zlayout: error:")]
    assert len(errors) == 1, lines
    assert not any("Traceback" in line for line in lines)
    return errors[0]


@pytest.mark.parametrize("flag, value, wanted", [
    ("--partition", "gpu\ntouch /tmp/x", "type the name as `sinfo`"),
    ("--account", "proj\rrm -rf ~", "type the name as `sinfo`"),
    ("--time-limit", "00:30:00\necho pwned", "type a time such as 00:30:00"),
    ("--out", "run\n#SBATCH --partition=other", "give another path"),
    ("--checkpoint-dir", "ck\x1b[2Jpt", "give another path"),
    ("--mem", "64G\nid", "type a size such as 64G"),
])
def test_a_control_character_in_a_value_for_the_script_is_refused(capsys, tmp_path, flag,
                                                                    value, wanted):
    script = tmp_path / "v.sbatch"
    code, lines = verify(capsys, flag, str(tmp_path / value) if flag in ("--out", "--checkpoint-dir")
                         else value, "--restart-drill", "--steps", "2",
                         "--slurm", str(script))
    error = one_error(lines)
    assert code == 2 and flag in error and wanted in error
    assert "\\n" in error or "\\r" in error or "\\x1b" in error  # the character shown, not obeyed
    assert not script.exists()


@pytest.mark.parametrize("flag, value, wanted", [
    ("--partition", "gpu;id", "letters, digits and _.-+ only"),
    ("--time-limit", "30 minutes", "HH:MM:SS"),
    ("--mem", "lots", "64G"),
    ("--cpus-per-task", "0", "give 1 or more"),
    ("--cpus-per-task", "1", "--cpus-per-task 2 or more"),  # 2 CPU processes on 1 core
])
def test_values_slurm_cannot_take_are_refused_in_one_line(capsys, tmp_path, flag, value, wanted):
    code, lines = verify(capsys, flag, value, "--slurm", str(tmp_path / "v.sbatch"),
                         "--out", str(tmp_path / "job"))
    assert code == 2 and wanted in one_error(lines)
    assert not (tmp_path / "v.sbatch").exists() and not (tmp_path / "job").exists()


def fake_bin(directory: Path) -> Path:
    """Stand-ins for the launchers: each records its argv as one JSON line in CALLS and does
    nothing else; srun runs its `bash -c` command (the part of the script it would start)."""
    directory.mkdir(parents=True, exist_ok=True)
    calls = directory / "calls.jsonl"
    record = (f'"$REAL_PYTHON" -c \'import json, sys; open({json.dumps(str(calls))}, "a").write('
              'json.dumps(sys.argv[1:]) + "\\n")\'')
    tools = {
        "srun": f'{record} srun "$@"\nwhile [ "${{1#-}}" != "$1" ]; do shift; done\n'
                'if [ "$1" = bash ]; then "$@"; fi',
        "scontrol": f'{record} scontrol "$@"\necho node-1',
        "python": f'{record} python "$@"\nif [ "$1" = -c ]; then echo 41234; fi',
        "deepspeed": f'{record} deepspeed "$@"',
    }
    for name, body in tools.items():
        path = directory / name
        path.write_text(f"#!/bin/bash\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return calls


def test_the_generated_script_runs_no_injected_command(tmp_path):
    """Paths with every shell metacharacter but no control character are accepted and
    quoted: run with stand-in launchers, the script starts the node preflight and one torchrun
    per node with the paths intact, and none of the injected commands ran."""
    bin_dir = tmp_path / "bin"
    calls = fake_bin(bin_dir)
    canary = tmp_path / "INJECTED"
    hostile = f"run $(touch {canary}) `touch {canary}` ; touch {canary} ' \" & | *"
    out_dir = tmp_path / hostile
    inp = tiny_input(gpus=2)
    job = slurm.prepare_job(inp, Layout(stage=2), VerifyOptions(
        out_dir=out_dir, cpu=True, processes=2, steps=2, restart_drill=True,
        python=str(bin_dir / "python")))
    script = tmp_path / "v.sbatch"
    script.write_text(slurm.batch_script(job, resources=slurm.Resources(
        partition="debug", account="proj", time_limit="00:20:00")))
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "REAL_PYTHON": sys.executable,
           "SLURM_JOB_ID": "77", "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "node-1",
           "SLURMD_NODENAME": "node-1", "HOME": str(tmp_path)}
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not canary.exists()
    assert "zlayout: job finished" in proc.stdout
    assert "rendezvous node-1:41234" in proc.stdout  # the port chosen on the node, not 29500
    srun = [json.loads(line)[1:] for line in calls.read_text().splitlines()
            if json.loads(line)[0] == "srun"]
    assert len(srun) == 3  # node preflight, the run, the drill's resume
    spec = str(out_dir.resolve() / "spec.json")
    assert srun[0][-3:] == ["preflight", "--spec", spec]
    ranks = shlex.split(srun[1][-1])  # the `bash -c` command: its words as bash sees them
    assert ranks[ranks.index("--out") + 1] == str(out_dir.resolve() / "result.json")
    # ... and as the node's python received them: the ranks' launcher, the paths intact
    started = [json.loads(line)[1:] for line in calls.read_text().splitlines()
               if json.loads(line)[:2] == ["python", "-P"] and "exec" in json.loads(line)]
    assert len(started) == 2 and started[0][started[0].index("--spec") + 1] == spec
    assert started[0][-2:] == ["--out", str(out_dir.resolve() / "result.json")]
    assert started[1][-1] == "--resume"
    assert (out_dir / "job-exit").read_text().strip() == "0"  # the EXIT trap's own record


def test_the_printed_hostfile_command_quotes_the_first_host(tmp_path):
    bin_dir = tmp_path / "bin"
    calls = fake_bin(bin_dir)
    canary = tmp_path / "INJECTED"
    hostfile = tmp_path / "hosts"
    hostfile.write_text(f"node-1;touch$IFS{canary} slots=8\nnode-2 slots=8\n")
    job = slurm.prepare_job(tiny_input(gpus=2), Layout(stage=2), VerifyOptions(out_dir=tmp_path / "j"))
    command = slurm.deepspeed_hostfile_command(job, hostfile)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "REAL_PYTHON": sys.executable}
    assert subprocess.run(["bash", "-c", command], env=env).returncode == 0
    assert not canary.exists()
    argv = json.loads(calls.read_text().splitlines()[0])
    assert argv[argv.index("--master_addr") + 1] == f"node-1;touch$IFS{canary}"
    assert argv[argv.index("--master_port") + 1] != "29500"


def test_a_newline_in_the_hostfiles_first_host_is_refused(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node-1\x1b]0;x\x07 slots=8\n")
    job = slurm.prepare_job(tiny_input(gpus=2), Layout(stage=2), VerifyOptions(out_dir=tmp_path / "j"))
    with pytest.raises(LaunchError, match="fix the hostfile's first line"):
        slurm.deepspeed_hostfile_command(job, hostfile)


def test_slurm_never_replaces_a_file_zlayout_did_not_write(capsys, tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text("[project]\nname = 'mine'\n")
    code, lines = verify(capsys, "--slurm", str(pyproject), "--out", str(tmp_path / "job"))
    assert code == 2 and "exists and zlayout did not write it" in one_error(lines)
    assert pyproject.read_text() == "[project]\nname = 'mine'\n"
    assert not (tmp_path / "job").exists()  # refused before anything was written
    # its own script it replaces
    script = tmp_path / "v.sbatch"
    assert verify(capsys, "--slurm", str(script), "--out", str(tmp_path / "job"))[0] == 0
    assert verify(capsys, "--slurm", str(script), "--out", str(tmp_path / "job"),
                  "--steps", "3")[0] == 0
    assert "--steps" not in script.read_text() and guard.SCRIPT_MARKER in script.read_text()
    link = tmp_path / "link.sbatch"
    link.symlink_to(script)
    code, lines = verify(capsys, "--slurm", str(link), "--out", str(tmp_path / "job"))
    assert code == 2 and "symlink" in one_error(lines)


@pytest.mark.parametrize("slurm_flags", [[], ["--slurm", "v.sbatch"]])
def test_out_never_replaces_files_zlayout_did_not_write(capsys, tmp_path, monkeypatch, slurm_flags):
    """A profile's directory (its own ds_config.json), handed to --out: refused, untouched,
    for a run here (checked before preflight) and for a SLURM script."""
    monkeypatch.chdir(tmp_path)
    profile = tmp_path / "profile"
    profile.mkdir()
    (profile / "ds_config.json").write_text('{"mine": true}')
    (profile / "result.json").write_text('{"theirs": 1}')
    code, lines = verify(capsys, "--out", str(profile), "--steps", "1", *slurm_flags)
    error = one_error(lines)
    assert code == 2 and "ds_config.json, result.json that zlayout verify did not write" in error
    assert "give a new or empty directory" in error
    assert (profile / "ds_config.json").read_text() == '{"mine": true}'
    assert sorted(p.name for p in profile.iterdir()) == ["ds_config.json", "result.json"]


@pytest.mark.parametrize("out", ["/", "/etc", "/usr/lib/x", "~"])
def test_out_refuses_system_and_home_directories(capsys, tmp_path, out):
    out = str(Path(out).expanduser())
    code, lines = verify(capsys, "--out", out, "--slurm", str(tmp_path / "v.sbatch"))
    assert code == 2 and "system or home directory" in one_error(lines)
    assert not (tmp_path / "v.sbatch").exists()


def test_checkpoint_dir_never_rewrites_a_training_runs_latest(capsys, tmp_path):
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "latest").write_text("global_step9000")
    for slurm_flags in ([], ["--slurm", str(tmp_path / "v.sbatch")]):
        code, lines = verify(capsys, "--restart-drill", "--steps", "2", "--checkpoint-dir",
                             str(checkpoint), "--out", str(tmp_path / "job"), *slurm_flags)
        assert code == 2 and "--checkpoint-dir" in one_error(lines) and "latest" in one_error(lines)
    assert (checkpoint / "latest").read_text() == "global_step9000"
    assert sorted(p.name for p in checkpoint.iterdir()) == ["latest"]


def test_a_directory_zlayout_made_is_its_own_to_reuse(tmp_path):
    out = guard.claim_dir("--out", tmp_path / "run")
    (out / "spec.json").write_text("{}")
    assert guard.claim_dir("--out", out) == out.resolve()  # marked: replaced by the next run
    assert (out / guard.MARKER).is_file()


def test_preflight_only_refuses_a_foreign_out_and_writes_nothing(capsys, tmp_path):
    out = tmp_path / "theirs"
    out.mkdir()
    (out / "spec.json").write_text("theirs")
    code, lines = verify(capsys, "--preflight-only", "--out", str(out))
    assert code == 2 and "did not write" in one_error(lines)
    assert sorted(p.name for p in out.iterdir()) == ["spec.json"]
