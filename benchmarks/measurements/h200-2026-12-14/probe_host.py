"""Where the host's time goes in a transformers model's forward and backward on CUDA, plain and under a
DeepSpeed engine (issue 27: granite-3.0-1b-a400m at ZeRO-3 issued its forward in 186-267 ms where the plan's
host side is 120). Prints JSON lines:
- `issue`: per pass, the host's issue time (the Python returns) and the wall (after a synchronize), plain
  model and engine, three steps each;
- `ops`: per ATen op, calls and the host's time inside it (a dispatch mode timing each call: the op's
  dispatch, its allocations and its launches, not the Python between ops), forward and backward, plain model;
- `syncs`: every host synchronization (torch.cuda.set_sync_debug_mode), with the frames that asked for it;
- `profile`: the engine's step under cProfile, the functions with the most time of their own.

    torchrun --nproc_per_node 1 probe_host.py CONFIG.json SEQ MICRO_BATCH STAGE [LAYERS]
"""
import cProfile
import collections
import io
import json
import os
import pstats
import sys
import time
import traceback
import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode

VIEWS = {"view", "_unsafe_view", "reshape", "transpose", "t", "permute", "expand", "unsqueeze", "squeeze",
         "slice", "select", "as_strided", "alias", "detach", "split", "chunk", "unbind", "split_with_sizes",
         "_reshape_alias", "narrow", "unflatten", "flatten", "view_as", "expand_as"}


def out(kind, **row):
    print(json.dumps({"kind": kind, **row}), flush=True)


class OpTimer(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.phase = "forward"
        self.rows = collections.defaultdict(lambda: [0, 0])

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        t0 = time.perf_counter_ns()
        result = func(*args, **(kwargs or {}))
        row = self.rows[(self.phase, func.overloadpacket.__name__)]
        row[0] += 1
        row[1] += time.perf_counter_ns() - t0
        return result


def sync_stacks(fn):
    """Run fn with CUDA's sync debug mode on; the stacks of the syncs, counted."""
    seen = collections.Counter()
    old = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        frames = [f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in traceback.extract_stack()[:-2]]
        seen[" <- ".join(reversed(frames[-6:]))] += 1

    warnings.showwarning = show
    torch.cuda.set_sync_debug_mode(1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = show
            fn()
    finally:
        torch.cuda.set_sync_debug_mode(0)
        warnings.showwarning = old
    return seen.most_common(20)


def timed(label, fwd, bwd, after=None, steps=3):
    for step in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = fwd()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        bwd(loss)
        t3 = time.perf_counter()
        torch.cuda.synchronize()
        t4 = time.perf_counter()
        if after:
            after()
        torch.cuda.synchronize()
        t5 = time.perf_counter()
        out("issue", run=label, step=step, forward_issue_ms=round((t1 - t0) * 1e3, 2),
            forward_wall_ms=round((t2 - t0) * 1e3, 2), backward_issue_ms=round((t3 - t2) * 1e3, 2),
            backward_wall_ms=round((t4 - t2) * 1e3, 2), step_ms=round((t5 - t4) * 1e3, 2))


def main():
    path, seq, mb, stage = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    layers = int(sys.argv[5]) if len(sys.argv) > 5 else None
    import deepspeed
    from zlayout.verify.worker_model import hf_builder

    cfg = json.load(open(path))
    if layers:
        cfg["num_hidden_layers"] = layers
    cfg["use_cache"] = False
    cfg["max_position_embeddings"] = max(int(cfg.get("max_position_embeddings") or 0), seq)
    name = os.path.basename(path)[:-5]
    out("host", config=name, gpu=torch.cuda.get_device_name(0), cores=os.cpu_count(), torch=torch.__version__,
        deepspeed=deepspeed.__version__, seq=seq, micro_batch=mb, stage=stage, layers=cfg.get("num_hidden_layers"))
    torch.cuda.set_device(0)
    deepspeed.init_distributed(dist_backend="nccl")
    build = hf_builder(cfg, False, keep_outputs=False)
    ids = torch.randint(0, 1000, (mb, seq), device="cuda")

    # plain: the model alone, bf16, no DeepSpeed
    if os.environ.get("PROBE_ENGINE_ONLY"):
        return engine_runs(build, ids, mb, stage)
    model = build().cuda().bfloat16().train()
    fwd = lambda: model(ids)  # noqa: E731 (HFCausalLM: returns the loss)
    bwd = lambda loss: loss.backward()  # noqa: E731
    zero = lambda: model.zero_grad(set_to_none=True)  # noqa: E731
    timed("plain-warmup", fwd, bwd, zero, steps=2)
    timed("plain", fwd, bwd, zero)
    timer = OpTimer()
    with timer:
        loss = fwd()
        timer.phase = "backward"
        bwd(loss)
    torch.cuda.synchronize()
    zero()
    for phase in ("forward", "backward"):
        rows = sorted(((k[1], v[0], v[1] / 1e3) for k, v in timer.rows.items() if k[0] == phase), key=lambda r: -r[2])
        out("ops", run="plain", phase=phase, ops=sum(r[1] for r in rows if r[0] not in VIEWS),
            views=sum(r[1] for r in rows if r[0] in VIEWS), host_us=round(sum(r[2] for r in rows)),
            top=[[r[0], r[1], round(r[2])] for r in rows[:40]])
    out("syncs", run="plain", stacks=sync_stacks(lambda: (bwd(fwd()), zero())))
    del model, timer, loss
    torch.cuda.empty_cache()
    engine_runs(build, ids, mb, stage)


def op_rows(timer, run):
    for phase in ("forward", "backward"):
        rows = sorted(((k[1], v[0], v[1] / 1e3) for k, v in timer.rows.items() if k[0] == phase), key=lambda r: -r[2])
        out("ops", run=run, phase=phase, ops=sum(r[1] for r in rows if r[0] not in VIEWS),
            views=sum(r[1] for r in rows if r[0] in VIEWS), host_us=round(sum(r[2] for r in rows)),
            top=[[r[0], r[1], round(r[2])] for r in rows[:40]])


def engine_runs(build, ids, mb, stage):
    import deepspeed

    # torch's AdamW: no op build (the optimizer step is not what this probe looks at)
    ds = {"train_micro_batch_size_per_gpu": mb, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
          "zero_optimization": {"stage": stage}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-5, "torch_adam": True}},
          "steps_per_print": 10**9}
    model = build()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)
    fwd = lambda: engine(ids)  # noqa: E731
    bwd = lambda loss: engine.backward(loss)  # noqa: E731
    timed("engine-warmup", fwd, bwd, engine.step, steps=2)
    timed("engine", fwd, bwd, engine.step)
    timer = OpTimer()
    with timer:
        loss = fwd()
        timer.phase = "backward"
        bwd(loss)
    torch.cuda.synchronize()
    engine.step()
    op_rows(timer, "engine")
    out("syncs", run="engine", stacks=sync_stacks(lambda: (bwd(fwd()), engine.step())))
    for phase in ("forward", "backward"):
        prof = cProfile.Profile()
        torch.cuda.synchronize()
        if phase == "forward":
            prof.enable()
            loss = fwd()
            prof.disable()
            bwd(loss)
        else:
            loss = fwd()
            torch.cuda.synchronize()
            prof.enable()
            bwd(loss)
            prof.disable()
        torch.cuda.synchronize()
        engine.step()
        stats = pstats.Stats(prof)
        rows = sorted(((f"{os.path.basename(k[0])}:{k[1]}({k[2]})", v[1], v[2], v[3]) for k, v in stats.stats.items()),
                      key=lambda r: -r[2])
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(30)
        out("profile", run="engine", phase=phase, total_ms=round(stats.total_tt * 1e3, 1),
            tottime=[[r[0], r[1], round(r[2] * 1e3, 2)] for r in rows[:40]],
            cumulative=text.getvalue()[-6000:])


if __name__ == "__main__":
    main()
