"""Ground truth for learned model cards (issue 27): one transformers family, built from its own
config class (transformers' defaults, the published flagship shape, with 2 layers), trained a few
DeepSpeed steps on one GPU with zlayout's reference DeepSpeed config at ZeRO-0, with both training
loops: `trainer` (outputs dropped before backward, as HF Trainer) and `deepspeed` (outputs kept,
as DeepSpeed's examples). Records peak allocated per step, the parameter count, and the caching
allocator's own trace of one trainer step (compacted), so cards learned on CPU can be held
request by request against what the GPU really allocated.

    OUT=/tmp/out torchrun --standalone --nproc_per_node 1 family_truth.py NAME MODEL_TYPE SEQ MB '{"overrides": ...}'
Prints one line `TRUTH {json}`; writes $OUT/NAME.trace.json.gz.
"""
from __future__ import annotations

import gzip
import json
import os
import sys
import time

import deepspeed
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

GiB = 1 << 30


def main() -> None:
    name, model_type, seq, mb, overrides = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), json.loads(sys.argv[5])
    # verify's own correction of the environment (the node's TORCH_CUDA_ARCH_LIST=9.0a breaks
    # DeepSpeed 0.19.8's op loader), as the verify worker applies it
    from zlayout.verify.environment import corrected_env
    env, _ = corrected_env(dict(os.environ))
    os.environ.clear()
    os.environ.update(env)
    torch.cuda.set_device(0)
    deepspeed.init_distributed(dist_backend="nccl")
    cfg = AutoConfig.for_model(model_type, **overrides)
    cls = transformers.MODEL_FOR_CAUSAL_LM_MAPPING[type(cfg)]
    attn = "sdpa" if getattr(cls, "_supports_sdpa", False) else "eager"
    t0 = time.time()
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=torch.bfloat16)
    model.train()
    params = sum(p.numel() for p in model.parameters())
    ds = {"train_micro_batch_size_per_gpu": mb, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
          "bf16": {"enabled": True}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
          "zero_optimization": {"stage": 0}, "steps_per_print": 10**9}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)
    after_init = torch.cuda.memory_allocated()
    vocab = cfg.vocab_size
    ids = torch.randint(0, vocab, (mb, seq), device="cuda")
    row = {"name": name, "model_type": model_type, "attn": attn, "seq": seq, "micro_batch": mb, "params": params,
           "overrides": overrides, "after_init_gib": after_init / GiB, "build_s": round(time.time() - t0, 1),
           "versions": [torch.__version__, deepspeed.__version__, transformers.__version__],
           "gpu": torch.cuda.get_device_name(0), "card_bytes": torch.cuda.get_device_properties(0).total_memory}
    for loop in ("trainer", "deepspeed"):
        peaks = []
        for step in range(3):
            torch.cuda.reset_peak_memory_stats()
            trace = loop == "trainer" and step == 2
            if trace:
                torch.cuda.memory._record_memory_history(max_entries=400_000, stacks="python")
            if loop == "trainer":
                loss = engine(input_ids=ids, labels=ids).loss
                engine.backward(loss)
            else:
                outputs = engine(input_ids=ids, labels=ids)
                engine.backward(outputs.loss)
            engine.step()
            if loop == "deepspeed":
                del outputs
            else:
                del loss
            torch.cuda.synchronize()
            peaks.append(torch.cuda.max_memory_allocated() / GiB)
            if trace:
                snap = torch.cuda.memory._snapshot()
                torch.cuda.memory._record_memory_history(enabled=None)
                rows = []
                for e in snap["device_traces"][0]:
                    fr = e.get("frames") or []
                    where = next((f"{f['filename'].split('/')[-1]}:{f['line']}:{f['name']}" for f in fr
                                  if "torch/" not in f["filename"] or "nn/functional" in f["filename"]), "")
                    rows.append([e["action"], e["addr"], e["size"], e.get("stream", 0), where])
                with gzip.open(os.path.join(os.environ["OUT"], f"{name}.trace.json.gz"), "wt") as fh:
                    json.dump({"row": row, "trace": rows}, fh)
        row[f"peak_gib_{loop}"] = peaks
        row[f"reserved_gib_{loop}"] = torch.cuda.max_memory_reserved() / GiB
    free, total = torch.cuda.mem_get_info()
    row["device_used_gib"] = (total - free) / GiB
    print("TRUTH " + json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
