"""Trace PyTorch's caching allocator through a few DeepSpeed steps of one layout (one GPU).

    OUT=/tmp/out torchrun --nproc_per_node 1 benchmarks/measurements/tools/allocator_trace.py \
        --name z3-param-cpu -- --stage 3 --offload-optimizer cpu --offload-param cpu \
        --layers 8 --hidden 4096 --heads 32 --vocab 32000 --seq 2048 --micro-batch 2 --gpus-per-node 1 --gpu h200

    # rank 0 of a 2-GPU run, on one GPU (torch's fake process group; no torchrun):
    OUT=/tmp/out python benchmarks/measurements/tools/allocator_trace.py --name z3-w2 --emulate-world 2 -- --stage 3 \
        --layers 8 --hidden 4096 --heads 32 --vocab 32000 --seq 2048 --micro-batch 2 --gpus-per-node 2 --gpu h200

The layout is given as `zlayout verify` arguments (after `--`), and is built exactly as the
verify worker builds it: zlayout's DeepSpeed config (`zlayout.profile.ds_config`), the worker's
model (`zlayout.verify.worker_model.builder`), ZeRO-3 under `deepspeed.zero.Init`, the
worker's random batches. Writes $OUT/<name>.json.gz (well under 16 MiB):

* `phases`: after initialize and after each forward / backward / step: allocated, reserved,
  `memory_stats` counters, and every segment (size, allocated bytes, its blocks' sizes with
  their state): which segments exist, what fragments them;
* `trace`: the allocator's own event list (torch.cuda.memory._record_memory_history without
  stacks), compacted to [action, address, size(, stream)] rows with phase markers (`phase_marks`: index
  of the first event of each phase), so `zlayout/core/allocator_sim.py`'s request sequence can
  be compared request by request with what DeepSpeed really asked for;
* the plan's predictions (allocated, reserved, device used) for the same layout.

Needs torch, DeepSpeed (and transformers for --impl hf) and the repository root on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]  # the repository (this is benchmarks/measurements/tools/)
sys.path.insert(0, str(ROOT))

ACTIONS = {"alloc": 0, "free_requested": 1, "free_completed": 2, "segment_alloc": 3, "segment_free": 4,
           "segment_map": 5, "segment_unmap": 6, "oom": 7, "snapshot": 8}
MAX_TRACE_ROWS = 400_000  # ~12 MiB of JSON at most


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--blocks", action="store_true", help="keep every block of every segment per phase")
    ap.add_argument("--emulate-world", type=int, default=0, metavar="N",
                    help="run as rank 0 of N GPUs on torch's fake process group (one process, one GPU; "
                         "the layout's --gpus-per-node must say N): the allocator of an N-GPU run's rank 0")
    ap.add_argument("layout", nargs=argparse.REMAINDER, help="-- then zlayout verify arguments")
    a = ap.parse_args()
    argv = [x for x in a.layout if x != "--"]

    from layout_on_gpu import build_model, parse_layout, start_distributed
    from zlayout.core.memory import estimate_memory
    from zlayout.spec import GiB

    inp, layout, cfg = parse_layout(argv)
    inp = inp.model_copy(update={"headroom_fraction": 0.0})
    est = estimate_memory(inp, layout)

    import deepspeed
    import torch

    from zlayout.verify.worker import batch

    if a.emulate_world > 1 and inp.hardware.world != a.emulate_world:
        ap.error(f"--emulate-world {a.emulate_world} but the layout plans {inp.hardware.world} GPUs")
    start_distributed(a.emulate_world)
    torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python",
                                             max_entries=MAX_TRACE_ROWS)
    m, t = inp.model, inp.training
    phases: list[dict] = []
    marks: list[tuple[str, int]] = []

    def snapshot_phase(name: str) -> None:
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
        n_events = sum(len(tr) for tr in snap.get("device_traces", []))
        marks.append((name, n_events))
        stats = torch.cuda.memory_stats()
        segments = []
        for seg in snap["segments"]:
            row = {"size": seg["total_size"], "allocated": seg["allocated_size"], "pool": seg["segment_type"],
                   "address": seg["address"]}
            if a.blocks or len(seg["blocks"]) <= 64:
                row["blocks"] = [[b["size"], b["state"][:1]] for b in seg["blocks"]]
            else:
                row["n_blocks"] = len(seg["blocks"])
                row["free_blocks"] = sorted((b["size"] for b in seg["blocks"] if b["state"] == "inactive"),
                                            reverse=True)[:32]
            segments.append(row)
        phases.append({
            "phase": name, "allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved(),
            "max_allocated": torch.cuda.max_memory_allocated(), "max_reserved": torch.cuda.max_memory_reserved(),
            "stats": {k: stats.get(k) for k in ("inactive_split_bytes.all.current", "inactive_split_bytes.all.peak",
                                                 "segment.all.current", "num_device_alloc", "num_device_free",
                                                 "num_alloc_retries", "reserved_bytes.small_pool.current",
                                                 "allocation.all.allocated")},
            "segments": sorted(segments, key=lambda s: -s["size"]),
        })

    started = time.time()
    model = build_model(inp, layout, cfg)
    snapshot_phase("built")
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    snapshot_phase("initialize")
    device = torch.device("cuda", torch.cuda.current_device())
    for step in range(a.steps):
        for micro in range(t.grad_accum):  # engine.step() steps the optimizer at the last micro-step
            name = f"step{step + 1}" + (f".m{micro + 1}" if t.grad_accum > 1 else "")
            ids = batch(step, micro, 0, 0, (t.micro_batch, t.seq), m.vocab).to(device)
            outputs = engine(ids)  # --loop deepspeed: the outputs stay bound to the next forward
            loss = getattr(outputs, "loss", outputs)
            snapshot_phase(f"{name}.forward")
            engine.backward(loss)
            snapshot_phase(f"{name}.backward")
            engine.step()
            snapshot_phase(f"{name}.step")
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    # the CUDA stream of each event as a small number in order of first use (0: the first seen,
    # the compute stream): a fourth field only where it is not that one
    streams: dict[int, int] = {}
    trace = [[ACTIONS.get(e["action"], 9), e["addr"], e["size"]]
             + ([n] if (n := streams.setdefault(e.get("stream", 0), len(streams))) else [])
             for tr in snap.get("device_traces", []) for e in tr][:MAX_TRACE_ROWS]
    # where the large requests come from: the first frames outside torch of each alloc >= 16 MiB
    big_allocs = []
    for tr in snap.get("device_traces", []):
        for i, e in enumerate(tr):
            if e["action"] == "alloc" and e["size"] >= 16 * 2**20 and len(big_allocs) < 20000:
                frames = [f"{Path(f['filename']).name}:{f['line']}:{f['name']}" for f in e.get("frames", [])
                          if "/torch/" not in f["filename"]][:4]
                big_allocs.append([i, e["size"], " < ".join(frames)])
    free, total = torch.cuda.mem_get_info()
    out = Path(os.environ.get("OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    result = {
        "name": a.name, "argv": shlex.join(argv), "emulated_world": a.emulate_world or None, "torch": torch.__version__, "deepspeed": deepspeed.__version__,
        "gpu": torch.cuda.get_device_name(), "wall_s": round(time.time() - started, 2),
        "device_used_bytes": total - free, "max_reserved_bytes": torch.cuda.max_memory_reserved(),
        "max_allocated_bytes": torch.cuda.max_memory_allocated(),
        "predicted": {"allocated_gib": est.gpu_peak_allocated_bytes / GiB,
                      "reserved_gib": est.gpu_peak_reserved_bytes / GiB,
                      "device_used_gib": est.gpu_device_used_bytes / GiB},
        "actions": ACTIONS, "phase_marks": marks, "phases": phases, "trace": trace,
        "big_allocs": big_allocs,
    }
    path = out / f"{a.name}.json.gz"  # gzipped: the traces travel with the tree to the device (64 MiB)
    path.write_bytes(gzip.compress(json.dumps(result, separators=(",", ":")).encode(), mtime=0))
    print(f"TRACE {a.name}: {path} {path.stat().st_size / 2**20:.1f} MiB, reserved "
          f"{result['max_reserved_bytes'] / GiB:.2f} GiB (predicted {est.gpu_peak_reserved_bytes / GiB:.2f}), "
          f"{len(trace)} events, {result['wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
