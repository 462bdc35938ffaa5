"""Time one transformers MoE block (Mixtral's: router + experts) against a dense SwiGLU MLP of the
same active FLOPs, forward and backward, on one GPU (issue 13: MoE rows' step time).

    python benchmarks/measurements/tools/moe_block_bench.py > moe-block.jsonl

The dense MLP's intermediate width is top_k x the expert's, so both do the same GEMM FLOPs per
token; the ratio of their times is what the experts' grouped GEMMs, the routing (sort, gather,
histogram, scatter) and the launches cost over dense work. The experts run as transformers runs
them by default (`config._experts_implementation`, recorded), bf16. Per shape: the median of
20 timed calls after 5 warm-up calls, GPU time (CUDA events) and wall time (synchronised), and
the kernels one forward and one backward launch (torch.profiler, one extra call).
"""

from __future__ import annotations

import json
import os
import statistics
import time

import torch

SHAPES = [  # hidden, expert ffn, experts, top-k, tokens
    (1024, 2816, 4, 2, 8192),  # held-out batch 3's MoE row (micro-batch 2 x seq 4096)
    (1536, 1536, 8, 2, 8192),  # held-out batch 4's
    (1536, 2048, 8, 2, 8192),  # the t-z2-moe trace's
    (2048, 1024, 64, 8, 8192),  # OLMoE-like: many narrow experts
    (4096, 14336, 8, 2, 4096),  # Mixtral-8x7B's block
]


def timed(fn, iters=20, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    gpu, wall = [], []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t = time.perf_counter()
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        wall.append(time.perf_counter() - t)
        gpu.append(a.elapsed_time(b) / 1e3)
    return statistics.median(gpu), statistics.median(wall)


def kernels(fn):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(e.count for e in prof.key_averages() if e.device_type.name == "CUDA")


def bench(module, x):
    out = {}
    def fwd():
        with torch.no_grad():
            module(x)
    def fwd_bwd():
        y = module(x)
        y = y[0] if isinstance(y, tuple) else y
        y.float().sum().backward()
    f_gpu, f_wall = timed(fwd)
    fb_gpu, fb_wall = timed(fwd_bwd)
    out.update(forward_gpu_s=f_gpu, forward_wall_s=f_wall, backward_gpu_s=fb_gpu - f_gpu,
               backward_wall_s=fb_wall - f_wall, forward_kernels=kernels(fwd),
               fwd_bwd_kernels=kernels(fwd_bwd))
    return out


def main():
    from transformers import AutoModelForCausalLM, LlamaConfig, MixtralConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    dev = torch.device("cuda")
    for h, f, e, k, tokens in SHAPES:
        # built as the verify worker builds a model (from_config), so the experts run the
        # implementation transformers picks for a whole model; then its one block
        cfg = MixtralConfig(hidden_size=h, intermediate_size=f, num_local_experts=e, num_experts_per_tok=k,
                            num_hidden_layers=1, num_attention_heads=h // 128, num_key_value_heads=2,
                            vocab_size=128)
        model = AutoModelForCausalLM.from_config(cfg)
        impl = model.config._experts_implementation
        moe = model.model.layers[0].mlp.to(dev, torch.bfloat16)
        for p in moe.parameters():
            torch.nn.init.normal_(p, std=0.02)
        dense = LlamaMLP(LlamaConfig(hidden_size=h, intermediate_size=k * f)).to(dev, torch.bfloat16)
        x = torch.randn(1, tokens, h, device=dev, dtype=torch.bfloat16, requires_grad=True)
        row = {"hidden": h, "expert_ffn": f, "experts": e, "top_k": k, "tokens": tokens,
               "experts_implementation": impl, "gpu": torch.cuda.get_device_name(),
               "torch": torch.__version__, "cores": os.cpu_count()}
        try:
            row["moe"] = bench(moe, x)
            row["dense"] = bench(dense, x)
            row["active_gemm_flops_fwd"] = 2 * tokens * k * 3 * h * f
        except Exception as err:  # noqa: BLE001 - one shape's failure must not lose the others
            row["error"] = repr(err)[:300]
        print(json.dumps(row), flush=True)
        del moe, dense, x
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
