"""DeepSpeedCPUAdam's step time per parameter at 1, 2, 4, 8, ... threads, and the curve fitted to it.

    python benchmarks/measurements/tools/cpu_adam_scaling.py --host h200-16core              # measure, print, append rows
    python benchmarks/measurements/tools/cpu_adam_scaling.py --threads 1,2 --params 50e6     # a small machine
    python benchmarks/measurements/tools/cpu_adam_scaling.py --fit                           # fit the curve per host

One process measures every thread count (torch and DeepSpeed are imported and the cpu_adam op
loaded once: a process per count spent most of a minute on imports): torch.set_num_threads
sets the OpenMP threads CPU Adam's loops run on, as OMP_NUM_THREADS does for a verify rank.
fp32 parameters of `--params` elements in a few tensors, one untimed step (the optimizer
states are created lazily), then `--repeats` timed steps; the median per parameter is the
figure. Thread counts run 1, all cores, then the powers of two between, so a run cut short by
`--deadline` (default 75 s from the start) still has both ends of the curve; each row is
written the moment it is measured.

Rows go to `--out` (default benchmarks/measurements/cpu-adam-scaling.jsonl; on a lent machine
point it under $OUT and append the file to that one afterwards) as JSON lines with the host's
cores and CPU model. `--fit` fits, per host, the planner's curve: t threads take
(1 + c (t - 1)) / t of one thread's time per parameter, and prints the two constants for
zlayout/core/steptime.py (CPU_OPTIMIZER_S_PER_PARAM_ONE_THREAD, CPU_THREAD_CONTENTION). The
file also holds "step-derived" rows (`steptime_accuracy.py --cpu-points`): the whole CPU
optimizer step (Adam, clipping, the bf16 cast) that measured H200 steps imply; the shipped
constants are fitted on those of the 32-core host.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "cpu-adam-scaling.jsonl"
TENSORS = 4  # a few parameter tensors, as DeepSpeed's sub-groups hand CPU Adam several


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def thread_order(cores: int) -> list[int]:
    """1, all cores, then the powers of two between (largest first)."""
    between = sorted({2**i for i in range(1, int(math.log2(cores)) + 1)} - {1, cores}, reverse=True)
    return [1] + ([cores] if cores > 1 else []) + between


def time_steps(optimizer, threads: int, repeats: int) -> list[float]:
    import torch

    torch.set_num_threads(threads)
    optimizer.step()  # the first at this thread count: OpenMP's pool resizes
    times_s = []
    for _ in range(repeats):
        started = time.perf_counter()
        optimizer.step()
        times_s.append(time.perf_counter() - started)
    return times_s


def measure(args: argparse.Namespace) -> int:
    started = time.monotonic()
    cores = os.cpu_count() or 1
    threads = [int(t) for t in args.threads.split(",")] if args.threads else thread_order(cores)
    params = int(float(args.params))
    import deepspeed
    import torch
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    size = params // TENSORS
    tensors = [torch.nn.Parameter(torch.randn(size)) for _ in range(TENSORS)]
    for p in tensors:
        p.grad = torch.randn(size) * 1e-3
    optimizer = DeepSpeedCPUAdam(tensors, lr=1e-4, adamw_mode=True)  # loads (or builds) the op
    torch.set_num_threads(cores)
    optimizer.step()  # creates exp_avg / exp_avg_sq: not part of a steady step
    print(f"torch, deepspeed and the cpu_adam op ready in {time.monotonic() - started:.1f} s", flush=True)

    base = {"kind": "direct", "host": args.host, "host_cores": cores, "cpu_model": cpu_model(),
            "torch": torch.__version__, "deepspeed": deepspeed.__version__,
            "date": time.strftime("%Y-%m-%d"), "repeats": args.repeats}
    print(f"{args.host}: {cores} cores, {base['cpu_model']}; {params / 1e6:.0f}M fp32 params, "
          f"median of {args.repeats} steps")
    print(f"{'threads':>7} {'step s':>8} {'ns/param':>9} {'speedup':>8}", flush=True)
    out_path = Path(args.out) if args.out else DATA
    rows, one_thread, last_s = [], None, 0.0
    for t in threads:
        # the next count takes about the last one's time scaled by the threads: stop before the deadline
        elapsed = time.monotonic() - started
        if rows and elapsed + last_s * 1.5 > args.deadline:
            print(f"deadline: {args.deadline:.0f} s reached, threads {threads[threads.index(t):]} not measured",
                  flush=True)
            break
        step_started = time.monotonic()
        step_s = time_steps(optimizer, t, args.repeats)
        last_s = time.monotonic() - step_started
        median_s = statistics.median(step_s)
        per_param_s = median_s / (size * TENSORS)
        one_thread = one_thread or (per_param_s if t == 1 else None)
        speedup = f"{one_thread / per_param_s:8.2f}" if one_thread else f"{'':>8}"
        load = os.getloadavg()[0]  # other work on the cores skews the points with many threads
        busy = f"  (load average {load:.1f} on {cores} cores: not a clean point)" if load > cores - t + 0.5 else ""
        print(f"{t:7d} {median_s:8.3f} {per_param_s * 1e9:9.3f} {speedup}{busy}", flush=True)
        row = {**base, "threads": t, "torch_threads": torch.get_num_threads(), "load_avg_1min": round(load, 2),
               "params": size * TENSORS, "s_per_param": per_param_s, "step_s": [round(s, 5) for s in step_s]}
        rows.append(row)
        if not args.no_save:
            with out_path.open("a") as f:
                f.write(json.dumps(row) + "\n")
    if not args.no_save:
        print(f"appended {len(rows)} rows to {out_path} in {time.monotonic() - started:.1f} s")
    return 0


def fit_curve(points: list[tuple[int, float]]) -> tuple[float, float, float]:
    """(one-thread s/param, contention c, worst relative error): least squares on log time."""
    best = None
    for step in range(0, 1001):
        c = step / 1000
        logs = [math.log(s * t / (1 + c * (t - 1))) for t, s in points]
        s1 = math.exp(sum(logs) / len(logs))
        sq = sum((math.log(s1 * (1 + c * (t - 1)) / t) - math.log(s)) ** 2 for t, s in points)
        if best is None or sq < best[0]:
            worst = max(abs(s1 * (1 + c * (t - 1)) / t / s - 1) for t, s in points)
            best = (sq, s1, c, worst)
    return best[1], best[2], best[3]


def fit(args: argparse.Namespace) -> int:
    rows = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    groups: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for r in rows:
        groups.setdefault((r["host"], r["kind"]), []).append((int(r["threads"]), float(r["s_per_param"])))
    for (host, kind), points in sorted(groups.items()):
        thread_counts = sorted({t for t, _ in points})
        if len(thread_counts) < 2:
            print(f"{host} ({kind}): one thread count only, nothing to fit")
            continue
        s1, c, worst = fit_curve(points)
        print(f"{host} ({kind}, {len(points)} rows, threads {thread_counts}): "
              f"CPU_OPTIMIZER_S_PER_PARAM_ONE_THREAD = {s1:.3e}  CPU_THREAD_CONTENTION = {c:.3f}  "
              f"(worst row {worst:.1%}; saturates at {1 / max(c, 1e-9):.1f}x one thread)")
    # the shipped curve against each host's direct rows: Adam alone is part of the whole CPU step
    # (clipping and the bf16 cast too), so compare shapes: each point over the host's one-thread point
    from zlayout.core.steptime import cpu_optimizer_s_per_param
    for (host, kind), points in sorted(groups.items()):
        ones = [s for t, s in points if t == 1]
        if kind != "direct" or not ones:
            continue
        one = statistics.median(ones)
        shape = "  ".join(f"{t}: {one / s:.2f}x (curve {cpu_optimizer_s_per_param(1) / cpu_optimizer_s_per_param(t):.2f}x)"
                          for t, s in sorted(points) if t > 1)
        print(f"{host} direct speedups over one thread vs the shipped curve: {shape}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", help="comma-separated thread counts (default 1, 2, 4, ... up to the cores)")
    parser.add_argument("--params", default="100e6", help="fp32 parameters per step (default 100e6)")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per thread count")
    parser.add_argument("--host", default=platform.node() or "this-host", help="host label for the rows")
    parser.add_argument("--no-save", action="store_true", help="print only; do not append rows")
    parser.add_argument("--out", help=f"append the rows here (default {DATA.relative_to(DATA.parents[2])})")
    parser.add_argument("--deadline", type=float, default=75.0,
                        help="seconds from the start after which no further thread count starts (default 75)")
    parser.add_argument("--fit", action="store_true", help="fit the planner's curve on the saved rows")
    args = parser.parse_args()
    return fit(args) if args.fit else measure(args)


if __name__ == "__main__":
    sys.exit(main())
