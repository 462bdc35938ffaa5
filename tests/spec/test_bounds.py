"""Bounds at the spec: every number has a range users recognise, and everything inside it plans.

The property test walks the whole accepted space (shapes up to 1,000 layers x 262,144 hidden,
65,536 nodes): ZeRO-3 never holds more model state per GPU than ZeRO-0, and every figure the
plan prints is finite (`plan --json` must never print Infinity or NaN).
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from zlayout import catalog
from zlayout.commands.plan import plan_json
from zlayout.core.memory import estimate_memory
from zlayout.core.plan import make_plan
from zlayout.spec import (BOUNDS, GiB, HardwareSpec, Layout, ModelSpec, PlanInput, TrainingSpec,
                          all_layouts)

GPU = catalog.load_gpu("h100")
NVLINK = catalog.load_link("nvlink4")
IB = catalog.load_link("ib-ndr")


@pytest.mark.parametrize(("field", "low", "high"), [
    ("layers", 1, 1000), ("hidden", 1, 262_144), ("heads", 1, 4096), ("vocab", 1, 10_000_000),
    ("seq", 1, 1_048_576), ("micro_batch", 1, 4096), ("grad_accum", 1, 65_536),
    ("gpus_per_node", 1, 128), ("nodes", 1, 65_536),
])
def test_integer_bounds_are_the_documented_ranges(field, low, high):
    bound = BOUNDS[field]
    assert (bound.low, bound.high) == (low, high)
    assert bound.check(low) == low and bound.check(high) == high
    for outside in (low - 1, high + 1):
        with pytest.raises(ValueError, match=rf"^must be from {low:,} to {high:,} \(got {outside:,}\)$"):
            bound.check(outside)


def test_spec_messages_name_the_range_not_the_field():
    with pytest.raises(ValidationError) as caught:
        TrainingSpec(seq=0, micro_batch=5000)
    errors = {e["loc"][0]: e["msg"] for e in caught.value.errors()}
    assert errors == {"seq": "Value error, must be from 1 to 1,048,576 (got 0)",
                      "micro_batch": "Value error, must be from 1 to 4,096 (got 5,000)"}


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_float_fields_refuse_infinity_and_nan(value):
    with pytest.raises(ValidationError, match="finite"):
        HardwareSpec(gpu=GPU, gpus_per_node=1, intra_link=NVLINK, nvme_gbps=value)
    with pytest.raises(ValidationError, match="finite"):
        GPU.model_validate({**GPU.model_dump(), "peak_bf16_flops": value})


def test_byte_fields_state_their_range_in_gib():
    with pytest.raises(ValidationError, match=r"must be from 1 GiB to 1,048,576 GiB \(got 0.5 GiB\)"):
        HardwareSpec(gpu=GPU, gpus_per_node=1, intra_link=NVLINK, host_ram_bytes=GiB // 2)


def test_the_divisor_hint_is_fast_for_the_largest_prime_width():
    # 262,139 is prime: the old linear search tried every number below it on each keystroke.
    with pytest.raises(ValidationError, match=r"try --heads 1\b"):
        ModelSpec(layers=1, hidden=262_139, heads=3, vocab=10)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def accepted_inputs(draw) -> PlanInput:
    head_dim = draw(st.sampled_from([1, 8, 64, 128, 256]))
    heads = draw(st.integers(1, min(4096, 262_144 // head_dim)))
    kv_heads = draw(st.sampled_from(_divisors(heads)[:12]))
    model = ModelSpec(
        layers=draw(st.integers(1, 1000)), hidden=heads * head_dim, heads=heads, kv_heads=kv_heads,
        ffn=draw(st.none() | st.integers(1, 1_048_576)), vocab=draw(st.integers(1, 10_000_000)),
        mlp=draw(st.sampled_from(["gelu", "swiglu"])), norm=draw(st.sampled_from(["layernorm", "rmsnorm"])),
        bias=draw(st.booleans()), tie_embeddings=draw(st.booleans()))
    nodes = draw(st.integers(1, 65_536))
    hardware = HardwareSpec(
        gpu=GPU, gpus_per_node=draw(st.integers(1, 128)), nodes=nodes, intra_link=NVLINK,
        inter_link=IB if nodes > 1 else None,
        host_ram_bytes=draw(st.integers(GiB, 1024 * 2**40)),
        nvme_bytes=draw(st.integers(0, 1024 * 2**40)),
        nvme_gbps=draw(st.floats(0.1, 1000)))
    training = TrainingSpec(seq=draw(st.integers(1, 1_048_576)), micro_batch=draw(st.integers(1, 4096)),
                            grad_accum=draw(st.integers(1, 65_536)),
                            precision=draw(st.sampled_from(["bf16", "fp16", "fp32"])),
                            checkpointing=draw(st.sampled_from(["none", "full"])))
    return PlanInput(model=model, hardware=hardware, training=training,
                     headroom_fraction=draw(st.floats(0, 0.9)))


def _model_states_per_gpu(inp: PlanInput, layout: Layout) -> int:
    return sum(t.bytes for t in estimate_memory(inp, layout).terms
               if t.where == "gpu" and t.category == "model_states")


def _no_constant(name: str):
    raise AssertionError(f"plan --json would print {name}")


@settings(max_examples=60, deadline=None)
@given(inp=accepted_inputs())
def test_every_accepted_input_plans_finite_figures_and_zero3_holds_the_least_model_state(inp):
    assert _model_states_per_gpu(inp, Layout(stage=3)) <= _model_states_per_gpu(inp, Layout(stage=0))
    plan = make_plan(inp, with_breakeven=False)
    for layout in (None, *all_layouts()[:1], Layout(stage=3, offload_optimizer="cpu")):
        text = json.dumps(plan_json(plan, layout), allow_nan=False)
        json.loads(text, parse_constant=_no_constant)
