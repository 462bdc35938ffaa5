"""Fakes for the app's tests: a fixed plan input, and a stub planner whose numbers these
tests own (so snapshots capture the app's looks, not the memory model of the day)."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Iterator

from zlayout.core.breakeven import BreakEven
from zlayout.core.comm import CommEstimate
from zlayout.core.memory import MemoryEstimate, MemoryTerm
from zlayout.core.plan import LayoutPlan, Plan
from zlayout.core.recommend import Recommendation
from zlayout.core.steptime import StepTimeEstimate
from zlayout.spec import (GiB, GpuSpec, HardwareSpec, Layout, LinkSpec, ModelSpec, PlanInput,
                          TrainingSpec, all_layouts)
from zlayout.tui.form import Presets

H200 = GpuSpec(name="h200", memory_bytes=143771 * 2**20, peak_bf16_flops=989e12, hbm_gbps=4800.0)
A100 = GpuSpec(name="a100-80gb", memory_bytes=80 * GiB, peak_bf16_flops=312e12)
NVLINK4 = LinkSpec(name="nvlink4", bandwidth_gbps=450.0, latency_us=3.0)
NVLINK3 = LinkSpec(name="nvlink3", bandwidth_gbps=300.0)
IB_NDR = LinkSpec(name="ib-ndr", bandwidth_gbps=50.0)
REFERENCE_GPT = ModelSpec(name="reference-gpt", layers=8, hidden=4096, heads=32, vocab=32000)


def fixed_input() -> PlanInput:
    """The reference GPT on 8 H200s, built without the catalog (never changes)."""
    return PlanInput(
        model=REFERENCE_GPT,
        hardware=HardwareSpec(gpu=H200, gpus_per_node=8, nodes=1, intra_link=NVLINK4,
                              inter_link=IB_NDR, host_ram_bytes=2048 * GiB, nvme_bytes=0),
        training=TrainingSpec(seq=4096, micro_batch=1),
    )


def fixed_presets() -> Presets:
    """A fixed preset list for snapshots (the real catalog grows)."""
    gpus = {g.name: g for g in (H200, A100)}
    links = {link.name: link for link in (NVLINK4, NVLINK3, IB_NDR)}
    models = {"reference-gpt": REFERENCE_GPT,
              "small-gpt": REFERENCE_GPT.model_copy(update={"name": "small-gpt", "layers": 4})}
    return Presets(models=tuple(models), gpus=tuple(gpus), links=tuple(links),
                   load_gpu=gpus.__getitem__, load_link=links.__getitem__,
                   load_model=models.__getitem__,
                   model_of_size=lambda text: REFERENCE_GPT.model_copy(
                       update={"name": f"gpt-{text}", "layers": max(1, int(float(text.rstrip("B")) * 4))}),
                   default_intra_link={"h200": "nvlink4", "a100-80gb": "nvlink3"}.__getitem__)


def stub_planner(inp: PlanInput) -> Plan:
    """A plan from simple arithmetic these tests control: ZeRO's sharding of 2+2+12 bytes per
    parameter, activations proportional to tokens, a fixed buffer and overhead."""
    params, world = inp.model.params, inp.hardware.world
    tokens = inp.training.seq * inp.training.micro_batch
    capacity = inp.hardware.gpu.memory_bytes
    planned = []
    for layout in all_layouts():
        shards = {0: (1, 1, 1), 1: (1, 1, world), 2: (1, world, world), 3: (world, world, world)}[layout.stage]
        on_gpu = {"params": layout.offload_param == "gpu", "optimizer": layout.offload_optimizer == "gpu"}
        param_bytes = 2 * params // shards[0]
        optimizer_bytes = 12 * params // shards[2]
        terms = (
            MemoryTerm("parameters", "gpu" if on_gpu["params"] else "host", param_bytes,
                       "model_states", "bf16 weights"),
            MemoryTerm("gradients", "gpu", 2 * params // shards[1], "model_states", "bf16 gradients"),
            MemoryTerm("optimizer_state", "gpu" if on_gpu["optimizer"] else "host", optimizer_bytes,
                       "model_states", "fp32 master weights and Adam moments"),
            MemoryTerm("activations", "gpu", 40 * tokens * inp.model.hidden * inp.model.layers,
                       "activations", "saved for the backward pass"),
            MemoryTerm("reduce_buckets", "gpu", 2 * GiB, "deepspeed_buffers", "reduce bucket x2"),
            MemoryTerm("cuda_context", "gpu", GiB // 2, "overhead", "CUDA context"),
        )
        gpu = sum(t.bytes for t in terms if t.where == "gpu")
        host = sum(t.bytes for t in terms if t.where == "host") * inp.hardware.gpus_per_node
        memory = _build(
            MemoryEstimate,
            layout=layout, terms=terms, gpu_peak_allocated_bytes=gpu - GiB // 2,
            gpu_peak_reserved_bytes=gpu - GiB // 2, gpu_device_used_bytes=gpu, gpu_needed_bytes=gpu,
            host_peak_bytes=host, nvme_bytes=0, gpu_capacity_bytes=capacity,
            host_capacity_bytes=inp.hardware.host_ram_bytes, nvme_capacity_bytes=inp.hardware.nvme_bytes,
            gpu_usable_bytes=int(capacity * (1 - inp.headroom_fraction)), peak_phase="optimizer step")
        comm_bytes = 0 if world == 1 else (3 if layout.stage == 3 else 2) * 2 * params * (world - 1) // world
        step_s = 0.5 + 0.25 * layout.stage + (3.0 if layout.offload_optimizer != "gpu" else 0.0)
        planned.append(LayoutPlan(
            layout=layout, memory=memory,
            comm=_build(CommEstimate, intra_node_bytes=comm_bytes, inter_node_bytes=0, pcie_bytes=0,
                              nvme_read_bytes=0, nvme_write_bytes=0),
            time=_build(StepTimeEstimate, compute_s=0.5, comm_s=step_s - 0.5, offload_s=0.0, step_time_s=step_s,
                                  tokens_per_s=tokens * world / step_s, mfu=0.4),
            breakeven=_build(BreakEven, max_params=int(capacity * 0.8 / 16 * shards[2]), max_micro_batch=4,
                                limited_by="gpu"),
        ))
    fitting = [lp for lp in planned if lp.memory.fits]
    best = min(fitting, key=lambda lp: lp.time.step_time_s).layout if fitting else None
    return Plan(input=inp, layouts=tuple(planned),
                recommendation=Recommendation(best, "fits and is fastest (stub)." if best else "No layout fits."))


def _build(cls: type, **known: Any) -> Any:
    """The core's result dataclass from the fields these tests set; fields added to the core
    later (that this stub does not know) are zero, so the stub keeps working as the core grows."""
    for field in dataclasses.fields(cls):
        if field.name in known or field.default is not dataclasses.MISSING \
                or field.default_factory is not dataclasses.MISSING:
            continue
        kind = str(field.type)
        known[field.name] = 0.0 if "float" in kind else "" if "str" in kind else 0
    return cls(**known)


class FakeVerifier:
    """Yields the given lines; with `wait_for_cancel`, then blocks until cancelled. Records
    whether its generator was closed (the real one kills its processes there)."""

    def __init__(self, lines: list[str], wait_for_cancel: bool = False, error: Exception | None = None):
        self.lines = lines
        self.wait_for_cancel = wait_for_cancel
        self.error = error
        self.started = threading.Event()
        self.cleaned_up = threading.Event()
        self.calls: list[tuple[PlanInput, Layout]] = []

    def __call__(self, inp: PlanInput, layout: Layout, cancel: threading.Event,
                 cpu_processes: int | None = None, emulate: bool = False) -> Iterator[str]:
        self.calls.append((inp, layout))
        self.cpu_processes = cpu_processes
        self.emulate = emulate
        self.started.set()
        try:
            yield from self.lines
            if self.error is not None:
                raise self.error
            if self.wait_for_cancel:
                cancel.wait(10)
                yield "stopping"
        finally:
            self.cleaned_up.set()



def stub_crossovers(inp: PlanInput) -> list[Any]:
    """Crossovers of the stub plan: each layout stops at its stub break-even size and the
    next larger one takes over."""
    from zlayout.core.breakeven import Crossover

    plan = stub_planner(inp)
    ordered = sorted(plan.layouts, key=lambda lp: (lp.breakeven.max_params, lp.layout.key))
    out = []
    for lp, bigger in zip(ordered, ordered[1:] + [None]):
        out.append(Crossover(params=lp.breakeven.max_params + 1, stops_fitting=lp.layout,
                             takes_over=bigger.layout if bigger is not None else None))
    return out


def snapshot_app() -> Any:
    """The app on the stub planner and fixed presets: its looks, not the model's numbers."""
    from zlayout.tui.app import ZLayoutApp

    return ZLayoutApp(initial=fixed_input(), planner=stub_planner, presets=fixed_presets(),
                      crossovers=stub_crossovers, cursor_blink=False)


async def settle(pilot, timeout_s: float = 30.0) -> None:
    """Wait until the plan of the fields is on screen (planning runs in a worker)."""
    app = pilot.app
    for _ in range(int(timeout_s / 0.02)):
        await pilot.pause()
        if app.plan is not None and not app.plan_pending:
            await pilot.pause()
            return
        await pilot.pause(0.02)
    raise AssertionError("the plan did not settle")
