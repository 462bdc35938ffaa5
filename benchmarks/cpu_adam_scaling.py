"""DeepSpeedCPUAdam's step time per parameter at 1, 2, 4, 8, ... threads, and the curve fitted to it.

    python benchmarks/cpu_adam_scaling.py --host h200-16core              # measure, print, append rows
    python benchmarks/cpu_adam_scaling.py --threads 1,2 --params 50e6     # a small machine
    python benchmarks/cpu_adam_scaling.py --fit                           # fit the curve per host

Each thread count runs in its own process (OMP_NUM_THREADS and torch.set_num_threads set
before the first step, as the verify launcher gives each rank its share of the cores): fp32
parameters of `--params` elements in a few tensors, one untimed step (the optimizer states
are created lazily), then `--repeats` timed steps; the median per parameter is the figure.

Rows go to benchmarks/measurements/cpu-adam-scaling.jsonl as JSON lines with the host's
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
import subprocess
import sys
import time
from pathlib import Path

DATA = Path(__file__).resolve().parent / "measurements" / "cpu-adam-scaling.jsonl"
TENSORS = 4  # a few parameter tensors, as DeepSpeed's sub-groups hand CPU Adam several


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def child(threads: int, params: int, repeats: int) -> None:
    import torch

    torch.set_num_threads(threads)
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    size = params // TENSORS
    tensors = [torch.nn.Parameter(torch.randn(size)) for _ in range(TENSORS)]
    for p in tensors:
        p.grad = torch.randn(size) * 1e-3
    optimizer = DeepSpeedCPUAdam(tensors, lr=1e-4, adamw_mode=True)
    optimizer.step()  # creates exp_avg / exp_avg_sq: not part of a steady step
    times_s = []
    for _ in range(repeats):
        started = time.perf_counter()
        optimizer.step()
        times_s.append(time.perf_counter() - started)
    print(json.dumps({"threads": threads, "torch_threads": torch.get_num_threads(),
                      "step_s": times_s, "params": size * TENSORS}))


def measure(args: argparse.Namespace) -> int:
    cores = os.cpu_count() or 1
    threads = ([int(t) for t in args.threads.split(",")] if args.threads
               else sorted({2**i for i in range(int(math.log2(cores)) + 1)} | {cores}))
    params = int(float(args.params))
    import deepspeed
    import torch

    base = {"kind": "direct", "host": args.host, "host_cores": cores, "cpu_model": cpu_model(),
            "torch": torch.__version__, "deepspeed": deepspeed.__version__,
            "date": time.strftime("%Y-%m-%d"), "repeats": args.repeats}
    print(f"{args.host}: {cores} cores, {base['cpu_model']}; {params / 1e6:.0f}M fp32 params, "
          f"median of {args.repeats} steps")
    print(f"{'threads':>7} {'step s':>8} {'ns/param':>9} {'speedup':>8}")
    rows, one_thread = [], None
    for t in threads:
        env = {**os.environ, "OMP_NUM_THREADS": str(t)}
        out = subprocess.run([sys.executable, __file__, "--child", str(t), "--params", str(params),
                              "--repeats", str(args.repeats)], env=env, capture_output=True, text=True)
        if out.returncode != 0:
            print(f"{t:7d} failed: {out.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
            return 1
        result = json.loads(out.stdout.strip().splitlines()[-1])
        median_s = statistics.median(result["step_s"])
        per_param_s = median_s / result["params"]
        one_thread = one_thread or (per_param_s if t == 1 else None)
        speedup = f"{one_thread / per_param_s:8.2f}" if one_thread else f"{'':>8}"
        load = os.getloadavg()[0]  # other work on the cores skews the points with many threads
        busy = f"  (load average {load:.1f} on {cores} cores: not a clean point)" if load > cores - t + 0.5 else ""
        print(f"{t:7d} {median_s:8.3f} {per_param_s * 1e9:9.3f} {speedup}{busy}")
        rows.append({**base, "threads": t, "torch_threads": result["torch_threads"], "load_avg_1min": round(load, 2),
                     "params": result["params"], "s_per_param": per_param_s,
                     "step_s": [round(s, 5) for s in result["step_s"]]})
    if not args.no_save:
        with DATA.open("a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        print(f"appended {len(rows)} rows to {DATA}")
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
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", help="comma-separated thread counts (default 1, 2, 4, ... up to the cores)")
    parser.add_argument("--params", default="100e6", help="fp32 parameters per step (default 100e6)")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per thread count")
    parser.add_argument("--host", default=platform.node() or "this-host", help="host label for the rows")
    parser.add_argument("--no-save", action="store_true", help="print only; do not append rows")
    parser.add_argument("--fit", action="store_true", help="fit the planner's curve on the saved rows")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, int(float(args.params)), args.repeats)
        return 0
    return fit(args) if args.fit else measure(args)


if __name__ == "__main__":
    sys.exit(main())
