"""Nothing injected: hostile values exported into every field that reaches a launch script.

Values a path may legally hold ($(...), backticks, quotes, braces, globs, spaces, non-ASCII) are
exported through the real command line, and the three scripts are run for real with stand-in
launchers (deepspeed, torchrun, srun, sbatch, scontrol on PATH that record their argv): every
argument arrives intact and nothing else runs. Values that could end a line (newline, CR,
U+2028, U+2029, U+0085, other controls) are refused at export with one line, and nothing is written.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from zlayout.cli import main
from zlayout.profile import build_profile, load_profile
from zlayout.profile.launch import launch_scripts
from zlayout.profile.schema import Profile
from zlayout.spec import Layout, ModelSpec

BASH = shutil.which("bash")
TINY = ["export", "--layers", "2", "--hidden", "128", "--heads", "4", "--vocab", "1000", "--seq", "64",
        "--gpus-per-node", "2", "--gpu", "h200"]
NVME = ["--stage", "3", "--offload-optimizer", "nvme", "--offload-param", "nvme", "--nvme-gib", "100"]

# each would run `touch PWNED` (or expand to something else) if it reached bash unquoted
HOSTILE = [
    "scripts/{a}b.py",
    "a b/$(touch PWNED).py",
    "x`touch PWNED`.py",
    "it's \"quoted\".py",
    "${HOME}/x.py",
    "~/x.py",
    ";touch PWNED;#.py",
    "a\\b\\'.py",
    "*.py",
    "tränïng✓/模型.py",
    "$'\\ntouch PWNED'.py",
    "}\"; touch PWNED; echo \"{",
]
LINE_BREAKERS = ["\n", "\r", "\u2028", "\u2029", "\x85", "\x1b", "\x7f", "\t"]


def _fake_bin(root: Path) -> Path:
    """Stand-ins that append their argv (NUL-separated, a second NUL ends the call) to $ARGS_OUT."""
    bin_dir = root / "bin"
    bin_dir.mkdir()
    for name in ("deepspeed", "torchrun", "srun"):
        tool = bin_dir / name
        tool.write_text(f'#!/bin/sh\nprintf "%s\\0" "{name}" "$@" >> "$ARGS_OUT"\nprintf "\\0" >> "$ARGS_OUT"\n')
        tool.chmod(0o755)
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho node-a\necho node-b\n")
    # sbatch: record its argv, then run the batch script as SLURM would (in the submit directory)
    (bin_dir / "sbatch").write_text(
        '#!/bin/sh\nprintf "%s\\0" sbatch "$@" >> "$ARGS_OUT"\nprintf "\\0" >> "$ARGS_OUT"\n'
        'SLURM_SUBMIT_DIR="$PWD" SLURM_JOB_NODELIST=node-[a-b] SLURM_NNODES=2 SLURM_JOB_ID=77 exec bash "$@"\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return bin_dir


def _calls(args_out: Path) -> list[list[str]]:
    # records end in an empty NUL-terminated field (no argument here is empty; any may hold a newline)
    return [record.split("\0") for record in args_out.read_text().split("\0\0") if record]


def _run_all(profile_dir: Path, root: Path, user_args: list[str]) -> dict[str, list[list[str]]]:
    bin_dir = _fake_bin(root)
    work = root / "work"
    work.mkdir()
    calls = {}
    for script in ("launch_deepspeed.sh", "launch_torchrun.sh", "launch_slurm.sbatch"):
        args_out = root / f"{script}.args"
        env = {"PATH": f"{bin_dir}{os.pathsep}/usr/bin:/bin", "ARGS_OUT": str(args_out), "HOME": str(root)}
        if script.endswith(".sbatch"):
            command = ["sbatch", str(profile_dir / script), *user_args]
        else:
            command = [BASH, str(profile_dir / script), *user_args]
        subprocess.run(command, cwd=profile_dir if script.endswith(".sbatch") else work, env=env,
                       check=True, timeout=60, capture_output=True)
        calls[script] = _calls(args_out)
    return calls


def _nothing_ran(root: Path) -> None:
    assert not list(root.rglob("PWNED")), "an injected command ran"


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_values_arrive_intact_and_nothing_else_runs(value, tmp_path, capsys):
    out = tmp_path / "profile"
    user_args = [value, "--lr=$(touch PWNED)"]
    code = main([*TINY, *NVME, "--out", str(out), "--train-script", value, "--nvme-path", "/nvme/" + value,
                 "--checkpoint-dir", "/ckpt/" + value, "--name", "run " + value])
    assert code == 0, capsys.readouterr().err
    profile = load_profile(out)
    assert profile.run.train_script == value and profile.run.nvme_path == "/nvme/" + value
    assert json.loads((out / "ds_config.json").read_text())["zero_optimization"]["offload_param"]["nvme_path"] \
        == "/nvme/" + value
    calls = _run_all(out, tmp_path, user_args)
    ds_config = str(out / "ds_config.json")
    for script, records in calls.items():
        launchers = [r[0] for r in records]
        if script.endswith(".sbatch"):
            assert launchers == ["sbatch", "srun"], script  # srun runs torchrun on each node
            launched = records[1]
        else:
            assert launchers == [script.removeprefix("launch_").removesuffix(".sh")], script
            launched = records[0]
        i = launched.index(value)  # the training script, exactly
        assert launched[i + 1:] == ["--deepspeed_config", ds_config, *user_args], (script, launched)
    # the runbook's commands are copied into a shell by whoever is on call: run them too
    runbook = (out / "RUNBOOK.md").read_text()
    commands = [m for line in runbook.splitlines() if "**NVMe offload path**" in line or "**last checkpoint**" in line
                for m in re.findall(r"`([^`]*(?:df -h|cat ).*?)`; expect", line)]
    assert len(commands) == 2, commands
    for command in commands:
        subprocess.run([BASH, "-c", command], cwd=tmp_path, capture_output=True, timeout=30)
    _nothing_ran(tmp_path)


def test_a_backtick_in_a_name_keeps_the_runbooks_code_spans_whole(tmp_path, capsys):
    """A script or directory name with backticks is shown in a code span that holds them (a fence
    one longer than its longest run): the single backticks broke the span (a QA pass)."""
    out = tmp_path / "profile"
    assert main([*TINY, *NVME, "--out", str(out), "--train-script", "x`touch PWNED`.py",
                 "--checkpoint-dir", "/ckpt/`id`"]) == 0, capsys.readouterr().err
    runbook = (out / "RUNBOOK.md").read_text()
    assert "``${TRAIN_SCRIPT:-'x`touch PWNED`.py'} --deepspeed_config ds_config.json``" in runbook
    assert "Checkpoints: `` /ckpt/`id` ``" in runbook  # padded: CommonMark strips one space each side


@pytest.mark.parametrize("flag", ["--train-script", "--nvme-path", "--checkpoint-dir", "--name"])
@pytest.mark.parametrize("breaker", LINE_BREAKERS, ids=[ascii(c) for c in LINE_BREAKERS])
def test_line_breaking_values_are_refused_and_nothing_is_written(flag, breaker, tmp_path, capsys):
    out = tmp_path / "profile"
    value = f"/x{breaker}touch PWNED{breaker}#"
    code = main([*TINY, *NVME, "--out", str(out), flag, value])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("zlayout: error: ") and "one line" in err
    assert flag.removeprefix("--").replace("-", "_") in err or flag == "--name"
    assert not out.exists()


def test_the_issue_reproduction_is_refused(tmp_path, capsys):
    code = main([*TINY, *NVME, "--nvme-path", "/x\ntouch PWNED\n#", "--out", str(tmp_path / "inj1")])
    assert code == 2 and "nvme_path" in capsys.readouterr().err
    assert not (tmp_path / "inj1").exists()


def test_train_script_that_looks_like_an_option_is_refused(tmp_path, capsys):
    assert main([*TINY, "--stage", "1", "--out", str(tmp_path / "p"), "--train-script=--help"]) == 2
    assert "starts with '-'" in capsys.readouterr().err


def test_names_built_around_validation_are_refused_at_the_profile(make_input):
    # model_copy skips pydantic's validators: the profile checks every text its scripts print
    sneaky = ModelSpec(name="tiny", layers=2, hidden=128, heads=4, vocab=1000).model_copy(
        update={"name": "tiny\u2028touch PWNED"})
    inp = make_input(model=sneaky, gpus_per_node=2)
    with pytest.raises(ValueError, match="inputs.model.name must be one line"):
        build_profile(inp, Layout(stage=1))
    good = build_profile(make_input(gpus_per_node=2), Layout(stage=1))
    run = good.run.model_copy(update={"train_script": "a\nb"})
    with pytest.raises(ValueError, match="train_script must be one line"):
        Profile.model_validate(good.model_dump() | {"run": run.model_dump()})


def test_scripts_stay_inert_even_for_a_profile_that_skipped_validation(make_input, tmp_path):
    """Defence in depth: a Profile built with model_construct (no validation at all) still gives
    scripts that run only the launcher, with the odd value as one argument."""
    good = build_profile(make_input(gpus_per_node=2), Layout(stage=1))
    hostile = "x\ntouch PWNED\n\u2028touch PWNED\x85$(touch PWNED)"
    run = type(good.run).model_construct(**(good.run.model_dump() | {"train_script": hostile}))
    profile = Profile.model_construct(**(dict(good) | {"name": hostile, "description": hostile, "run": run}))
    out = tmp_path / "profile"
    out.mkdir()
    (out / "ds_config.json").write_text("{}")
    for name, text in launch_scripts(profile).items():
        header = text.split("set -euo pipefail")[0]  # the comments: one printable line each
        assert all(line.startswith("#") and line.isprintable() for line in header.split("\n")[:-1]), name
        (out / name).write_text(text)
    calls = _run_all(out, tmp_path, [])
    assert calls["launch_torchrun.sh"][0][-3:] == [hostile, "--deepspeed_config", str(out / "ds_config.json")]
    _nothing_ran(tmp_path)
