"""`zlayout breakeven`: the JSON contract, the table, and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from zlayout.cli import build_parser, main, plan_input_from_args
from zlayout.core.breakeven import break_even
from zlayout.core.memory import estimate_memory
from zlayout.spec import Layout, all_layouts

REFERENCE_FLAGS = ["--layers", "8", "--hidden", "4096", "--heads", "32", "--vocab", "32000",
                   "--seq", "2048", "--micro-batch", "2", "--gpus-per-node", "2", "--gpu", "h200"]


def run_json(capsys, *flags: str) -> dict:
    assert main(["breakeven", *flags, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_has_every_layout_with_the_core_answer(capsys):
    data = run_json(capsys, *REFERENCE_FLAGS)
    inp = plan_input_from_args(build_parser().parse_args(["breakeven", *REFERENCE_FLAGS]))
    assert data["params"] == 1_873_190_912 and data["scaling"] == "depth"
    assert len(data["layouts"]) == len(all_layouts())
    for row, layout in zip(data["layouts"], all_layouts()):
        assert set(row) >= {"stage", "offload_optimizer", "offload_param", "max_params", "max_micro_batch",
                            "limited_by"}
        assert row["stage"] == layout.stage
        assert row["offload_optimizer"] == ("none" if layout.offload_optimizer == "gpu" else layout.offload_optimizer)
        assert row["offload_param"] == ("none" if layout.offload_param == "gpu" else layout.offload_param)
        assert Layout(stage=row["stage"], offload_optimizer=row["offload_optimizer"],
                      offload_param=row["offload_param"]) == layout
        be = break_even(inp, layout)
        assert (row["max_params"], row["max_micro_batch"], row["limited_by"]) == \
            (be.max_params, be.max_micro_batch, be.limited_by)
        assert row["limited_by"] in ("gpu", "host", "nvme", "range")


def test_the_reference_model_fits_and_grows_on_two_h200(capsys):
    data = run_json(capsys, *REFERENCE_FLAGS)
    stage2 = next(r for r in data["layouts"] if r["stage"] == 2 and r["offload_optimizer"] == "none")
    # measured: this layout peaks at 21 GiB on 2 H200s (benchmarks/measurements/h200-2026-11-29.jsonl), so it carries more
    assert stage2["max_params"] > data["params"]
    assert stage2["max_micro_batch"] >= 2 and stage2["fits_current_model"]
    # the largest model is the same architecture, deeper
    assert stage2["max_model"]["hidden"] == 4096
    assert stage2["max_model"]["params"] == stage2["max_params"]


def test_nvme_layouts_without_nvme_are_limited_by_nvme(capsys):
    data = run_json(capsys, *REFERENCE_FLAGS)
    for row in data["layouts"]:
        if "nvme" in (row["offload_optimizer"], row["offload_param"]):
            assert (row["max_params"], row["limited_by"]) == (0, "nvme")


def test_family_preset_and_crossovers(capsys):
    data = run_json(capsys, "--preset", "llama3-8b", "--gpus-per-node", "8", "--nvme-gib", "8192")
    assert data["family"] == "llama3" and data["scaling"] == "family"
    assert data["crossovers"]
    inp = plan_input_from_args(build_parser().parse_args(
        ["breakeven", "--preset", "llama3-8b", "--gpus-per-node", "8", "--nvme-gib", "8192"]))
    for c in data["crossovers"]:
        stops = Layout(stage=c["stops_fitting"]["stage"], offload_optimizer=c["stops_fitting"]["offload_optimizer"],
                       offload_param=c["stops_fitting"]["offload_param"])
        be = break_even(inp, stops)
        assert c["params"] == be.next_params
        assert not estimate_memory(inp.model_copy(update={"model": be.next_model}), stops).fits
        assert "stops fitting" in c["text"]


def test_table_lists_every_layout(capsys):
    assert main(["breakeven", *REFERENCE_FLAGS]) == 0
    out = capsys.readouterr().out
    for layout in all_layouts():
        assert layout.label in out
    assert "largest model" in out and "max micro-batch" in out


def test_offload_flags_are_not_accepted_and_say_so_in_one_line(capsys):
    assert main(["breakeven", *REFERENCE_FLAGS, "--offload-optimizer", "cpu"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("zlayout: error: unrecognized arguments: --offload-optimizer cpu")
    assert err[1:] == ["zlayout: hint: `zlayout breakeven --help` lists every flag"]


def test_unknown_preset_says_what_exists(capsys):
    assert main(["breakeven", "--preset", "llama9-1t"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("zlayout: error:") and "llama3-8b" in err


def test_installed_entry_point_prints_json():
    out = subprocess.run([sys.executable, "-m", "zlayout", "breakeven", *REFERENCE_FLAGS, "--json"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    data = json.loads(out)
    assert len(data["layouts"]) == len(all_layouts())


# -- user model presets: a broken one is refused, a family of --presets-dir is used ---------------

LLAMA_LIKE = ('family = "llama3"\nlayers = 40\nhidden = {hidden}\nheads = 40\nkv_heads = 8\n'
              'ffn = 14336\nvocab = 128256\nmlp = "swiglu"\nnorm = "rmsnorm"\nbias = false\n')


def presets_dir(tmp_path, **files: str):
    (tmp_path / "models").mkdir()
    for name, text in files.items():
        (tmp_path / "models" / f"{name}.toml").write_text(text)
    return str(tmp_path)


@pytest.fixture
def fresh_breakeven():
    """Break-even remembers families per process; these tests change the preset files."""
    from zlayout.core import breakeven

    breakeven.clear_caches()
    yield
    breakeven.clear_caches()


def test_a_broken_family_preset_in_presets_dir_is_refused_naming_file_and_line(capsys, tmp_path,
                                                                                fresh_breakeven):
    # It used to be skipped: break-even read no --presets-dir, so the answer ignored the user's files.
    folder = presets_dir(tmp_path, **{"llama3-bad": 'family = "llama3"\nlayers = 40\nhidden = 5120 5120\n'})
    assert main(["breakeven", "--preset", "llama3-8b", "--presets-dir", folder]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    line, = captured.err.splitlines()
    assert line.startswith("zlayout: error: break-even cannot scale the llama3 family: ")
    assert "llama3-bad.toml: invalid TOML" in line and "line 3, column 15" in line
    # as `plan --preset` refuses the same file
    assert main(["plan", "--preset", "llama3-bad", "--presets-dir", folder]) == 2
    assert "llama3-bad.toml: invalid TOML" in capsys.readouterr().err


def test_a_wrongly_typed_user_preset_does_not_turn_into_depth_scaling(capsys, tmp_path, monkeypatch,
                                                                       fresh_breakeven):
    # ZLAYOUT_PRESETS_DIR was read, the file failed, and the sizes silently grew in depth instead.
    folder = presets_dir(tmp_path, **{"llama3-mine": LLAMA_LIKE.format(hidden='"5120"')})
    monkeypatch.setenv("ZLAYOUT_PRESETS_DIR", folder)
    assert main(["breakeven", "--preset", "llama3-8b", "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "deeper or shallower" not in captured.err
    assert "llama3-mine.toml: invalid model preset: hidden: expected an integer" in captured.err
    # a model without a family reads no preset: it grows in depth, as documented
    assert main(["breakeven", *REFERENCE_FLAGS, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["scaling"] == "depth"


def test_a_family_of_presets_dir_scales_along_its_presets(capsys, tmp_path, fresh_breakeven):
    text = LLAMA_LIKE.format(hidden=5120).replace('"llama3"', '"myfam"')
    folder = presets_dir(tmp_path, **{"myfam-13b": text})
    data = run_json(capsys, "--preset", "myfam-13b", "--gpu", "h100", "--presets-dir", folder)
    assert (data["family"], data["scaling"]) == ("myfam", "family")
    grown = [row["max_model"] for row in data["layouts"] if row["max_model"]]
    assert grown and all(model["name"].startswith("myfam-") for model in grown)
    # export stores the same limits in the profile (they were depth-scaled)
    from zlayout.profile import load_profile

    out = tmp_path / "profile"
    assert main(["export", "--preset", "myfam-13b", "--gpu", "h100", "--stage", "3",
                 "--presets-dir", folder, "--out", str(out)]) == 0
    limits = load_profile(str(out)).limits
    assert limits.scaling == "family" and limits.max_model.startswith("myfam-")


def test_export_refuses_a_broken_family_preset_before_writing(capsys, tmp_path, monkeypatch,
                                                              fresh_breakeven):
    # the profile's limits are break-even's: they were written depth-scaled without a word
    monkeypatch.setenv("ZLAYOUT_PRESETS_DIR", presets_dir(tmp_path, **{"llama3-mine": LLAMA_LIKE.format(hidden="[5120]")}))
    out = tmp_path / "profile"
    assert main(["export", "--preset", "llama3-8b", "--stage", "3", "--out", str(out)]) == 2
    assert "llama3-mine.toml: invalid model preset: hidden" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_stage_narrows_the_layouts_and_keeps_their_answers(capsys, stage):
    every = run_json(capsys, *REFERENCE_FLAGS)
    narrowed = run_json(capsys, *REFERENCE_FLAGS, "--stage", str(stage))
    assert narrowed["stage"] == stage and every["stage"] is None
    assert narrowed["layouts"] == [row for row in every["layouts"] if row["stage"] == stage]
    assert len(narrowed["layouts"]) == {0: 1, 1: 2, 2: 2, 3: 8}[stage]
    for crossover in narrowed["crossovers"]:
        assert crossover["stops_fitting"]["stage"] == stage
        assert crossover["takes_over"] is None or crossover["takes_over"]["stage"] == stage


def test_a_narrowed_table_does_not_say_nothing_else_fits_when_another_stage_does(capsys):
    flags = ["--preset", "llama3-8b", "--gpu", "h200", "--gpus-per-node", "8"]
    assert main(["breakeven", *flags, "--stage", "1"]) == 0
    out = capsys.readouterr().out
    assert "ZeRO-1 layouts only" in out.splitlines()[1]
    assert "nothing else fits" not in out and "stops fitting; no other ZeRO-1 layout fits" in out
    assert "ZeRO-3" not in out and "--nvme-gib" not in out  # no NVMe layout among stage 1's


def test_stage_outside_zero_is_one_line(capsys):
    assert main(["breakeven", *REFERENCE_FLAGS, "--stage", "zero3"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "zlayout: error: --stage: 'zero3' is not one of 0, 1, 2, 3 (did you mean 3?)"


def test_fits_the_current_model_is_the_plans_own_verdict(capsys):
    """On the card's edge fitting is not monotone in the micro-batch (mistral-7b ZeRO-1 on H100 at
    1024 tokens: 52 fits, 53 does not by 3 MiB, 54 fits). At 53 the row was starred because the
    largest micro-batch found (54) was not below it; plan says 53 does not fit."""
    flags = ["--preset", "mistral-7b", "--gpu", "h100", "--seq", "1024", "--checkpointing", "full",
             "--micro-batch", "53", "--stage", "1"]
    data = run_json(capsys, *flags)
    inp = plan_input_from_args(build_parser().parse_args(["breakeven", *flags]))
    for row in data["layouts"]:
        layout = Layout(stage=row["stage"], offload_optimizer=row["offload_optimizer"], offload_param=row["offload_param"])
        assert row["fits_current_model"] == estimate_memory(inp, layout).fits
    assert [row["fits_current_model"] for row in data["layouts"]] == [False, True]


# -- a layout that fits but will not run (plan's `will_not_run`) has no break-even size -------------

ZAYA_TINY = Path(__file__).resolve().parents[1] / "learn" / "configs" / "zaya-tiny.json"
ZAYA_DEFAULT = (Path(__file__).resolve().parents[2] / "benchmarks" / "measurements" / "h200-2026-12-31c"
                / "configs" / "zaya-default.json")  # its card: heldout/cards beside it


def _layout_of(row: dict) -> Layout:
    return Layout(stage=row["stage"], offload_optimizer=row["offload_optimizer"], offload_param=row["offload_param"])


@pytest.fixture
def zaya_tiny_card(tmp_path, monkeypatch):
    """zaya-tiny's card learned from its config (its experts run a grouped GEMM on weights that
    DeepSpeed's unpadded packing puts off a 16-byte boundary), where $ZLAYOUT_CARDS_DIR points."""
    pytest.importorskip("transformers")
    from zlayout import cards
    from zlayout.learn.learner import learn

    config = json.loads(ZAYA_TINY.read_text())
    key = cards.config_key(config)
    cards.write_card(tmp_path / "cards", key, cards.dumps_card(learn(config), key, ZAYA_TINY.name), replace=False)
    monkeypatch.setenv("ZLAYOUT_CARDS_DIR", str(tmp_path / "cards"))
    return ["--hf-config", str(ZAYA_TINY), "--seq", "256"]


def test_a_layout_that_will_not_run_gets_no_size_but_plans_reason(capsys, zaya_tiny_card):
    """ZeRO-0, and ZeRO-3 with its weights on one GPU, fit zaya but will not run it (plan's `✗ run`);
    breakeven printed a largest model and micro-batch for them as for any other. Now their rows hold
    no figure and say why in plan's words, in the JSON (null sizes, `will_not_run`) and the table."""
    for gpus, refused in (("1", {"z0-opt_gpu-param_gpu", "z3-opt_gpu-param_gpu", "z3-opt_cpu-param_gpu",
                                 "z3-opt_nvme-param_gpu"}),
                          ("8", {"z0-opt_gpu-param_gpu"})):  # over 8 GPUs ZeRO-3 gathers each weight: it runs
        flags = [*zaya_tiny_card, "--gpus-per-node", gpus]
        assert main(["plan", *flags, "--json"]) == 0
        wont = json.loads(capsys.readouterr().out)["will_not_run"]
        assert set(wont) == refused
        data = run_json(capsys, *flags)
        assert data["will_not_run"] == wont  # as plan --json: layout key -> why
        for row in data["layouts"]:
            key = _layout_of(row).key
            if key in refused:
                assert row["will_not_run"] == wont[key] and "will not run this model" in row["will_not_run"]
                assert [row[k] for k in ("max_params", "max_micro_batch", "limited_by", "next_params",
                                         "max_model")] == [None] * 5
            else:
                assert row["will_not_run"] is None and isinstance(row["max_params"], int)
                if "nvme" not in (row["offload_optimizer"], row["offload_param"]):  # no NVMe given: none
                    assert row["max_params"] > 0 and row["max_micro_batch"] > 0
        assert not any(_layout_of(c[side]).key in refused for c in data["crossovers"]
                       for side in ("stops_fitting", "takes_over") if c[side] is not None)
        assert main(["breakeven", *flags]) == 0
        out = capsys.readouterr().out
        for layout in all_layouts():
            line = next(line for line in out.splitlines() if line[2:].split("  ")[0] == layout.label)
            if layout.key in refused:
                assert "will not run" in line
                assert not any(ch.isdigit() for ch in line.replace(layout.label, "")), line
                assert not line.startswith("*")
            else:
                assert "will not run" not in line
        for why in set(wont.values()):
            assert f"Note: {why}." in out


def test_breakeven_of_zaya_names_no_size_or_crossover_for_a_layout_that_will_not_run(capsys, monkeypatch):
    """zaya's full card on one H200: breakeven said ZeRO-0 carries up to 4.9B, and its crossovers
    had ZeRO-3 (weights on the one GPU: will not run) take over from ZeRO-1. The layout that takes
    over is one that runs."""
    monkeypatch.setenv("ZLAYOUT_CARDS_DIR", str(ZAYA_DEFAULT.parents[1] / "heldout" / "cards"))
    flags = ["--hf-config", str(ZAYA_DEFAULT), "--gpu", "h200", "--gpus-per-node", "1"]
    data = run_json(capsys, *flags)
    assert set(data["will_not_run"]) == {"z0-opt_gpu-param_gpu", "z3-opt_gpu-param_gpu", "z3-opt_cpu-param_gpu",
                                         "z3-opt_nvme-param_gpu"}
    zero0 = next(row for row in data["layouts"] if row["stage"] == 0)
    assert zero0["max_params"] is None and zero0["will_not_run"].startswith("ZeRO-0 will not run this model")
    named = [_layout_of(c[side]).key for c in data["crossovers"] for side in ("stops_fitting", "takes_over")
             if c[side] is not None]
    assert named and not set(named) & set(data["will_not_run"])
    zero1 = next(c for c in data["crossovers"] if c["stops_fitting"]["label"] == "ZeRO-1")
    assert zero1["takes_over"]["label"] == "ZeRO-3 param→cpu"  # was ZeRO-3, which will not run here


def test_a_model_smaller_than_the_searchs_floor_gets_its_largest_size_not_none(capsys, zaya_tiny_card):
    """zaya-tiny (107K parameters, hidden 64) at 65,536 tokens on one H100: its depth series ends at
    1,000 blocks (45M), under the search's 100M floor, and that shape does not fit; breakeven said
    "none" beside a largest micro-batch of 85. The search now starts from the model's own size: a
    largest depth that fits, one block more that does not, for every layout that runs it."""
    flags = [*zaya_tiny_card[:2], "--seq", "65536", "--gpu", "h100", "--gpus-per-node", "1"]
    data = run_json(capsys, *flags)
    sized = [row for row in data["layouts"] if row["will_not_run"] is None
             and "nvme" not in (row["offload_optimizer"], row["offload_param"])]
    assert sized
    for row in sized:
        assert row["max_micro_batch"] > 0 and row["max_params"] >= data["params"], row
        assert row["limited_by"] == "gpu" and row["next_params"] > row["max_params"]


def test_the_runbook_gives_no_size_for_a_layout_that_will_not_run(capsys, tmp_path, zaya_tiny_card):
    """The exported profile's [limits] and its runbook's table of every layout's largest model."""
    out = tmp_path / "profile"
    assert main(["export", *zaya_tiny_card, "--gpus-per-node", "1", "--stage", "1", "--host-ram-gib", "64",
                 "--out", str(out)]) == 0
    runbook = (out / "RUNBOOK.md").read_text()
    assert "| ZeRO-0 | will not run | — |" in runbook and "| ZeRO-3 | will not run | — |" in runbook
    assert "| ZeRO-3 param→cpu | will not run" not in runbook  # its weights are not packed on the GPU
    assert main(["show", str(out)]) == 0  # the stored limits are the ones recomputed from its inputs
