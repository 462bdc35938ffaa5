"""Measure DeepSpeed's real memory, phase by phase, for one layout on GPUs (one process per GPU).

The model is the verification worker's (zlayout/verify/worker_model.py), so the planner is
checked against the network the product trains. Run under torchrun on a GPU machine, with the
repository root on PYTHONPATH; rank 0 prints one line `MEASURE {json}` with the fields
of benchmarks/measurements/h200-2026-11-29.jsonl plus per-phase peaks (forward, backward, optimizer step),
so the memory model can be checked term by term, not only at the peak. This is a measurement
script for the accuracy benchmark; the product's verification worker is zlayout/verify/worker.py.

    torchrun --nproc_per_node 2 benchmarks/measurements/tools/measure.py --stage 3 --offload-opt cpu ...
"""
import argparse
import json
import os
import resource
import time

import deepspeed
import torch

from zlayout.spec import ModelSpec
from zlayout.verify.worker_model import build_model

GIB = 2**30


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--stage", type=int, default=0)
    p.add_argument("--offload-opt", default="none")
    p.add_argument("--offload-param", default="none")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=0)
    p.add_argument("--ffn", type=int, default=0)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--mlp", default="gelu")
    p.add_argument("--norm", default="layernorm")
    p.add_argument("--no-bias", action="store_true")
    p.add_argument("--tie", type=int, default=0)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--mbs", type=int, default=2)
    p.add_argument("--gas", type=int, default=1)
    p.add_argument("--ckpt", type=int, default=0)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--tag", default="")
    a = p.parse_args()
    a.kv_heads = a.kv_heads or a.heads
    a.ffn = a.ffn or 4 * a.hidden
    a.bias = not a.no_bias
    spec = ModelSpec(layers=a.layers, hidden=a.hidden, heads=a.heads, kv_heads=a.kv_heads, ffn=a.ffn,
                     vocab=a.vocab, mlp=a.mlp, norm=a.norm, bias=a.bias, tie_embeddings=bool(a.tie))
    deepspeed.init_distributed()
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    zero = {"stage": a.stage, "overlap_comm": True, "contiguous_gradients": True}
    if a.offload_opt != "none":
        zero["offload_optimizer"] = {"device": a.offload_opt, "pin_memory": True}
    if a.offload_param != "none":
        zero["offload_param"] = {"device": a.offload_param, "pin_memory": True}
    cfg = {"train_micro_batch_size_per_gpu": a.mbs, "gradient_accumulation_steps": a.gas,
           "bf16": {"enabled": True}, "zero_optimization": zero,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.0}},
           "gradient_clipping": 1.0, "steps_per_print": 10**9}
    t0 = time.time()
    if a.stage == 3:
        with deepspeed.zero.Init(config_dict_or_path=cfg):
            model = build_model(spec, checkpointing=bool(a.ckpt))
        nparams = sum(getattr(q, "ds_numel", q.numel()) for q in model.parameters())
    else:
        model = build_model(spec, checkpointing=bool(a.ckpt))
        nparams = sum(q.numel() for q in model.parameters())
    before_init = torch.cuda.memory_allocated()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    torch.cuda.synchronize()
    init_s = time.time() - t0
    after_init = torch.cuda.memory_allocated()
    init_peak = torch.cuda.max_memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    overall, peaks, fwd, bwd, opt, after_fwd, after_step, times, losses = 0, [], [], [], [], [], [], [], []
    g = torch.Generator(device="cuda").manual_seed(rank)
    for _ in range(a.steps):
        torch.cuda.synchronize()
        t = time.time()
        for micro in range(a.gas):
            ids = torch.randint(0, a.vocab, (a.mbs, a.seq), device="cuda", generator=g)
            torch.cuda.reset_peak_memory_stats()
            loss = engine(ids)
            fwd.append(torch.cuda.max_memory_allocated())
            after_fwd.append(torch.cuda.memory_allocated())
            torch.cuda.reset_peak_memory_stats()
            engine.backward(loss)
            bwd.append(torch.cuda.max_memory_allocated())
            torch.cuda.reset_peak_memory_stats()
            engine.step()
            opt.append(torch.cuda.max_memory_allocated())
            overall = max(overall, fwd[-1], bwd[-1], opt[-1])
        torch.cuda.synchronize()
        times.append(time.time() - t)
        losses.append(loss.item())
        after_step.append(torch.cuda.memory_allocated())
        peaks.append(overall)
    free, total = torch.cuda.mem_get_info()
    stats = torch.cuda.memory_stats()
    if rank == 0:
        r = lambda x: round(x / GIB, 4)  # noqa: E731
        print("MEASURE " + json.dumps({
            "tag": a.tag, "stage": a.stage, "offload_opt": a.offload_opt, "offload_param": a.offload_param,
            "world": world, "layers": a.layers, "hidden": a.hidden, "heads": a.heads,
            "kv_heads": a.kv_heads, "ffn": a.ffn, "vocab": a.vocab, "mlp": a.mlp, "norm": a.norm,
            "bias": a.bias, "tie": a.tie, "seq": a.seq, "mbs": a.mbs, "gas": a.gas, "ckpt": a.ckpt,
            "params": nparams, "init_s": round(init_s, 1),
            "before_init_gib": r(before_init), "init_peak_gib": r(init_peak),
            "after_init_gib": r(after_init), "peak_gib": [r(x) for x in peaks],
            "fwd_peak_gib": [r(x) for x in fwd], "bwd_peak_gib": [r(x) for x in bwd],
            "step_peak_gib": [r(x) for x in opt], "after_fwd_gib": [r(x) for x in after_fwd],
            "after_step_gib": [r(x) for x in after_step],
            "reserved_gib": r(torch.cuda.max_memory_reserved()),
            "device_used_gib": r(total - free),
            "alloc_retries": stats.get("num_alloc_retries", 0),
            "host_maxrss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3),
            "step_s": [round(x, 3) for x in times], "loss": [round(x, 3) for x in losses],
            "cpu_threads": torch.get_num_threads(), "torch": torch.__version__, "deepspeed": deepspeed.__version__}), flush=True)


if __name__ == "__main__":
    main()
