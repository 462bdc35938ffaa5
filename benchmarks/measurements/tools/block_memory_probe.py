"""One transformers model of a config's first block(s), forward and backward on one GPU in bf16, with the
caching allocator's history: every request of at least --min-mib during backward, with the ops
(C++ frames named aten::/at::native) and Python lines that made it, and the peak above what the
forward left. For a card's block requests that miss a run's peak (h200-2026-12-09 falcon-7b-L8).

    python benchmarks/measurements/tools/block_memory_probe.py CONFIG.json --layers 1 --batch 4 --seq 2048
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--min-mib", type=float, default=256)
    ap.add_argument("--stacks", default="all", choices=("all", "python"))
    a = ap.parse_args()
    import torch
    import transformers

    cfg = transformers.AutoConfig.for_model(**json.loads(Path(a.config).read_text()))
    cfg.num_hidden_layers = a.layers
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16, attn_implementation="sdpa")
    model.train()
    ids = torch.randint(0, cfg.vocab_size, (a.batch, a.seq), device="cuda")
    loss = model(input_ids=ids, labels=ids).loss  # warm-up (cuBLAS workspaces, kernels)
    loss.backward()
    model.zero_grad(set_to_none=True)
    del loss
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks=a.stacks, max_entries=200000)
    loss = model(input_ids=ids, labels=ids).loss
    torch.cuda.synchronize()
    after_forward = torch.cuda.memory_allocated()
    fwd_peak = torch.cuda.max_memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss.backward()
    torch.cuda.synchronize()
    bwd_peak = torch.cuda.max_memory_allocated()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    mib = 2**20
    print(f"PROBE {Path(a.config).stem} L{a.layers} b{a.batch} s{a.seq}: base {base / mib:.1f} MiB, "
          f"forward peak +{(fwd_peak - base) / mib:.1f}, after forward +{(after_forward - base) / mib:.1f}, "
          f"backward peak +{(bwd_peak - base) / mib:.1f} MiB (above after-forward {(bwd_peak - after_forward) / mib:.1f})")
    live = 0
    for trace in snap["device_traces"]:
        for ev in trace:
            if ev["action"] not in ("alloc", "free_requested"):
                continue
            size = ev["size"]
            live += size if ev["action"] == "alloc" else -size
            if size < a.min_mib * mib:
                continue
            frames = ev.get("frames") or []
            ops = [f["name"] for f in frames if "aten::" in f["name"] or "at::native" in f["name"]][:3]
            py = [f"{Path(f['filename']).name}:{f['line']}" for f in frames if f["filename"].endswith(".py")][:2]
            print(f"{ev['action'][:5]:5} {size / mib:9.1f} MiB live {live / mib:9.1f}  {' | '.join(o[:70] for o in ops)}  {' '.join(py)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
