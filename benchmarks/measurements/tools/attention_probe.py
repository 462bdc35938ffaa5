"""What scaled_dot_product_attention costs on this GPU at a shape, with and without dropout, causal
or given a mask: the kernel torch picks and its forward and backward times (CUDA events, median of
20 after 5 warm-up calls). And what transformers passes it when GPT-2 trains (mask or is_causal,
dropout_p), by wrapping the function while one GPT-2 block runs forward in train mode.

    python benchmarks/measurements/tools/attention_probe.py [--out FILE.json]
    python benchmarks/measurements/tools/attention_probe.py --sweep [--out FILE.json]

The events time the host's launch too, which is longer than a small kernel (under 0.1 ms: the
first call's GPT-2 shapes). `--sweep` times the kernels themselves (torch.profiler, the CUDA
kernels each call launched, summed) causal, with and without dropout, over sequence lengths 512 to
8,192 at 16,384 tokens a call and head sizes 64, 80, 96, 128 and 256, then the shapes above.

Prints one line per case and writes them as JSON (default $OUT/attention-probe.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
import torch.nn.functional as F

# (batch, heads, sequence, head size): GPT-2-XL at micro-batch 4 (h200-2026-12-31e, -15.7%), GPT-2
# medium at 8, and a head size of 128 at 4,096 tokens (the rows ATTENTION_EFFICIENCY was read on)
SHAPES = ((4, 25, 1024, 64), (8, 16, 1024, 64), (1, 32, 4096, 128), (2, 16, 2048, 64))
BACKENDS = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}


def timed(fn, iters: int = 20, warmup: int = 5) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def case(b: int, h: int, s: int, d: int, dropout: float, masked: bool) -> dict:
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    mask = torch.ones(s, s, device="cuda", dtype=torch.bool).tril() if masked else None
    kwargs = dict(attn_mask=mask, dropout_p=dropout, is_causal=not masked)
    try:
        choice = BACKENDS.get(int(torch._fused_sdp_choice(q, k, v, **kwargs)), "?")
    except Exception as e:  # noqa: BLE001 - a private function: record why it did not answer
        choice = f"? ({type(e).__name__})"
    grad = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)
    fwd_ms = timed(lambda: F.scaled_dot_product_attention(q, k, v, **kwargs))

    def both():
        out = F.scaled_dot_product_attention(q, k, v, **kwargs)
        out.backward(grad)

    both_ms = timed(both)
    flops = 4 * b * h * s * s * d / 2  # the forward's two matmuls on the causal half
    peak = 989e12
    return {"shape": [b, h, s, d], "dropout": dropout, "mask": masked, "backend": choice,
            "forward_ms": round(fwd_ms, 4), "backward_ms": round(both_ms - fwd_ms, 4),
            "forward_of_peak_on_half": round(flops / (fwd_ms * 1e-3) / peak, 3)}


SWEEP = tuple((16384 // s, 2048 // d, s, d) for d in (64, 80, 96, 128) for s in (512, 1024, 2048, 4096, 8192)) \
    + tuple((16384 // s, 8, s, 256) for s in (512, 1024, 2048, 4096, 8192)) + SHAPES


def kernel_ms(fn, iters: int = 10) -> float:
    """The CUDA kernels' own time per call of `fn` (torch.profiler), after 3 warm-up calls."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    kernels = [ev for ev in prof.events() if ev.device_type == torch.autograd.DeviceType.CUDA]
    return sum(ev.time_range.elapsed_us() for ev in kernels) / iters / 1e3


def sweep_case(b: int, h: int, s: int, d: int, dropout: float) -> dict:
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    grad = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)
    kwargs = dict(dropout_p=dropout, is_causal=True)
    try:
        choice = BACKENDS.get(int(torch._fused_sdp_choice(q, k, v, **kwargs)), "?")
    except Exception as e:  # noqa: BLE001 - a private function: record why it did not answer
        choice = f"? ({type(e).__name__})"
    fwd = kernel_ms(lambda: F.scaled_dot_product_attention(q, k, v, **kwargs))
    out = F.scaled_dot_product_attention(q, k, v, **kwargs)
    both = kernel_ms(lambda: torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, **kwargs), (q, k, v), grad))
    flops = 4 * b * h * s * s * d / 2
    del out
    return {"shape": [b, h, s, d], "dropout": dropout, "backend": choice, "forward_kernel_ms": round(fwd, 4),
            "backward_kernel_ms": round(both - fwd, 4), "forward_of_peak_on_half": round(flops / (fwd * 1e-3) / 989e12, 3),
            "backward_of_peak_on_half": round(2.5 * flops / ((both - fwd) * 1e-3) / 989e12, 3)}


def gpt2_calls() -> list[dict]:
    """What transformers' GPT-2 passes to sdpa in one training forward (2 blocks, its config's dropout)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    seen = []
    original = F.scaled_dot_product_attention

    def spy(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, **kw):
        seen.append({"mask": None if attn_mask is None else list(attn_mask.shape), "dropout_p": dropout_p,
                     "is_causal": bool(is_causal), "q": list(query.shape)})
        return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kw)

    F.scaled_dot_product_attention = spy
    try:
        config = GPT2Config(n_layer=2, attn_implementation="sdpa")
        model = GPT2LMHeadModel(config).to("cuda", torch.bfloat16).train()
        ids = torch.randint(0, config.vocab_size, (2, 256), device="cuda")
        model(input_ids=ids, labels=ids).loss.backward()
    finally:
        F.scaled_dot_product_attention = original
    return seen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "attention-probe.json"))
    parser.add_argument("--sweep", action="store_true", help="kernel times over sequence and head size")
    args = parser.parse_args()
    if args.sweep:
        rows = [sweep_case(*shape, dropout) for shape in SWEEP for dropout in (0.0, 0.1)]
        for row in rows:
            print(json.dumps(row), flush=True)
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "sweep": rows}, f, indent=1)
        return 0
    rows = []
    for b, h, s, d in SHAPES:
        for dropout in (0.0, 0.1):
            for masked in (False, True):
                row = case(b, h, s, d, dropout, masked)
                rows.append(row)
                print(json.dumps(row), flush=True)
    calls = gpt2_calls()
    print("gpt2 sdpa calls:", json.dumps(calls[:2]), flush=True)
    with open(args.out, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cases": rows,
                   "gpt2_calls": calls}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
