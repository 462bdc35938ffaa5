"""The verification worker: runs inside each rank, trains the planned layout for a few steps.

    python -m torch.distributed.run --nproc_per_node P -m zlayout.verify.worker \
        --spec spec.json --out run/result.json [--resume]

One of the two modules (with `worker_model`) that import torch and deepspeed. It builds the
planned model with random weights under the planned DeepSpeed config (inside
`deepspeed.zero.Init` for stage 3), trains on random tokens and measures, per rank, what the
planner predicted: peak allocated and reserved GPU memory, device memory used, host peak RSS,
step times, tokens/s, achieved TFLOP/s and the losses. Progress goes to stdout as JSON lines
(`{"event": "init"|"step"|"checkpoint"|"resumed"|"done"|"oom"|"error", "rank": r, ...}`),
and every rank writes its figures to `<out>.rank<r>.json`, so a rank that runs out of memory
still leaves its report behind when the launcher tears the others down.

Batches are seeded by (step, micro-step, rank), so a run resumed from a checkpoint sees
exactly the batches the uninterrupted run saw: the restart drill compares their losses.
On CPU (`"device": "cpu"` in the spec) the backend is gloo and the optimizer is torch's AdamW
(`torch_adam`), because DeepSpeed's FusedAdam and CPUAdam are JIT-compiled CUDA/C++ ops.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
import traceback
from pathlib import Path
from typing import Any

PROCESS_START_S = time.time()



def emit(event: str, rank: int, **fields: Any) -> None:
    """One progress line on stdout, flushed at once (the launcher streams it live)."""
    print(json.dumps({"event": event, "rank": rank, **fields}), flush=True)


def is_out_of_memory(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    text = str(exc).lower()
    # CUDA says "out of memory"; the CPU allocator "can't allocate memory" (CPU mode, host RAM).
    return isinstance(exc, RuntimeError) and any(
        phrase in text for phrase in ("out of memory", "can't allocate memory"))


def join_emulated_world(world: int) -> None:
    """This process as rank 0 of `world` on torch's fake process group: DeepSpeed (which takes a
    process group that is already there) shards, buckets and gathers as on the full world, and
    each collective returns at once without moving data (losses are not the real run's)."""
    import torch
    import torch.distributed as dist

    try:
        from torch.testing._internal.distributed.fake_pg import FakeStore
    except ImportError as exc:  # torch's own module path, not a public API
        raise RuntimeError(f"--emulate needs torch's fake process group, which torch "
                           f"{torch.__version__} lacks ({exc}); verify on the real GPUs") from None
    os.environ.update(RANK="0", WORLD_SIZE=str(world))
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)


def batch(step: int, micro: int, rank: int, seed: int, shape: tuple[int, int], vocab: int):
    """Random tokens fixed by (seed, step, micro-step, rank): the same in a resumed run."""
    import torch

    generator = torch.Generator(device="cpu").manual_seed(
        seed * 1_000_003 + step * 10_007 + micro * 101 + rank)
    return torch.randint(0, vocab, shape, generator=generator)


def host_maxrss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def cpu_model() -> str | None:
    """The host CPU's model name (/proc/cpuinfo), recorded so step times can be compared."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def _proc_kib(path: str, *fields: str) -> list[int | None]:
    """The `Field:   N kB` lines of one read of a /proc file, in bytes (None where the file or a
    line is missing)."""
    found: dict[str, int] = {}
    try:
        for line in Path(path).read_text().splitlines():
            name, _, rest = line.partition(":")
            if name in fields:
                found[name] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return [found.get(field) for field in fields]


def transparent_hugepages() -> str | None:
    """The kernel's transparent-hugepage mode (`always`, `madvise`, `never`): whether the CPU
    optimizer's tens of GiB of fp32 state sit on 2 MiB pages or 4 KiB ones."""
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return None
    chosen = [word for word in text.split() if word.startswith("[")]
    return chosen[0].strip("[]") if chosen else None


def host_facts() -> dict[str, Any]:
    """The cores this rank may use, the CPU model and the host memory's state when it started
    (offload step times depend on them: an offloaded step's CPU optimizer ran 2.9-3.1 s in one
    process and 3.8-3.9 s in another on the same node, issue 27's Mixtral rows)."""
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = None
    return {"host_cores_usable": usable, "host_cpu_model": cpu_model(),
            "host_mem_available_at_start_bytes": _proc_kib("/proc/meminfo", "MemAvailable")[0],
            "host_transparent_hugepages": transparent_hugepages()}


def host_memory_after_training(before: Any) -> dict[str, Any]:
    """What of this rank's memory the kernel backs with huge pages once the steps have run, and
    the page faults and kernel time the steps cost since `before` (a `resource.getrusage`): an
    offloaded step's fresh pageable temporaries are faulted in and zeroed by the kernel each step."""
    huge, rss = _proc_kib("/proc/self/smaps_rollup", "AnonHugePages", "Rss")
    now = resource.getrusage(resource.RUSAGE_SELF)
    return {"host_anon_huge_bytes": huge, "host_rss_after_training_bytes": rss,
            "host_minor_faults_training": now.ru_minflt - before.ru_minflt,
            "host_system_s_training": round(now.ru_stime - before.ru_stime, 3)}


def allocator_peaks(stats: dict[str, Any]) -> dict[str, Any]:
    """The figures of `allocator_stats` the result folds over ranks, under flat names."""
    return {"reserved_bytes_all_peak": stats.get("reserved_bytes.all.peak"),
            "alloc_retries": stats.get("num_alloc_retries"), "num_ooms": stats.get("num_ooms")}


def device_used_at_peak(used_now: int, reserved_now: int, max_reserved: int) -> int:
    """The card's memory in use at the run's peak: what is not PyTorch's cache now (the CUDA
    context, NCCL, cuBLAS outside the allocator) plus the cache at its largest. After a failed
    cudaMalloc the allocator frees its cached segments and retries, so the cache at the end can
    be GiBs below its peak (ZeRO-2 L18 h4096 on an H200: 7 retries, 136.41 GiB reserved at the
    peak, 128.45 at the end): the card's use read after the run is not the run's peak."""
    return used_now - reserved_now + max_reserved


def host_rss_now_bytes() -> int | None:
    try:
        import psutil
    except ImportError:
        return None
    return psutil.Process().memory_info().rss


def allocator_conf(planned: str, current: str | None) -> str | None:
    """PYTORCH_CUDA_ALLOC_CONF for the planned allocator, keeping the user's other options:
    the run must measure the allocator the plan assumed."""
    options = [o for o in (current or "").split(",") if o.strip()
               and not o.strip().startswith("expandable_segments")]
    if planned == "expandable":
        options.append("expandable_segments:True")
    return ",".join(options) or None


def initialise_partitioned_hf_weights(deepspeed: Any, hf_model: Any) -> None:
    """transformers initialises weights after the whole model is built, when zero.Init has
    already partitioned them: tensors it creates empty (Mixtral's fused experts) would keep
    whatever memory they got. Run its initialiser module by module on the gathered weights
    (one module gathered at a time: the peak stays that of the largest module)."""
    for module in hf_model.modules():
        own = list(module.parameters(recurse=False))
        if own:
            with deepspeed.zero.GatheredParameters(own, modifier_rank=0):
                hf_model._init_weights(module)


def allocator_stats(torch: Any) -> dict[str, Any]:
    """What the caching allocator did: peaks of reserved, allocated and free-but-split bytes
    (memory held in segments that also hold live blocks: fragmentation), retries after a
    failed cudaMalloc, and the cached segments' sizes at the end (largest first)."""
    stats = torch.cuda.memory_stats()
    keys = ("reserved_bytes.all.peak", "allocated_bytes.all.peak", "active_bytes.all.peak",
            "inactive_split_bytes.all.peak", "reserved_bytes.large_pool.peak",
            "reserved_bytes.small_pool.peak", "segment.all.peak", "num_alloc_retries", "num_ooms",
            "num_device_alloc", "num_device_free", "requested_bytes.all.peak")
    segments = sorted(((s["total_size"], s["allocated_size"]) for s in torch.cuda.memory_snapshot()),
                      reverse=True)
    return {**{k: stats.get(k) for k in keys},
            "segments_end": [list(s) for s in segments[:40]], "segment_count_end": len(segments)}


class PlanAssumptionError(RuntimeError):
    """The node would train something other than what the plan priced (one line)."""


def check_linear_attention(report: dict[str, Any], model: Any, build: Any) -> None:
    """Record which linear-attention kernels transformers resolved for the model built
    (worker_model.linear_attention_implementation), and stop before training where the card
    priced flash-linear-attention + causal-conv1d and this node runs the torch fallback."""
    import torch

    from zlayout.verify.worker_model import linear_attention_implementation, linear_attention_refusal

    resolved = linear_attention_implementation(getattr(build, "model_module", None))
    if resolved is None:
        return
    report["linear_attention"] = resolved
    refusal = linear_attention_refusal(getattr(model.card, "linear_attention", None), resolved)
    if refusal is None and "flash-linear-attention" in resolved.values() and torch.cuda.is_available():
        # fla's gated backward on Hopper with a Triton it refuses: stop here, not in the first backward
        from zlayout.verify.environment import fla_hopper_refusal, triton_and_tilelang

        refusal = fla_hopper_refusal([torch.cuda.get_device_capability()[0]], *triton_and_tilelang())
    if refusal is not None:
        raise PlanAssumptionError(refusal)


def run(spec: dict[str, Any], out: Path, resume: bool) -> int:
    cpu = spec["device"] == "cpu"
    if cpu:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    planned_allocator = spec["inputs"].get("training", {}).get("allocator", "default")
    conf = allocator_conf(planned_allocator, os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))
    if conf is None:
        os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    else:  # set before torch is imported: the allocator reads it once, at CUDA's first use
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = conf
    from zlayout.spec import HOST_HUGEPAGES_ENV, Layout, PlanInput

    layout = Layout.model_validate(spec["layout"])
    if layout.offloads:  # before torch is imported, as the launchers zlayout writes export it
        os.environ.setdefault(HOST_HUGEPAGES_ENV, "1")
    import deepspeed
    import torch
    import torch.distributed as dist

    from zlayout.verify.worker_model import builder, count_parameters

    inp = PlanInput.model_validate(spec["inputs"])
    cfg = json.loads(json.dumps(spec["ds_config"]))
    if cpu:
        cfg.setdefault("optimizer", {"type": "AdamW", "params": {}})
        cfg["optimizer"].setdefault("params", {})["torch_adam"] = True

    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if cpu:
        device = torch.device("cpu")
    else:  # before the process group, so NCCL's first collective uses this rank's GPU
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    emulate_world = int(spec.get("emulate_world") or 0)
    if emulate_world > 1:
        join_emulated_world(emulate_world)
    deepspeed.init_distributed(dist_backend="gloo" if cpu else "nccl")
    rank, world = dist.get_rank(), dist.get_world_size()

    report: dict[str, Any] = {
        "rank": rank, "world": world, "local_rank": local_rank, "resume": resume,
        "hostname": os.uname().nodename, "device": str(device), "status": "running",
        "phase": "build", "torch": torch.__version__, "deepspeed": deepspeed.__version__,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "torch_threads": torch.get_num_threads(),
        # PyTorch's switch for 2 MiB-aligned, MADV_HUGEPAGE host allocations (THP mode madvise)
        "thp_mem_alloc_enable": os.environ.get(HOST_HUGEPAGES_ENV),
        "allocator": planned_allocator, "pytorch_cuda_alloc_conf": conf,
        "emulated_world": emulate_world or None,
        "host_cores": os.cpu_count(), **host_facts(),
    }
    if not cpu:
        report["gpu_name"] = torch.cuda.get_device_name(local_rank)
    rank_file = out.with_name(f"{out.name}.rank{rank}.json")

    def write_report() -> None:
        report["host_maxrss_bytes"] = host_maxrss_bytes()
        report["host_rss_end_bytes"] = host_rss_now_bytes()
        tmp = rank_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(report, indent=1))
        tmp.replace(rank_file)

    def synchronize() -> None:
        if not cpu:
            torch.cuda.synchronize()

    try:
        m, t = inp.model, inp.training
        torch.manual_seed(spec.get("seed", 0))
        checkpointing = t.checkpointing == "full"
        impl = t.impl
        report["impl"] = impl
        if impl == "hf":
            import transformers
            report["transformers"] = transformers.__version__
        # The training loop the plan assumed: "deepspeed" holds each micro-step's outputs (the
        # logits) until the next forward rebinds them; "trainer" keeps only the loss.
        loop = t.loop
        report["loop"] = loop
        build = builder(m, checkpointing, impl, t.seq, spec.get("hf_config"), loop=loop)
        check_linear_attention(report, m, build)
        if layout.stage == 3:
            with deepspeed.zero.Init(config_dict_or_path=cfg):
                model = build()
            if impl == "hf":
                initialise_partitioned_hf_weights(deepspeed, model.model)
        else:
            model = build()
        params = count_parameters(model)
        report["params"] = params
        if params != m.params:
            raise AssertionError(f"built {params} parameters, the plan says {m.params}: "
                                 "worker_model and ModelSpec.params disagree")
        report["phase"] = "initialize"
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=cfg)
        synchronize()
        report["init_s"] = time.time() - PROCESS_START_S
        if not cpu:
            report["after_init_allocated_bytes"] = torch.cuda.memory_allocated()
            report["init_peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        emit("init", rank, pid=os.getpid(), params=params, init_s=round(report["init_s"], 2),
             after_init_allocated_bytes=report.get("after_init_allocated_bytes"))

        if resume:
            report["phase"] = "resume"
            load_start = time.time()
            load_path, _ = engine.load_checkpoint(spec["checkpoint_dir"])
            synchronize()
            report["resume_s"] = time.time() - load_start
            report["resumed_from"] = str(load_path)
            report["step_resumed"] = int(engine.global_steps)
            emit("resumed", rank, step=int(engine.global_steps), resume_s=round(report["resume_s"], 3),
                 path=str(load_path))
            if load_path is None:
                raise RuntimeError(f"no checkpoint found under {spec['checkpoint_dir']}")

        shape = (t.micro_batch, t.seq)
        seed = int(spec.get("seed", 0))
        save_at = spec.get("save_at_step")
        steps = int(spec["resume_steps"] if resume else spec["steps"])
        report.update(steps_run=[], losses=[], step_s=[], forward_s=[], backward_s=[],
                      optimizer_s=[], peak_allocated_bytes=[])
        report["phase"] = "train"
        train_start, usage_at_start = time.time(), resource.getrusage(resource.RUSAGE_SELF)
        for _ in range(steps):
            step_index = int(engine.global_steps)
            synchronize()
            started = time.time()
            # Forward, backward and optimizer step timed apart (summed over micro-steps), each
            # between synchronizes on GPU so a phase is not billed for the one before it.
            phase_s = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}
            for micro in range(t.grad_accum):
                ids = batch(step_index, micro, rank, seed, shape, m.vocab).to(device)
                mark = time.time()
                outputs = engine(ids)  # rebound here, at the next forward: held until then
                loss = outputs.loss if loop == "deepspeed" else outputs
                synchronize()
                phase_s["forward"] += time.time() - mark
                mark = time.time()
                engine.backward(loss)
                synchronize()
                phase_s["backward"] += time.time() - mark
                mark = time.time()
                engine.step()
                synchronize()
                phase_s["optimizer"] += time.time() - mark
            loss_value = float(loss.detach().float().item())
            synchronize()
            step_s = time.time() - started
            peak = torch.cuda.max_memory_allocated() if not cpu else None
            report["steps_run"].append(int(engine.global_steps))
            report["losses"].append(loss_value)
            report["step_s"].append(step_s)
            for name, seconds in phase_s.items():
                report[f"{name}_s"].append(seconds)
            report["peak_allocated_bytes"].append(peak)
            emit("step", rank, step=int(engine.global_steps), loss=loss_value,
                 step_s=round(step_s, 4), forward_s=round(phase_s["forward"], 4),
                 backward_s=round(phase_s["backward"], 4),
                 optimizer_s=round(phase_s["optimizer"], 4), peak_allocated_bytes=peak)
            if save_at is not None and not resume and int(engine.global_steps) == int(save_at):
                save_start = time.time()
                engine.save_checkpoint(spec["checkpoint_dir"], tag=f"step{save_at}")
                synchronize()
                report["save_s"] = time.time() - save_start
                emit("checkpoint", rank, step=int(engine.global_steps),
                     save_s=round(report["save_s"], 3), path=spec["checkpoint_dir"])
        report["train_s"] = time.time() - train_start
        report.update(host_memory_after_training(usage_at_start))

        if not cpu:
            free, total = torch.cuda.mem_get_info()
            report["max_reserved_bytes"] = torch.cuda.max_memory_reserved()
            report["device_used_at_end_bytes"] = total - free
            report["device_used_bytes"] = device_used_at_peak(total - free, torch.cuda.memory_reserved(),
                                                              report["max_reserved_bytes"])
            report["device_total_bytes"] = total
            report["gpu_name"] = torch.cuda.get_device_name(local_rank)
            # what a reduction kernel's launch heuristics read (the plan's GpuSpec.multiprocessors)
            props = torch.cuda.get_device_properties(local_rank)
            report["gpu_multiprocessors"] = getattr(props, "multi_processor_count", None)
            report["gpu_max_threads_per_multiprocessor"] = getattr(props, "max_threads_per_multi_processor", None)
            report["allocator_stats"] = allocator_stats(torch)
            report.update(allocator_peaks(report["allocator_stats"]))
        report["status"] = "ok"
        report["phase"] = "done"
        write_report()
        emit("done", rank, host_maxrss_bytes=report["host_maxrss_bytes"])
    except BaseException as exc:  # noqa: BLE001 - every failure must leave a report behind
        oom = not isinstance(exc, KeyboardInterrupt) and is_out_of_memory(exc)
        report["status"] = "oom" if oom else "error"
        report["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        # a PlanAssumptionError is its one line: no stack to read
        report["traceback"] = "" if isinstance(exc, PlanAssumptionError) else traceback.format_exc()[-4000:]
        if not cpu and torch.cuda.is_available():
            report["max_allocated_bytes_at_failure"] = torch.cuda.max_memory_allocated()
            report["allocated_bytes_at_failure"] = torch.cuda.memory_allocated()
            try:
                report["allocator_stats"] = allocator_stats(torch)
                report.update(allocator_peaks(report["allocator_stats"]))
            except Exception:  # noqa: BLE001 - a report without them beats none
                pass
        write_report()
        emit("oom" if oom else "error", rank, phase=report["phase"], message=report["error"][:500])
        sys.stdout.flush()
        sys.stderr.write(report["traceback"])
        sys.stderr.flush()
        # Peers are blocked in collectives: leave at once, the launcher tears the group down.
        os._exit(3 if oom else 1)
    return shutdown(report, write_report, dist)


def shutdown(report: dict[str, Any], write_report, dist) -> int:
    """Wait for every rank, then destroy the process group: a rank that leaves with the group
    alive can abort in gloo's or NCCL's destructors (`terminate called without an active
    exception`). The figures are final by now; a failure here is recorded, not a run failure."""
    report["phase"] = "shutdown"
    try:
        if report["world"] > 1:  # one rank has no peer; its first NCCL call would allocate on a full card
            dist.barrier()
        dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001 - the run's figures stand; say why shutdown failed
        report["shutdown_error"] = f"{type(exc).__name__}: {exc}"[:500]
        write_report()
        emit("shutdown", report["rank"], message=report["shutdown_error"])
        return 4
    report["phase"] = "done"
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zlayout.verify.worker",
                                     description="Run the planned layout for a few steps (one rank).")
    parser.add_argument("--spec", required=True, type=Path, help="run spec written by the launcher")
    parser.add_argument("--out", required=True, type=Path,
                        help="result path; each rank writes <out>.rank<r>.json")
    parser.add_argument("--resume", action="store_true",
                        help="load the latest checkpoint of the spec's checkpoint_dir first")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None,
                        help=argparse.SUPPRESS)  # DeepSpeed's launcher passes it; LOCAL_RANK rules
    args = parser.parse_args(argv)
    spec = json.loads(args.spec.read_text())
    return run(spec, args.out, args.resume)


if __name__ == "__main__":
    sys.exit(main())
