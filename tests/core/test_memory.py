"""The memory model: each term against hand-computed bytes, the phases, and invariants."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zlayout import catalog
from zlayout.core.memory import estimate_memory
from zlayout.core.tensors import parameter_tensor_sizes
from zlayout.spec import GiB, HardwareSpec, Layout, ModelSpec, PlanInput, TrainingSpec, all_layouts

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/core/replay_golden.py, the grid's recorder

REFERENCE_PARAMS = 1_873_190_912  # benchmarks/measurements/README.md


def reference_input(world: int = 1, **training) -> PlanInput:
    model = ModelSpec(name="reference-gpt", layers=8, hidden=4096, heads=32, vocab=32000)
    hardware = HardwareSpec(gpu=catalog.load_gpu("h200"), gpus_per_node=world,
                            intra_link=catalog.load_link("nvlink4"))
    return PlanInput(model=model, hardware=hardware,
                     training=TrainingSpec(seq=2048, micro_batch=2, **training))


def term(estimate, name: str, where: str = "gpu") -> int:
    matches = [t.bytes for t in estimate.terms if t.name == name and t.where == where]
    assert matches, f"no {where} term {name!r}"
    return matches[0]


def test_reference_model_has_the_published_parameter_count():
    assert reference_input().model.params == REFERENCE_PARAMS


@pytest.mark.parametrize("stage,world,expected_param_bytes,expected_master_bytes", [
    (0, 1, 2 * REFERENCE_PARAMS, 4 * REFERENCE_PARAMS),
    (1, 2, 2 * REFERENCE_PARAMS, 2 * REFERENCE_PARAMS),
    (2, 2, 2 * REFERENCE_PARAMS, 2 * REFERENCE_PARAMS),
    (3, 2, REFERENCE_PARAMS, 2 * REFERENCE_PARAMS),
])
def test_model_state_terms_shard_by_stage(stage, world, expected_param_bytes, expected_master_bytes):
    est = estimate_memory(reference_input(world), Layout(stage=stage))
    assert term(est, "parameters") == expected_param_bytes
    assert term(est, "master_weights") == expected_master_bytes
    assert term(est, "adam_moments") == 2 * expected_master_bytes


def test_optimizer_offload_moves_master_and_moments_to_the_host_of_every_rank():
    est = estimate_memory(reference_input(2), Layout(stage=2, offload_optimizer="cpu"))
    assert not [t for t in est.gpu_terms() if t.name in ("master_weights", "adam_moments")]
    # per node = both ranks' partitions = the whole model's fp32 master + moments
    assert term(est, "master_weights", "host") == 4 * REFERENCE_PARAMS
    assert term(est, "adam_moments", "host") == 8 * REFERENCE_PARAMS


def test_activations_of_the_reference_block_are_32_bytes_per_token_and_hidden():
    """16 bf16 tensors of hidden size per token (see layer_activation_bytes) plus fp32 stats;
    measured on H200: 1.006 GiB per block at h=2048 and 16384 tokens (= 32.2 bytes)."""
    est = estimate_memory(reference_input(), Layout(stage=2))
    tokens = 2 * 2048
    stats = 4 * (2 * 2 + 32)  # two LayerNorms (mean, rstd) + one log-sum-exp per head
    assert term(est, "activations") == 8 * tokens * (32 * 4096 + stats)


def test_the_loss_holds_three_fp32_tokens_by_vocab_tensors():
    est = estimate_memory(reference_input(), Layout(stage=2))
    assert term(est, "loss_logits") == 3 * 4 * (2 * 2048) * 32000


def test_pinned_host_buffers_round_up_to_a_power_of_two():
    """PyTorch's pinned allocator rounds to 2**k: a 2.4B-param model's fp32 gradient partition
    (9.6 GB) pins 16 GiB; this is why the H200 run of ZeRO-2 + CPU offload peaked at 60 GiB RSS."""
    from zlayout.core.memory import pinned_bytes
    assert pinned_bytes(9_594_875_904) == 16 * GiB
    assert pinned_bytes(8 * GiB) == 8 * GiB and pinned_bytes(8 * GiB + 1) == 16 * GiB


def test_checkpointing_keeps_only_block_inputs_and_recomputes_one_block():
    plain = estimate_memory(reference_input(), Layout(stage=2))
    ckpt = estimate_memory(reference_input(checkpointing="full"), Layout(stage=2))
    tokens = 2 * 2048
    assert term(ckpt, "activations") == 8 * tokens * 4096 * 2
    assert term(ckpt, "recompute") == term(plain, "activations") // 8


def test_reduce_buckets_follow_reduce_bucket_size_and_overlap_comm():
    inp = reference_input(2)
    est = estimate_memory(inp, Layout(stage=2))
    assert term(est, "reduce_buckets") == 2 * 500_000_000 * 2  # double-buffered bf16
    single = inp.model_copy(update={"zero": inp.zero.model_copy(update={"overlap_comm": False})})
    assert term(estimate_memory(single, Layout(stage=2)), "reduce_buckets") == 500_000_000 * 2


def test_after_init_matches_the_reference_measurements_exactly_where_deepspeed_is_deterministic():
    """after_init_gib in benchmarks/measurements/h200-2026-11-29.jsonl: 14P (stage 0), 6P (stage 2, 1 GPU), 4P (stage 1/2,
    2 GPUs), 8P + one reduce bucket (stage 3)."""
    cases = [(0, 1, 24.425), (2, 1, 10.468), (2, 2, 6.978), (3, 1, 14.888), (3, 2, 7.91)]
    for stage, world, measured_gib in cases:
        est = estimate_memory(reference_input(world), Layout(stage=stage))
        assert est.after_init_bytes / GiB == pytest.approx(measured_gib, abs=0.01), (stage, world)


def test_peak_is_the_largest_phase_and_reserved_and_device_used_add_on_top():
    est = estimate_memory(reference_input(), Layout(stage=0))
    assert est.peak_phase == "optimizer step"  # stage 0 casts all gradients to fp32 in step()
    assert est.gpu_peak_reserved_bytes >= est.gpu_peak_allocated_bytes
    assert est.gpu_device_used_bytes > est.gpu_peak_reserved_bytes


def test_fits_uses_the_requested_headroom():
    inp = reference_input()
    est = estimate_memory(inp, Layout(stage=0))
    assert est.fits
    needed_fraction = est.gpu_device_used_bytes / est.gpu_capacity_bytes
    tight = inp.model_copy(update={"headroom_fraction": 1 - needed_fraction + 0.01})
    assert not estimate_memory(tight, Layout(stage=0)).fits_gpu


def test_agrees_with_deepspeeds_zero2_estimator_on_the_model_states_it_counts():
    """DeepSpeed's estimate_zero2_model_states_mem_needs counts 2P + 18P/n on the GPU (bf16
    weights; bf16 and fp32 gradients, fp32 master, two moments, sharded); zlayout's matching
    terms add up to the same bytes. (The estimator itself is imported from DeepSpeed.)"""
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    for world in (1, 2, 8):
        inp = reference_input(world)
        est = estimate_memory(inp, Layout(stage=2))
        p = inp.model.params
        fp32_grads = 4 * p // world  # the fp32 cast inside step_fp32_gradients
        ours = (term(est, "parameters") + term(est, "gradients") + term(est, "master_weights")
                + term(est, "adam_moments") + fp32_grads)
        _, theirs = estimate_zero2_model_states_mem_needs(p, world, 1, cpu_offload=False)
        assert ours == pytest.approx(theirs, rel=1e-6)
        _, theirs_offload = estimate_zero2_model_states_mem_needs(p, world, 1, cpu_offload=True)
        offloaded = estimate_memory(inp, Layout(stage=2, offload_optimizer="cpu"))
        assert term(offloaded, "parameters") == theirs_offload  # 2P of bf16 weights stay


def test_agrees_with_deepspeeds_zero3_estimator_on_model_states():
    """estimate_zero3_model_states_mem_needs: 4 * largest layer + 18P/n without offload
    (2 bf16 weights + 4 fp32 gradients + 4 master + 8 moments: it leaves out the bf16 gradient
    partition stage 3 allocates at init, which the H200 runs show), and 2P/n of weights with
    optimizer offload."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

    inp = reference_input(2)
    p, largest = inp.model.params, max(parameter_tensor_sizes(inp.model, inp.training.impl))
    _, theirs, largest_bytes = estimate_zero3_model_states_mem_needs(p, largest, 2, 1, cpu_offload=False,
                                                                     cpu_offload_params=False)
    est = estimate_memory(inp, Layout(stage=3))
    states = sum(term(est, name) for name in ("parameters", "gradients", "master_weights", "adam_moments"))
    bf16_gradient_partition = term(est, "gradients")
    assert states - bf16_gradient_partition + 4 * p // 2 + largest_bytes == pytest.approx(theirs, rel=1e-6)
    _, theirs, _ = estimate_zero3_model_states_mem_needs(p, largest, 2, 1, cpu_offload=True,
                                                         cpu_offload_params=False)
    offloaded = estimate_memory(inp, Layout(stage=3, offload_optimizer="cpu"))
    assert term(offloaded, "parameters") + largest_bytes == theirs


# ----------------------------------------------------------------------------- properties

shapes = st.builds(
    lambda layers, heads, head_dim, vocab_k: ModelSpec(layers=layers, hidden=heads * head_dim, heads=heads,
                                                      vocab=vocab_k * 1000),
    st.integers(1, 96), st.integers(1, 64), st.sampled_from([64, 128]), st.integers(8, 256))
worlds = st.integers(1, 64)


def input_for(model: ModelSpec, world: int) -> PlanInput:
    hardware = HardwareSpec(gpu=catalog.load_gpu("h100"), gpus_per_node=min(world, 8),
                            nodes=max(1, world // 8), intra_link=catalog.load_link("nvlink4"),
                            inter_link=catalog.load_link("ib-ndr"))
    return PlanInput(model=model, hardware=hardware, training=TrainingSpec(seq=2048))


def model_state_gpu_bytes(est) -> int:
    return sum(t.bytes for t in est.gpu_terms() if t.category == "model_states")


@settings(max_examples=60, deadline=None)
@given(shapes, st.integers(1, 8))
def test_more_gpus_never_raise_per_gpu_model_states_at_stage_3(model, nodes):
    small = estimate_memory(input_for(model, 8 * nodes), Layout(stage=3))
    large = estimate_memory(input_for(model, 8 * (nodes + 1)), Layout(stage=3))
    assert model_state_gpu_bytes(large) <= model_state_gpu_bytes(small)


@settings(max_examples=60, deadline=None)
@given(shapes, worlds)
def test_a_higher_stage_never_raises_model_state_bytes(model, world):
    inp = input_for(model, world)
    per_stage = [model_state_gpu_bytes(estimate_memory(inp, Layout(stage=s))) for s in range(4)]
    assert per_stage == sorted(per_stage, reverse=True)


@settings(max_examples=60, deadline=None)
@given(shapes, worlds)
def test_offloading_never_raises_gpu_bytes_beyond_deepspeeds_staging_buffer(model, world):
    """Offloading removes 12-14 bytes/param/n from the GPU but DeepSpeed adds GPU buffers: a
    staging buffer the size of the largest tensor and that tensor's gradient with its fp32
    cast on its way to the host (optimizer offload: 2 + 2 + 4 bytes per element), and with offloaded
    weights on one GPU the fetched copy of the largest module plus the prefetch bucket (without
    offload a one-GPU 'gather' is free). So offloading never raises GPU bytes by more than those
    buffers, and never raises them at all once the states it moves outweigh them."""
    inp = input_for(model, world)
    largest = max(parameter_tensor_sizes(model, inp.training.impl))
    allowance = largest * (2 + 2 + 4)
    if world == 1:
        allowance += (largest + inp.zero.stage3_prefetch_bucket_size) * 2
    for layout in all_layouts():
        if layout.offload_optimizer == "gpu" and layout.offload_param == "gpu":
            continue
        offloaded = estimate_memory(inp, layout).gpu_peak_allocated_bytes
        resident = estimate_memory(inp, Layout(stage=layout.stage)).gpu_peak_allocated_bytes
        assert offloaded <= resident + allowance, layout.key
        if layout.offload_param == "gpu" and 12 * model.params // inp.hardware.world >= allowance:
            assert offloaded <= resident, layout.key


@pytest.mark.parametrize("impl", ["zlayout", "hf"])
@pytest.mark.parametrize("layout", [Layout(stage=0), Layout(stage=2, offload_optimizer="cpu"),
                                    Layout(stage=3, offload_optimizer="cpu", offload_param="cpu")])
def test_the_deepspeed_loop_holds_the_bf16_logits_on_top_of_the_trainer_plan(impl, layout):
    # issue 27: `outputs = engine(...); engine.backward(outputs.loss)` measured exactly
    # tokens x vocab x 2 bytes above the plan of the loop that drops them (HF Trainer's)
    kept = estimate_memory(reference_input(impl=impl, loop="deepspeed"), layout)
    dropped = estimate_memory(reference_input(impl=impl, loop="trainer"), layout)
    logits = 2 * 2048 * 32000 * 2  # micro-batch x seq x vocab x bf16
    assert kept.gpu_peak_allocated_bytes - dropped.gpu_peak_allocated_bytes == logits
    assert term(kept, "loop_held_logits") == logits
    assert "loop_held_logits" not in {t.name for t in dropped.terms}
    assert kept.after_init_bytes == dropped.after_init_bytes  # nothing is held before the first forward


def test_the_loop_defaults_to_deepspeeds_examples():
    assert TrainingSpec(seq=2048).loop == "deepspeed"
    with pytest.raises(ValueError):
        TrainingSpec(seq=2048, loop="keras")


def test_a_record_without_a_loop_ran_the_trainer_loop_and_a_marked_one_keeps_its_own():
    from zlayout.spec import recorded_inputs

    inputs = reference_input().model_dump(mode="json")
    del inputs["training"]["loop"]
    assert PlanInput.model_validate(recorded_inputs(inputs)).training.loop == "trainer"
    inputs["training"]["loop"] = "deepspeed"
    assert PlanInput.model_validate(recorded_inputs(inputs)).training.loop == "deepspeed"


def test_a_record_of_a_shipped_gpu_from_before_its_hbm_factor_takes_todays_preset():
    """H100 results and profiles recorded before `hbm_efficiency_factor` are that GPU as the catalog
    then described it: they take today's factor (1.12), and the step-time model's H100 pricing with
    it. A GPU of that name with other figures (the user's own preset) and a record that has the field
    keep theirs."""
    from zlayout import catalog
    from zlayout.spec import HardwareSpec, recorded_inputs

    h100 = catalog.load_gpu("h100")
    assert h100.hbm_efficiency_factor == pytest.approx(1.12)
    hardware = HardwareSpec(gpu=h100, gpus_per_node=1, intra_link=catalog.load_link("nvlink4"))
    inputs = reference_input().model_copy(update={"hardware": hardware}).model_dump(mode="json")
    del inputs["hardware"]["gpu"]["hbm_efficiency_factor"]
    assert PlanInput.model_validate(inputs).hardware.gpu.hbm_efficiency_factor == 1.0
    assert PlanInput.model_validate(recorded_inputs(inputs)).hardware.gpu.hbm_efficiency_factor == pytest.approx(1.12)
    inputs["hardware"]["gpu"]["hbm_gbps"] = 2000.0  # an H100 PCIe someone named h100
    assert PlanInput.model_validate(recorded_inputs(inputs)).hardware.gpu.hbm_efficiency_factor == 1.0
    inputs["hardware"]["gpu"].update(hbm_gbps=h100.hbm_gbps, hbm_efficiency_factor=1.3)
    assert PlanInput.model_validate(recorded_inputs(inputs)).hardware.gpu.hbm_efficiency_factor == 1.3


def _shipped_card_input(config: str, *flags: str):
    from pathlib import Path

    from zlayout.cli import build_parser, plan_input_from_args

    published = Path(__file__).resolve().parents[1] / "hf" / "configs" / "published"
    return plan_input_from_args(build_parser().parse_args(
        ["plan", "--hf-config", str(published / config), "--gpu", "h200", *flags]))


@pytest.mark.parametrize(("gpus", "accumulation"), [(1, 1), (8, 1), (1, 2)])
def test_stage_2_holds_zeros_for_the_gradients_a_text_step_gives_a_vision_tower(monkeypatch, gpus, accumulation):
    """DeepSpeed's end of backward (stage_1_and_2.py get_all_grad_tensors) zero-fills the gradient of
    every parameter in the rank's partition that got none, in the training dtype, kept to step()
    (with accumulation, through the window): Qwen2.5-VL-3B's vision tower, 1.25 GiB on one GPU
    (h200-2026-12-16 call 2: the plan was 1.24 GiB under at the step). At most the rank's share."""
    monkeypatch.delenv("ZLAYOUT_CARDS_DIR", raising=False)
    inp = _shipped_card_input("Qwen2.5-VL-3B-Instruct.json", "--seq", "4096", "--gpus-per-node", str(gpus),
                              "--grad-accum", str(accumulation))
    card = inp.model.card
    assert card.untrained_params > 600e6  # the vision tower and its merger
    share = -(-inp.model.params // gpus)
    mem = estimate_memory(inp, Layout(stage=2))
    zeros = {t.name: t.bytes for t in mem.terms}["untrained_zero_gradients"]
    assert zeros == 2 * min(card.untrained_params, share)
    without = estimate_memory(inp.model_copy(update={"model": inp.model.model_copy(update={"card": None})}),
                              Layout(stage=2))
    assert "untrained_zero_gradients" not in {t.name for t in without.terms}
    # ZeRO-3 keeps its gradients in its own partition: nothing of the kind
    assert "untrained_zero_gradients" not in {t.name for t in estimate_memory(inp, Layout(stage=3)).terms}


def test_offload_staging_is_sized_by_the_cards_largest_tensor(monkeypatch):
    """DeepSpeed sizes ZeRO-1/2's offload staging buffers by the largest parameter it flattens
    (stage_1_and_2.py: temp_grad_buffer_for_gpu_offload, and the host's pinned twin). Phi-3's fused
    gate/up (2 x 17,920 x 5,120 = 183.5M) is larger than its embedding (164.2M), which the hand
    shape took for the largest: the card's tensor list is the one that says so, for the transformers
    class it was learned from. Without a card the tensors are laid out by hand, per implementation:
    transformers' Phi-3 shape by hand keeps gate and up apart (the embedding is the largest),
    zlayout's own GPT (`--impl zlayout`) fuses them."""

    monkeypatch.delenv("ZLAYOUT_CARDS_DIR", raising=False)
    inp = _shipped_card_input("Phi-3-medium-4k-instruct.json", "--seq", "4096")
    model = inp.model
    assert max(model.card.parameter_numels) == 2 * 17920 * 5120 > model.vocab * model.hidden
    assert max(parameter_tensor_sizes(model, "hf")) == 2 * 17920 * 5120

    def staging(plan_input) -> int:
        terms = estimate_memory(plan_input, Layout(stage=2, offload_optimizer="cpu")).terms
        return {t.name: t.bytes for t in terms}["offload_staging"]

    assert staging(inp) == 2 * 2 * 17920 * 5120
    hand = model.model_copy(update={"card": None})
    assert max(parameter_tensor_sizes(hand, "hf")) == model.vocab * model.hidden
    assert staging(inp.model_copy(update={"model": hand})) == 2 * model.vocab * model.hidden
    own_gpt = inp.model_copy(update={"training": inp.training.model_copy(update={"impl": "zlayout"})})
    assert staging(own_gpt) == 2 * 2 * 17920 * 5120


def _planned(flags: str):
    import shlex

    from zlayout.cli import build_parser, layout_from_args, plan_input_from_args

    args = build_parser().parse_args(["plan", *shlex.split(flags)])
    return plan_input_from_args(args), layout_from_args(args)


def test_a_carded_gpu_resident_peak_is_what_the_replayed_requests_hold_at_once():
    """Falcon-7B at 8 layers, ZeRO-2, one 2,048-token sequence on an H100 (h200-2026-12-18): the run's
    max_memory_allocated was 45,942,680,576 bytes; the per-phase sum said 44.30e9 (3.6% under), the
    card's requests replayed in their order hold 45.94e9 at once. The live replay's count (blocks
    written out in `run_program`, closed groups skipped whole) is the event list's, byte for byte."""
    from replay_golden import events_peak_allocated  # tests/core/replay_golden.py

    from zlayout.core.allocator_sim import allocation_sequence, replay_at_capacity, replayed_allocated_counts
    from zlayout.core.replay_state import _Seq

    inp, layout = _planned("--hf-config tests/hf/configs/published/falcon-7b.json --layers 8 --stage 2 --seq 2048 "
                           "--micro-batch 1 --gpus-per-node 1 --gpu h100 --loop trainer --host-cores 16")
    assert inp.model.card is not None and replayed_allocated_counts(inp, layout)
    est = estimate_memory(inp, layout)
    assert abs(est.gpu_peak_allocated_bytes / 45_942_680_576 - 1) < 0.001
    [order] = [t for t in est.terms if t.name == "request_order"]
    assert order.where == "gpu" and order.bytes > 1.4 * GiB
    peak = events_peak_allocated(allocation_sequence(inp, layout, steps=2, _seq=_Seq()))
    capacity = replay_at_capacity(inp, layout, 1 << 50)
    assert capacity.peak_allocated == peak


def test_expandable_segments_take_the_replayed_requests_peak_too():
    """A tensor's bytes do not depend on where the allocator puts it: with `--allocator expandable`
    the same Falcon-7B layout's peak allocated is the default allocator's replayed one (the run's,
    45.94e9), and expandable segments reserve it plus their page slack, not the per-phase sum."""
    flags = ("--hf-config tests/hf/configs/published/falcon-7b.json --layers 8 --stage 2 --seq 2048 "
             "--micro-batch 1 --gpus-per-node 1 --gpu h100 --loop trainer --host-cores 16")
    default = estimate_memory(*_planned(flags))
    expandable = estimate_memory(*_planned(flags + " --allocator expandable"))
    [order] = [t for t in expandable.terms if t.name == "request_order"]
    assert order.bytes > 1.4 * GiB
    assert expandable.gpu_peak_allocated_bytes == default.gpu_peak_allocated_bytes
    assert expandable.gpu_peak_reserved_bytes > expandable.gpu_peak_allocated_bytes
    # without the replay (break-even's searches) the per-phase sum, as before
    unreplayed = estimate_memory(*_planned(flags + " --allocator expandable"), replay=False)
    assert unreplayed.gpu_peak_allocated_bytes == default.gpu_peak_allocated_bytes - order.bytes


def test_the_hand_models_peak_stays_the_per_phase_sum():
    """The hand-written blocks' requests are sized for what the allocator reserves: their replay's
    allocated peak is not taken (on h200-2026-12-01's GPU-resident rows it was 1-21% over the runs,
    where the per-phase sum is exact). Offloaded and ZeRO-3-gathering layouts of a card neither."""
    from zlayout.core.allocator_sim import replayed_allocated_counts

    inp, layout = _planned("--layers 8 --hidden 4096 --heads 32 --vocab 32000 --seq 2048 --micro-batch 2 --stage 2 "
                           "--gpus-per-node 1 --gpu h200")
    assert not replayed_allocated_counts(inp, layout)
    assert not any(t.name == "request_order" for t in estimate_memory(inp, layout).terms)
    card = "--hf-config tests/hf/configs/published/falcon-7b.json --layers 8 --seq 2048 --gpu h200 "
    for flags in ("--stage 3 --offload-optimizer cpu --gpus-per-node 1", "--stage 3 --gpus-per-node 8"):
        inp, layout = _planned(card + flags)
        assert inp.model.card is not None and not replayed_allocated_counts(inp, layout)


def test_stage2_offload_cast_is_placed_by_the_replay_not_bounded():
    """OLMo-2-7B at 8 layers, ZeRO-2 with the optimizer on the CPU, one 4,096-token sequence on an
    H100 (h200-2026-12-31g, predicted before the run): max_memory_allocated 19,672,140,800 bytes. The
    per-phase rule bounds the offload cast of the head's gradient (it fits the reduce bucket) with
    every activation alive, 5.8% over; the card's requests replayed in DeepSpeed's order (the buckets
    reduced and cast as backward fills them) hold what the run held. Without the replay (break-even's
    searches) the bound stands."""
    from zlayout.core.allocator_sim import offload_cast_replayed, replayed_allocated_counts

    flags = ("--hf-config tests/hf/configs/published/OLMo-2-1124-7B.json --layers 8 --stage 2 --offload-optimizer cpu "
             "--seq 4096 --micro-batch 1 --loop trainer --gpus-per-node 1 --gpu h100 --host-cores 16")
    inp, layout = _planned(flags)
    assert inp.model.card is not None
    assert offload_cast_replayed(inp, layout) and replayed_allocated_counts(inp, layout)
    run = 19_672_140_800
    est = estimate_memory(inp, layout)
    assert abs(est.gpu_peak_allocated_bytes / run - 1) < 0.005
    assert est.peak_phase != "backward (offload cast)"
    bound = estimate_memory(inp, layout, replay=False)
    assert bound.peak_phase == "backward (offload cast)" and bound.gpu_peak_allocated_bytes > 1.05 * run
    expandable = estimate_memory(*_planned(flags + " --allocator expandable"))
    assert expandable.gpu_peak_allocated_bytes == est.gpu_peak_allocated_bytes
    # expandable segments reserve the replayed peak (plus their slack), not the bound
    expandable_bound = estimate_memory(*_planned(flags + " --allocator expandable"), replay=False)
    assert est.gpu_peak_allocated_bytes < expandable.gpu_peak_reserved_bytes
    assert expandable_bound.gpu_peak_reserved_bytes - expandable.gpu_peak_reserved_bytes == \
        bound.gpu_peak_allocated_bytes - est.gpu_peak_allocated_bytes


def test_a_moe_model_cut_to_its_dense_blocks_is_planned_as_the_dense_model_it_trains():
    """DeepSeek-V3.2 at 3 blocks is its 3 dense blocks: no expert's gradient, dispatch or phase (the
    expert phases put h200-2026-12-31c's deepseek_v32 L3 line +39.6% over the run's peak)."""
    hardware = HardwareSpec(gpu=catalog.load_gpu("h200"), gpus_per_node=1, intra_link=catalog.load_link("nvlink4"))
    shape = dict(layers=2, hidden=1024, heads=8, vocab=32000, ffn=4096, mlp="swiglu")
    cut = ModelSpec(name="moe-cut", experts=8, top_k=2, expert_ffn=512, dense_layers=(0, 1), **shape)
    dense = ModelSpec(name="dense", **shape)
    assert cut.params == dense.params and cut.moe_layer_count == 0
    for layout in (Layout(stage=0), Layout(stage=3, offload_optimizer="cpu")):
        a, b = (estimate_memory(PlanInput(model=m, hardware=hardware, training=TrainingSpec(seq=2048)), layout)
                for m in (cut, dense))
        assert not [t for t in a.terms if t.name.startswith("moe_") and t.bytes]
        assert (a.gpu_peak_allocated_bytes, a.peak_phase) == (b.gpu_peak_allocated_bytes, b.peak_phase)
