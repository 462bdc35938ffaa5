"""What a transformers model asks of the allocator in one forward and backward, without DeepSpeed:
on the GPU (the caching allocator's own counters) or on the meta device (zlayout's learner's
ledger, attention priced as `zlayout.learn.trace.fused_attention` prices it). The two side by side
say whether a miss of the plan is the model's code (the card) or DeepSpeed's (the replay).

    python benchmarks/measurements/h200-2026-12-03/probe_blocks.py --device cuda|meta \
        --config CONFIG.json --micro-batch B --seq T [--layers N] --out OUT.jsonl

For each config: the weights' bytes; the peak above the weights during the forward; what the
forward leaves alive (saved tensors, the logits and the loss); the peak above the weights during
the backward. Gradients are dropped as their hook fires (as DeepSpeed takes them into its
buckets). On CUDA also the kernel each attention call runs (`torch._fused_sdp_choice`) and the
passes' times (median of 3 after one warm-up).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))


def build(config: dict, device: str, attention: str | None):
    from zlayout.learn.learner import build_model

    if device == "meta":
        return build_model(config)
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(config)
    model_type = cfg.pop("model_type")
    for key in ("_name_or_path", "transformers_version", "architectures"):
        cfg.pop(key, None)
    hf_config = AutoConfig.for_model(model_type, **cfg)
    _, attention = build_model(config)  # the same rule the learner and verify use
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(hf_config, attn_implementation=attention,
                                                 dtype=torch.bfloat16)
    return model, attention


def sdpa_names() -> dict[int, str]:
    # torch.nn.attention.SDPBackend's values (a pybind11 enum: not iterable in torch 2.11)
    return {-1: "ERROR", 0: "MATH", 1: "FLASH_ATTENTION", 2: "EFFICIENT_ATTENTION", 3: "CUDNN_ATTENTION",
            4: "OVERRIDEABLE"}


def run(args) -> dict:
    config = json.loads(Path(args.config).read_text())
    if args.layers:
        config["num_hidden_layers"] = args.layers
    model, attention = build(config, args.device, None)
    model.train()
    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(lambda q: setattr(q, "grad", None))
    ids = torch.zeros(args.micro_batch, args.seq, dtype=torch.long, device=args.device)
    row = {"config": args.config, "device": args.device, "attention": attention, "micro_batch": args.micro_batch,
           "seq": args.seq, "params": sum(p.numel() for p in model.parameters())}
    if args.device == "meta":
        from zlayout.learn.learner import _patched
        from zlayout.learn.trace import StorageLedger

        ledger = StorageLedger()
        ledger.exclude([*model.parameters(), *model.buffers(), ids])
        with _patched(ledger), ledger:
            out = model(input_ids=ids, labels=ids, use_cache=False)
            fwd_peak, fwd_live = ledger.peak, ledger.current
            loss = out.loss
            del out
            ledger.peak = ledger.current
            loss.backward()
            del loss
        row.update(forward_peak=fwd_peak, after_forward=fwd_live, backward_peak=ledger.peak,
                   sdpa_kernels=dict(ledger.sdpa_kernels))
        return row

    names, choices = sdpa_names(), Counter()
    original = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        try:
            choice = int(torch._fused_sdp_choice(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                                                 is_causal=is_causal, scale=scale, enable_gqa=enable_gqa))
        except (TypeError, RuntimeError) as exc:  # the private call's signature moves between releases
            choice = f"? ({type(exc).__name__})"
        choices[names.get(choice, str(choice))] += 1
        return original(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                        enable_gqa=enable_gqa)

    torch.nn.functional.scaled_dot_product_attention = spy
    torch.cuda.synchronize()
    weights = torch.cuda.memory_allocated()
    fwd_s, bwd_s = [], []
    for i in range(4):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        out = model(input_ids=ids, labels=ids, use_cache=False)
        loss = out.loss
        del out
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        fwd_peak, fwd_live = torch.cuda.max_memory_allocated() - weights, torch.cuda.memory_allocated() - weights
        torch.cuda.reset_peak_memory_stats()
        loss.backward()
        del loss
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        bwd_peak = torch.cuda.max_memory_allocated() - weights
        if i:
            fwd_s.append(t1 - t0)
            bwd_s.append(t2 - t1)
    torch.nn.functional.scaled_dot_product_attention = original
    row.update(weights=weights, forward_peak=fwd_peak, after_forward=fwd_live, backward_peak=bwd_peak,
               sdpa_kernels=dict(choices), forward_s=statistics.median(fwd_s), backward_s=statistics.median(bwd_s),
               torch=torch.__version__, cudnn=torch.backends.cudnn.version(),
               gpu=torch.cuda.get_device_name())
    del model
    torch.cuda.empty_cache()
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", choices=("cuda", "meta"), required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    row = run(args)
    G = 2**30
    print(f"{Path(args.config).stem:28s} {args.device:4s} fwd peak {row['forward_peak'] / G:7.2f} after fwd "
          f"{row['after_forward'] / G:7.2f} bwd peak {row['backward_peak'] / G:7.2f} GiB  {row['sdpa_kernels']}")
    with open(args.out, "a") as f:
        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
