"""The math attention's requests on CUDA, in order, beside the learner's meta-device record of the
same call: Falcon-7B's shape (71 query heads, 1 key/value head, head 64, a bool mask), B=2, T=2048.

    python benchmarks/measurements/h200-2026-12-03/probe_math_attention.py --device cuda|meta OUT.json
"""
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
B, H, HK, T, D = 2, 71, 1, 2048, 64


def main() -> None:
    device, out_path = sys.argv[2], sys.argv[3]
    q = torch.randn(B, H, T, D, dtype=torch.bfloat16, device=device, requires_grad=True)
    k = torch.randn(B, HK, T, D, dtype=torch.bfloat16, device=device, requires_grad=True)
    v = torch.randn(B, HK, T, D, dtype=torch.bfloat16, device=device, requires_grad=True)
    mask = torch.ones(B, 1, T, T, dtype=torch.bool, device=device).tril()
    grad = torch.randn(B, H, T, D, dtype=torch.bfloat16, device=device)
    row = {"device": device}
    if device == "meta":
        from zlayout.learn.learner import _patched
        from zlayout.learn.trace import StorageLedger

        ledger = StorageLedger()
        ledger.exclude([q, k, v, mask, grad])
        f = ledger.open_window("forward", 0)
        with _patched(ledger), ledger:
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            ledger.close_window(f)
            b = ledger.open_window("backward", 0)
            out.backward(grad)
            del out
        ledger.close_window(b)
        row.update(forward=f.events, backward=b.events)
    else:
        torch.cuda.synchronize()
        torch.cuda.memory._record_memory_history(max_entries=100000)
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        torch.cuda.synchronize()
        row["forward_peak"] = torch.cuda.max_memory_allocated() - base
        row["after_forward"] = torch.cuda.memory_allocated() - base
        torch.cuda.reset_peak_memory_stats()
        out.backward(grad)
        del out
        torch.cuda.synchronize()
        row["backward_peak"] = torch.cuda.max_memory_allocated() - base
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        events = []
        for e in snap["device_traces"][0]:
            if e["action"] in ("alloc", "free_requested"):
                frames = [f"{fr['name']}" for fr in e.get("frames", [])[:12] if "aten" in fr.get("filename", "")
                          or "autograd" in fr.get("filename", "")][:4]
                events.append([e["size"] if e["action"] == "alloc" else -e["size"], frames])
        row["events"] = events
        row["choice"] = int(torch._fused_sdp_choice(q, k, v, attn_mask=mask))
    Path(out_path).write_text(json.dumps(row))
    for key in ("forward_peak", "after_forward", "backward_peak"):
        if key in row:
            print(key, round(row[key] / 2**30, 3), "GiB")


if __name__ == "__main__":
    main()
