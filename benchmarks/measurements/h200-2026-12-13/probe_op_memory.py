"""Which ATen op makes each large CUDA request in one block's step: a dispatch mode around every op
(forward and autograd's backward) reads the caching allocator's allocated bytes before and after it
and its peak while it ran. An op whose peak passes both is a kernel's own buffer, which the meta
device (`zlayout learn`) cannot see. For batch s's Gemma-2-2B reserve (README): the 72 MiB request
at each float32 RMSNorm's backward.

    python probe_op_memory.py CONFIG.json SEQ MICRO_BATCH [ATTENTION]   # on a GPU; prints JSON lines
"""
import json
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoConfig, AutoModelForCausalLM

MiB = 2**20


class Probe(TorchDispatchMode):
    def __init__(self, phase):
        super().__init__()
        self.phase, self.rows = phase, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        out = func(*args, **(kwargs or {}))
        after, peak = torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()
        outs = [t for t in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(t, torch.Tensor)]
        big = max([t.untyped_storage().nbytes() for t in outs] or [0])
        inner = peak - max(before, after)
        if big >= 16 * MiB or inner >= 16 * MiB:
            self.rows.append({"phase": self.phase[0], "op": str(func), "out_MiB": round(big / MiB, 1),
                              "inner_MiB": round(inner / MiB, 1), "dtypes": [str(t.dtype)[6:] for t in outs],
                              "in": [[list(a.shape), str(a.dtype)[6:]] for a in args if isinstance(a, torch.Tensor)]})
        return out


def main():
    path, seq, mb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    attention = sys.argv[4] if len(sys.argv) > 4 else "eager"
    cfg = json.load(open(path))
    cfg["num_hidden_layers"] = 1
    model_type = cfg.pop("model_type")
    for key in ("architectures", "_name_or_path", "transformers_version"):
        cfg.pop(key, None)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **cfg),
                                             attn_implementation=attention).cuda().bfloat16()
    ids = torch.randint(0, 1000, (mb, seq), device="cuda")
    for step in range(2):
        phase = ["forward"]
        probe = Probe(phase)
        with probe:
            loss = model(input_ids=ids, labels=ids).loss
            phase[0] = "backward"
            loss.backward()
        torch.cuda.synchronize()
        if step == 1:
            for row in probe.rows:
                print(json.dumps(row))
        model.zero_grad(set_to_none=True)


if __name__ == "__main__":
    main()
