"""The recommendation: the fastest layout that fits, a reason with real numbers, verified fixes."""

from __future__ import annotations

import dataclasses
import re

import pytest

from zlayout import catalog
from zlayout.cli import build_parser, plan_input_from_args
from zlayout.core.memory import estimate_memory
from zlayout.core.plan import make_plan
from zlayout.core.recommend import TIE_FRACTION, offload_count, suggest_fixes
from zlayout.spec import GiB, HardwareSpec, PlanInput, TrainingSpec, gib_figure


def make_input(preset="llama3-8b", gpus_per_node=8, nodes=1, micro_batch=1, seq=4096,
               nvme_bytes=0, checkpointing="none") -> PlanInput:
    hardware = HardwareSpec(
        gpu=catalog.load_gpu("h200"), gpus_per_node=gpus_per_node, nodes=nodes,
        intra_link=catalog.load_link("nvlink4"),
        inter_link=catalog.load_link("ib-ndr") if nodes > 1 else None, nvme_bytes=nvme_bytes)
    return PlanInput(model=catalog.load_model(preset), hardware=hardware,
                     training=TrainingSpec(seq=seq, micro_batch=micro_batch, checkpointing=checkpointing))


@pytest.mark.parametrize("preset, gpus", [("llama3-8b", 8), ("reference-gpt", 1), ("llama3-70b", 8)])
def test_recommends_the_fastest_fitting_layout(preset, gpus):
    plan = make_plan(make_input(preset, gpus_per_node=gpus, checkpointing="full"), with_breakeven=False)
    rec = plan.recommendation
    assert rec.layout is not None
    chosen = plan.for_layout(rec.layout)
    assert chosen.memory.fits
    fitting = [lp for lp in plan.layouts if lp.memory.fits]
    fastest = min(lp.time.step_time_s for lp in fitting)
    assert chosen.time.step_time_s <= fastest * 1.03
    # the sentence carries the fit rule's own words for the chosen layout (core.fit)
    assert rec.reason.startswith(rec.layout.label + ": " + chosen.memory.gpu_fit.summary())
    assert rec.suggestions == ()
    if rec.runner_up is not None:
        assert plan.for_layout(rec.runner_up).memory.fits
        assert rec.runner_up.label in rec.reason


@pytest.mark.parametrize("preset, gpus, nodes, seq", [
    ("llama3-8b", 8, 1, 4096), ("llama3-8b", 1, 1, 2048), ("llama3-70b", 8, 2, 2048),
    ("llama3-70b", 8, 2, 4096), ("mistral-7b", 2, 1, 8192), ("reference-gpt", 4, 1, 1024)])
def test_a_tie_goes_to_the_fewest_offloads_then_the_lowest_stage(preset, gpus, nodes, seq):
    plan = make_plan(make_input(preset, gpus_per_node=gpus, nodes=nodes, seq=seq, checkpointing="full"),
                     with_breakeven=False)
    rec = plan.recommendation
    fitting = [lp for lp in plan.layouts if lp.memory.fits]
    if rec.layout is None:
        assert not fitting
        return
    fastest_s = min(lp.time.step_time_s for lp in fitting)
    tied = [lp for lp in fitting if lp.time.step_time_s <= fastest_s * (1 + TIE_FRACTION)]
    simplest = min((offload_count(lp.layout), lp.layout.stage) for lp in tied)
    assert (offload_count(rec.layout), rec.layout.stage) == simplest
    assert plan.for_layout(rec.layout) in tied
    if rec.runner_up is not None:  # the sentence names the runner-up and by how much it differs
        runner = plan.for_layout(rec.runner_up)
        assert f"runner-up {rec.runner_up.label} is " in rec.reason
        assert f"({runner.time.step_time_s:.2f} s/step)" in rec.reason
        assert re.search(r"(\d+(\.\d)?% (slower|faster)|\d+\.\dx slower|as fast)", rec.reason)


def test_the_tie_rule_never_adds_an_offload_for_a_small_gain():
    """Parameter offload predicted 1% faster than plain ZeRO-3 must not win."""
    from zlayout.core.recommend import recommend

    plan = make_plan(make_input("llama3-8b", gpus_per_node=8), with_breakeven=False)
    z3 = next(lp for lp in plan.layouts if lp.layout.key == "z3-opt_gpu-param_gpu")
    z3_param_cpu = next(lp for lp in plan.layouts if lp.layout.key == "z3-opt_gpu-param_cpu")
    faster = dataclasses.replace(z3_param_cpu, time=dataclasses.replace(
        z3_param_cpu.time, step_time_s=z3.time.step_time_s * 0.99))
    rec = recommend(plan.input, (faster, z3))
    assert rec.layout == z3.layout and rec.runner_up == faster.layout
    assert "1.0% faster" in rec.reason and "fewer offloads wins" in rec.reason
    much_faster = dataclasses.replace(faster, time=dataclasses.replace(
        faster.time, step_time_s=z3.time.step_time_s * 0.9))
    assert recommend(plan.input, (much_faster, z3)).layout == much_faster.layout


def test_nothing_fits_gives_verified_suggestions():
    inp = make_input("llama3-70b", gpus_per_node=1, micro_batch=4)
    plan = make_plan(inp, with_breakeven=False)
    rec = plan.recommendation
    assert rec.layout is None and rec.reason.startswith("No layout fits")
    assert rec.fixes, "more GPUs always make a 70B model fit somewhere"
    assert rec.suggestions == tuple(f.text for f in rec.fixes)
    for fix in rec.fixes:
        assert estimate_memory(fix.input, fix.layout).fits, fix.text
        assert fix.layout.label in fix.text and fix.flags in fix.text


CLI_BASE = ["plan", "--preset", "llama3-70b", "--gpus-per-node", "1", "--micro-batch", "4", "--seq", "4096"]


def test_suggested_flags_reproduce_the_verified_input():
    """Typing a suggestion's flags on the command line gives exactly the input that was checked."""
    base = plan_input_from_args(build_parser().parse_args(CLI_BASE))
    fixes = make_plan(base, with_breakeven=False).recommendation.fixes
    assert fixes
    for fix in fixes:
        typed = plan_input_from_args(build_parser().parse_args(CLI_BASE + fix.flags.split()))
        assert typed.training == fix.input.training
        hw_typed, hw_fix = typed.hardware, fix.input.hardware
        assert (hw_typed.gpus_per_node, hw_typed.nodes) == (hw_fix.gpus_per_node, hw_fix.nodes)
        assert hw_typed.nvme_bytes >= hw_fix.nvme_bytes
        assert estimate_memory(typed, fix.layout).fits


def test_checkpointing_suggested_when_it_alone_fits():
    # the smallest micro-batch at which nothing fits 8 H100s without checkpointing
    for micro_batch in (1, 2, 4, 8, 16, 32):
        inp = make_input("llama3-70b", gpus_per_node=8, micro_batch=micro_batch)
        plan = make_plan(inp, with_breakeven=False)
        if plan.recommendation.layout is None:
            break
    assert plan.recommendation.layout is None, "expected llama3-70b not to fit 8 H100s at micro-batch 32"
    with_ckpt = inp.model_copy(update={"training": inp.training.model_copy(update={"checkpointing": "full"})})
    assert make_plan(with_ckpt, with_breakeven=False).recommendation.layout is not None
    flags = [f.flags for f in plan.recommendation.fixes]
    assert "--checkpointing full" in flags


def test_smaller_micro_batch_keeps_the_global_batch():
    inp = make_input("llama3-8b", gpus_per_node=2, micro_batch=16, checkpointing="full")
    for fix in suggest_fixes(inp):
        t = fix.input.training
        if fix.flags.startswith("--micro-batch"):
            assert t.micro_batch * t.grad_accum == 16
            assert t.micro_batch < 16


def test_nvme_suggestion_sizes_the_capacity():
    inp = make_input("llama3-70b", gpus_per_node=1, checkpointing="full")
    nvme = [f for f in suggest_fixes(inp) if "--nvme-gib" in f.flags]
    for fix in nvme:
        gib = int(re.search(r"--nvme-gib (\d+)", fix.flags).group(1))
        assert fix.input.hardware.nvme_bytes == gib * GiB
        assert "nvme" in (fix.layout.offload_optimizer, fix.layout.offload_param)
        assert estimate_memory(fix.input, fix.layout).fits


def test_more_gpus_suggests_the_fewest_that_fit():
    """70B, checkpointing, one H200 per node with 256 GiB of host RAM: the host binds, so more
    nodes (not more GPUs per node) are suggested, and the next smaller option does not fit."""
    from zlayout.spec import all_layouts

    inp = make_input("llama3-70b", gpus_per_node=1, checkpointing="full")
    inp = inp.model_copy(update={"hardware": inp.hardware.model_copy(update={"host_ram_bytes": 256 * GiB})})
    gpu_fixes = [f for f in suggest_fixes(inp) if "--nodes" in f.flags or "--gpus-per-node" in f.flags]
    assert gpu_fixes
    fix = gpu_fixes[0]
    assert estimate_memory(fix.input, fix.layout).fits
    hw = fix.input.hardware
    smaller_worlds = [(hw.nodes, hw.gpus_per_node - 1)] if hw.nodes == 1 else \
        [(max(n for n in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64) if n < hw.nodes), 1), (1, 8)]
    for nodes, per_node in smaller_worlds:
        fewer = inp.model_copy(update={"hardware": inp.hardware.model_copy(update={
            "nodes": nodes, "gpus_per_node": per_node, "inter_link": hw.inter_link})})
        assert not any(estimate_memory(fewer, layout).fits for layout in all_layouts()), (nodes, per_node)


def test_nothing_fits_names_the_closest_layout_with_the_figures_the_verdict_compares():
    """The closest layout is the one whose needed bytes overshoot least, and the reason quotes
    those bytes (what decides "fits"), not device used, which the verdict does not compare."""
    inp = make_input("llama3-70b", gpus_per_node=1, micro_batch=4)
    plan = make_plan(inp, with_breakeven=False)
    gpu_bound = [lp for lp in plan.layouts if not lp.memory.fits_gpu]
    closest = min(plan.layouts, key=lambda lp: max(lp.memory.gpu_needed_bytes / lp.memory.gpu_usable_bytes,
                                                   lp.memory.host_peak_bytes / lp.memory.host_capacity_bytes,
                                                   lp.memory.nvme_bytes / max(1, lp.memory.nvme_capacity_bytes)))
    reason = plan.recommendation.reason
    assert f"the closest, {closest.layout.label}, {closest.memory.shortfall}." in reason
    assert gpu_bound, "a 70B model on one GPU"
    mem = gpu_bound[0].memory
    needed = re.search(r"needs ([\d.]+) GiB per GPU, ([\d.]+) of [\d.]+ GiB is usable", mem.shortfall)
    assert needed and needed.group(1) == gib_figure(mem.gpu_needed_bytes)  # the table's Need, as written
    assert needed.group(2) == gib_figure(mem.gpu_usable_bytes)
