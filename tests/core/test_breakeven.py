"""Break-even sizes against the memory model itself: consistency, monotonicity, what binds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zlayout import catalog
from zlayout.core.breakeven import break_even, crossovers, largest_micro_batch, scaled_model
from zlayout.core.comm import estimate_comm
from zlayout.core.memory import estimate_memory
from zlayout.core.steptime import estimate_step_time
from zlayout.spec import GiB, HardwareSpec, Layout, ModelSpec, PlanInput, TrainingSpec, all_layouts

CUSTOM = ModelSpec(layers=8, hidden=4096, heads=32, vocab=32000)  # no family: grows in depth
AMPLE_HOST = 1 << 50  # 1 PiB: host RAM and NVMe that never bind


def make_input(model=None, gpu="h200", gpus_per_node=8, nodes=1, micro_batch=1, seq=2048,
               host_ram_bytes=2048 * GiB, nvme_bytes=0, headroom=0.05, checkpointing="none") -> PlanInput:
    hardware = HardwareSpec(
        gpu=catalog.load_gpu(gpu), gpus_per_node=gpus_per_node, nodes=nodes,
        intra_link=catalog.load_link("nvlink4"),
        inter_link=catalog.load_link("ib-ndr") if nodes > 1 else None,
        host_ram_bytes=host_ram_bytes, nvme_bytes=nvme_bytes)
    return PlanInput(model=model or catalog.load_model("llama3-8b"), hardware=hardware,
                     training=TrainingSpec(seq=seq, micro_batch=micro_batch, checkpointing=checkpointing),
                     headroom_fraction=headroom)


def with_model(inp: PlanInput, model: ModelSpec) -> PlanInput:
    return inp.model_copy(update={"model": model})


def fits(inp: PlanInput, layout: Layout) -> bool:
    return estimate_memory(inp, layout).fits


LAYOUTS_TO_CHECK = [Layout(stage=0), Layout(stage=2), Layout(stage=2, offload_optimizer="cpu"),
                    Layout(stage=3), Layout(stage=3, offload_optimizer="cpu", offload_param="cpu"),
                    Layout(stage=3, offload_optimizer="nvme", offload_param="nvme")]


@pytest.mark.parametrize("layout", LAYOUTS_TO_CHECK, ids=lambda l: l.key)
@pytest.mark.parametrize("gpu, gpus", [("h200", 8), ("h100", 2)])
def test_family_break_even_fits_and_three_percent_more_does_not(layout, gpu, gpus):
    inp = make_input(gpu=gpu, gpus_per_node=gpus, nvme_bytes=64 * 1024 * GiB)
    be = break_even(inp, layout)
    assert be.scaling == "family"
    assert be.max_params > 0, "llama3 models of 100M fit everywhere here"
    assert be.max_model.params == be.max_params and be.max_model.family == "llama3"
    assert fits(with_model(inp, be.max_model), layout)
    # what a user gets by asking for that size (--params N) fits too
    assert fits(with_model(inp, catalog.model_for_size(be.max_params, "llama3")), layout)
    larger = catalog.model_for_size(be.max_params * 1.03, "llama3")
    assert larger.params > be.max_params
    assert not fits(with_model(inp, larger), layout)
    assert not fits(with_model(inp, be.next_model), layout)
    assert be.next_params > be.max_params


@pytest.mark.parametrize("layout", LAYOUTS_TO_CHECK[:4], ids=lambda l: l.key)
def test_custom_model_grows_in_depth(layout):
    inp = make_input(model=CUSTOM, nvme_bytes=64 * 1024 * GiB)
    be = break_even(inp, layout)
    assert be.scaling == "depth"
    biggest = be.max_model
    assert (biggest.hidden, biggest.heads, biggest.vocab) == (4096, 32, 32000)
    assert fits(with_model(inp, biggest), layout)
    deeper = biggest.model_copy(update={"layers": biggest.layers + 1})
    assert deeper.params == be.next_params
    assert not fits(with_model(inp, deeper), layout)


@pytest.mark.parametrize("layout", LAYOUTS_TO_CHECK[:5], ids=lambda l: l.key)
def test_largest_micro_batch_fits_and_one_more_does_not(layout):
    inp = make_input(model=catalog.load_model("reference-gpt"))
    largest = largest_micro_batch(inp, layout)
    assert largest >= 1
    training = inp.training
    assert fits(inp.model_copy(update={"training": training.model_copy(update={"micro_batch": largest})}), layout)
    assert not fits(inp.model_copy(update={"training": training.model_copy(update={"micro_batch": largest + 1})}),
                    layout)
    assert break_even(inp, layout).max_micro_batch == largest


def test_no_micro_batch_when_the_model_does_not_fit():
    inp = make_input(model=catalog.load_model("llama3-70b"), gpus_per_node=1)
    assert break_even(inp, Layout(stage=0)).max_micro_batch == 0


def test_nvme_layouts_without_nvme_carry_nothing():
    inp = make_input(nvme_bytes=0)
    be = break_even(inp, Layout(stage=3, offload_optimizer="nvme"))
    assert (be.max_params, be.limited_by, be.max_model) == (0, "nvme", None)


def test_small_host_ram_binds_cpu_offload():
    inp = make_input(host_ram_bytes=256 * GiB)
    be = break_even(inp, Layout(stage=3, offload_optimizer="cpu", offload_param="cpu"))
    assert be.limited_by == "host"
    larger = with_model(inp, be.next_model)
    est = estimate_memory(larger, Layout(stage=3, offload_optimizer="cpu", offload_param="cpu"))
    assert est.fits_gpu and not est.fits_host


def test_gpu_binds_gpu_resident_layouts():
    assert break_even(make_input(), Layout(stage=2)).limited_by == "gpu"


def test_less_headroom_carries_a_larger_model():
    tight = break_even(make_input(headroom=0.0), Layout(stage=3))
    loose = break_even(make_input(headroom=0.3), Layout(stage=3))
    assert tight.max_params > loose.max_params


def test_memoized_per_input_and_layout():
    inp = make_input()
    assert break_even(inp, Layout(stage=3)) is break_even(make_input(), Layout(stage=3))


@settings(max_examples=25, deadline=None)
@given(gpus=st.sampled_from([2, 4, 8]), more=st.sampled_from([2, 4, 8]), nodes=st.sampled_from([1, 2]),
       layout=st.sampled_from(all_layouts()),
       family=st.sampled_from(["llama3-8b", "reference-gpt", "qwen2.5-7b"]))
def test_more_gpus_never_shrink_the_largest_model(gpus, more, nodes, layout, family):
    """From 2 GPUs on (going from 1 to 2 adds NCCL's buffers, which can cost a layer)."""
    """From two GPUs on: going from one GPU to two adds NCCL's communicator buffers (0.48 GiB
    outside the allocator), which can cost a layout that shards nothing on the GPU a little."""
    model = catalog.load_model(family)
    few = break_even(make_input(model=model, gpus_per_node=gpus, nodes=1, nvme_bytes=AMPLE_HOST,
                                host_ram_bytes=AMPLE_HOST), layout)
    many = break_even(make_input(model=model, gpus_per_node=gpus * more, nodes=nodes, nvme_bytes=AMPLE_HOST,
                                 host_ram_bytes=AMPLE_HOST), layout)
    # near the card the default allocator's replay decides, and how its segments fragment
    # depends on the partition sizes: llama3-8b's family at ZeRO-3 full offload carries 113
    # layers on 8 H200s and 112 on 64 (133.59 GiB needed after the cache flush, 133.38 usable);
    # with the step asked to run on the card less the headroom too, 109 x 14336 (273.7B) on 8 and
    # 107 on 2 x 16: two layers
    assert few.max_model is None or many.max_params >= few.max_params - 2 * few.max_model.layer_params()


# each pair: (less offload, more offload) of the same stage
OFFLOAD_STEPS = [
    (Layout(stage=1), Layout(stage=1, offload_optimizer="cpu")),
    (Layout(stage=2), Layout(stage=2, offload_optimizer="cpu")),
    (Layout(stage=3), Layout(stage=3, offload_optimizer="cpu")),
    (Layout(stage=3), Layout(stage=3, offload_param="cpu")),
    (Layout(stage=3, offload_optimizer="cpu"), Layout(stage=3, offload_optimizer="cpu", offload_param="cpu")),
    (Layout(stage=3, offload_optimizer="cpu"), Layout(stage=3, offload_optimizer="nvme")),
    (Layout(stage=3, offload_optimizer="cpu", offload_param="cpu"),
     Layout(stage=3, offload_optimizer="cpu", offload_param="nvme")),
]


@settings(max_examples=25, deadline=None)
@given(step=st.sampled_from(OFFLOAD_STEPS), gpus=st.sampled_from([1, 2, 8]),
       family=st.sampled_from(["llama3-8b", "reference-gpt"]), micro_batch=st.sampled_from([1, 4]))
def test_more_offload_never_shrinks_the_largest_model_when_host_and_nvme_are_ample(step, gpus, family,
                                                                                   micro_batch):
    """With host RAM and NVMe to spare, moving a state off the GPU can only help."""
    inp = make_input(model=catalog.load_model(family), gpus_per_node=gpus, micro_batch=micro_batch,
                     host_ram_bytes=AMPLE_HOST, nvme_bytes=AMPLE_HOST)
    less, more = step
    assert break_even(inp, more).max_params >= break_even(inp, less).max_params


def test_crossovers_name_a_layout_that_really_takes_over():
    inp = make_input(nvme_bytes=16 * 1024 * GiB)
    found = crossovers(inp)
    assert found, "some layout stops fitting below 10T params"
    sizes = [c.params for c in found]
    assert sizes == sorted(sizes)
    for c in found:
        bigger = with_model(inp, break_even(inp, c.stops_fitting).next_model)
        assert bigger.model.params == c.params
        assert not fits(bigger, c.stops_fitting)
        if c.takes_over is None:
            assert not any(fits(bigger, other) for other in all_layouts())
            continue
        assert fits(bigger, c.takes_over)
        chosen_s = estimate_step_time(bigger, c.takes_over, estimate_comm(bigger, c.takes_over)).step_time_s
        for other in all_layouts():
            if other != c.stops_fitting and fits(bigger, other):
                assert chosen_s <= estimate_step_time(bigger, other, estimate_comm(bigger, other)).step_time_s
        assert "stops fitting" in c.describe() and c.takes_over.label in c.describe()


def test_scaled_model_follows_the_family_or_the_depth():
    llama = scaled_model(catalog.load_model("llama3-8b"), 70e9)
    assert llama.family == "llama3" and llama.params == catalog.model_for_size(70e9, "llama3").params
    deeper = scaled_model(CUSTOM, 2 * CUSTOM.params)
    assert (deeper.hidden, deeper.vocab) == (CUSTOM.hidden, CUSTOM.vocab)
    assert deeper.layers > CUSTOM.layers
    assert abs(deeper.params - 2 * CUSTOM.params) <= CUSTOM.layer_params() / 2


def test_break_even_stays_inside_the_ranges_zlayout_takes():
    """A tiny custom model on two H200s fits at every depth zlayout accepts: the break-even is
    the deepest such model (1000 layers) and 'range', never a 25,809-layer model nor a
    micro-batch above 4096, which no input could then ask for."""
    from zlayout.spec import BOUNDS

    tiny = ModelSpec(name="custom", layers=2, hidden=128, heads=4, vocab=1000)
    inp = make_input(model=tiny, gpus_per_node=2, seq=64)
    for layout in (Layout(stage=0), Layout(stage=3)):
        be = break_even(inp, layout)
        assert be.limited_by == "range"
        assert be.max_model.layers == BOUNDS["layers"].high
        assert be.max_micro_batch == BOUNDS["micro_batch"].high
        assert scaled_model(tiny, 1e15).layers == BOUNDS["layers"].high


def with_micro_batch(inp: PlanInput, micro_batch: int) -> PlanInput:
    return inp.model_copy(update={"training": inp.training.model_copy(update={"micro_batch": micro_batch})})


@pytest.mark.parametrize("model, gpu, gpus, seq, ckpt, headroom, layout", [
    # the replay's answer 16 and more below the per-phase rule's: 56 and 119 were returned, and did not fit
    ("mistral-7b", "h100", 8, 1024, "full", 0.05, Layout(stage=1)),
    ("reference-gpt", "a100-40gb", 1, 512, "none", 0.0, Layout(stage=1, offload_optimizer="cpu")),
])
def test_the_largest_micro_batch_is_one_the_plan_says_fits(model, gpu, gpus, seq, ckpt, headroom, layout):
    inp = make_input(catalog.load_model(model), gpu=gpu, gpus_per_node=gpus, seq=seq, checkpointing=ckpt,
                     headroom=headroom)
    best = largest_micro_batch(inp, layout)
    assert best >= 1
    assert fits(with_micro_batch(inp, best), layout)


def test_a_layout_that_takes_over_fits_where_the_one_before_stops_as_plan_judges_it():
    """The per-phase rule alone said ZeRO-3 takes over from ZeRO-3 param→cpu at 1.43B on an L40S
    at 8192 tokens, where plan (the allocator's replay on the card) says ZeRO-3 needs 0.6 GiB more."""
    inp = make_input(catalog.load_model("mistral-7b"), gpu="l40s", gpus_per_node=1, seq=8192,
                     host_ram_bytes=256 * GiB)
    found = crossovers(inp)
    assert any(c.takes_over is not None for c in found)
    for c in found:
        if c.takes_over is not None:
            bigger = with_model(inp, break_even(inp, c.stops_fitting).next_model)
            assert fits(bigger, c.takes_over), c.describe()
