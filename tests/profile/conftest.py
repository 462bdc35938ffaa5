"""Shared fixtures: real plan inputs from the shipped presets, and profiles built from them."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from zlayout import catalog
from zlayout.spec import HardwareSpec, Layout, ModelSpec, PlanInput, TrainingSpec

FIXED_TIME = datetime(2026, 11, 30, 1, 2, 3, tzinfo=timezone.utc)


def plan_input(model: str | ModelSpec = "llama3-8b", gpu: str = "h100", gpus_per_node: int = 8,
               nodes: int = 1, seq: int = 2048, micro_batch: int = 1, grad_accum: int = 1,
               precision: str = "bf16", checkpointing: str = "none", nvme_gib: float = 0) -> PlanInput:
    spec = catalog.load_model(model) if isinstance(model, str) else model
    hw = HardwareSpec(gpu=catalog.load_gpu(gpu), gpus_per_node=gpus_per_node, nodes=nodes,
                      intra_link=catalog.load_link(catalog.default_intra_link(gpu)),
                      inter_link=catalog.load_link("ib-ndr") if nodes > 1 else None,
                      nvme_bytes=int(nvme_gib * 2**30))
    return PlanInput(model=spec, hardware=hw,
                     training=TrainingSpec(seq=seq, micro_batch=micro_batch, grad_accum=grad_accum,
                                           precision=precision, checkpointing=checkpointing))


TINY_MODEL = ModelSpec(name="tiny", layers=2, hidden=256, heads=4, vocab=1000)


@pytest.fixture
def make_input():
    return plan_input


@pytest.fixture
def tiny_model():
    return TINY_MODEL


@pytest.fixture
def profile_8b():
    from zlayout.profile import build_profile

    return build_profile(plan_input(), Layout(stage=3, offload_optimizer="cpu"), now=FIXED_TIME)


@pytest.fixture
def fixed_time():
    return FIXED_TIME


def verify_result(profile, status: str = "validated", scale: float = 1.04) -> dict:
    """A result dict shaped like zlayout.verify.result.build_result's."""
    p = profile.prediction
    return {
        "status": status,
        "cause": None if status == "validated" else "rank 0 failed during step: boom",
        "mode": "gpu",
        "layout": {**profile.layout.model_dump(mode="json"), "key": profile.layout.key},
        "inputs": profile.inputs.model_dump(mode="json"),
        "measured": {
            "world": profile.world, "params": profile.inputs.model.params,
            "gpu_peak_allocated_bytes": int(p.gpu_peak_allocated_bytes * scale),
            "gpu_peak_allocated_bytes_per_step": [1, 2, 3],
            "gpu_peak_reserved_bytes": int(p.gpu_peak_reserved_bytes * scale),
            "gpu_device_used_bytes": int(p.gpu_device_used_bytes * scale),
            "host_peak_bytes": int(p.host_peak_bytes * 0.9),
            "step_time_s": 0.5, "step_times_s": [2.0, 0.5, 0.5], "tokens_per_s": 32768.0,
            "init_s": 61.5, "losses": [10.4, 10.2, 10.1], "steps_run": [1, 2, 3],
        },
        "predicted": p.figures() | {"fits": True, "peak_phase": "backward"},
        "restart_drill": {"resumed_ok": True, "resume_s": 12.5, "step_before": 2, "step_after": 2,
                          "loss_exact": True, "losses_compared": 1},
        "environment": {"gpus": ["NVIDIA H100 80GB HBM3"] * profile.world, "driver": "560.35.03",
                        "cuda": "12.6", "torch": "2.5.1", "deepspeed": "0.19.8", "hostname": "node1"},
        "ranks": [], "output_tail": [],
    }


@pytest.fixture
def make_verify_result():
    return verify_result
