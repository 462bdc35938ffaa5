"""MoE in the memory and time model, and --hf-config/--experts/--top-k on the command line."""

from __future__ import annotations

import json
import tomllib

import pytest

from zlayout import catalog, hfconfig
from zlayout.cli import main
from zlayout.core.memory import (estimate_memory, layer_activation_bytes, moe_dispatch_bytes,
                                 persistent_small_param_elements, saved_activation_bytes)
from zlayout.core.reductions import device_of
from zlayout.core.steptime import estimate_step_time, matmul_params, micro_step_work
from zlayout.spec import HardwareSpec, Layout, ModelSpec, PlanInput, TrainingSpec, ZeroKnobs
from tests.hf.conftest import CONFIGS

MIXTRAL = CONFIGS / "published" / "Mixtral-8x7B-v0.1.json"
SMALL_MIXTRAL = CONFIGS / "small" / "mixtral.json"


def moe(experts: int = 8, top_k: int = 2, **changes) -> ModelSpec:
    base = dict(name="moe", layers=4, hidden=1024, heads=8, kv_heads=2, ffn=2816, vocab=32000,
                mlp="swiglu", norm="rmsnorm", bias=False, experts=experts, top_k=top_k)
    return ModelSpec(**{**base, **changes})


def plan_input(model: ModelSpec, world: int = 8, **training) -> PlanInput:
    hardware = HardwareSpec(gpu=catalog.load_gpu("h200"), gpus_per_node=world,
                            intra_link=catalog.load_link("nvlink4"))
    return PlanInput(model=model, hardware=hardware,
                     training=TrainingSpec(seq=training.pop("seq", 2048), **training))


def term(est, name: str, where: str = "gpu") -> int:
    return next((t.bytes for t in est.terms if t.name == name and t.where == where), 0)


@pytest.mark.parametrize("stage,shard_params,shard_states", [(0, False, False), (1, False, True),
                                                            (2, False, True), (3, True, True)])
def test_every_experts_weights_gradients_and_optimizer_states_are_counted(stage, shard_params, shard_states):
    model = hfconfig.load(MIXTRAL)
    est = estimate_memory(plan_input(model), Layout(stage=stage))
    p, n = model.params, 8
    assert term(est, "parameters") == 2 * (-(-p // n) if shard_params else p)
    states_p = -(-p // n) if shard_states else p
    assert term(est, "master_weights") == 4 * states_p
    assert term(est, "adam_moments") == 8 * states_p


def test_routed_activations_grow_with_top_k_and_router_probabilities_with_experts():
    t = TrainingSpec(seq=1024, micro_batch=2)
    tokens, h, ef = 2048, 1024, 2816
    # each more expert per token: its gathered input and output (2h) and SwiGLU's 4 x ffn, bf16
    k1, k2 = layer_activation_bytes(moe(top_k=1), t, moe=True), layer_activation_bytes(moe(top_k=2), t, moe=True)
    assert k2 - k1 == tokens * (2 * (2 * h + 4 * ef) + 4 + 8)
    # each more expert: one fp32 router probability per token
    e8, e16 = layer_activation_bytes(moe(experts=8), t, moe=True), layer_activation_bytes(moe(experts=16), t, moe=True)
    assert e16 - e8 == tokens * 4 * 8
    # a MoE block keeps more than the dense block of the same expert size
    assert k2 > layer_activation_bytes(moe(), t, moe=False)


def test_dense_blocks_of_a_moe_model_keep_dense_activations():
    t = TrainingSpec(seq=512)
    model = moe(dense_layers=(0,))
    assert saved_activation_bytes(model, t) == (layer_activation_bytes(model, t)
                                                + 3 * layer_activation_bytes(model, t, moe=True))


def test_dispatch_and_expert_gradients_appear_only_for_moe():
    dense = ModelSpec(layers=4, hidden=1024, heads=8, ffn=2816, vocab=32000, mlp="swiglu")
    for model, present in ((dense, False), (moe(), True)):
        est = estimate_memory(plan_input(model, world=1), Layout(stage=0))
        assert (term(est, "moe_dispatch") > 0) is present
        assert (term(est, "moe_expert_gradients") > 0) is present
    # the one-hot mask: tokens x top_k x (experts + 1) int64, plus the zeroed output
    assert moe_dispatch_bytes(moe(), TrainingSpec(seq=1000), device_of(catalog.load_gpu("h200"))) == 1000 * (2 * 9 * 8 + 1024 * 2)


def test_small_routers_persist_under_stage3():
    model = moe(experts=8)  # router 8 x 1024 = 8192 elements, under the 1e5 threshold
    small = persistent_small_param_elements(model, ZeroKnobs())
    norms = 4 * 2 * 1024 + 1024
    assert small == norms + 4 * 8 * 1024


def test_compute_counts_the_experts_a_token_uses_not_all_of_them():
    few, many = moe(experts=4, top_k=2), moe(experts=32, top_k=2)
    assert many.params > 3 * few.params // 2
    # only the router (experts x hidden per block) grows with the experts; the 2 experts used do not
    assert matmul_params(plan_input(many)) - matmul_params(plan_input(few)) == 4 * (32 - 4) * 1024
    t_few = estimate_step_time(plan_input(few), Layout(stage=3))
    t_many = estimate_step_time(plan_input(many), Layout(stage=3))
    # the GEMMs (not the stage-3 gathers and gradient copies, which move every expert's bytes)
    for pass_few, pass_many in zip(micro_step_work(plan_input(few), Layout(stage=3)),
                                   micro_step_work(plan_input(many), Layout(stage=3))):
        assert pass_many.gemm_flops / pass_few.gemm_flops < 1.002
    assert t_many.model_flops_per_step == 6 * many.active_params * t_many.tokens_per_step


# --------------------------------------------------------------------------- command line


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_reads_the_config_and_reports_moe(capsys):
    code, out, err = run(capsys, "plan", "--hf-config", str(MIXTRAL), "--gpus-per-node", "8", "--stage", "3",
                         "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["params"] == 46_702_792_704
    assert data["model"]["hf_model_type"] == "mixtral" and data["model"]["experts"] == 8
    assert {"moe_dispatch", "moe_expert_gradients"} <= {t["name"] for t in data["terms"]}
    code, out, _ = run(capsys, "plan", "--hf-config", str(MIXTRAL), "--gpus-per-node", "8", "--stage", "3")
    assert code == 0 and "8 experts, top-2" in out


def test_hand_entered_moe_equals_the_config(capsys):
    flags = ["--layers", "32", "--hidden", "4096", "--heads", "32", "--kv-heads", "8", "--ffn", "14336",
             "--vocab", "32000", "--mlp", "swiglu", "--norm", "rmsnorm", "--no-bias",
             "--experts", "8", "--top-k", "2", "--gpus-per-node", "8", "--stage", "2", "--json"]
    code, out, err = run(capsys, "plan", *flags)
    assert code == 0, err
    assert json.loads(out)["params"] == hfconfig.load(MIXTRAL).params


def test_breakeven_grows_a_moe_model_in_depth(capsys):
    code, out, err = run(capsys, "breakeven", "--hf-config", str(SMALL_MIXTRAL), "--gpus-per-node", "2", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["scaling"] == "depth" and data["params"] == hfconfig.load(SMALL_MIXTRAL).params


@pytest.mark.parametrize("argv,words", [
    (["--hf-config", "nowhere/config.json"], ["nowhere/config.json", "no such file"]),
    (["--hf-config", str(MIXTRAL), "--preset", "llama3-8b"], ["--preset", "--hf-config", "not several"]),
    (["--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "100", "--experts", "4"], ["--top-k"]),
    (["--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "100", "--top-k", "2"], ["--experts"]),
    (["--hf-config", str(SMALL_MIXTRAL), "--top-k", "5"], ["top_k (5) must be at most experts (4)"]),
])
def test_bad_model_input_exits_2_with_one_line(capsys, argv, words):
    code, out, err = run(capsys, "plan", *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("zlayout: error: ")
    for word in words:
        assert word in err


def test_the_profile_records_the_config_and_restores_the_model(tmp_path, capsys):
    config = CONFIGS / "published" / "DeepSeek-V2-Lite.json"
    out_dir = tmp_path / "profile"
    code, _, err = run(capsys, "export", "--hf-config", str(config), "--gpus-per-node", "8", "--stage", "3",
                       "--out", str(out_dir))
    assert code == 0, err
    table = tomllib.loads((out_dir / "profile.toml").read_text())
    recorded = table["inputs"]["model"]
    assert recorded["hf_model_type"] == "deepseek_v2"
    assert recorded["hf_config"] == "hf_config.json"  # a copy travels inside the profile
    from zlayout.profile import load_profile

    profile = load_profile(out_dir / "profile.toml")
    same = {"hf_config": None}  # the path differs (the copy's), the model must not
    assert profile.inputs.model.model_copy(update=same) == hfconfig.load(config).model_copy(update=same)
    assert profile.inputs.training.impl == "hf"  # a config.json model is trained with its model class


@pytest.mark.parametrize("command", ["breakeven", "export", "verify"])
def test_every_planning_command_takes_hf_config(tmp_path, capsys, command):
    extra = {"export": ["--stage", "0", "--out", str(tmp_path / "p")], "verify": ["--stage", "0", "--cpu"]}
    code, out, err = run(capsys, command, "--hf-config", str(tmp_path / "missing"), *extra.get(command, []))
    assert code == 2 and err.startswith("zlayout: error: ") and "no such file" in err
