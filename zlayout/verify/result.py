"""Measured against predicted: the verification result and its verdict (no torch here).

The workers leave one report per rank (`<out>.rank<r>.json`); this module folds them into
the figures the planner predicts, computes the error of each in percent and decides:

- `validated`: the run completed and the measured peak allocated GPU memory is within
  `TOLERANCE_FRACTION` of the prediction (the memory model's stated tolerance);
- `mismatch`: the run completed but the peak is further off than that (the plan is wrong);
- `does-not-fit`: a rank ran out of GPU memory (a result, not a crash);
- `failed`: anything else, with its cause (the rank's error and the last lines of output);
- `cancelled`: stopped by the user;
- `cpu-ok`: CPU mode ran end to end; no GPU memory to compare, so nothing is validated.

A run that did not complete (failed, does-not-fit, cancelled) keeps what it measured, marked
`measured_partial`, and gets no error percentages: a peak cut short by a crash is not an
error of the plan. An out-of-memory names the least the run needed, read from PyTorch's
message (allocated when it failed + the request that failed), against the prediction.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

from zlayout.core.plan import plan_layout
from zlayout.core.steptime import host_bound_share, offload_bound_share, steady_step_s, steady_steps
from zlayout.spec import GiB, Layout, PlanInput, offload_flag

TOLERANCE_FRACTION = 0.10
DRILL_LOSS_TOLERANCE = 1e-3  # relative; bitwise equality is reported separately as loss_exact

STATUSES = ("validated", "mismatch", "does-not-fit", "failed", "cancelled", "cpu-ok")
COMPLETE_STATUSES = ("validated", "mismatch", "cpu-ok")

# PyTorch's caching allocator formats sizes as "N bytes", "N.NN KiB|MiB|GiB" (format_size in
# c10/cuda/CUDACachingAllocator.cpp); these two phrases are in every CUDA OOM message.
_SIZE = r"([0-9.]+) (bytes|KiB|MiB|GiB|TiB)"
_TRIED = re.compile(r"Tried to allocate " + _SIZE)
_ALLOCATED = re.compile(r"Of the allocated memory " + _SIZE + r" is allocated by PyTorch")
_UNIT_BYTES = {"bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def oom_need_bytes(message: str) -> tuple[int, int] | None:
    """(allocated when it failed, the request that failed) from PyTorch's OOM message."""
    tried, allocated = _TRIED.search(message), _ALLOCATED.search(message)
    if not tried or not allocated:
        return None
    return (int(float(allocated.group(1)) * _UNIT_BYTES[allocated.group(2)]),
            int(float(tried.group(1)) * _UNIT_BYTES[tried.group(2)]))


def predicted_figures(inp: PlanInput, layout: Layout) -> dict[str, Any]:
    """What the planner says this layout will measure (per GPU, per node for the host)."""
    lp = plan_layout(inp, layout, with_breakeven=False)
    mem, time = lp.memory, lp.time
    return {
        "params": inp.model.params,
        "gpu_peak_allocated_bytes": mem.gpu_peak_allocated_bytes,
        "gpu_peak_reserved_bytes": mem.gpu_peak_reserved_bytes,
        "gpu_device_used_bytes": mem.gpu_device_used_bytes,
        "host_peak_bytes": mem.host_peak_bytes,
        "nvme_bytes": mem.nvme_bytes,
        "fits": mem.fits,
        "peak_phase": mem.peak_phase,
        "step_time_s": time.step_time_s,
        "host_overhead_s": time.host_overhead_s,  # the host's side the kernels do not hide
        "offload_s": time.offload_s,  # CPU optimizer, PCIe copies not hidden, NVMe
        "tokens_per_s": time.tokens_per_s,
        "tflops_per_gpu": _tflops_per_gpu(inp, time.step_time_s),
    }


def _tflops_per_gpu(inp: PlanInput, step_time_s: float | None) -> float | None:
    """Achieved model TFLOP/s per GPU, 6 * params * tokens per GPU / step time (as MFU counts)."""
    if not step_time_s:
        return None
    t = inp.training
    tokens_per_gpu = t.seq * t.micro_batch * t.grad_accum
    return 6 * inp.model.params * tokens_per_gpu / step_time_s / 1e12


def _max(values: Iterable[Any]) -> Any:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def measured_figures(inp: PlanInput, reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Fold per-rank reports into per-GPU figures (the worst rank) and per-node host memory."""
    ok = [r for r in reports if r.get("steps_run")]
    world = len(reports)
    per_step_peak: list[int | None] = []
    per_step_s: list[float] = []
    per_phase_s: dict[str, list[float]] = {"forward": [], "backward": [], "optimizer": []}
    if ok:
        n_steps = min(len(r["step_s"]) for r in ok)
        for i in range(n_steps):
            per_step_peak.append(_max(r["peak_allocated_bytes"][i] for r in ok))
            per_step_s.append(max(r["step_s"][i] for r in ok))
        for name, values in per_phase_s.items():
            if all(len(r.get(f"{name}_s") or []) >= n_steps for r in ok):
                values.extend(max(r[f"{name}_s"][i] for r in ok) for i in range(n_steps))
    step_time_s = steady_step_s(per_step_s)  # what the plan predicts: no warm-up steps
    host_by_node: dict[str, int] = {}
    for r in reports:
        if r.get("host_maxrss_bytes") is not None:
            node = r.get("hostname", "?")
            host_by_node[node] = host_by_node.get(node, 0) + r["host_maxrss_bytes"]
    t = inp.training
    rank0 = next((r for r in reports if r.get("rank") == 0), reports[0] if reports else {})
    return {
        "world": world,
        "params": rank0.get("params"),
        "after_init_allocated_bytes": _max(r.get("after_init_allocated_bytes") for r in reports),
        "gpu_peak_allocated_bytes": _max(per_step_peak) if per_step_peak else
        _max(r.get("max_allocated_bytes_at_failure") for r in reports),
        "gpu_peak_allocated_bytes_per_step": per_step_peak,
        "gpu_peak_reserved_bytes": _max(r.get("max_reserved_bytes") for r in reports),
        "gpu_device_used_bytes": _max(r.get("device_used_bytes") for r in reports),
        "host_peak_bytes": max(host_by_node.values()) if host_by_node else None,
        "host_maxrss_bytes_per_rank": [r.get("host_maxrss_bytes") for r in reports],
        "step_time_s": step_time_s,
        "step_times_s": per_step_s,
        # the steady steps' fastest and slowest: how far the run's own steps scatter around its
        # step time (ZeRO-3 on one GPU, host-bound: up to 2x step to step)
        "step_time_range_s": ([min(steady_steps(per_step_s)), max(steady_steps(per_step_s))]
                              if len(per_step_s) >= 4 else None),
        # Per step, the slowest rank's time in each phase (summed over micro-steps).
        "forward_s": steady_step_s(per_phase_s["forward"]),
        "backward_s": steady_step_s(per_phase_s["backward"]),
        "optimizer_s": steady_step_s(per_phase_s["optimizer"]),
        "forward_times_s": per_phase_s["forward"],
        "backward_times_s": per_phase_s["backward"],
        "optimizer_times_s": per_phase_s["optimizer"],
        "reserved_bytes_all_peak": _max(r.get("reserved_bytes_all_peak") for r in reports),
        "alloc_retries": _max(r.get("alloc_retries") for r in reports),
        "num_ooms": _max(r.get("num_ooms") for r in reports),
        "train_s": _max(r.get("train_s") for r in reports),
        "tokens_per_s": (t.seq * t.micro_batch * t.grad_accum * world / step_time_s
                         if step_time_s else None),
        "tflops_per_gpu": _tflops_per_gpu(inp, step_time_s),
        "init_s": _max(r.get("init_s") for r in reports),
        "losses": rank0.get("losses", []),
        "steps_run": rank0.get("steps_run", []),
    }


ERROR_FIGURES = ("gpu_peak_allocated_bytes", "gpu_peak_reserved_bytes", "gpu_device_used_bytes",
                 "host_peak_bytes", "step_time_s", "tokens_per_s", "tflops_per_gpu")


def errors_pct(measured: dict[str, Any], predicted: dict[str, Any]) -> dict[str, float | None]:
    """(predicted - measured) / measured in percent: positive means the plan over-estimates."""
    errors: dict[str, float | None] = {}
    for key in ERROR_FIGURES:
        m, p = measured.get(key), predicted.get(key)
        errors[key] = round(100.0 * (p - m) / m, 2) if m and p is not None else None
    return errors


# Steady steps that scatter more than this around their median make a single step-time error
# figure unreliable; the line below says so and how many steps would steady it.
UNEVEN_STEPS_FRACTION = 0.2
STEADY_STEPS_WANTED = 8
CALIBRATE_HINT_FRACTION = 0.15  # an offload-bound step this far off: the host's rate, not the run's noise


def step_time_spread_line(result: dict[str, Any]) -> str | None:
    """How the run's own steady steps scattered, and whether the predicted step time lies among
    them: an error against the median alone reads as the plan's when the steps themselves vary.
    None for a CPU run (a GPU prediction against CPU steps) and a partial one."""
    measured, predicted = result.get("measured") or {}, result.get("predicted") or {}
    if result.get("mode") == "cpu" or result.get("measured_partial") or not isinstance(measured, dict) \
            or not isinstance(predicted, dict):
        return None
    span, median, want = measured.get("step_time_range_s"), measured.get("step_time_s"), predicted.get("step_time_s")
    if not (isinstance(span, list) and len(span) == 2 and median and isinstance(want, (int, float))):
        return None
    lo, hi = float(span[0]), float(span[1])
    n = max(0, len(measured.get("step_times_s") or []) - 2)
    where = "inside" if lo <= want <= hi else "outside"
    line = (f"steady steps ({n}): {lo:.3f}-{hi:.3f} s, {(lo - median) / median:+.0%}/{(hi - median) / median:+.0%} "
            f"around the median; the prediction lies {where} that range")
    if (hi - lo) / median > UNEVEN_STEPS_FRACTION and n < STEADY_STEPS_WANTED:
        line += f" (steps this uneven need more of them: --steps {STEADY_STEPS_WANTED + 2})"
    host = predicted.get("host_overhead_s")
    share = host_bound_share(host, want) if isinstance(host, (int, float)) else None
    if share is not None:
        line += (f"; host-bound (the host's Python sets {share:.0%} of the predicted step): such "
                 "steps vary up to 1.8x from one process to the next on one host, so one run's median "
                 "is not the layout's: run it again before reading the error as the plan's")
    offload = predicted.get("offload_s")
    share = offload_bound_share(offload, want) if isinstance(offload, (int, float)) else None
    if share is not None:
        line += (f"; offload-bound (the CPU optimizer and host copies set {share:.0%} of the predicted "
                 "step): such steps varied 27% from one process to the next on one host, so run it "
                 "again before reading the error as the plan's")
        if abs(want - median) / median > CALIBRATE_HINT_FRACTION:
            # the CPU optimizer's rate is the host's (its memory and cores), fitted on the H200
            # nodes' hosts: 14-28% pessimistic on an H100 node's (h200-2026-12-29/-30)
            line += ("; where runs again agree, `zlayout calibrate` on these results fits this host's CPU "
                     "optimizer rate (the shipped one is the H200 nodes' hosts')")
    return line


def restart_drill_result(first: list[dict[str, Any]], resumed: list[dict[str, Any]],
                         save_at_step: int, resume_wall_s: float | None) -> dict[str, Any]:
    """Did the resumed run continue at the saved step with the losses of the uninterrupted one?"""
    by_rank = {r["rank"]: r for r in first}
    step_after = _max(r.get("step_resumed") for r in resumed)
    steps_ok = bool(resumed) and all(r.get("step_resumed") == save_at_step for r in resumed)
    compared, exact, worst_rel = 0, True, 0.0
    loss_expected = loss_resumed = None
    for r in resumed:
        original = by_rank.get(r["rank"], {})
        expected = dict(zip(original.get("steps_run", []), original.get("losses", [])))
        for step, loss in zip(r.get("steps_run", []), r.get("losses", [])):
            if step not in expected:
                continue
            if r["rank"] == 0 and loss_expected is None:
                loss_expected, loss_resumed = expected[step], loss
            compared += 1
            exact &= loss == expected[step]
            worst_rel = max(worst_rel, abs(loss - expected[step]) / max(abs(expected[step]), 1e-12))
    losses_ok = compared > 0 and worst_rel <= DRILL_LOSS_TOLERANCE
    return {
        "resumed_ok": steps_ok and losses_ok,
        "resume_s": _max(r.get("resume_s") for r in resumed),
        "restart_wall_s": resume_wall_s,
        "save_s": _max(r.get("save_s") for r in first),
        "step_before": save_at_step,
        "step_after": step_after,
        "loss_expected": loss_expected,
        "loss_resumed": loss_resumed,
        "loss_exact": exact and compared > 0,
        "loss_max_rel_diff": worst_rel if compared else None,
        "losses_compared": compared,
    }


def oom_cause(report: dict[str, Any], predicted: dict[str, Any]) -> str:
    """The least this rank needed (A + B GiB) against the predicted peak, or PyTorch's words."""
    head = f"rank {report['rank']} ran out of memory during {report.get('phase')}"
    need = oom_need_bytes(report.get("error", ""))
    p = predicted.get("gpu_peak_allocated_bytes")
    if need is None:
        return f"{head}: {report.get('error', '')[:300]}"
    allocated, request = need
    text = (f"{head}: needs at least {allocated / GiB:.2f} + {request / GiB:.2f} = "
            f"{(allocated + request) / GiB:.2f} GiB allocated (allocated when it failed + the "
            f"request that failed)")
    if p:
        text += f"; predicted peak allocated {p / GiB:.2f} GiB"
    return text


def verdict(reports: list[dict[str, Any]], measured: dict[str, Any], predicted: dict[str, Any],
            cpu: bool, returncode: int | None, output_tail: list[str], cancelled: bool,
            expected_ranks: int) -> tuple[str, str | None]:
    """The status and, unless validated, its cause in one sentence a user can act on."""
    if cancelled:
        return "cancelled", "stopped by the user; every rank was killed"
    oom = [r for r in reports if r.get("status") == "oom"]
    if oom:
        r = oom[0]
        return "does-not-fit", oom_cause(r, predicted)
    errors = [r for r in reports if r.get("status") == "error"]
    if errors:
        r = errors[0]
        return "failed", f"rank {r['rank']} failed during {r.get('phase')}: {r.get('error', '')[:500]}"
    done = [r for r in reports if r.get("status") == "ok"]
    if len(done) < expected_ranks or returncode not in (0, None):
        tail = "\n".join(output_tail[-20:])
        killed = ""
        if any("Signal 9 (SIGKILL)" in line for line in output_tail):
            # torchrun's words for a rank the kernel killed: nothing else sends SIGKILL to a rank
            # that did not time out (the launcher's own kills are the `cancelled`/timeout paths)
            host, device = predicted.get("host_peak_bytes"), predicted.get("gpu_peak_allocated_bytes")
            if host and cpu and device:  # the ranks' device memory is host memory too (preflight.check_host)
                host += expected_ranks * device
            killed = ("a rank was killed with SIGKILL, most likely by the kernel's out-of-memory killer"
                      + (f" (the plan's host peak: {host / GiB:.1f} GiB on this node"
                         + (", the ranks' device memory included: host memory in CPU mode" if cpu and device else "")
                         + ")" if host else "")
                      + ": check `dmesg` or the job's memory limit; ")
        return "failed", (f"{killed}{len(done)} of {expected_ranks} ranks finished "
                          f"(launcher exit code {returncode}); last output:\n{tail}")
    if cpu:
        return "cpu-ok", "CPU mode: the configuration ran end to end; GPU memory is not measured on CPU"
    m, p = measured.get("gpu_peak_allocated_bytes"), predicted.get("gpu_peak_allocated_bytes")
    if not m or p is None:
        return "failed", "no GPU peak memory was measured"
    error = (p - m) / m
    if abs(error) <= TOLERANCE_FRACTION:
        return "validated", None
    return "mismatch", (f"measured peak allocated {m / GiB:.2f} GiB, predicted {p / GiB:.2f} GiB "
                        f"({100 * error:+.1f}%, tolerance ±{100 * TOLERANCE_FRACTION:.0f}%)")


# What an emulated run (rank 0 of the world on one GPU) measures as the full run would: the GPU
# figures. Its step has no communication and its host holds one rank, not a node's.
EMULATION_UNMEASURED = ("host_peak_bytes", "step_time_s", "step_time_range_s", "tokens_per_s",
                        "tflops_per_gpu", "forward_s", "backward_s", "optimizer_s")


def emulated_figures(inp: PlanInput, measured: dict[str, Any],
                     predicted: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Measured and predicted as an emulated run compares them: per-GPU figures for the plan's
    world; NCCL's communicator and its buffers (outside the allocator) left out of the predicted
    device use, since a fake process group opens none; the figures it cannot measure None."""
    from zlayout.core.memory import NCCL_BUFFER_BYTES, NCCL_ONE_RANK_BYTES

    measured = {**measured, "world": inp.hardware.world, "emulated": True,
                **dict.fromkeys(EMULATION_UNMEASURED)}
    predicted = dict(predicted)
    if predicted.get("gpu_device_used_bytes") is not None:
        predicted["gpu_device_used_bytes"] -= NCCL_BUFFER_BYTES + NCCL_ONE_RANK_BYTES
    for key in ("host_peak_bytes", "step_time_s", "tokens_per_s", "tflops_per_gpu"):
        predicted[key] = None
    return measured, predicted


def build_result(inp: PlanInput, layout: Layout, reports: list[dict[str, Any]], *,
                 cpu: bool, returncode: int | None, output_tail: list[str], cancelled: bool = False,
                 expected_ranks: int, restart_drill: dict[str, Any] | None = None,
                 environment: dict[str, Any] | None = None,
                 extra: dict[str, Any] | None = None, emulated: bool = False) -> dict[str, Any]:
    predicted = predicted_figures(inp, layout)
    measured = measured_figures(inp, reports) if reports else {}
    if emulated and measured:
        measured, predicted = emulated_figures(inp, measured, predicted)
    status, cause = verdict(reports, measured, predicted, cpu, returncode, output_tail,
                            cancelled, expected_ranks)
    if (status in COMPLETE_STATUSES and restart_drill is not None
            and not restart_drill.get("resumed_ok")):
        status, cause = "failed", ("the restart drill did not resume where the run stopped: "
                                   + str(restart_drill.get("cause") or _drill_gap(restart_drill)))
    partial = status not in COMPLETE_STATUSES and bool(measured)
    env = dict(environment or {})
    rank0 = next((r for r in reports if r.get("rank") == 0), {})
    env.setdefault("torch", rank0.get("torch"))
    env.setdefault("deepspeed", rank0.get("deepspeed"))
    env.setdefault("hostname", rank0.get("hostname"))
    for key in ("host_cores", "host_cores_usable", "host_cpu_model", "gpu_name", "gpu_multiprocessors",
                "gpu_max_threads_per_multiprocessor", "allocator",
                "pytorch_cuda_alloc_conf", "host_transparent_hugepages", "host_mem_available_at_start_bytes",
                "host_anon_huge_bytes", "host_minor_faults_training", "host_system_s_training",
                "thp_mem_alloc_enable"):
        env.setdefault(key, rank0.get(key))
    if rank0.get("linear_attention") is not None:  # the kernels transformers resolved (worker.check_linear_attention)
        env.setdefault("linear_attention", rank0["linear_attention"])
    env.setdefault("gpus", [r.get("gpu_name") for r in sorted(reports, key=lambda r: r["rank"])]
                   if not cpu else [])
    result = {
        "status": status,
        "cause": cause,
        "mode": "cpu" if cpu else "gpu",
        "loop": inp.training.loop,  # the training loop the ranks ran (TrainingSpec.loop)
        "tolerance_pct": 100 * TOLERANCE_FRACTION,
        "layout": {**layout.model_dump(mode="json"), "key": layout.key, "label": layout.label},
        "inputs": inp.model_dump(mode="json"),
        "measured": measured,
        "predicted": predicted,
        "measured_partial": partial,
        "errors_pct": errors_pct(measured, predicted) if not cpu and not partial else {},
        "restart_drill": restart_drill,
        "environment": env,
        "ranks": [{k: v for k, v in r.items() if k != "traceback"} for r in reports],
        "output_tail": output_tail[-40:] if status not in ("validated", "cpu-ok") else [],
        "emulated_world": inp.hardware.world if emulated else None,
    }
    if extra:
        result.update(extra)
    return result


def _drill_gap(drill: dict[str, Any]) -> str:
    return (f"saved at step {drill.get('step_before')}, resumed at {drill.get('step_after')}; "
            f"loss {drill.get('loss_expected')} vs {drill.get('loss_resumed')}")


def reference_row(result: dict[str, Any]) -> dict[str, Any]:
    """The result in the field format of benchmarks/measurements/h200-2026-11-29.jsonl (for the benchmark)."""
    inp = PlanInput.model_validate(result["inputs"])
    m, t = inp.model, inp.training
    lay, meas = result["layout"], result["measured"]
    rank0 = next((r for r in result["ranks"] if r.get("rank") == 0), {})

    def gib(x: float | None) -> float | None:
        return round(x / GiB, 4) if x is not None else None

    return {
        "stage": lay["stage"], "offload_opt": offload_flag(lay["offload_optimizer"]),
        "offload_param": offload_flag(lay["offload_param"]), "world": meas.get("world"),
        "layers": m.layers, "hidden": m.hidden, "heads": m.heads, "kv_heads": m.num_kv_heads,
        "ffn": m.ffn_size, "vocab": m.vocab, "mlp": m.mlp, "norm": m.norm, "bias": m.bias,
        "qkv_bias": m.qkv_bias, "tie": int(m.tie_embeddings), "seq": t.seq, "mbs": t.micro_batch,
        "gas": t.grad_accum, "ckpt": int(t.checkpointing == "full"), "params": meas.get("params"),
        "init_s": round(meas["init_s"], 1) if meas.get("init_s") else None,
        "after_init_gib": gib(meas.get("after_init_allocated_bytes")),
        "peak_gib": [gib(x) for x in meas.get("gpu_peak_allocated_bytes_per_step", [])],
        "reserved_gib": gib(meas.get("gpu_peak_reserved_bytes")),
        "device_used_gib": gib(meas.get("gpu_device_used_bytes")),
        "host_maxrss_gib": gib(rank0.get("host_maxrss_bytes")),
        "step_s": [round(x, 3) for x in meas.get("step_times_s", [])],
        "forward_s": [round(x, 4) for x in meas.get("forward_times_s", [])],
        "backward_s": [round(x, 4) for x in meas.get("backward_times_s", [])],
        "optimizer_s": [round(x, 4) for x in meas.get("optimizer_times_s", [])],
        "reserved_peak_stat_gib": gib(meas.get("reserved_bytes_all_peak")),
        "alloc_retries": meas.get("alloc_retries"), "num_ooms": meas.get("num_ooms"),
        "host_cores": result["environment"].get("host_cores"),
        "host_cpu_model": result["environment"].get("host_cpu_model"),
        "gpu_name": result["environment"].get("gpu_name"),
        "gpu_multiprocessors": result["environment"].get("gpu_multiprocessors"),
        "alloc_conf": result["environment"].get("pytorch_cuda_alloc_conf"),
        "host_thp": result["environment"].get("host_transparent_hugepages"),
        "host_anon_huge_gib": gib(result["environment"].get("host_anon_huge_bytes")),
        "loss": [round(x, 3) for x in meas.get("losses", [])],
        "status": result["status"],
        "torch": result["environment"].get("torch"),
        "deepspeed": result["environment"].get("deepspeed"),
        "source": "zlayout verify",
    }
