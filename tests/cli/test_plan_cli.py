"""`zlayout plan`: the command-line contract (README.md), run as a real subprocess and in-process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from zlayout.cli import main

REFERENCE_FLAGS = ["--layers", "8", "--hidden", "4096", "--heads", "32", "--vocab", "32000",
                   "--seq", "2048", "--micro-batch", "2", "--gpus-per-node", "2", "--gpu", "h200"]
CONTRACT_KEYS = {"params", "gpu_peak_allocated_bytes", "gpu_peak_reserved_bytes", "host_peak_bytes",
                 "fits", "step_time_s"}


def run_plan(capsys, *flags: str) -> tuple[int, str, str]:
    code = main(["plan", *flags])
    out, err = capsys.readouterr()
    return code, out, err


def test_contract_command_prints_one_json_object_with_the_contract_keys():
    proc = subprocess.run(
        [sys.executable, "-m", "zlayout", "plan", *REFERENCE_FLAGS, "--stage", "3",
         "--offload-optimizer", "cpu", "--offload-param", "cpu", "--checkpointing", "full", "--json"],
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert CONTRACT_KEYS <= data.keys()
    assert data["params"] == 1_873_190_912
    assert data["stage"] == 3 and data["offload_optimizer"] == "cpu" and data["offload_param"] == "cpu"
    assert isinstance(data["fits"], bool)
    assert data["gpu_peak_reserved_bytes"] >= data["gpu_peak_allocated_bytes"] > 0
    assert data["host_peak_bytes"] > 0 and data["step_time_s"] > 0


def test_without_stage_every_layout_is_evaluated(capsys):
    code, out, _ = run_plan(capsys, *REFERENCE_FLAGS, "--json")
    assert code == 0
    data = json.loads(out)
    keys = {(lp["stage"], lp["offload_optimizer"], lp["offload_param"]) for lp in data["layouts"]}
    assert len(keys) == 13
    assert (0, "none", "none") in keys and (3, "nvme", "nvme") in keys
    for lp in data["layouts"]:
        assert CONTRACT_KEYS - {"params"} <= lp.keys()
    assert data["recommendation"]["layout"] is not None


def test_terms_add_up_to_the_peak_phase_and_carry_explanations(capsys):
    code, out, _ = run_plan(capsys, *REFERENCE_FLAGS, "--stage", "2", "--json")
    data = json.loads(out)
    gpu_terms = [t for t in data["terms"] if t["where"] == "gpu"]
    assert all(t["explanation"] for t in data["terms"])
    assert {"parameters", "gradients", "master_weights", "adam_moments", "activations",
            "reduce_buckets", "cuda_context"} <= {t["name"] for t in gpu_terms}


def test_readable_table_by_default(capsys):
    code, out, _ = run_plan(capsys, *REFERENCE_FLAGS)
    assert code == 0
    assert "ZeRO-3 opt→cpu param→cpu" in out and "Recommendation:" in out


def _step_parts(out: str) -> tuple[float, list[float], bool]:
    """The single-layout text's step time, its parts, and whether the host-bound note is there."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Step time "))
    total = float(lines[start].split()[2])
    parts = []
    for line in lines[start + 1:]:
        if not line.startswith("  ") or line.startswith(("  host-bound", "  offload-bound")):
            break
        parts.append(float(line[20:28]))
    return total, parts, any(line.startswith("  host-bound:") for line in lines[start:])


HOST_BOUND_Z3 = ["--impl", "hf", "--stage", "3", "--layers", "16", "--hidden", "2048", "--heads", "16",
                 "--kv-heads", "8", "--ffn", "5632", "--vocab", "32000", "--mlp", "swiglu", "--norm", "rmsnorm",
                 "--no-bias", "--seq", "4096", "--micro-batch", "2", "--gpus-per-node", "1", "--gpu", "h200"]


def test_one_layout_prints_its_step_time_part_by_part_and_the_parts_add_up(capsys):
    code, out, _ = run_plan(capsys, *REFERENCE_FLAGS, "--stage", "2", "--offload-optimizer", "cpu")
    assert code == 0
    total, parts, host_bound = _step_parts(out)
    assert len(parts) >= 3 and abs(sum(parts) - total) <= 0.002 * len(parts)
    assert "offload" in out and "CPU optimizer" in out and not host_bound
    data = json.loads(run_plan(capsys, *REFERENCE_FLAGS, "--stage", "2", "--offload-optimizer", "cpu", "--json")[1])
    assert abs(data["step_time_s"] - total) < 0.0005


def test_an_offload_bound_step_says_its_figure_varies_and_a_gpu_bound_one_does_not(capsys):
    # Mixtral-8x7B-L2's shape at ZeRO-3 with the optimizer on the CPU: 3.13-4.46 s a step over three
    # verify processes on one host (h200-2026-12-04/06/08); the CPU optimizer is most of its step
    _, out, _ = run_plan(capsys, *REFERENCE_FLAGS, "--stage", "3", "--offload-optimizer", "cpu")
    total, parts, _ = _step_parts(out)
    assert abs(sum(parts) - total) <= 0.002 * len(parts)
    note = next(line for line in out.splitlines() if line.startswith("  offload-bound: "))
    assert "varies from process to process" in note and "zlayout calibrate" in note
    _, out, _ = run_plan(capsys, *REFERENCE_FLAGS, "--stage", "3")
    assert "offload-bound" not in out


def test_a_host_bound_step_says_so_and_a_kernel_bound_one_does_not(capsys):
    # batch 9's transformers ZeRO-3 layout on one GPU: 0.197-0.359 s over six processes
    _, out, _ = run_plan(capsys, *HOST_BOUND_Z3)
    total, parts, host_bound = _step_parts(out)
    assert host_bound and abs(sum(parts) - total) <= 0.002 * len(parts)
    # the same model at micro-batch 8 keeps the GPU busy: its host side hides behind the kernels
    flags = [*HOST_BOUND_Z3[:-5], "8", *HOST_BOUND_Z3[-4:]]
    assert flags[flags.index("--micro-batch") + 1] == "8"
    _, out, _ = run_plan(capsys, *flags)
    assert not _step_parts(out)[2]


def test_presets_and_sizes_extend_the_contract(capsys):
    code, out, _ = run_plan(capsys, "--preset", "llama3-8b", "--gpus-per-node", "8", "--gpu", "h100",
                            "--stage", "3", "--json")
    assert code == 0 and json.loads(out)["params"] == 8_030_261_248
    code, out, _ = run_plan(capsys, "--params", "13B", "--gpus-per-node", "8", "--stage", "2", "--json")
    assert code == 0 and abs(json.loads(out)["params"] / 13e9 - 1) < 0.05


@pytest.mark.parametrize("flags,message", [
    (["--stage", "1", "--offload-param", "cpu"], "parameter offload needs ZeRO stage 3"),
    (["--stage", "2", "--offload-optimizer", "nvme"], "NVMe offload needs ZeRO stage 3"),
    (["--stage", "0", "--offload-optimizer", "cpu"], "optimizer offload needs ZeRO stage 1"),
])
def test_impossible_layouts_exit_2_with_what_to_change(capsys, flags, message):
    code, out, err = run_plan(capsys, *REFERENCE_FLAGS, *flags, "--json")
    assert code == 2 and out == ""
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("flags,message", [
    (["--layers", "8", "--hidden", "4100", "--heads", "32", "--vocab", "32000"], "divisible by heads"),
    (["--layers", "8", "--hidden", "4096", "--heads", "32"], "--vocab"),
    (["--layers", "-1", "--hidden", "4096", "--heads", "32", "--vocab", "32000"], "layers"),
    (["--preset", "llama9"], "available:"),
    (["--params", "lots"], "13B"),
    (["--params", "7B", "--gpus-per-node", "0"], "--gpus-per-node: must be from 1 to 128 (got 0)"),
    (["--params", "7B", "--gpu", "h300"], "unknown GPU"),
])
def test_bad_input_exits_2_without_a_traceback(capsys, flags, message):
    code, out, err = run_plan(capsys, *flags)
    assert code == 2
    assert message in err, err
    assert "Traceback" not in err


LLAMA70_64XH100 = ["--preset", "llama3-70b", "--gpu", "h100", "--gpus-per-node", "8", "--nodes", "8"]


def test_the_table_names_every_broken_limit_and_what_is_missing(capsys):
    # ZeRO-0..2 need 2127.92 GiB of host RAM per node (2048 by default) besides the GPU: 8 ranks
    # each build the model in fp32 and cast it to bf16 tensor by tensor, the embedding first.
    code, out, _ = run_plan(capsys, *LLAMA70_64XH100, "--checkpointing", "full")
    assert code == 0
    rows = {line[:26].strip(): line for line in out.splitlines()}
    assert rows["ZeRO-2"].endswith("no (gpu +82.3 GiB, host +79.9 GiB)")
    assert "2127.92" in rows["ZeRO-2"] and "-78.93" in rows["ZeRO-2"]  # GPU free, in GiB (of what CUDA hands out)
    assert rows["ZeRO-3 opt→nvme"].endswith("no (nvme +98.6 GiB)")
    assert "%" not in rows["ZeRO-0"]


def test_json_says_how_much_each_layout_is_short(capsys):
    code, out, _ = run_plan(capsys, *LLAMA70_64XH100, "--checkpointing", "full", "--json")
    layouts = {(lp["stage"], lp["offload_optimizer"], lp["offload_param"]): lp
               for lp in json.loads(out)["layouts"]}
    z2 = layouts[(2, "none", "none")]
    assert set(z2["short_by_bytes"]) == {"gpu", "host"} and not z2["fits_host"]
    assert z2["short_by_bytes"]["host"] == z2["host_peak_bytes"] - 2048 * 2**30
    assert layouts[(3, "none", "none")]["short_by_bytes"] == {}


def test_one_layout_says_when_the_recommendation_is_another(capsys):
    code, out, _ = run_plan(capsys, *REFERENCE_FLAGS, "--stage", "3", "--offload-optimizer", "cpu", "--json")
    data = json.loads(out)
    rec = data["recommendation"]["layout"]
    assert (rec["stage"], rec["offload_optimizer"]) != (3, "cpu") and data["recommended"] is False
    assert data["recommendation_note"].startswith(f"the recommendation is another layout, {rec['label']}")
    code, out, _ = run_plan(capsys, *REFERENCE_FLAGS, "--stage", str(rec["stage"]),
                            "--offload-optimizer", rec["offload_optimizer"],
                            "--offload-param", rec["offload_param"], "--json")
    assert json.loads(out)["recommended"] is True
    code, out, _ = run_plan(capsys, *REFERENCE_FLAGS, "--stage", "3", "--offload-optimizer", "cpu")
    assert f"Note: the recommendation is another layout, {rec['label']}, not ZeRO-3 opt→cpu." in out


def test_a_preset_with_a_changed_architecture_is_a_custom_model_of_no_family(capsys):
    """--preset llama3-70b --layers 48 --hidden 4096 ... is a 19.8B model: it is not Llama-3-70B,
    and its break-even follows its own shape, not the Llama-3 family's sizes. Flags that repeat
    the preset's own values keep the preset."""
    from zlayout.cli import build_parser, plan_input_from_args

    def model(*flags):
        return plan_input_from_args(build_parser().parse_args(["plan", "--preset", "llama3-70b", *flags])).model

    changed = model("--layers", "48", "--hidden", "4096", "--heads", "32", "--kv-heads", "4")
    assert (changed.name, changed.family, changed.layers, changed.hidden) == ("custom", None, 48, 4096)
    same = model("--layers", "80")
    assert (same.name, same.family) == ("llama3-70b", "llama3")
    code, out, _ = run_plan(capsys, "--preset", "llama3-70b", "--layers", "48", "--hidden", "4096",
                            "--heads", "32", "--kv-heads", "4")
    assert code == 0 and out.startswith("custom: 19.8B params")


def test_only_the_process_command_line_freezes_the_collector(capsys):
    """`python -m zlayout plan` freezes what its imports made (the process ends after the
    command); called with arguments, as tests and the app call it, main leaves the collector
    of the process it runs in as it was."""
    import gc

    frozen = gc.get_freeze_count()
    code, _, _ = run_plan(capsys, *REFERENCE_FLAGS, "--stage", "3", "--json")
    assert code == 0 and gc.get_freeze_count() == frozen
