"""Where one layout's step time goes on the GPU and on the host (one GPU, torch.profiler).

    OUT=/tmp/out torchrun --nproc_per_node 1 benchmarks/measurements/tools/steptime_profile.py \
        --name z3-L16 -- --stage 3 --layers 16 --hidden 2048 --heads 16 --vocab 32768 \
        --seq 2048 --micro-batch 8 --gpus-per-node 1 --gpu h200

The layout is given as `zlayout verify` arguments (after `--`) and built as the verify worker
builds it (zlayout's DeepSpeed config, the worker's model, ZeRO-3 under zero.Init). Two warm-up
steps, then `--steps` profiled steps with forward / backward / step marked. Writes
$OUT/<name>.json (small): per phase the wall time, the time the GPU was busy (union of kernel
and copy intervals), the idle gaps (the host not keeping the GPU fed: Python hooks, launches,
synchronisation), kernel and copy counts, the top kernels and host operators; and the plan's
step-time prediction with its phases. This is what steptime_fit.py cannot see from verify's
phase times alone: whether a phase is bound by the GPU or by the host.

Before the profiled steps, `--timed-steps` steps run without the profiler (whose own per-operator
cost would inflate the host's side) and record per phase: the host's issue time (when the call
returned: everything queued, unless something in it waited on the GPU), the wall time (after the
kernels finished) and the time Python's garbage collector ran. The profiled steps add the host's
waits inside each phase (stream and event synchronisations, blocking copies).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import resource
import shlex
import sys
import time
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[3]  # the repository (this is benchmarks/measurements/tools/)
sys.path.insert(0, str(ROOT))

PHASES = ("forward", "backward", "step")


def busy_time_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def host_counters() -> dict:
    """What the host did, read from /proc: this process's threads' CPU ticks (by name), its
    context switches, the machine's CPU time by kind (steal: a VM's vCPUs waiting for the host)."""
    threads = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            name = (task / "comm").read_text().strip()
        except OSError:
            continue
        threads[f"{name}:{task.name}"] = int(fields[11]) + int(fields[12])  # utime + stime
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    cpu = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"threads": threads, "wall": time.perf_counter(),
            "minflt": usage.ru_minflt, "majflt": usage.ru_majflt, "stime": usage.ru_stime,
            "voluntary": int(status["voluntary_ctxt_switches"]),
            "involuntary": int(status["nonvoluntary_ctxt_switches"]), "cpu": [int(x) for x in cpu]}


def host_usage(before: dict, after: dict) -> dict:
    """CPU seconds per thread (the busiest 8), context switches, and the machine's busy, idle and
    steal shares over the interval."""
    tick = os.sysconf("SC_CLK_TCK")
    per_thread = {k: (v - before["threads"].get(k, 0)) / tick for k, v in after["threads"].items()}
    busiest = sorted(per_thread.items(), key=lambda kv: -kv[1])[:8]
    cpu = [b - a for a, b in zip(before["cpu"], after["cpu"])]
    total = max(1, sum(cpu))
    # /proc/stat: user nice system idle iowait irq softirq steal ...
    return {"wall_s": round(after["wall"] - before["wall"], 3),
            "thread_cpu_s": [[k, round(v, 2)] for k, v in busiest], "threads": len(per_thread),
            "voluntary_switches": after["voluntary"] - before["voluntary"],
            "involuntary_switches": after["involuntary"] - before["involuntary"],
            "machine_busy_share": round(1 - (cpu[3] + cpu[4]) / total, 3),
            "machine_system_share": round(cpu[2] / total, 3),
            # page faults and kernel time: fresh pageable temporaries are zeroed by the kernel
            "minor_faults": after["minflt"] - before["minflt"],
            "major_faults": after["majflt"] - before["majflt"],
            "process_system_s": round(after["stime"] - before["stime"], 2),
            "machine_steal_share": round(cpu[7] / total, 4) if len(cpu) > 7 else None}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    ap.add_argument("--steps", type=int, default=2, help="profiled steps, after two warm-up steps")
    ap.add_argument("--timed-steps", type=int, default=6,
                    help="unprofiled steps after the warm-up: host issue time, wall time, GC time per phase")
    ap.add_argument("--stacks", action="store_true",
                    help="record the Python stacks of the host's waits on the GPU in the profiled steps "
                         "(with_stack: slower profiled steps; the timed steps are unaffected)")
    ap.add_argument("layout", nargs=argparse.REMAINDER, help="-- then zlayout verify arguments")
    a = ap.parse_args()
    argv = [x for x in a.layout if x != "--"]

    from layout_on_gpu import build_model, parse_layout, start_distributed
    from zlayout.core.steptime import estimate_step_time

    inp, layout, cfg = parse_layout(argv)
    predicted = estimate_step_time(inp, layout)

    import deepspeed
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from zlayout.verify.worker import batch

    start_distributed()
    m, t = inp.model, inp.training
    model = build_model(inp, layout, cfg)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    device = torch.device("cuda", torch.cuda.current_device())
    accum = t.grad_accum

    gc_s = [0.0]  # time in Python's cyclic garbage collector (gc.callbacks), summed
    gc_started = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            gc_started[0] = time.perf_counter()
        else:
            gc_s[0] += time.perf_counter() - gc_started[0]

    gc.callbacks.append(on_gc)

    def one_step(step: int, walls: dict[str, float] | None, timed: dict[str, list] | None = None) -> None:
        # timed: per phase, (host issue s, wall s, gc s) of each micro-step: issue is when the call
        # returned (the host had queued everything), wall when its kernels had finished
        for micro in range(accum):
            ids = batch(step, micro, 0, 0, (t.micro_batch, t.seq), m.vocab).to(device)
            for phase, run in (("forward", lambda: engine(ids)), ("backward", None)):
                torch.cuda.synchronize()
                gc0 = gc_s[0]
                start = time.perf_counter()
                with record_function(f"phase:{phase}"):  # the window ends after its kernels do
                    if phase == "forward":  # --loop deepspeed: the outputs stay bound to the next forward
                        outputs = run()
                        loss = getattr(outputs, "loss", outputs)
                    else:
                        engine.backward(loss)
                    issued = time.perf_counter()
                    torch.cuda.synchronize()
                end = time.perf_counter()
                if walls is not None:
                    walls[phase] += end - start
                if timed is not None:
                    timed[phase].append((issued - start, end - start, gc_s[0] - gc0))
            torch.cuda.synchronize()
            gc0 = gc_s[0]
            start = time.perf_counter()
            with record_function("phase:step"):
                engine.step()
                issued = time.perf_counter()
                torch.cuda.synchronize()
            end = time.perf_counter()
            if walls is not None:
                walls["step"] += end - start
            if timed is not None:
                timed["step"].append((issued - start, end - start, gc_s[0] - gc0))

    for step in range(2):
        one_step(step, None)
    # unprofiled steps: the host's issue time against the wall time, without the profiler's own cost
    timed: dict[str, list] = {phase: [] for phase in PHASES}
    before = host_counters()
    for step in range(2, 2 + a.timed_steps):
        one_step(step, None, timed)
    host = host_usage(before, host_counters())
    walls = {phase: 0.0 for phase in PHASES}
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=a.stacks) as prof:
        for step in range(2 + a.timed_steps, 2 + a.timed_steps + a.steps):
            one_step(step, walls)

    events = prof.events()
    windows: dict[str, list[tuple[float, float]]] = {phase: [] for phase in PHASES}
    for ev in events:
        if ev.name.startswith("phase:"):
            windows[ev.name[6:]].append((ev.time_range.start, ev.time_range.end))
    # the phase:* record_functions also show on the GPU timeline as annotations spanning the window:
    # they are not work, leave them out of busy time and kernel counts
    device_events = [ev for ev in events if ev.device_type == torch.autograd.DeviceType.CUDA
                     and not ev.name.startswith("phase:")]

    def phase_of(ev) -> str | None:
        # a kernel belongs to the phase whose host window launched it (its correlated CPU op)
        start = ev.time_range.start
        for phase, spans in windows.items():
            if any(s <= start < e for s, e in spans):
                return phase
        return None

    # --stacks: with_stack records the Python calls as events around the operators; a runtime call
    # (cudaMemcpyAsync, ...) names who made the host wait through its enclosing events
    def caller(ev) -> str:
        frames, parent = [], ev.cpu_parent
        while parent is not None and len(frames) < 6:
            name = parent.name
            if ".py(" in name and "torch/nn/modules/module.py" not in name and "torch/profiler" not in name:
                frames.append(name)
            elif not frames and ".py(" not in name:
                frames.append(name)  # the operator that waited (aten::item, aten::nonzero, ...)
            parent = parent.cpu_parent
        return " <- ".join(frames) or "?"

    summary = {}
    for phase in PHASES:
        evs = [ev for ev in device_events if phase_of(ev) == phase]
        kernels = [ev for ev in evs if "memcpy" not in ev.name.lower() and "memset" not in ev.name.lower()]
        copies = [ev for ev in evs if "memcpy" in ev.name.lower()]
        wall_us = sum(e - s for s, e in windows[phase])
        busy_us = busy_time_us([(ev.time_range.start, ev.time_range.end) for ev in evs])
        top: dict[str, list[float]] = {}
        for ev in kernels:
            entry = top.setdefault(ev.name[:90], [0.0, 0])
            entry[0] += ev.time_range.elapsed_us()
            entry[1] += 1
        syncs = [ev for ev in events if ev.device_type == torch.autograd.DeviceType.CPU
                 and ev.name in ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize",
                                 "cudaMemcpy", "cudaMemcpyAsync", "cudaStreamWaitEvent")
                 and any(s <= ev.time_range.start < e for s, e in windows[phase])]
        sync_calls: dict[str, list[float]] = {}
        sync_stacks: dict[str, list[float]] = {}  # --stacks: who waited, by its innermost Python frames
        for ev in syncs:
            entry = sync_calls.setdefault(ev.name, [0, 0.0])
            entry[0] += 1
            entry[1] += ev.time_range.elapsed_us()
            if a.stacks and ev.name != "cudaStreamWaitEvent":  # a stream wait does not block the host
                entry = sync_stacks.setdefault(f"{ev.name} <- {caller(ev)}", [0, 0.0])
                entry[0] += 1
                entry[1] += ev.time_range.elapsed_us()
        rows = timed[phase]
        summary[phase] = {
            # unprofiled: per step, host issue ms / wall ms / GC ms
            "timed_issue_ms": [round(r[0] * 1e3, 2) for r in rows],
            "timed_wall_ms": [round(r[1] * 1e3, 2) for r in rows],
            "timed_gc_ms": [round(r[2] * 1e3, 2) for r in rows],
            # profiled: the host's waits (the last cudaDeviceSynchronize is the window's own end)
            "sync_calls": {k: [n // a.steps, round(us / 1e3 / a.steps, 3)] for k, (n, us) in sync_calls.items()},
            "sync_stacks": [[k, n // a.steps, round(us / 1e3 / a.steps, 3)] for k, (n, us)
                            in sorted(sync_stacks.items(), key=lambda kv: -kv[1][0])[:12]],
            "wall_ms": round(wall_us / 1e3 / a.steps, 3),
            "wall_sync_ms": round(walls[phase] * 1e3 / a.steps, 3),
            "gpu_busy_ms": round(busy_us / 1e3 / a.steps, 3),
            "kernels": len(kernels) // a.steps, "copies": len(copies) // a.steps,
            "copy_ms": round(sum(ev.time_range.elapsed_us() for ev in copies) / 1e3 / a.steps, 3),
            "top_kernels": [[name, round(us / 1e3 / a.steps, 3), n // a.steps] for name, (us, n)
                            in sorted(top.items(), key=lambda kv: -kv[1][0])[:15]],
        }
    host_ops = sorted((ev for ev in prof.key_averages() if not ev.key.startswith("phase:")),
                      key=lambda ev: -ev.self_cpu_time_total)[:25]
    result = {
        "name": a.name, "argv": shlex.join(argv),
        "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "THP_MEM_ALLOC_ENABLE", "PYTORCH_CUDA_ALLOC_CONF")},
        "torch": torch.__version__, "deepspeed": deepspeed.__version__,
        "gpu": torch.cuda.get_device_name(), "cores": os.cpu_count(), "profiled_steps": a.steps,
        "phases": summary,
        "host_during_timed_steps": host,
        "host_ops_self_ms": [[ev.key[:90], round(ev.self_cpu_time_total / 1e3 / a.steps, 3), ev.count // a.steps]
                             for ev in host_ops],
        "predicted": {k: v for k, v in dataclasses.asdict(predicted).items() if isinstance(v, (int, float))},
    }
    out = Path(os.environ.get("OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{a.name}.json"
    path.write_text(json.dumps(result, indent=1))
    line = "  ".join(f"{p} {s['wall_sync_ms']:.1f} ms (gpu busy {s['gpu_busy_ms']:.1f}, {s['kernels']} kernels; "
                     f"unprofiled issue/wall/gc ms {median(s['timed_issue_ms'])}/{median(s['timed_wall_ms'])}/"
                     f"{max(s['timed_gc_ms'] or [0])})" for p, s in summary.items())
    print(f"PROFILE {a.name}: {line}; predicted step {predicted.step_time_s * 1e3:.1f} ms")
    print(f"HOST {a.name}: {json.dumps(host)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
