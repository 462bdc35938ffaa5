"""Fit the GPU-resident step model's constants, phase by phase, on every measured row.

    python benchmarks/steptime_fit.py              # fit on every GPU-resident row, print the constants
    python benchmarks/steptime_fit.py --loo        # also leave-one-out: refit without each row, predict it
    python benchmarks/steptime_fit.py --host-floor # the host's constants, from the host-floor rows
    python benchmarks/steptime_fit.py --overlap-p  # the fit at each exponent of the smooth maximum

The model (zlayout/core/steptime.py) prices a pass as a smooth maximum (steptime.pass_s, exponent
OVERLAP_P) of its GPU side

    GEMM FLOPs / peak * (1 + GEMM_HALF_WIDTH / hidden) / GEMM_EFFICIENCY
    + attention forward-equivalent FLOPs / (peak * ATTENTION_EFFICIENCY)
    + elementwise bytes / (HBM * 0.8)                       (counted, not fitted)
    + kernels * KERNEL_OVERHEAD_S

and its host side, the host floor (ops * HOST_S_PER_KERNEL, an op's further kernels *
HOST_S_PER_EXTRA_KERNEL, a fixed part per forward, stages 1-2's gradient hooks: measured on the
host-floor rows, `--host-floor`, not fitted here) plus
ZeRO-3's fetches * STAGE3_FETCH_OVERHEAD_S + gradient hooks * STAGE3_GRAD_HOOK_S. The smooth
maximum is homogeneous, so a pass is w_gpu * GPU side + w_host * host side with weights that
depend only on the sides' ratio (steptime.pass_weights). The optimizer step: bytes / (HBM *
GPU_OPTIMIZER_HBM_EFFICIENCY) + tensors * STEP_OVERHEAD_PER_TENSOR_S + STEP_BASE_OVERHEAD_S (stage
3: its per-gradient norm kernels at HOST_S_PER_KERNEL); ZeRO-0 (FP16_Optimizer): tensors *
STAGE0_STEP_OVERHEAD_PER_TENSOR_S, no fixed part, fitted on the rows with phases only
(STAGE0_OPT_TERMS). With the weights known each is linear in 1/efficiency (and
half-width/efficiency) and the overheads, so non-negative least squares finds them: one residual
per phase where verify timed forward, backward and optimizer apart (each over the row's measured
step, so a phase counts by its share of the step), one per whole step elsewhere. Each round takes
the weights, and the exposed communication (2-GPU rows), from the previous round's constants and
solves the linear part again. OVERLAP_P (the forward's exponent) and BACKWARD_OVERLAP_P are held
through a fit; `--overlap-p` fits at each forward exponent of a grid and prints the fit's loss
(benchmarks/steptime_overlap.py shows each pass against its two sides, where both were read).
Offloaded rows are not fitted here (their CPU optimizer and PCIe constants have their own measurements), nor the
host-floor rows (the host's constants are theirs); they are reported by
benchmarks/steptime_accuracy.py.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from zlayout.core.calibrate import MeasuredStep  # noqa: E402
from zlayout.core.comm import estimate_comm  # noqa: E402
from zlayout.core.steptime import (HALF_ALIGNED_HEAD_EFFICIENCY, HBM_EFFICIENCY, HOST_S_PER_EXTRA_KERNEL, HOST_S_PER_KERNEL,  # noqa: E402
                                   STAGE3_GATHER_OVERHEAD_S, STAGE3_GRAD_HOOK_S,
                                   GpuStepConstants, attention_dropout_s, estimate_step_time, host_floor_s, host_pass_s,
                                   micro_step_work, optimizer_kernels, optimizer_work, pass_weights,
                                   phase_kernel_s)

PASS_TERMS = 7  # 1/E_gemm, h0/E_gemm, 1/E_unaligned, 1/E_attn, s/kernel, s/fetch, s/gradient hook
OPT_TERMS = 4  # 1/E_opt, s/tensor, s (stages 1-3), s/tensor (stage 0: FP16_Optimizer)


def is_gpu_resident(step: MeasuredStep) -> bool:
    return step.layout.offload_optimizer == "gpu" and step.layout.offload_param == "gpu"


def is_fitted(step: MeasuredStep) -> bool:
    """GPU-resident, and the caching allocator never had to flush and retry: a run at the edge of
    memory (L18 h4096: 136-137 GiB reserved, 5-7 retries) pays cudaFree syncs no step model prices."""
    return is_gpu_resident(step) and not step.alloc_retries


def _predict(step: MeasuredStep, c: GpuStepConstants | None = None):
    inp = step.inp
    return estimate_step_time(inp, step.layout, estimate_comm(inp, step.layout),
                              cpu_threads_per_rank=step.cpu_threads_per_rank, constants=c)


def _design(step: MeasuredStep, c: GpuStepConstants) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per phase (forward, backward, optimizer): the coefficients of theta, and the fixed seconds.

    A pass is w_gpu * its GPU side + w_host * its host side, the weights (`pass_weights`) from the
    constants `c`; the host's side is the host floor (HOST_* constants, from the host-floor rows:
    fixed here) and ZeRO-3's hooks.
    """
    inp, layout = step.inp, step.layout
    hw, accum = inp.hardware, inp.training.grad_accum
    peak = hw.gpu.peak_bf16_flops * (0.5 if inp.training.precision == "fp32" else 1.0)
    hbm = hw.gpu.hbm_gbps * 1e9
    gather = STAGE3_GATHER_OVERHEAD_S if hw.world > 1 else 0.0
    rows, fixed = [], []
    for work, p in zip(micro_step_work(inp, layout), (c.overlap_p, c.backward_overlap_p)):
        x = np.zeros(PASS_TERMS + OPT_TERMS)
        w_gpu, w_host = pass_weights(phase_kernel_s(inp, work, c) + work.kernels * c.kernel_overhead_s,
                                     host_pass_s(inp, work, c), p)
        x[:5] = w_gpu * np.array([work.gemm_flops / peak, work.gemm_flops / peak / inp.model.hidden,
                                  work.unaligned_gemm_flops / peak, work.attention_flops / peak, work.kernels])
        x[5:7] = w_host * np.array([work.stage3_fetches, work.stage3_grad_hooks])
        # the host floor is measured apart (no fitted constant); ZeRO-3's gathers are not fitted either
        fixed.append(accum * (w_gpu * (work.hbm_bytes / (hbm * HBM_EFFICIENCY) + work.fixed_s
                                       + attention_dropout_s(inp, work)
                                       + work.half_aligned_gemm_flops / (peak * HALF_ALIGNED_HEAD_EFFICIENCY))
                              + w_host * (host_floor_s(work) + work.stage3_fetches * gather)))
        rows.append(x * accum)
    opt_bytes, tensors = optimizer_work(inp, layout)
    x = np.zeros(PASS_TERMS + OPT_TERMS)
    if layout.stage == 0 and layout.offload_optimizer == "gpu":
        x[PASS_TERMS:] = [opt_bytes / hbm, 0.0, 0.0, tensors]
    else:
        x[PASS_TERMS:] = [opt_bytes / hbm, tensors, 1.0, 0.0]
    rows.append(x)
    fixed.append(optimizer_kernels(inp, layout) * HOST_S_PER_KERNEL)
    return np.array(rows), np.array(fixed), np.array(step.phases_s) if step.phases_s else None


def constants_from_theta(theta: np.ndarray, base: GpuStepConstants) -> GpuStepConstants:
    """`base` with theta's constants (its overlap_p is not in theta: held)."""
    (inv_gemm, width_over_gemm, inv_unaligned, inv_attn, kernel_s, fetch_s, grad_hook_s,
     inv_opt, tensor_s, base_s, stage0_tensor_s) = theta
    return replace(
        base,
        gemm_efficiency=1 / inv_gemm, gemm_half_width=width_over_gemm / inv_gemm,
        unaligned_head_efficiency=1 / inv_unaligned,
        attention_efficiency=1 / inv_attn, kernel_overhead_s=kernel_s, stage3_fetch_overhead_s=fetch_s,
        stage3_grad_hook_s=grad_hook_s, optimizer_hbm_efficiency=1 / inv_opt,
        step_overhead_per_tensor_s=tensor_s, step_base_overhead_s=base_s,
        stage0_step_overhead_per_tensor_s=stage0_tensor_s)


def theta_from_constants(c: GpuStepConstants) -> np.ndarray:
    return np.array([1 / c.gemm_efficiency, c.gemm_half_width / c.gemm_efficiency,
                     1 / c.unaligned_head_efficiency, 1 / c.attention_efficiency,
                     c.kernel_overhead_s, c.stage3_fetch_overhead_s, c.stage3_grad_hook_s,
                     1 / c.optimizer_hbm_efficiency, c.step_overhead_per_tensor_s, c.step_base_overhead_s,
                     c.stage0_step_overhead_per_tensor_s])


def nnls(a: np.ndarray, b: np.ndarray, iterations: int = 200) -> np.ndarray:
    """Lawson-Hanson non-negative least squares (numpy only)."""
    n = a.shape[1]
    x, passive = np.zeros(n), np.zeros(n, dtype=bool)
    for _ in range(iterations):
        w = a.T @ (b - a @ x)
        if passive.all() or w[~passive].max(initial=-np.inf) <= 1e-12 * np.abs(a.T @ b).max():
            break
        passive[np.argmax(np.where(passive, -np.inf, w))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > 1e-15
    return x


def loss(steps: list[MeasuredStep], c: GpuStepConstants) -> float:
    """What the fit minimises: squared phase (or whole-step) errors, each over its row's measured step."""
    total = 0.0
    for step in steps:
        est = _predict(step, c)
        if step.phases_s is not None:
            predicted = (est.forward_s, est.backward_s, est.optimizer_s)
            total += sum(((p - m) / step.measured_step_s) ** 2 for p, m in zip(predicted, step.phases_s))
        else:
            total += ((est.step_time_s - step.measured_step_s) / step.measured_step_s) ** 2
    return total


# Where the ZeRO-3 hooks' constants start (per module per pass, per gradient hook): a pass's longer
# side depends on them, so the fit starts from each and keeps the best (a start at which every
# pass is kernel-bound would leave the hooks' constants unseen).
HOOK_STARTS_S = ((0.3e-3, 0.05e-3), (0.5e-3, 0.15e-3), (0.7e-3, 0.3e-3))


# ZeRO-0's per-tensor optimizer constant is fitted on the rows that timed the optimizer phase apart; a
# whole-step row holds it at the round's value (what a step leaves after its passes would otherwise
# price the passes' misfit as the optimizer's: fitted on whole steps too it falls to 0.05 ms, which
# the ZeRO-0 rows' own optimizer phases, 0.13-0.19 ms per tensor, contradict).
STAGE0_OPT_TERMS = [PASS_TERMS + 3]

HOOK_TERMS = [5, 6]  # theta's ZeRO-3 hook constants: s/fetch, s/gradient hook
OVERLAP_P_GRID = (2.0, 2.5, 3.0, 3.5, 4.0, 6.0, 8.0, float("inf"))  # `--overlap-p`; inf: the hard maximum


def _solve(steps: list[MeasuredStep], c: GpuStepConstants, rounds: int,
           only: list[int] | None = None) -> tuple[float, GpuStepConstants]:
    """Rounds of non-negative least squares from `c`; `only`: the terms solved, the others held."""
    best = (loss(steps, c), c)
    for _ in range(rounds):
        a_rows, b_rows = [], []
        for step in steps:
            x, fixed, phases = _design(step, c)
            scale = 1 / step.measured_step_s
            if phases is not None:
                for i in range(3):
                    a_rows.append(x[i] * scale)
                    b_rows.append((phases[i] - fixed[i]) * scale)
            else:
                est = _predict(step, c)
                whole = x.sum(axis=0)
                whole[STAGE0_OPT_TERMS] = 0  # held at this round's value (STAGE0_OPT_TERMS)
                linear = whole @ theta_from_constants(c) + fixed.sum()
                other = est.step_time_s - linear  # exposed communication, which the fit holds fixed
                a_rows.append(whole * scale)
                b_rows.append((step.measured_step_s - fixed.sum() - other) * scale)
        a, b = np.array(a_rows), np.array(b_rows)
        previous = theta_from_constants(c)
        if only is None:
            theta = nnls(a, b)
        else:
            held = [i for i in range(a.shape[1]) if i not in only]
            theta = previous.copy()
            theta[only] = nnls(a[:, only], b - a[:, held] @ previous[held])
        unseen = ~np.any(a != 0, axis=0)  # no pass on that side this round: keep the constant
        theta[unseen] = previous[unseen]
        theta = np.maximum(theta, 1e-12)  # an efficiency's inverse must stay finite
        c = constants_from_theta(theta, c)
        best = min(best, (loss(steps, c), c), key=lambda pair: pair[0])
    return best


def fit(steps: list[MeasuredStep], start: GpuStepConstants | None = None, rounds: int = 8,
        overlap_p: float | None = None) -> GpuStepConstants:
    """The constants that bring the GPU-resident `steps` closest to their measurements.

    In two parts: the kernels', launches' and optimizer's constants on the rows without ZeRO-3
    (no hooks: every second of a pass is kernels or launches), then the hooks' constants on the
    ZeRO-3 rows with those held (a ZeRO-3 pass shows its kernels or its hooks, whichever is longer,
    so fitting both there lets one stand in for the other).
    """
    steps = [s for s in steps if is_fitted(s)]
    c = start or GpuStepConstants()
    if overlap_p is not None:  # held through the fit (`--overlap-p` picks it by the fit's loss)
        c = replace(c, overlap_p=overlap_p)
    plain = [s for s in steps if s.layout.stage != 3]
    if plain:
        c = _solve(plain, c, rounds)[1]
    hooked = [s for s in steps if s.layout.stage == 3]
    if not hooked:
        return c
    starts = [c] if start is not None else [
        replace(c, stage3_fetch_overhead_s=fetch_s, stage3_grad_hook_s=grad_s) for fetch_s, grad_s in HOOK_STARTS_S]
    return min((_solve(hooked, s, rounds, only=HOOK_TERMS) for s in starts), key=lambda pair: pair[0])[1]


def host_floor(steps: list[MeasuredStep]) -> dict[str, float]:
    """The host's constants from the host-floor rows (each pass the host's time; the GPU's kernels take
    microseconds): least squares of the ten passes over a fixed forward part, a cost per kernel and
    one per stages 1-2's gradient hook (a fixed backward part comes out below 1 ms, not kept); and
    the ZeRO-0 optimizer's time per tensor the floor implies, its phase less the GPU optimizer's HBM
    passes, over the tensors (not adopted: the fitted rows put it lower, docs/tradeoffs.md)."""
    a, b, opt_a, opt_b = [], [], [], []
    # stages 0-2 only: ZeRO-3's floor rows (call 5) carry its hooks, priced apart and reported
    for step in (s for s in steps if s.layout.stage < 3):
        fwd, bwd = micro_step_work(step.inp, step.layout)
        # per op (an op's further kernels at HOST_S_PER_EXTRA_KERNEL, not fitted: none on rows without a card)
        a += [[1.0, fwd.host_kernels - fwd.host_extra_kernels, fwd.grad_hooks],
              [0.0, bwd.host_kernels - bwd.host_extra_kernels, bwd.grad_hooks]]
        b += [phase_s - work.host_extra_kernels * HOST_S_PER_EXTRA_KERNEL
              for phase_s, work in zip(step.phases_s[:2], (fwd, bwd))]
        if step.layout.stage == 0:
            opt_bytes, tensors = optimizer_work(step.inp, step.layout)
            gpu_s = opt_bytes / (step.inp.hardware.gpu.hbm_gbps * 1e9 * GpuStepConstants().optimizer_hbm_efficiency)
            opt_a.append(tensors)
            opt_b.append(step.phases_s[2] - gpu_s)
    fixed_s, kernel_s, hook_s = np.linalg.lstsq(np.array(a), np.array(b), rcond=None)[0]
    opt_a, opt_b = np.array(opt_a, dtype=float), np.array(opt_b)
    found = {"HOST_FORWARD_FIXED_S": fixed_s, "HOST_S_PER_KERNEL": kernel_s, "HOST_GRAD_HOOK_S": hook_s,
             "ZeRO-0 optimizer per tensor (implied)": float(opt_a @ opt_b / (opt_a @ opt_a))}
    # ZeRO-3's hooks per module each pass implies: the pass less its host floor (and, backward, the
    # gradient hooks at STAGE3_GRAD_HOOK_S), over its module fetches. Reported, not adopted: the
    # step rows hold STAGE3_FETCH_OVERHEAD_S for both passes (docs/tradeoffs.md, "ZeRO-3's hooks")
    for step in (s for s in steps if s.layout.stage == 3):
        fwd, bwd = micro_step_work(step.inp, step.layout)
        impl = step.inp.training.impl
        found[f"ZeRO-3 forward per module ({impl}, implied)"] = (
            (step.phases_s[0] - host_floor_s(fwd)) / fwd.stage3_fetches)
        found[f"ZeRO-3 backward per module ({impl}, implied)"] = (
            (step.phases_s[1] - host_floor_s(bwd) - bwd.stage3_grad_hooks * STAGE3_GRAD_HOOK_S) / bwd.stage3_fetches)
    return found


def load_steps(held_out: bool = False) -> list[MeasuredStep]:
    from measurements import load_rows
    return [r.step for r in load_rows() if r.held_out == held_out and not r.floor]


def relative_errors(steps: list[MeasuredStep], c: GpuStepConstants | None) -> list[float]:
    return [(_predict(s, c).step_time_s - s.measured_step_s) / s.measured_step_s for s in steps]


def leave_one_out(steps: list[MeasuredStep]) -> list[tuple[MeasuredStep, float]]:
    """Each GPU-resident row predicted by constants fitted without it."""
    out = []
    for i, step in enumerate(steps):
        if not is_fitted(step):
            continue
        c = fit(steps[:i] + steps[i + 1:])
        out.append((step, relative_errors([step], c)[0]))
    return out


def describe(c: GpuStepConstants) -> str:
    return "\n".join(f"  {f.name:<28} {getattr(c, f.name):.4g}" for f in fields(c))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loo", action="store_true", help="leave-one-out cross-validation of the fit")
    parser.add_argument("--host-floor", action="store_true",
                        help="the host's constants from the host-floor rows, and each pass's error under them")
    parser.add_argument("--overlap-p", action="store_true",
                        help="the fit at each exponent of the smooth maximum (steptime.pass_s): its loss "
                             "on the in-sample rows")
    args = parser.parse_args()
    if args.host_floor:
        from measurements import load_rows
        steps = [r.step for r in load_rows() if r.floor]
        for name, value in host_floor(steps).items():
            print(f"  {name:<38} {value:.4g}")
        for step in steps:
            est = _predict(step)
            errs = [(p - m) / m for p, m in zip((est.forward_s, est.backward_s, est.optimizer_s), step.phases_s)]
            print(f"  {step.label:<40} {step.inp.training.impl:<8} fwd {errs[0]:+6.1%}  bwd {errs[1]:+6.1%}  "
                  f"opt {errs[2]:+6.1%}  (shipped constants)")
        return 0
    steps = load_steps()
    if args.overlap_p:
        fitted = [s for s in steps if is_fitted(s)]
        for p in OVERLAP_P_GRID:
            c = fit(steps, overlap_p=p)
            errs = np.abs(relative_errors(fitted, c))
            print(f"  p {p:>4}  loss {loss(fitted, c):.4f}  in-sample mean |err| {errs.mean():.1%}  "
                  f"max {errs.max():.1%}  (kernel {c.kernel_overhead_s:.2g} s, "
                  f"GEMM half-width {c.gemm_half_width:.0f})")
        return 0
    c = fit(steps)
    print(f"Fitted on {sum(is_fitted(s) for s in steps)} GPU-resident rows "
          f"({sum(s.phases_s is not None for s in steps if is_fitted(s))} with phases; "
          f"{sum(is_gpu_resident(s) and not is_fitted(s) for s in steps)} left out: allocator retries):")
    print(describe(c))
    errs = [abs(e) for s, e in zip(steps, relative_errors(steps, c)) if is_fitted(s)]
    print(f"  in-sample GPU-resident: mean |err| {np.mean(errs):.1%}  max {np.max(errs):.1%}")
    if args.loo:
        loo = [abs(e) for _, e in leave_one_out(steps)]
        print(f"  leave-one-out GPU-resident: mean |err| {np.mean(loo):.1%}  max {np.max(loo):.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
