"""ds_config.json as written beside the profile is accepted by DeepSpeed's own config class."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zlayout.profile import build_profile, save_profile_dir
from zlayout.spec import Layout, all_layouts

import deepspeed.runtime.config as deepspeed_config  # noqa: E402  (the test extras install it)


@pytest.fixture
def world_of(monkeypatch):
    """DeepSpeedConfig asks torch.distributed for the world size (1 when it is not initialized)
    and checks train_batch_size against it; stand in for the profile's world of processes."""

    def set_world(world: int) -> None:
        monkeypatch.setattr(deepspeed_config.dist, "get_world_size", lambda *a, **k: world)
        monkeypatch.setattr(deepspeed_config.dist, "get_rank", lambda *a, **k: 0)

    return set_world


def _load(path, world_of, world):
    world_of(world)
    return deepspeed_config.DeepSpeedConfig(str(path))


@pytest.mark.parametrize("layout", all_layouts(), ids=lambda lay: lay.key)
@pytest.mark.parametrize("shape", [
    dict(gpus_per_node=1, precision="bf16"),
    dict(gpus_per_node=8, micro_batch=2, grad_accum=4, precision="fp16", checkpointing="full"),
    dict(gpus_per_node=8, nodes=8, precision="bf16", grad_accum=16),
], ids=["1gpu-bf16", "8gpu-fp16", "64gpu-bf16"])
def test_deepspeed_accepts_the_written_config(layout, shape, make_input, tmp_path, world_of):
    inp = make_input(nvme_gib=4096, **shape)
    profile = build_profile(inp, layout)
    save_profile_dir(profile, tmp_path)
    cfg = _load(tmp_path / "ds_config.json", world_of, inp.hardware.world)
    t = inp.training
    assert cfg.zero_optimization_stage == layout.stage
    assert cfg.train_micro_batch_size_per_gpu == t.micro_batch
    assert cfg.gradient_accumulation_steps == t.grad_accum
    assert cfg.train_batch_size == t.micro_batch * t.grad_accum * inp.hardware.world
    assert cfg.bfloat16_config.enabled == (t.precision == "bf16")
    assert cfg.float16_config.enabled == (t.precision == "fp16")
    zero = cfg.zero_config
    assert zero.overlap_comm == inp.zero.overlap_comm
    assert zero.reduce_bucket_size == inp.zero.reduce_bucket_size
    offload_opt = zero.offload_optimizer.device if zero.offload_optimizer else "none"
    offload_param = zero.offload_param.device if zero.offload_param else "none"
    assert offload_opt == {"gpu": "none"}.get(layout.offload_optimizer, layout.offload_optimizer)
    assert offload_param == {"gpu": "none"}.get(layout.offload_param, layout.offload_param)
    assert cfg.optimizer_name == "adamw"
    assert cfg.gradient_clipping == inp.zero.gradient_clipping


def test_the_test_catches_a_rejected_config(make_input, tmp_path, world_of):
    """The check above can fail: DeepSpeed rejects a misspelt knob and a wrong batch size."""
    profile = build_profile(make_input(), Layout(stage=3))
    save_profile_dir(profile, tmp_path)
    path = tmp_path / "ds_config.json"
    good = json.loads(path.read_text())
    bad = json.loads(path.read_text())
    bad["zero_optimization"]["stage3_prefetch_bucket"] = 1
    path.write_text(json.dumps(bad))
    with pytest.raises(Exception, match="stage3_prefetch_bucket"):
        _load(path, world_of, 8)
    path.write_text(json.dumps(good))
    with pytest.raises(AssertionError, match="train_batch_size"):
        _load(path, world_of, 16)  # the profile says 8 processes


def test_nvme_path_reaches_the_config(make_input, tmp_path, world_of):
    from zlayout.profile import RunSettings

    layout = Layout(stage=3, offload_optimizer="nvme", offload_param="nvme")
    profile = build_profile(make_input(nvme_gib=4096), layout, run=RunSettings(nvme_path="/scratch/nvme0"))
    save_profile_dir(profile, tmp_path)
    cfg = _load(tmp_path / "ds_config.json", world_of, 8)
    assert str(cfg.zero_config.offload_optimizer.nvme_path) == "/scratch/nvme0"
    assert str(cfg.zero_config.offload_param.nvme_path) == "/scratch/nvme0"


ZAYA_TINY = Path(__file__).resolve().parents[1] / "learn" / "configs" / "zaya-tiny.json"


def _learned(path: Path, folder: Path) -> dict:
    """The config at `path`, its card learned into `folder` (where ZLAYOUT_CARDS_DIR points)."""
    from zlayout import cards
    from zlayout.learn.learner import learn

    config = json.loads(path.read_text())
    key = cards.config_key(config)
    cards.write_card(folder, key, cards.dumps_card(learn(config), key, path.name), replace=False)
    return config


def _planned(path: Path, stage: int, gpus: int):
    """The plan input and layout of `plan --hf-config PATH --stage STAGE` on GPUS GPUs, 256 tokens."""
    from zlayout.cli import build_parser, layout_from_args, plan_input_from_args

    args = build_parser().parse_args(["plan", "--hf-config", str(path), "--stage", str(stage),
                                      "--gpus-per-node", str(gpus), "--seq", "256"])
    return plan_input_from_args(args), layout_from_args(args)


def test_a_grouped_experts_weight_off_a_16_byte_boundary_asks_deepspeed_to_align_every_tensor(tmp_path, monkeypatch):
    """zaya's 2-element `qk_norm.temp` comes before its experts: ZeRO-1/2's flat buffer, packed tensor
    after tensor, puts the experts 4 bytes off a 16-byte boundary, where torch's grouped GEMM refuses
    them on a GPU (h200-2026-12-31c). The written config asks DeepSpeed to pad each tensor
    (`parameter_alignment`) at those stages only: ZeRO-0's FP16_Optimizer and ZeRO-3 on one GPU pack
    alike with no switch to pad (the plan refuses them), and ZeRO-3 over several GPUs gathers each
    into its own allocation."""
    pytest.importorskip("transformers")
    from zlayout.core.tensors import grouped_gemm_misaligned
    from zlayout.profile.ds_config import ds_config

    monkeypatch.setenv("ZLAYOUT_CARDS_DIR", str(tmp_path))
    _learned(ZAYA_TINY, tmp_path)
    got = {}
    for stage, gpus in ((0, 1), (1, 1), (2, 1), (2, 8), (3, 1), (3, 8)):
        inp, layout = _planned(ZAYA_TINY, stage, gpus)
        got[stage, gpus] = (grouped_gemm_misaligned(inp, layout),
                            ds_config(inp, layout)["zero_optimization"].get("parameter_alignment"))
        assert inp.model.card.grouped_gemm_weights  # the experts' 3-D weights, read from the card
    first = got[2, 1][0]
    assert first is not None and first in inp.model.card.grouped_gemm_weights
    assert got == {(0, 1): (first, None), (1, 1): (first, True), (2, 1): (first, True), (2, 8): (first, True),
                   (3, 1): (first, None), (3, 8): (None, None)}


def test_zero0_and_zero3_on_one_gpu_are_refused_where_their_packed_weights_misalign_the_experts(tmp_path):
    """ZeRO-3 on one GPU points each weight at its partition in one packed buffer (stage3.py
    `defragment`, no padding switch): zaya's experts land 4 bytes off a boundary there too (checked
    on a CPU engine; on an H100, torch's grouped GEMM refused it: h200-2026-12-31c). ZeRO-0's
    FP16_Optimizer packs the weights the same way (fused_optimizer.py). plan says why in a note for
    each; verify and export refuse the layouts in one line rather than launch or write a run that
    fails at its first forward; over 8 GPUs ZeRO-3 gathers each weight into its own tensor and runs."""
    pytest.importorskip("transformers")
    import os
    import subprocess
    import sys

    from zlayout import cards
    from zlayout.learn.learner import learn

    config = json.loads(ZAYA_TINY.read_text())
    key = cards.config_key(config)
    cards.write_card(tmp_path / "cards", key, cards.dumps_card(learn(config), key, ZAYA_TINY.name), replace=False)
    env = dict(os.environ, ZLAYOUT_CARDS_DIR=str(tmp_path / "cards"))

    def zlayout(*argv):
        return subprocess.run([sys.executable, "-m", "zlayout", *argv, "--hf-config", str(ZAYA_TINY), "--seq", "256"],
                              capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)

    plan = zlayout("plan", "--gpus-per-node", "1")
    assert plan.returncode == 0 and "Note: ZeRO-3 on one GPU will not run this model" in plan.stdout
    assert "Note: ZeRO-0 will not run this model: DeepSpeed's FP16_Optimizer packs" in plan.stdout
    row = next(line for line in plan.stdout.splitlines() if line.split()[:2] == ["ZeRO-3", "1.00"]
               or (line.startswith("ZeRO-3 ") and "opt" not in line))
    assert row.endswith("but will not run (Note)")
    wont = json.loads(zlayout("plan", "--gpus-per-node", "1", "--json").stdout)["will_not_run"]
    # every ZeRO-3 layout with its weights on the GPU, whatever holds the optimizer
    assert sorted(wont) == ["z0-opt_gpu-param_gpu", "z3-opt_cpu-param_gpu", "z3-opt_gpu-param_gpu",
                            "z3-opt_nvme-param_gpu"]
    assert "grouped GEMM refuses it" in wont["z3-opt_gpu-param_gpu"]
    for argv in (("verify", "--stage", "3", "--out", str(tmp_path / "v")),
                 ("export", "--stage", "3", "--out", str(tmp_path / "p")),
                 ("verify", "--stage", "0", "--out", str(tmp_path / "v")),
                 ("export", "--stage", "0", "--out", str(tmp_path / "p"))):
        refused = zlayout(*argv, "--gpus-per-node", "1")
        assert refused.returncode == 2 and "grouped GEMM refuses it" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "v").exists() and not (tmp_path / "p").exists()
    # an 8-GPU plan run as one process on this node is ZeRO-3 on one GPU
    one = zlayout("verify", "--stage", "3", "--gpus-per-node", "8", "--processes", "1", "--out", str(tmp_path / "v1"))
    assert one.returncode == 2 and "grouped GEMM refuses it" in one.stderr and not (tmp_path / "v1").exists()
    eight = zlayout("export", "--stage", "3", "--gpus-per-node", "8", "--out", str(tmp_path / "p8"))
    assert eight.returncode == 0, eight.stderr
    assert "ZeRO-3 on one GPU will not run" not in zlayout("plan", "--gpus-per-node", "8").stdout
    assert sorted(json.loads(zlayout("plan", "--gpus-per-node", "8", "--json").stdout)["will_not_run"]) == [
        "z0-opt_gpu-param_gpu"]  # FP16_Optimizer packs at any world


def test_the_recommendation_never_picks_a_layout_that_will_not_run(tmp_path, monkeypatch):
    """Where ZeRO-3 on one GPU is the only layout left that fits, zaya's misaligned experts leave none
    to recommend (the suggestions say what to change); over 8 GPUs ZeRO-3 runs and is recommended."""
    pytest.importorskip("transformers")
    from zlayout import cards
    from zlayout.cli import build_parser, plan_input_from_args
    from zlayout.core.plan import plan_layout
    from zlayout.core.recommend import recommend
    from zlayout.learn.learner import learn

    monkeypatch.setenv("ZLAYOUT_CARDS_DIR", str(tmp_path))
    config = json.loads(ZAYA_TINY.read_text())
    key = cards.config_key(config)
    cards.write_card(tmp_path, key, cards.dumps_card(learn(config), key, ZAYA_TINY.name), replace=False)
    for gpus, expected in ((1, None), (8, Layout(stage=3))):
        args = build_parser().parse_args(["plan", "--hf-config", str(ZAYA_TINY), "--gpus-per-node", str(gpus),
                                          "--seq", "256"])
        inp = plan_input_from_args(args)
        only = plan_layout(inp, Layout(stage=3), with_breakeven=False)
        assert only.memory.fits
        assert recommend(inp, (only,)).layout == expected
    # the app's table marks them where the plan's rows say "but will not run": ZeRO-0, and every ZeRO-3
    # layout with its weights on the one GPU
    from zlayout.core.plan import make_plan
    from zlayout.tui.view import WILL_NOT_RUN_CELL, layout_rows

    args = build_parser().parse_args(["plan", "--hf-config", str(ZAYA_TINY), "--gpus-per-node", "1", "--seq", "256"])
    rows = layout_rows(make_plan(plan_input_from_args(args), with_breakeven=False))
    assert {r.key for r in rows if r.headroom == WILL_NOT_RUN_CELL} == {
        "z0-opt_gpu-param_gpu", "z3-opt_gpu-param_gpu", "z3-opt_cpu-param_gpu"}
    assert all(r.headroom_level == "over" and not r.recommended for r in rows if r.headroom == WILL_NOT_RUN_CELL)


APERTUS_TINY = Path(__file__).resolve().parents[1] / "learn" / "configs" / "apertus-tiny.json"


def test_dense_weights_packed_off_a_boundary_run_on_slower_gemms_where_nothing_pads_them(tmp_path, monkeypatch):
    """Apertus's xIELU keeps two 1-element scalars after each block's MLP: packed tensor after tensor,
    block 1's matrices start 4 bytes off a 16-byte boundary and the head, after two blocks and the
    final norm, 8 bytes off. ZeRO-0 (FP16_Optimizer) and ZeRO-3 on one GPU pack with no padding, so
    the GEMMs reading those weights are priced on cuBLAS's 2- and 4-element kernels (h200-2026-12-31c:
    apertus1p5_text at ZeRO-3 on one GPU ran `..._align2` CUTLASS kernels, -24.8% -> -5.3%); ZeRO-1/2
    get `parameter_alignment` in the written config and run aligned; ZeRO-3 over 8 GPUs gathers."""
    pytest.importorskip("transformers")
    from zlayout.core.steptime import card_with_work, card_work, micro_step_work
    from zlayout.core.tensors import gemm_weight_alignment
    from zlayout.profile.ds_config import ds_config

    monkeypatch.setenv("ZLAYOUT_CARDS_DIR", str(tmp_path))
    _learned(APERTUS_TINY, tmp_path)
    got = {}
    for stage, gpus in ((0, 1), (1, 1), (2, 1), (3, 1), (3, 8)):
        inp, layout = _planned(APERTUS_TINY, stage, gpus)
        got[stage, gpus] = (gemm_weight_alignment(inp, layout),
                            ds_config(inp, layout)["zero_optimization"].get("parameter_alignment"))
        forward, _ = micro_step_work(inp, layout)
        aligned, _ = card_work(inp, card_with_work(inp))
        # the same GEMM FLOPs, moved to the slower kernels where a weight is off its boundary
        moved = forward.half_aligned_gemm_flops - aligned.half_aligned_gemm_flops
        assert forward.gemm_flops + forward.half_aligned_gemm_flops == pytest.approx(
            aligned.gemm_flops + aligned.half_aligned_gemm_flops)
        assert (moved > 0) == (got[stage, gpus][0] is not None)
    packed = ({2: pytest.approx(0.5)}, 4)
    assert got == {(0, 1): (packed, None), (1, 1): (None, True), (2, 1): (None, True), (3, 1): (packed, None),
                   (3, 8): (None, None)}
    # the runbook's contract keeps the setting, and says a checkpoint saved without it will not load
    from zlayout.profile.contract import script_contract

    rows = {stage: [r for r in script_contract(build_profile(*_planned(APERTUS_TINY, stage, 1)))
                    if "parameter_alignment" in r.what] for stage in (0, 2)}
    assert not rows[0] and len(rows[2]) == 1
    assert "DeepSpeed refuses to load a ZeRO-1/2 checkpoint saved with the other setting" in rows[2][0].how
    assert "grouped GEMM" not in rows[2][0].protects  # apertus has no grouped experts
