"""Shared builders for the verification tests: tiny models that a 2-core CI machine trains
with real DeepSpeed engines on CPU (gloo) in seconds."""

from __future__ import annotations

import pytest

from zlayout.spec import GiB, GpuSpec, HardwareSpec, LinkSpec, ModelSpec, PlanInput, TrainingSpec

H200 = GpuSpec(name="h200", memory_bytes=141 * GiB, peak_bf16_flops=989e12)
NVLINK = LinkSpec(name="nvlink4", bandwidth_gbps=450)


def tiny_input(gpus: int = 1, checkpointing: str = "none", micro_batch: int = 2, seq: int = 32,
               **model: object) -> PlanInput:
    shape = dict(layers=2, hidden=64, heads=4, vocab=128)
    shape.update(model)
    return PlanInput(model=ModelSpec(**shape),
                     hardware=HardwareSpec(gpu=H200, gpus_per_node=gpus, intra_link=NVLINK),
                     training=TrainingSpec(seq=seq, micro_batch=micro_batch,
                                           checkpointing=checkpointing))


@pytest.fixture
def make_input():
    return tiny_input
