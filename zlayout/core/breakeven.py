"""Break-even sizes: the largest model each layout carries, the largest micro-batch, crossovers.

"Largest model" means the largest model of the current model's family (the family's shape
rule scales depth and width together: `catalog.model_for_size`) that fits GPU memory with
the requested headroom, host RAM and NVMe, everything else unchanged. A model without a
family (or of a family no preset names) is scaled in depth at fixed width: same layers'
shape, vocabulary and style, more or fewer layers. A model preset file that cannot be read
(bad TOML, wrong types) raises PresetFileError rather than falling back to depth: the
sizes would silently answer another question. `presets_dirs` are `--presets-dir`'s folders,
looked up before the usual ones (catalog.search_dirs).

The TUI recomputes every layout's break-even on each keystroke, so the searches count their
memory evaluations: a bisection in log(params) (about a dozen evaluations, fewer when
neighbouring sizes map to the same shape), a micro-batch search that extrapolates the
(nearly linear) memory growth and then checks its neighbours, and a memo of the whole
answer per (input, layout). A caller that may stop wanting the answer (the TUI, when the
user edits again) runs the searches inside `cancellable(stop)`: every evaluation first asks
`stop()`, and `Cancelled` ends the search within one evaluation.

A layout that will not run the model whatever its memory (tensors.grouped_gemm_refusal: ZeRO-0, or
ZeRO-3 on one GPU, of a model whose grouped-experts weights DeepSpeed packs off a 16-byte boundary)
carries no size of it: its BreakEven says why (`will_not_run`) and no search runs; crossovers
neither name it as stopping nor as taking over.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from dataclasses import dataclass
from typing import Callable, Iterator

from zlayout.catalog import PresetFileError, family_scaler, format_params
from zlayout.core import memory
from zlayout.core.memory import MemoryEstimate
from zlayout.core.tensors import grouped_gemm_refusal
from zlayout.spec import BOUNDS, Layout, ModelSpec, PlanInput, all_layouts

MIN_PARAMS = 1e8
MAX_PARAMS = 1e13
PARAMS_TOLERANCE = 0.002  # stop bisecting when the bracket is this narrow (relative)
MAX_MICRO_BATCH = int(BOUNDS["micro_batch"].high)  # the largest micro-batch zlayout takes
FAMILY_GRID = math.log(1.0025)  # family searches ask for sizes 0.25% apart (cached shapes)
PROBE_WINDOW = 0.08  # after converging, look this far (relative) above for a shape that fits again (a width step of the
# llama3 family is 3.5% wide: 258B at 118 x 13312 ran out, 267B at 106 x 14336 fits, on 16 H200s at ZeRO-3 full offload)
MAX_RESTARTS = 4


@dataclass(frozen=True, slots=True)
class BreakEven:
    max_params: int  # largest model of the family that fits with the requested headroom
    max_micro_batch: int  # largest micro-batch that fits the current model (0: none)
    limited_by: str  # what the next larger model runs out of: "gpu", "host", "nvme"; "range" if none up to 1e13 params or 1000 layers (the spec's range); WILL_NOT_RUN: see will_not_run
    max_model: ModelSpec | None = None  # the model at max_params (None when none fits)
    next_params: int = 0  # the smallest larger model of the family, which does not fit (0: none)
    next_model: ModelSpec | None = None  # that model
    scaling: str = "family"  # "family" (model_for_size) or "depth" (layers at fixed width)
    # why this layout will not run this model at any size (tensors.grouped_gemm_refusal, the line
    # Plan.will_not_run gives): max_params and max_micro_batch are then 0 and nothing was searched
    will_not_run: str | None = None


WILL_NOT_RUN = "will_not_run"  # BreakEven.limited_by of a layout that will not run the model


@dataclass(frozen=True, slots=True)
class Crossover:
    params: int  # the first model size (of the family) at which `stops_fitting` no longer fits
    stops_fitting: Layout
    takes_over: Layout | None  # the fastest layout that still fits at that size; None: none does

    def describe(self) -> str:
        size = format_params(self.params)
        if self.takes_over is None:
            return f"from {size} params, {self.stops_fitting.label} stops fitting; nothing else fits"
        return (f"from {size} params, {self.stops_fitting.label} stops fitting; "
                f"{self.takes_over.label} takes over")


class Cancelled(Exception):
    """The searches were stopped: `cancellable`'s `stop()` said their answer is no longer wanted."""


_cancellation = threading.local()  # per thread: the TUI's planning worker sets its own


@contextlib.contextmanager
def cancellable(stop: Callable[[], bool]) -> Iterator[None]:
    """Within, in this thread, every memory evaluation of the searches first calls `stop()`
    and raises Cancelled when it is True (nothing half-searched is memoized)."""
    previous = getattr(_cancellation, "stop", None)
    _cancellation.stop = stop
    try:
        yield
    finally:
        _cancellation.stop = previous


def estimate_memory(inp: PlanInput, layout: Layout, **options) -> MemoryEstimate:
    """memory.estimate_memory, unless the searches were cancelled (see `cancellable`)."""
    stop = getattr(_cancellation, "stop", None)
    if stop is not None and stop():
        raise Cancelled
    return memory.estimate_memory(inp, layout, **options)


# --------------------------------------------------------------------------- scaling the model


@functools.lru_cache(maxsize=64)
def _scaler(family: str, presets_dirs: tuple[str, ...] = ()):
    return family_scaler(family, presets_dirs)


def _family_model(family: str, target_params: float, presets_dirs: tuple[str, ...] = ()) -> ModelSpec:
    """The family's shape nearest `target_params` (catalog.model_for_size, presets read once)."""
    return _scaler(family, presets_dirs)(target_params)


def clear_caches() -> None:
    """Forget every memoized answer (after a model preset file changed)."""
    _break_even.cache_clear()
    _scaler.cache_clear()
    _family_is_known.cache_clear()


@functools.lru_cache(maxsize=256)
def _family_is_known(family: str | None, presets_dirs: tuple[str, ...] = ()) -> bool:
    if not family:
        return False
    try:
        _family_model(family, 1e9, presets_dirs)
    except PresetFileError as err:
        # a broken file may be one of this family's presets: its sizes cannot be trusted
        raise PresetFileError(f"break-even cannot scale the {family} family: {err}; "
                              "fix or remove that file") from None
    except (KeyError, ValueError):  # no preset names the family, or its shapes do not scale
        return False
    return True


def scaling_rule(model: ModelSpec, presets_dirs: tuple[str, ...] = ()) -> str:
    """"family" when the catalog can scale this model's family, else "depth".

    Raises PresetFileError when a model preset file cannot be read."""
    return "family" if _family_is_known(model.family, tuple(presets_dirs)) else "depth"


def model_with_layers(model: ModelSpec, layers: int) -> ModelSpec:
    return model.with_layers(layers)


def scaled_model(model: ModelSpec, target_params: float, presets_dirs: tuple[str, ...] = ()) -> ModelSpec:
    """The model of `model`'s family (or depth series) nearest `target_params`."""
    presets_dirs = tuple(presets_dirs)
    if scaling_rule(model, presets_dirs) == "family":
        return _family_model(model.family, math.exp(_snap(math.log(target_params))), presets_dirs)
    fixed = model.params - model.layers * model.layer_params()
    # no deeper than a model zlayout takes (the spec's layer range): beyond it, "range"
    layers = min(BOUNDS["layers"].high, max(1, round((target_params - fixed) / model.layer_params())))
    return model_with_layers(model, layers)


def _snap(log_params: float) -> float:
    """A size on the family searches' grid in log(params), so searches share cached shapes."""
    return round(log_params / FAMILY_GRID) * FAMILY_GRID


def _with_model(inp: PlanInput, model: ModelSpec) -> PlanInput:
    return inp.model_copy(update={"model": model})


def _binding(est: MemoryEstimate) -> str:
    if not est.fits_gpu:
        return "gpu"
    if not est.fits_host:
        return "host"
    return "nvme"


# --------------------------------------------------------------------------- searches


def _load_log(est: MemoryEstimate) -> float:
    """log of the most loaded resource's use over its capacity (> 0: does not fit)."""
    ratios = [est.gpu_needed_bytes / max(1, est.gpu_usable_bytes)]
    if est.host_peak_bytes:
        ratios.append(est.host_peak_bytes / max(1, est.host_capacity_bytes))
    if est.nvme_bytes:
        ratios.append(est.nvme_bytes / max(1, est.nvme_capacity_bytes))
    return math.log(max(max(ratios), 1e-12))


def _largest_fitting(inp: PlanInput, layout: Layout, candidate, grid: float | None,
                     replay: bool = False) -> tuple[ModelSpec | None, ModelSpec | None, str]:
    """(largest fitting model, smallest non-fitting model, what that one runs out of).

    `candidate(x)` is the model of the series nearest params = exp(x), non-decreasing in x.
    With a `grid`, every x asked is a multiple of it (the family's shapes are cached per
    grid point, so later searches reuse them) and the search ends on adjacent grid points;
    without, x is continuous and the search ends within PARAMS_TOLERANCE.
    The bracket [lo fits, hi does not] in log(params) shrinks by regula falsi on the log of
    the memory load (nearly linear in log params for large models), Illinois-modified so
    both ends move, kept a step inside the bracket so it closes; steps whose model is one
    already judged cost no evaluation. `replay`: judge with the default allocator's replay on
    the card (tenths of a second a model) rather than the per-phase rule alone.
    """
    def judge(model: ModelSpec) -> MemoryEstimate:
        return estimate_memory(_with_model(inp, model), layout, replay=replay)

    def snap(x: float) -> float:
        return round(x / grid) * grid if grid else x

    margin = grid if grid else 0.5 * PARAMS_TOLERANCE
    done = 1.5 * grid if grid else PARAMS_TOLERANCE
    lo, hi = snap(math.log(MIN_PARAMS)), snap(math.log(MAX_PARAMS))
    lo_model = candidate(lo)
    est = judge(lo_model)
    if not est.fits:
        # a model under MIN_PARAMS (zaya-tiny's 107K at 65,536 tokens: its depth series ends at
        # 45M, which does not fit): search from its own size before saying none fits
        own = snap(math.log(max(inp.model.params, 1)))
        own_model = candidate(own) if own < lo else None
        own_est = judge(own_model) if own_model is not None and own_model != lo_model else None
        if own_est is None or not own_est.fits:
            return None, lo_model, _binding(est)
        hi, hi_model, f_hi, hi_binding = lo, lo_model, max(_load_log(est), 1e-9), _binding(est)
        lo, lo_model, f_lo = own, own_model, min(_load_log(own_est), 0.0)
    else:
        f_lo = min(_load_log(est), 0.0)
        hi_model = candidate(hi)
        est = judge(hi_model)
        if est.fits:
            return hi_model, None, "range"
        f_hi, hi_binding = max(_load_log(est), 1e-9), _binding(est)
    top, f_top, top_model, top_binding = hi, f_hi, hi_model, hi_binding
    for _ in range(MAX_RESTARTS + 1):
        side = 0
        while hi - lo > done:
            width = hi - lo
            x = lo - f_lo * width / (f_hi - f_lo) if f_hi > f_lo else lo + 0.5 * width
            x = snap(min(max(x, lo + margin), hi - margin))
            model = candidate(x)
            if model == lo_model:
                lo = x
                continue
            if model == hi_model:
                hi = x
                continue
            est = judge(model)
            if est.fits:
                lo, lo_model, f_lo = x, model, min(_load_log(est), 0.0)
                if side == -1:
                    f_hi *= 0.5
                side = -1
            else:
                hi, hi_model, hi_binding = x, model, _binding(est)
                f_hi = max(_load_log(est), 1e-9)
                if side == 1:
                    f_lo *= 0.5
                side = 1
        if not grid:
            break  # a depth series: deeper always needs more memory
        found = _fitting_shape_above(hi, hi_model, candidate, judge, grid)
        if found is None:
            break
        # a wider, shallower shape just above fits again: search on from there
        lo, lo_model, f_lo = found
        hi, f_hi, hi_model, hi_binding = top, f_top, top_model, top_binding
    return lo_model, hi_model, hi_binding


MAX_CARD_STEPS = 16  # micro-batches the replay on the card may move the rule's answer by, each way


def _on_the_card(inp: PlanInput, layout: Layout, candidate, grid: float | None, largest: ModelSpec | None,
                 smallest_failing: ModelSpec | None, limited_by: str):
    """The boundary the per-phase rule found, checked with the default allocator's replay on
    the card (memory.estimate_memory with the replay: PyTorch frees its cache and retries
    before it runs out of memory); where the replay disagrees at either side, the search runs
    again judging every candidate that way. Layouts the replay does not cover keep the rule's."""
    def fits(model: ModelSpec | None) -> bool | None:
        return None if model is None else estimate_memory(_with_model(inp, model), layout).fits

    if fits(largest) in (True, None) and fits(smallest_failing) in (False, None):
        return largest, smallest_failing, limited_by
    return _largest_fitting(inp, layout, candidate, grid, replay=True)


MAX_ASKED_STEPS = 8  # grid points the answer may step down to one whose size, asked for, fits


def _as_asked(inp: PlanInput, layout: Layout, candidate, grid: float, largest: ModelSpec | None,
              smallest_failing: ModelSpec | None, limited_by: str):
    """The largest model that fits and whose size, asked for (`--params N`: the family's shape
    nearest N), fits too. The family's shapes are not monotone in memory where its width
    changes, and the shape nearest a size need not be the one the search met there: on 2 H100s
    at ZeRO-2 the search's largest llama3 is 23 x 4096 (6.07B), and asking for 6.07B gives
    31 x 3584 (6.01B), whose deeper activations run the card out of memory in the replay's
    third step. Where that happens the answer steps down the grid to a size that fits both
    ways, and the shape asked for becomes the smallest that does not."""
    model = largest
    for _ in range(MAX_ASKED_STEPS):
        if model is None:
            break
        asked = candidate(math.log(model.params))
        if asked == model:
            return model, smallest_failing, limited_by
        est = estimate_memory(_with_model(inp, asked), layout)
        if est.fits:
            return model, smallest_failing, limited_by
        smallest_failing, limited_by = asked, _binding(est)
        x, model = _snap(math.log(asked.params)), None
        while x > math.log(MIN_PARAMS):  # the next fitting shape below the one asked for
            x -= grid
            below = candidate(x)
            if below.params >= asked.params:
                continue
            est = estimate_memory(_with_model(inp, below), layout)
            if est.fits:
                model = below
                break
            smallest_failing, limited_by = below, _binding(est)
    return model, smallest_failing, limited_by


def _fitting_shape_above(hi: float, hi_model: ModelSpec, candidate, judge, grid: float):
    """A shape up to PROBE_WINDOW above `hi_model` that fits after all, or None.

    Fitting is not monotone in params where the family changes width: a wider, shallower
    model has fewer activations than a narrower, deeper one of nearly the same size. Shapes
    at least as wide and as deep cannot fit and cost no evaluation.
    """
    seen = hi_model
    steps = max(1, round(math.log1p(PROBE_WINDOW) / grid))
    for k in range(1, steps + 1):
        x = hi + k * grid
        model = candidate(x)
        if model == seen:
            continue
        seen = model
        if model.hidden >= hi_model.hidden and model.layers >= hi_model.layers:
            continue  # at least as wide and as deep: at least as much memory
        est = judge(model)
        if est.fits:
            return x, model, min(_load_log(est), 0.0)
    return None


def largest_micro_batch(inp: PlanInput, layout: Layout) -> int:
    """The largest micro-batch that fits the current model (0 when even 1 does not): the
    per-phase rule's answer, moved where the default allocator's replay on the card says
    otherwise (as `_on_the_card` moves the largest model)."""
    best = _largest_micro_batch_by_rule(inp, layout)
    if inp.training.allocator != "default":
        return best

    def fits(micro_batch: int) -> bool:
        training = inp.training.model_copy(update={"micro_batch": micro_batch})
        return estimate_memory(inp.model_copy(update={"training": training}), layout).fits

    if best >= 1 and not fits(best):
        # down from the rule's answer one at a time, then (a replay further off than that: the
        # allocator's flushes cost more than the rule counts) by halves below the last that
        # failed: the answer is always one the replay says fits. Fitting is not monotone in the
        # micro-batch on the card's edge (a segment size rounds either way), so "largest" is
        # the largest found fitting, not every one below it.
        failing, found = best, 0
        for candidate in range(best - 1, max(best - 1 - MAX_CARD_STEPS, 0), -1):
            if fits(candidate):
                found = candidate
                break
            failing = candidate
        if not found:
            low = 0  # fits (or none does); `failing` does not
            while failing - low > 1:
                middle = (low + failing) // 2
                low, failing = (middle, failing) if fits(middle) else (low, middle)
            found = low
        return found
    for _ in range(MAX_CARD_STEPS):
        if best >= MAX_MICRO_BATCH or not fits(best + 1):
            break
        best += 1
    return best


def _largest_micro_batch_by_rule(inp: PlanInput, layout: Layout) -> int:
    """largest_micro_batch by the per-phase rule alone (no replay). Memory grows almost
    linearly with the micro-batch, so two evaluations predict the answer; a gallop from the
    prediction and a bisection make it exact."""
    def fits(micro_batch: int) -> bool:
        training = inp.training.model_copy(update={"micro_batch": micro_batch})
        return estimate_memory(inp.model_copy(update={"training": training}), layout, replay=False).fits

    def used(micro_batch: int) -> tuple[bool, int, int]:
        training = inp.training.model_copy(update={"micro_batch": micro_batch})
        est = estimate_memory(inp.model_copy(update={"training": training}), layout, replay=False)
        return est.fits, est.gpu_needed_bytes, est.gpu_usable_bytes

    fits1, used1, usable = used(1)
    if not fits1:
        return 0
    fits2, used2, _ = used(2)
    if not fits2:
        return 1
    slope = used2 - used1
    guess = MAX_MICRO_BATCH if slope <= 0 else int(1 + (usable - used1) // slope)
    guess = min(MAX_MICRO_BATCH, max(2, guess))
    # bracket [lo fits, hi does not], galloping out from the guess
    if fits(guess):
        lo, step = guess, 1
        hi = guess + step
        while hi <= MAX_MICRO_BATCH and fits(hi):
            lo, step = hi, step * 2
            hi = lo + step
        if hi > MAX_MICRO_BATCH:
            if fits(MAX_MICRO_BATCH):
                return MAX_MICRO_BATCH
            hi = MAX_MICRO_BATCH
    else:
        hi, step = guess, 1
        lo = max(2, guess - step)
        while lo > 2 and not fits(lo):
            hi, step = lo, step * 2
            lo = max(2, hi - step)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def break_even(inp: PlanInput, layout: Layout, presets_dirs: tuple[str, ...] = ()) -> BreakEven:
    """The largest model and micro-batch `layout` carries on `inp`'s hardware (memoized).

    Raises PresetFileError when a model preset file cannot be read."""
    return _break_even(inp, layout, tuple(str(d) for d in presets_dirs))


@functools.lru_cache(maxsize=1024)
def _break_even(inp: PlanInput, layout: Layout, presets_dirs: tuple[str, ...]) -> BreakEven:
    rule = scaling_rule(inp.model, presets_dirs)
    refusal = grouped_gemm_refusal(inp, layout)
    if refusal is not None:  # no size of this model runs there: nothing to search
        return BreakEven(max_params=0, max_micro_batch=0, limited_by=WILL_NOT_RUN, scaling=rule,
                         will_not_run=refusal)
    model = inp.model
    if rule == "family":
        def candidate(log_params: float) -> ModelSpec:
            return _family_model(model.family, math.exp(log_params), presets_dirs)
    else:
        def candidate(log_params: float) -> ModelSpec:
            return scaled_model(model, math.exp(log_params), presets_dirs)
    grid = FAMILY_GRID if rule == "family" else None
    largest, smallest_failing, limited_by = _largest_fitting(inp, layout, candidate, grid)
    if inp.training.allocator == "default":
        largest, smallest_failing, limited_by = _on_the_card(inp, layout, candidate, grid, largest,
                                                             smallest_failing, limited_by)
    if rule == "family":
        largest, smallest_failing, limited_by = _as_asked(inp, layout, candidate, grid, largest,
                                                          smallest_failing, limited_by)
    return BreakEven(
        max_params=largest.params if largest else 0,
        max_micro_batch=largest_micro_batch(inp, layout),
        limited_by=limited_by,
        max_model=largest,
        next_params=smallest_failing.params if smallest_failing else 0,
        next_model=smallest_failing,
        scaling=rule,
    )


def crossovers(inp: PlanInput, layouts: tuple[Layout, ...] | None = None,
               presets_dirs: tuple[str, ...] = ()) -> list[Crossover]:
    """Where each layout stops fitting as the model grows, and which layout is fastest beyond.

    One entry per layout that fits some size of the family and stops within the range, in
    order of size; `takes_over` is the fastest (by predicted step time) of the layouts that
    still fit at the first size `stops_fitting` cannot carry. A layout that will not run the
    model (BreakEven.will_not_run: it carries no size) is neither.
    """
    from zlayout.core.comm import estimate_comm
    from zlayout.core.steptime import estimate_step_time

    chosen = tuple(layouts) if layouts is not None else all_layouts()
    evens = {layout: break_even(inp, layout, presets_dirs) for layout in chosen}
    out = []
    ordered = sorted((be.next_params, layout.key, layout) for layout, be in evens.items()
                     if be.max_params > 0 and be.next_params > 0)
    for next_params, _, layout in ordered:
        bigger = _with_model(inp, evens[layout].next_model)

        def step_s(other: Layout) -> float:
            return estimate_step_time(bigger, other, estimate_comm(bigger, other)).step_time_s

        still = [other for other, be in evens.items()
                 if other != layout and (be.max_params >= next_params or be.limited_by == "range")]
        # fastest first; each checked, since fitting is not monotone in size everywhere, with
        # the allocator's replay as `plan` judges it (the per-phase rule alone named layouts
        # that plan says do not fit)
        takes_over = next((other for other in sorted(still, key=lambda o: (step_s(o), o.key))
                           if estimate_memory(bigger, other).fits), None)
        out.append(Crossover(next_params, layout, takes_over))
    return out

