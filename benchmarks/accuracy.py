"""Predicted vs measured peak GPU memory on every measured layout, against DeepSpeed's estimator.

    python benchmarks/accuracy.py            # table + mean/max error
    python benchmarks/accuracy.py --phases   # also forward/backward/step phase peaks where measured

Which rows informed the model: h200-2026-11-29.jsonl (the reference rows) and h200-measure-a.jsonl were read while
building it; h200-measure-b.jsonl was measured afterwards and checked as a hold-out (one row
of it, ZeRO-2 + CPU offload of an 8B model, then led to the "offload cast" phase).

DeepSpeed's `estimate_zero2_model_states_mem_needs` / `estimate_zero3_...` (model states only)
is the anchor users have today; it needs deepspeed (and torch) importable, else its column is
left out. Stage 0 has no DeepSpeed estimator; the column shows the ZeRO paper's 16 bytes/param.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from measurements import MeasuredLayout, load_measured  # noqa: E402

from zlayout.core.memory import estimate_memory  # noqa: E402
from zlayout.core.tensors import parameter_tensor_sizes  # noqa: E402
from zlayout.spec import GiB  # noqa: E402


def deepspeed_estimate(m: MeasuredLayout) -> float | None:
    try:
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
    except Exception:
        return None
    p, n, lay = m.inp.model.params, m.inp.hardware.world, m.layout
    if lay.stage == 0:
        return 16.0 * p
    if lay.stage in (1, 2):
        _, gpu = estimate_zero2_model_states_mem_needs(p, n, 1, cpu_offload=lay.offload_optimizer != "gpu")
        return float(gpu)
    largest = max(parameter_tensor_sizes(m.inp.model, m.inp.training.impl))
    _, gpu, *_ = estimate_zero3_model_states_mem_needs(p, largest, n, 1, cpu_offload=lay.offload_optimizer != "gpu",
                                                       cpu_offload_params=lay.offload_param != "gpu")
    return float(gpu)


def pct(predicted: float, measured: float) -> float:
    return 100.0 * (predicted - measured) / measured


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phases", action="store_true")
    args = ap.parse_args()
    rows = load_measured()
    if not rows:
        print("no measurements found")
        return 1
    ours, theirs, host_err, reserved_err, used_err = [], [], [], [], []
    by_source: dict[str, list[float]] = {}
    print(f"{'layout':58} {'meas GiB':>9} {'zlayout':>8} {'err%':>6} {'DS est':>7} {'err%':>6}"
          f" {'host meas':>9} {'host pred':>9}")
    for m in rows:
        est = estimate_memory(m.inp, m.layout)
        measured = m.peak_allocated_bytes
        err = pct(est.gpu_peak_allocated_bytes, measured)
        ours.append(abs(err))
        by_source.setdefault(m.source, []).append(abs(err))
        ds = deepspeed_estimate(m)
        ds_text = ds_err_text = "-"
        if ds is not None:
            ds_err = pct(ds, measured)
            theirs.append(abs(ds_err))
            ds_text, ds_err_text = f"{ds / GiB:7.2f}", f"{ds_err:+6.1f}"
        host_meas = m.host_maxrss_bytes
        host_text = "-"
        if host_meas is not None and m.layout.offload_optimizer != "gpu":
            host_rank = est.host_peak_bytes / m.inp.hardware.gpus_per_node
            host_err.append(abs(pct(host_rank, host_meas)))
        if host_meas is not None:
            host_text = f"{host_meas / GiB:9.2f} {est.host_peak_bytes / m.inp.hardware.gpus_per_node / GiB:9.2f}"
        if m.row.get("reserved_gib"):
            reserved_err.append(abs(pct(est.gpu_peak_reserved_bytes, m.row["reserved_gib"] * GiB)))
        if m.row.get("device_used_gib"):
            used_err.append(abs(pct(est.gpu_device_used_bytes, m.row["device_used_gib"] * GiB)))
        print(f"{m.label[:58]:58} {measured / GiB:9.2f} {est.gpu_peak_allocated_bytes / GiB:8.2f} {err:+6.1f}"
              f" {ds_text:>7} {ds_err_text:>6} {host_text}   [{est.peak_phase}]")
        if args.phases and "fwd_peak_gib" in m.row:
            r = m.row
            print(f"{'':6}measured after_init {r['after_init_gib']:.2f} fwd {max(r['fwd_peak_gib']):.2f} "
                  f"bwd {max(r['bwd_peak_gib']):.2f} step {max(r['step_peak_gib']):.2f} "
                  f"| predicted after_init {est.after_init_bytes / GiB:.2f}")
    print()
    print(f"layouts: {len(rows)}")
    print(f"zlayout peak allocated: mean |err| {sum(ours) / len(ours):.1f}%, max {max(ours):.1f}%")
    for source, errors in by_source.items():
        print(f"  {source:32} {len(errors):3} layouts: mean |err| {sum(errors) / len(errors):.1f}%, "
              f"max {max(errors):.1f}%")
    if theirs:
        print(f"DeepSpeed estimator:    mean |err| {sum(theirs) / len(theirs):.1f}%, max {max(theirs):.1f}%")
    if reserved_err:
        print(f"zlayout peak reserved:  mean |err| {sum(reserved_err) / len(reserved_err):.1f}%, "
              f"max {max(reserved_err):.1f}%")
    if used_err:
        print(f"zlayout device used:    mean |err| {sum(used_err) / len(used_err):.1f}%, "
              f"max {max(used_err):.1f}%")
    if host_err:
        print(f"zlayout host (offload layouts, per rank vs rank 0 maxrss): mean |err| "
              f"{sum(host_err) / len(host_err):.1f}%, max {max(host_err):.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
