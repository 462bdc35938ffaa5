"""export, show, check and diff through the real command line (zlayout.cli.main)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from zlayout.cli import main
from zlayout.profile import attach_verification, load_profile, save_profile
from zlayout.spec import gib_figure

EXPORT_8B = ["export", "--preset", "llama3-8b", "--gpu", "h100", "--gpus-per-node", "8",
             "--stage", "3", "--offload-optimizer", "cpu", "--seq", "4096"]
TINY = ["--layers", "2", "--hidden", "256", "--heads", "4", "--vocab", "1000", "--seq", "256"]


def export(tmp_path: Path, capsys, *extra: str, name: str = "p", argv=EXPORT_8B) -> tuple[int, Path]:
    out = tmp_path / name
    code = main([*argv, "--out", str(out), *extra])
    return code, out


def test_export_writes_the_profile_and_its_files(tmp_path, capsys):
    code, out = export(tmp_path, capsys)
    assert code == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "RUNBOOK.md", "alerts.yml", "ds_config.json", "launch_deepspeed.sh", "launch_slurm.sbatch",
        "launch_torchrun.sh", "memory.svg", "profile.toml"]
    profile = load_profile(out)
    assert profile.layout.stage == 3 and profile.layout.offload_optimizer == "cpu"
    assert profile.inputs.model.name == "llama3-8b" and profile.inputs.training.seq == 4096
    assert profile.status == "unverified"
    assert json.loads((out / "ds_config.json").read_text()) == profile.ds_config()
    assert f"wrote {out}/" in capsys.readouterr().out


def test_export_needs_a_stage(tmp_path, capsys):
    code = main(["export", "--preset", "llama3-8b", "--out", str(tmp_path / "p")])
    assert code == 2
    assert "add --stage" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()


def test_export_refuses_to_overwrite_without_force(tmp_path, capsys):
    code, out = export(tmp_path, capsys)
    before = (out / "profile.toml").read_bytes()
    capsys.readouterr()
    code, _ = export(tmp_path, capsys, "--seq", "8192")
    assert code == 2
    err = capsys.readouterr().err
    assert "already exists" in err and "--force" in err
    assert (out / "profile.toml").read_bytes() == before


def test_force_replaces_and_keeps_the_change_log(tmp_path, capsys):
    export(tmp_path, capsys)
    code, out = export(tmp_path, capsys, "--stage", "2", "--offload-optimizer", "none", "--force",
                       "--why", "GPU memory to spare: drop the CPU optimizer for speed")
    assert code == 0
    profile = load_profile(out)
    assert profile.layout.stage == 2
    assert len(profile.changelog) == 2
    entry = profile.changelog[-1]
    assert entry.why == "GPU memory to spare: drop the CPU optimizer for speed"
    assert entry.layout_before == "ZeRO-3 opt→cpu" and entry.layout_after == "ZeRO-2"
    assert entry.gpu_peak_bytes_before != entry.gpu_peak_bytes_after


def test_force_keeps_a_hand_edited_launch_script_beside_the_new_one(tmp_path, capsys):
    """Re-exporting wrote over a hand-edited launch script without a word (a QA pass): the edit is
    the user's. It is kept as NAME.edited (then .edited.1), the new script takes its place, and
    the export says so; an unedited script is replaced with no copy."""
    export(tmp_path, capsys)
    out = tmp_path / "p"
    script = out / "launch_deepspeed.sh"
    for round_, kept in enumerate(["launch_deepspeed.sh.edited", "launch_deepspeed.sh.edited.1"]):
        mine = script.read_text() + f"# the team's edit {round_}\n"
        script.write_text(mine)
        capsys.readouterr()
        code, _ = export(tmp_path, capsys, "--force", "--seq", str(2048 * (round_ + 1)))
        assert code == 0
        assert f"your version is kept as {kept}" in capsys.readouterr().out
        assert (out / kept).read_text() == mine
        assert "the team's edit" not in script.read_text()
    capsys.readouterr()
    export(tmp_path, capsys, "--force")
    assert "edited by hand" not in capsys.readouterr().out
    assert sorted(p.name for p in out.glob("*.edited*")) == ["launch_deepspeed.sh.edited", "launch_deepspeed.sh.edited.1"]


def test_force_never_overwrites_a_corrupt_profile(tmp_path, capsys):
    _, out = export(tmp_path, capsys)
    corrupt = (out / "profile.toml").read_bytes()[:1500]
    (out / "profile.toml").write_bytes(corrupt)
    capsys.readouterr()
    code, _ = export(tmp_path, capsys, "--force")
    assert code == 2
    assert "Not replacing a profile zlayout cannot read" in capsys.readouterr().err
    assert (out / "profile.toml").read_bytes() == corrupt


def test_show_summarizes_what_lives_where(tmp_path, capsys):
    _, out = export(tmp_path, capsys)
    capsys.readouterr()
    for target in (out, out / "profile.toml"):
        assert main(["show", str(target)]) == 0
        text = capsys.readouterr().out
        profile = load_profile(out)
        assert profile.name in text and "UNVERIFIED" in text
        assert "What lives where" in text and "GPU, per GPU" in text
        for term in profile.prediction.terms:
            assert term.name in text and term.explanation in text
        assert "Alerts" in text and "Change log" in text and "MISSING" not in text


def test_show_reports_missing_files(tmp_path, capsys):
    _, out = export(tmp_path, capsys)
    (out / "launch_slurm.sbatch").unlink()
    capsys.readouterr()
    assert main(["show", str(out)]) == 0
    assert "MISSING: launch_slurm.sbatch" in capsys.readouterr().out


def test_show_json_is_the_profile(tmp_path, capsys):
    _, out = export(tmp_path, capsys)
    capsys.readouterr()
    assert main(["show", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["layout"] == {"stage": 3, "offload_optimizer": "cpu", "offload_param": "gpu"}
    assert data["prediction"]["gpu_peak_allocated_bytes"] == load_profile(out).prediction.gpu_peak_allocated_bytes


def test_show_corrupt_profile_exits_2_naming_the_line(tmp_path, capsys):
    _, out = export(tmp_path, capsys)
    path = out / "profile.toml"
    text = path.read_text().replace("layers = 32", "layers = many")
    path.write_text(text)
    capsys.readouterr()
    assert main(["show", str(out)]) == 2
    err = capsys.readouterr().err
    line = next(i for i, s in enumerate(text.splitlines(), 1) if s.startswith("layers = many"))
    assert err.startswith("zlayout: error: ") and f"line {line}" in err
    assert path.read_text() == text


def test_show_unknown_path(tmp_path, capsys):
    assert main(["show", str(tmp_path / "nope")]) == 2
    assert "no profile at" in capsys.readouterr().err


def test_show_after_verification(tmp_path, capsys, make_verify_result):
    _, out = export(tmp_path, capsys)
    profile = load_profile(out)
    save_profile(attach_verification(profile, make_verify_result(profile)), out)
    capsys.readouterr()
    assert main(["show", str(out)]) == 0
    text = capsys.readouterr().out
    assert "VALIDATED on 8x NVIDIA H100 80GB HBM3" in text and "DeepSpeed 0.19.8" in text
    assert "Measured vs predicted" in text and "-3.8%" in text  # predicted is 1/1.04 of measured
    assert "Restart drill: resumed OK in 12.5 s" in text


def test_diff_shows_changes_and_effect(tmp_path, capsys):
    _, a = export(tmp_path, capsys, name="a")
    _, b = export(tmp_path, capsys, "--seq", "8192", "--checkpointing", "full", name="b")
    capsys.readouterr()
    assert main(["diff", str(a), str(b / "profile.toml")]) == 0
    text = capsys.readouterr().out
    assert "inputs.training.seq" in text and "4096 -> 8192" in text
    assert "inputs.training.checkpointing" in text and "none -> full" in text
    assert "gpu_peak_allocated_bytes (predicted)" in text
    assert main(["diff", str(a), str(b), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    fields = {c["field"]: (c["before"], c["after"]) for c in data["changes"]}
    assert fields["inputs.training.seq"] == (4096, 8192)
    effects = {e["figure"]: e for e in data["effects"]}
    assert effects["gpu_peak_allocated_bytes"]["after"] == load_profile(b).prediction.gpu_peak_allocated_bytes


def test_diff_of_a_profile_with_itself(tmp_path, capsys):
    _, a = export(tmp_path, capsys, name="a")
    capsys.readouterr()
    assert main(["diff", str(a), str(a)]) == 0
    text = capsys.readouterr().out
    assert "Configuration: identical" in text and "Effect: none" in text


# ------------------------------------------------------------------ check

def _fake_nvidia_smi(tmp_path: Path, monkeypatch, rows: list[str], rc: int = 0) -> None:
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / "nvidia-smi"
    body = "".join(f"echo '{row}'\n" for row in rows)
    tool.write_text(f"#!/bin/sh\n{body}exit {rc}\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


H100_ROW = "NVIDIA H100 80GB HBM3, 81559 MiB, 80000 MiB"


def test_check_without_gpus_says_so_and_exits_1(tmp_path, capsys, monkeypatch):
    _, out = export(tmp_path, capsys)
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    capsys.readouterr()
    assert main(["check", str(out)]) == 1
    text = capsys.readouterr().out
    assert "[FAIL] GPUs visible: nvidia-smi not found" in text and "do not launch" in text


def test_check_passes_on_matching_hardware(tmp_path, capsys, monkeypatch):
    _, out = export(tmp_path, capsys, argv=["export", *TINY, "--gpu", "h100", "--gpus-per-node", "2",
                                            "--stage", "2"])
    _fake_nvidia_smi(tmp_path, monkeypatch, [H100_ROW] * 2)
    capsys.readouterr()
    code = main(["check", str(out), "--json"])
    data = json.loads(capsys.readouterr().out)
    verdicts = {c["name"]: c["verdict"] for c in data["checks"]}
    assert verdicts["GPUs visible"] == "pass" and verdicts["GPU model"] == "pass"
    assert verdicts["GPU free memory"] == "pass"
    assert verdicts["profile verified"] == "warn"
    assert code == (0 if data["ok"] else 1) and (data["ok"] == (verdicts["host memory"] != "fail"))


@pytest.mark.parametrize("rows,failing,words", [
    ([H100_ROW] * 4, "GPUs visible", "4 visible, the profile runs 8"),
    (["NVIDIA A100-SXM4-80GB, 81920 MiB, 80000 MiB"] * 8, "GPU model", "this machine has NVIDIA A100"),
    ([H100_ROW] * 7 + ["NVIDIA H100 80GB HBM3, 81559 MiB, 2000 MiB"], "GPU free memory", "GPU 7 has 1.95 GiB free"),
])
def test_check_fails_on_a_mismatch(tmp_path, capsys, monkeypatch, rows, failing, words):
    _, out = export(tmp_path, capsys)
    _fake_nvidia_smi(tmp_path, monkeypatch, rows)
    capsys.readouterr()
    assert main(["check", str(out)]) == 1
    text = capsys.readouterr().out
    assert f"[FAIL] {failing}: " in text and words in text


def test_check_honours_cuda_visible_devices(tmp_path, capsys, monkeypatch):
    _, out = export(tmp_path, capsys)
    _fake_nvidia_smi(tmp_path, monkeypatch, [H100_ROW] * 8)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    capsys.readouterr()
    assert main(["check", str(out)]) == 1
    assert "2 visible, the profile runs 8" in capsys.readouterr().out


def test_check_nvidia_smi_failure(tmp_path, capsys, monkeypatch):
    _, out = export(tmp_path, capsys)
    _fake_nvidia_smi(tmp_path, monkeypatch, ["NVIDIA-SMI has failed because it could not communicate"], rc=9)
    capsys.readouterr()
    assert main(["check", str(out)]) == 1
    assert "nvidia-smi failed (exit 9)" in capsys.readouterr().out


def _checkpoint(root: Path, tag: str, ranks: int, empty: str | None = None) -> None:
    d = root / tag
    d.mkdir(parents=True)
    (d / "mp_rank_00_model_states.pt").write_bytes(b"\x80" * 4096)
    for r in range(ranks):
        name = f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt"
        (d / name).write_bytes(b"" if name == empty else b"\x80" * 4096)
    (root / "latest").write_text(tag)


@pytest.mark.parametrize("case,verdict,words", [
    ("none", "pass", "no checkpoint in"),
    ("good", "pass", "readable: 9 files"),
    ("missing-tag", "fail", "names global_step20, which is missing"),
    ("empty-file", "fail", "(empty)"),
    ("other-world", "warn", "written by 4 ranks, this profile runs 8"),
])
def test_check_last_checkpoint(tmp_path, capsys, monkeypatch, case, verdict, words):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    if case == "good":
        _checkpoint(ckpt, "global_step10", 8)
    elif case == "missing-tag":
        _checkpoint(ckpt, "global_step10", 8)
        (ckpt / "latest").write_text("global_step20\n")
    elif case == "empty-file":
        _checkpoint(ckpt, "global_step10", 8, empty="bf16_zero_pp_rank_3_mp_rank_00_optim_states.pt")
    elif case == "other-world":
        _checkpoint(ckpt, "global_step10", 4)
    _, out = export(tmp_path, capsys, "--checkpoint-dir", str(ckpt))
    assert load_profile(out).run.checkpoint_dir == str(ckpt)
    _fake_nvidia_smi(tmp_path, monkeypatch, [H100_ROW] * 8)
    capsys.readouterr()
    main(["check", str(out), "--json"])
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert checks["last checkpoint"]["verdict"] == verdict
    assert words in checks["last checkpoint"]["detail"]


def test_check_missing_checkpoint_dir_fails(tmp_path, capsys, monkeypatch):
    _, out = export(tmp_path, capsys)
    _fake_nvidia_smi(tmp_path, monkeypatch, [H100_ROW] * 8)
    capsys.readouterr()
    assert main(["check", str(out), "--checkpoint-dir", str(tmp_path / "gone")]) == 1
    assert "does not exist" in capsys.readouterr().out


def test_check_corrupt_profile_exits_2(tmp_path, capsys):
    (tmp_path / "profile.toml").write_text("schema_version = 1\nname = \n")
    assert main(["check", str(tmp_path)]) == 2
    assert "line 2" in capsys.readouterr().err


def test_check_reads_a_real_h200_nvidia_smi_line(tmp_path, capsys, monkeypatch):
    """The line nvidia-smi printed on the H200 machines (driver 580, 143771 MiB per GPU)."""
    from zlayout import catalog

    preset = catalog.preset_path("profiles", "llama3-8b-1xh200-offload")
    _fake_nvidia_smi(tmp_path, monkeypatch, ["NVIDIA H200, 143771 MiB, 143195 MiB"])
    capsys.readouterr()
    main(["check", str(preset), "--json"])
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert checks["GPUs visible"]["verdict"] == "pass"
    assert checks["GPU model"]["verdict"] == "pass"
    assert checks["GPU free memory"]["verdict"] == "pass"


def test_check_compares_the_driver_with_the_verified_one(tmp_path, capsys, monkeypatch):
    from zlayout.profile import load_profile
    from zlayout.profile.check import GpuInfo, check_driver
    from zlayout import catalog

    profile = load_profile(catalog.preset_path("profiles", "llama3-8b-1xh200-offload"))
    verified = profile.model_copy(update={"verification": profile.verification.model_copy(
        update={"driver": "580.159.04"})})
    gpu = GpuInfo("NVIDIA H200", 143771 * 2**20, 143195 * 2**20, "580.159.04")
    assert check_driver(verified, [gpu]).verdict == "pass"
    newer = GpuInfo("NVIDIA H200", 143771 * 2**20, 143195 * 2**20, "590.10")
    item = check_driver(verified, [newer])
    assert item.verdict == "warn" and "580.159.04" in item.detail and "590.10" in item.detail
    assert check_driver(profile, [gpu]) is None  # unverified profiles name no driver
    # nvidia-smi's fourth column is read
    _fake_nvidia_smi(tmp_path, monkeypatch, ["NVIDIA H200, 143771 MiB, 143195 MiB, 590.10"])
    from zlayout.profile.check import query_gpus
    assert query_gpus()[0].driver == "590.10"


def test_export_json_and_a_layout_that_does_not_fit(tmp_path, capsys):
    code = main(["export", "--preset", "llama3-70b", "--gpu", "h100", "--gpus-per-node", "8", "--stage", "0",
                 "--out", str(tmp_path / "big"), "--json"])
    assert code == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert data["fits"] is False and data["layout"] == "z0-opt_gpu-param_gpu"
    assert data["profile"] == str(tmp_path / "big" / "profile.toml")
    assert "predicted NOT to fit" in captured.err
    assert load_profile(tmp_path / "big").prediction.fits is False


def test_check_and_alerts_of_a_layout_whose_cache_fills_the_card(tmp_path, capsys, monkeypatch):
    """Llama-3-70B on 8x8 H100, ZeRO-3: the caching allocator is predicted to grow into the whole
    card (device used = capacity) while the run needs less (the least its peak runs in). An idle
    H100 with 79.1 GiB free passes `check`, and no alert fires on a healthy run's free memory."""
    _, out = export(tmp_path, capsys, argv=["export", "--preset", "llama3-70b", "--gpu", "h100",
                                            "--gpus-per-node", "8", "--nodes", "8", "--stage", "3",
                                            "--headroom", "0.02"])  # it needs 95% of the card (core.fit)
    profile = load_profile(out)
    pred = profile.prediction
    assert pred.fits and pred.gpu_device_used_bytes > pred.gpu_usable_bytes > pred.gpu_needed_bytes
    assert profile.alerts.gpu_memory.critical_free_below_bytes is None
    assert "DCGM_FI_DEV_FB_FREE" not in (out / "alerts.yml").read_text()
    _fake_nvidia_smi(tmp_path, monkeypatch, ["NVIDIA H100 80GB HBM3, 81559 MiB, 81004 MiB"] * 8)
    capsys.readouterr()
    main(["check", str(out), "--json"])
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert checks["GPU free memory"]["verdict"] == "pass", checks["GPU free memory"]
    assert f"the run needs {gib_figure(pred.gpu_needed_bytes)} GiB" in checks["GPU free memory"]["detail"]
