"""Whether a layout fits on the GPU, and how much of the card is left: the one rule every surface
uses (the plan's text and JSON, break-even, the recommendation, the app, the profile's runbook
and alerts). None of them compares bytes itself; each calls `gpu_fit(memory)` and shows its figures
and `summary()`.

    fit = gpu_fit(estimate)            # estimate: core.memory.MemoryEstimate
    fit.fits                           # the verdict (GPU only; host and NVMe: MemoryEstimate.fits)
    fit.state                          # "fits", "fits-flushing" or "does-not-fit"
    fit.headroom_bytes, fit.headroom_fraction
    fit.summary()                      # the same words on every surface
    fit.alert_thresholds()             # what a device-memory alert may watch, each below the card

The figures, each on what it measures (per GPU, bytes):

* `capacity_bytes`: the card's memory (what nvidia-smi reports as its total).
* `allocatable_bytes`: what a process can have of it: the card less `driver_reserved_bytes`, the
  memory the driver keeps for itself (nvidia-smi -q's "Reserved"; cudaMemGetInfo's total, which
  is torch's "total capacity", leaves it out: 139.80 of 140.40 GiB on an H200). cudaMalloc
  fails past it, whatever the card's total says.
* `needed_bytes`: the least device memory the step runs in: the allocated peak, the cached
  blocks the caching allocator cannot give back (free parts of segments that still hold a live
  tensor), the CUDA context and NCCL's buffers. A run needing more than `allocatable_bytes` is
  an out-of-memory error.
* `usable_bytes`: the card less the headroom asked for (`--headroom`, default 5%), never more
  than `allocatable_bytes`.
* fits: needed <= usable.
* `device_used_bytes`: what the card shows at the peak (reserved + context + NCCL): the cache
  grows until the card is full, so it can be well above `needed_bytes`, never above
  `allocatable_bytes`.
* headroom: what is left that the process could still allocate at the peak (allocatable less
  device used: `headroom_bytes`, and as a fraction of the card). 0 when the cache fills the
  card; it is not the margin to an out-of-memory error (`margin_bytes`: allocatable minus needed).
* flushes: with the default allocator, a card that the cache fills makes a cudaMalloc fail; PyTorch
  then frees every cached segment no tensor uses and retries (`num_alloc_retries`); the step
  pays for each (`flush_cost_s`). A layout that fits only so is "fits-flushing": "fits; the
  device will be full and the allocator flushes its cache about N times a step, +X ms".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from zlayout.spec import gib_figure

GiB = 2**30
MiB = 2**20

FitState = Literal["fits", "fits-flushing", "does-not-fit"]

# A retry (c10/cuda/CUDACachingAllocator.cpp malloc -> release_cached_blocks ->
# alloc_block(isRetry)) synchronizes the device, cudaFree's every unused cached segment and
# cudaMalloc's again. The slope per GiB released is measured on one H200
# (benchmarks/measurements/h200-2026-12-02c/call1-retry.log, retry_cost.py: one retry releasing
# 69-132 GiB of 21 MiB to 1 GiB segments took 0.20-0.36 s, 1.5 ms per GiB by least squares). The
# fixed part is fitted in training, where the GPU is busy when the retry synchronizes: the two
# H200 ZeRO-2 rows that retried every step (h200-2026-12-01 batch2 and call3, 17 and 18 layers of
# Llama-3-8B's shape at micro-batch 4: 4 and 7 retries in 3 steps, the replay says 4 and 6) took
# 0.130 and 0.147 s a step more than the step model: 0.04 s a retry plus the slope (in-sample; the
# isolated retries of retry_cost.py come out 0.06-0.12 s under it).
FLUSH_FIXED_S = 0.04
FLUSH_S_PER_GIB = 0.0015

# Alerts on device used (DCGM_FI_DEV_FB_USED): "nearly full" at 97% of the card, present whenever
# the plan's device use is within 10% of the card or the plan flushes, unless the plan's own device
# use is already past 97% (a rule firing on every healthy step); "above plan" over the device use
# the alert follows, kept below "nearly full": 5% over a run's measured device use (a layout repeats
# its own to within 1%), 15% over a prediction, which has been under the run by up to 11.7% on
# held-out layouts (Qwen3-8B at ZeRO-3, h200-2026-12-12; Gemma-2-2B eager -7.7%, h200-2026-12-13:
# the caching allocator's segments follow request orders the meta trace cannot see), so that a
# healthy first run of an unverified profile does not page.

NEARLY_FULL_FRACTION = 0.97
NEAR_CARD_FRACTION = 0.90
ABOVE_PLAN_FRACTION = 0.05  # over a measured device use
ABOVE_PREDICTION_FRACTION = 0.15  # over a predicted one
PREDICTED_DEVICE_USED_WORST_UNDER = 0.117  # the held-out runs above (the runbook quotes it)


def fills_alert_range(device_used_bytes: int, capacity_bytes: int) -> bool:
    """The plan's own device use is at or past the "nearly full" threshold: no device-used
    threshold can tell a healthy step from trouble (the alerts and the runbook ask)."""
    return device_used_bytes >= int(capacity_bytes * NEARLY_FULL_FRACTION)


@dataclass(frozen=True, slots=True)
class AlertThreshold:
    name: str  # "above_plan" or "nearly_full"
    bytes: int  # device used (per GPU) above which the alert fires; always below the card
    watches: str  # what it compares, in words


@dataclass(frozen=True, slots=True)
class GpuFit:
    capacity_bytes: int
    needed_bytes: int
    usable_bytes: int
    device_used_bytes: int
    flushes_per_step: int = 0
    flush_cost_s: float = 0.0
    driver_reserved_bytes: int = 0  # the card's memory no process gets (GpuSpec.driver_reserved_bytes)

    @property
    def fits(self) -> bool:
        return self.needed_bytes <= self.limit_bytes

    @property
    def limit_bytes(self) -> int:
        """The most the step may need: the usable part of the card, never more than the driver
        hands out."""
        return min(self.usable_bytes, self.allocatable_bytes)

    @property
    def allocatable_bytes(self) -> int:
        """What cudaMalloc and the CUDA context can have of the card (cudaMemGetInfo's total)."""
        return self.capacity_bytes - self.driver_reserved_bytes

    @property
    def presses_card(self) -> bool:
        """The step fills the card: the allocator flushes its cache, or device used reaches it."""
        return self.flushes_per_step > 0 or self.device_used_bytes >= self.allocatable_bytes

    @property
    def headroom_bytes(self) -> int:
        """What the process could still allocate at the peak (0: the cache fills the card)."""
        return self.allocatable_bytes - self.device_used_bytes

    @property
    def headroom_fraction(self) -> float:
        return self.headroom_bytes / self.capacity_bytes

    @property
    def margin_bytes(self) -> int:
        """What the card can hand out minus what the step needs: how much more it could need
        before a retry fails (negative: what is missing on the card)."""
        return self.allocatable_bytes - self.needed_bytes

    @property
    def short_by_bytes(self) -> int:
        """What the step needs past the usable part of the card (0 when it fits)."""
        return 0 if self.fits else self.needed_bytes - self.limit_bytes

    @property
    def state(self) -> FitState:
        if not self.fits:
            return "does-not-fit"
        return "fits-flushing" if self.flushes_per_step > 0 else "fits"

    def summary(self) -> str:
        """One sentence for every surface (no trailing period)."""
        if not self.fits:
            needs, usable = gib_figure(self.needed_bytes), gib_figure(self.limit_bytes)
            # a shortfall the figures round away is said in MiB ("needs 75.7, 75.7 is usable" read as a fit)
            short = f" ({-(-self.short_by_bytes // MiB):,} MiB short)" if needs == usable else ""
            return (f"does not fit: needs {needs} GiB per GPU, "
                    f"{usable} of {gib_figure(self.capacity_bytes)} GiB is usable{short}")
        if self.state == "fits-flushing":
            return (f"fits; the device will be full and the allocator flushes its cache about "
                    f"{self.flushes_per_step} time{'s' if self.flushes_per_step != 1 else ''} a step, "
                    f"+{self.flush_cost_s * 1000:.0f} ms (needs {gib_figure(self.needed_bytes)} of "
                    f"{gib_figure(self.capacity_bytes)} GiB per GPU)")
        return (f"fits; {self.headroom_fraction:.0%} of the card free at the peak (device used "
                f"{gib_figure(self.device_used_bytes)} of {gib_figure(self.capacity_bytes)} GiB per GPU)")

    @property
    def fills_alert_range(self) -> bool:
        return fills_alert_range(self.device_used_bytes, self.capacity_bytes)

    def alert_thresholds(self, measured: bool = False) -> tuple[AlertThreshold, ...]:
        """Device-used thresholds an alert may fire on, each below the card's memory: "nearly
        full" whenever the plan is near the card (or flushes), "above plan" where it is below
        "nearly full" (`measured`: the device use is a run's, not the plan's prediction)."""
        nearly_full = int(self.capacity_bytes * NEARLY_FULL_FRACTION)
        out = []
        margin = ABOVE_PLAN_FRACTION if measured else ABOVE_PREDICTION_FRACTION
        above_plan = min(int(self.device_used_bytes * (1 + margin)), nearly_full - MiB)
        if above_plan > self.device_used_bytes:
            basis = "the measured" if measured else "the plan's"
            out.append(AlertThreshold("above_plan", above_plan,
                                      f"device used per GPU more than {margin:.0%} above {basis} "
                                      f"{gib_figure(self.device_used_bytes)} GiB"))
        # a plan whose own device use is past "nearly full" (its cache fills the card: device used
        # is then at the card however healthy the step) would fire it on every step: left out,
        # and the allocated-peak alert is what tells trouble (`fills_alert_range`)
        if (self.device_used_bytes >= NEAR_CARD_FRACTION * self.capacity_bytes or self.flushes_per_step) \
                and not self.fills_alert_range:
            out.append(AlertThreshold("nearly_full", nearly_full,
                                      f"device used per GPU within {1 - NEARLY_FULL_FRACTION:.0%} of the card's "
                                      f"{gib_figure(self.capacity_bytes)} GiB: the next larger request may not fit"))
        return tuple(out)


def flush_cost_s(flushes: int, freed_bytes: int) -> float:
    """What `flushes` retries cost a step that frees `freed_bytes` in them (FLUSH_FIXED_S,
    FLUSH_S_PER_GIB)."""
    return flushes * FLUSH_FIXED_S + FLUSH_S_PER_GIB * freed_bytes / GiB if flushes else 0.0


def gpu_fit(memory) -> GpuFit:
    """The fit of one layout's `MemoryEstimate` (core.memory): its flushes a step are the replay's
    on the card; a layout the replay does not cover whose cache would outgrow the card (device
    used at the card) is counted one a step, at FLUSH_FIXED_S."""
    flushes, cost = memory.gpu_flushes_per_step, memory.gpu_flush_cost_s
    if flushes is None:  # not replayed: the cache outgrows the card where device used reaches it
        allocatable = memory.gpu_capacity_bytes - memory.gpu_driver_reserved_bytes
        flushes = 1 if memory.gpu_device_used_bytes >= allocatable else 0
        cost = flush_cost_s(flushes, 0)
    return GpuFit(capacity_bytes=memory.gpu_capacity_bytes, needed_bytes=memory.gpu_needed_bytes,
                  usable_bytes=memory.gpu_usable_bytes, device_used_bytes=memory.gpu_device_used_bytes,
                  flushes_per_step=flushes, flush_cost_s=cost,
                  driver_reserved_bytes=memory.gpu_driver_reserved_bytes)
