"""Alert thresholds derived from the measurement (or the prediction until one exists).

The numbers are what an on-call engineer wires into monitoring; each carries a one-line why,
so the person paged at 3 a.m. knows what crossing it means and what to look at.
"""

from __future__ import annotations

from zlayout.core.fit import GpuFit
from zlayout.core.steptime import host_bound_share, offload_bound_share
from zlayout.profile.schema import (MEASURED_STATUSES, Alerts, Basis, DiskSpaceAlert, GpuHealthAlert,
                                    GpuMemoryAlert, HostMemoryAlert, LossSpikeAlert, Prediction, StepTimeAlert,
                                    Verification)
from zlayout.spec import GiB, PlanInput

GPU_MEMORY_MARGIN = 0.10
HOST_MEMORY_MARGIN = 0.15
HOST_MEMORY_CEILING = 0.95  # of host RAM: above this the kernel's OOM killer is near
STEP_TIME_FACTOR = 1.25
# A host-bound step (core.steptime.host_bound_note: the host's unhidden side a quarter of the step or
# more) varies from process to process on one healthy host: one such layout took 0.197-0.359 s over
# six runs (1.82x). 1.25x would page on a healthy restart; twice the step still catches a hang, a
# throttled GPU or a swapping host.
HOST_BOUND_STEP_TIME_FACTOR = 2.0
# An offload-bound step (core.steptime.offload_bound_note: the CPU optimizer and host copies half the
# step or more) varied 27% from one process to the next on one host (Mixtral-8x7B-L2 ZeRO-3 opt->cpu:
# 3.19 and 4.05 s, h200-2026-12-04): 1.25x would page on a healthy restart.
OFFLOAD_BOUND_STEP_TIME_FACTOR = 1.5
LOSS_SPIKE_FACTOR = 2.0
LOSS_SPIKE_WINDOW_STEPS = 100
GPU_IDLE_UTIL_PERCENT = 10
GPU_IDLE_MINUTES = 10
CHECKPOINT_SPACE_FACTOR = 2  # the next save is written beside the last one before `latest` moves


def _gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


def warn_below_the_card(value: int, capacity: int) -> int:
    """A warning on allocated memory (the training script's gauge) that a GPU can reach:
    GPU_MEMORY_MARGIN above `value`, but never past a third of the way to the card's capacity
    (issue 28: a threshold clamped at the capacity could never fire). A plan over the card warns
    just below it. Device-used thresholds are core.fit's."""
    if value >= capacity:
        return capacity - capacity // 100
    return min(int(value * (1 + GPU_MEMORY_MARGIN)), value + (capacity - value) // 3)


def derive_alerts(inp: PlanInput, prediction: Prediction, verification: Verification,
                  checkpoint_dir: str | None = None) -> Alerts:
    """Thresholds from a complete run's measurement when there is one, else from the prediction."""
    same_world = verification.world in (None, inp.hardware.world)  # per-GPU shards differ otherwise
    measured = verification.measured if verification.status in MEASURED_STATUSES and same_world else {}

    def pick(key: str, predicted: int | float | None) -> tuple[Basis, int | float | None]:
        if key in measured:
            return "measured", measured[key]
        return "predicted", predicted

    gpu_basis, peak = pick("gpu_peak_allocated_bytes", prediction.gpu_peak_allocated_bytes)
    used_basis, used = pick("gpu_device_used_bytes", prediction.gpu_device_used_bytes)
    capacity = prediction.gpu_capacity_bytes
    peak, used = int(peak), int(used)
    # device-used thresholds are core.fit's (one rule for every surface), on the figure alerts follow
    fit = GpuFit(capacity_bytes=capacity, needed_bytes=prediction.gpu_needed_bytes or prediction.gpu_device_used_bytes,
                 usable_bytes=prediction.gpu_usable_bytes, device_used_bytes=min(used, capacity),
                 flushes_per_step=prediction.gpu_flushes_per_step or 0)
    thresholds = {t.name: t.bytes for t in fit.alert_thresholds(measured=used_basis == "measured")}
    gpu = GpuMemoryAlert(
        basis=gpu_basis if gpu_basis == used_basis else "measured",
        peak_allocated_bytes=peak, warn_allocated_above_bytes=warn_below_the_card(peak, capacity),
        device_used_bytes=used, warn_device_used_above_bytes=thresholds.get("above_plan"),
        capacity_bytes=capacity, margin_fraction=GPU_MEMORY_MARGIN,
        critical_device_used_above_bytes=thresholds.get("nearly_full"),
        why=(f"the {gpu_basis} peak is {_gib(peak)} of {_gib(capacity)}; "
             f"{GPU_MEMORY_MARGIN:.0%} above it (or a third of the way to the card's capacity, whichever is lower) "
             "something grew (sequence length, batch, a leak) and the next step may run out of memory"),
    )

    host_basis, host_peak = pick("host_peak_bytes", prediction.host_peak_bytes)
    host_peak = int(host_peak)
    host_cap = inp.hardware.host_ram_bytes
    host = HostMemoryAlert(
        basis=host_basis, peak_bytes=host_peak,
        warn_above_bytes=min(int(host_peak * (1 + HOST_MEMORY_MARGIN)), int(host_cap * HOST_MEMORY_CEILING)),
        capacity_bytes=host_cap, margin_fraction=HOST_MEMORY_MARGIN,
        why=(f"the {host_basis} host peak of the job's processes is {_gib(host_peak)} per node; "
             "offload buffers are fixed, so growth means dataloader workers or a leak, "
             "and the kernel's OOM killer ends the job without a Python traceback"),
    )

    step_basis, step_s = pick("step_time_s", prediction.step_time_s)
    step = None
    if step_s:
        host_share = host_bound_share(prediction.host_overhead_s, prediction.step_time_s)
        offload_share = None if host_share is not None else offload_bound_share(
            prediction.offload_s, prediction.step_time_s)
        factor = (HOST_BOUND_STEP_TIME_FACTOR if host_share is not None
                  else OFFLOAD_BOUND_STEP_TIME_FACTOR if offload_share is not None else STEP_TIME_FACTOR)
        step = StepTimeAlert(
            basis=step_basis, step_time_s=float(step_s),
            warn_above_s=round(float(step_s) * factor, 6), factor=factor,
            why=(f"{factor}x the {step_basis} step time of {float(step_s):.3g} s: "
                 "a throttled or failing GPU, a slow link, a straggler node, "
                 "or host memory swapping under offload"
                 + ("" if host_share is None else "; wide because the step is host-bound (the host's "
                    f"Python sets {host_share:.0%} of it), and such steps vary up to 1.8x from one "
                    "process to the next on a healthy host")
                 + ("" if offload_share is None else "; wider because the step is offload-bound (the CPU "
                    f"optimizer and host copies set {offload_share:.0%} of it), and such steps varied 27% "
                    "from one process to the next on a healthy host")),
        )

    loss = LossSpikeAlert(
        window_steps=LOSS_SPIKE_WINDOW_STEPS, factor=LOSS_SPIKE_FACTOR,
        rule=(f"loss > {LOSS_SPIKE_FACTOR} x its median over the last {LOSS_SPIKE_WINDOW_STEPS} steps, "
              "or loss not finite"),
        why=("a spike that size usually precedes divergence: stop, resume from the last "
             "checkpoint and skip the batch or lower the learning rate"),
    )
    health = GpuHealthAlert(
        idle_util_below_percent=GPU_IDLE_UTIL_PERCENT, idle_for_minutes=GPU_IDLE_MINUTES,
        xid_rule="any XID error reported by the driver (DCGM_FI_DEV_XID_ERRORS > 0)",
        why=("a training step keeps every GPU busy, so minutes near idle mean a hang (NCCL waiting "
             "on a dead rank, a stuck dataloader or checkpoint write); an XID is the driver reporting "
             "a GPU fault (48: double-bit ECC, 79: fell off the bus) and the node needs draining"),
    )
    space = None
    if checkpoint_dir and prediction.checkpoint_bytes:
        space = DiskSpaceAlert(
            path=checkpoint_dir, needed_bytes=prediction.checkpoint_bytes,
            warn_free_below_bytes=CHECKPOINT_SPACE_FACTOR * prediction.checkpoint_bytes,
            why=(f"one checkpoint is about {_gib(prediction.checkpoint_bytes)}; with less than "
                 f"{CHECKPOINT_SPACE_FACTOR}x that free the next save can fail part way and leave "
                 "`latest` pointing at a cut-short tag"),
        )
    return Alerts(gpu_memory=gpu, host_memory=host, step_time=step, gpu_health=health,
                  checkpoint_space=space, loss_spike=loss)
