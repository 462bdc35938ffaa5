"""What a verification run is asked to do, and the requests it refuses (no torch here).

Shared by the preflight, the launcher and the runner, so none of them imports another for it.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from zlayout.profile.ds_config import DEFAULT_NVME_PATH
from zlayout.spec import Layout, PlanInput


# A verification that has not ended in an hour is stuck (a few steps of a layout take minutes
# at most; the op builds have their own limit in preflight): ended, not left hanging.
DEFAULT_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class VerifyOptions:
    """How to run a verification (the layout and the sizes come from the PlanInput)."""

    steps: int = 5
    restart_drill: bool = False
    save_at_step: int | None = None  # default: half-way through the steps (at least 1)
    cpu: bool = False
    processes: int | None = None  # default: the plan's GPUs per node; 1 in CPU mode
    out_dir: Path | None = None  # default: $XDG_CACHE_HOME/zlayout/verify/<time>-<layout key>
    checkpoint_dir: Path | None = None  # default: <out_dir>/checkpoint
    nvme_path: str = DEFAULT_NVME_PATH
    python: str = field(default_factory=lambda: sys.executable)
    seed: int = 1234
    timeout_s: float | None = DEFAULT_TIMEOUT_S  # per launch here; the whole job with SLURM
    run_preflight: bool = True
    extra_env: dict[str, str] = field(default_factory=dict)
    ds_config: dict[str, Any] | None = None  # default: zlayout's ds_config(inp, layout)
    # The user's config.json (the file --hf-config names, or a profile's copy): the worker builds
    # the model from it, the plan's shape laid over it, so what trains is the model the card was
    # learned from (its activation, dropouts, rope, softcapping), not the class's defaults.
    hf_config: dict[str, Any] | None = None
    # Rank 0 of the plan's whole world (nodes x GPUs per node) as one process on one GPU, on
    # torch's fake process group: DeepSpeed shards, buckets and gathers as on the full world and
    # the collectives move nothing, so GPU memory is the full run's; step time and host memory
    # are not (benchmarks/measurements/tools/emulated_world.py: equal to 2 real GPUs' peaks on 14 of 16 layouts).
    emulate: bool = False

    def drill_step(self) -> int:
        return self.save_at_step if self.save_at_step is not None else max(1, self.steps // 2)


class LaunchError(Exception):
    """The verification cannot start as asked (message says what to change)."""


def world_for(inp: PlanInput, options: VerifyOptions) -> int:
    """The processes this node starts (one per GPU; one in CPU mode or when emulating)."""
    if options.emulate:
        return 1
    if options.processes is not None:
        return options.processes
    if options.cpu:
        return 1
    return inp.hardware.gpus_per_node


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask, as a batch scheduler sets it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


DEFAULT_CPU_PROCESSES = 4  # a CPU check's default where the plan and the cores allow it


def cpu_processes_limit() -> int:
    """The most processes a CPU check runs here: one per usable core (check_request refuses
    more; the app's verify dialog offers and accepts no more)."""
    return usable_cores()


def default_cpu_processes(inp: PlanInput) -> int:
    """What the app's verify dialog offers for a CPU check: the plan's GPUs, at most 4, and
    never more than cpu_processes_limit()."""
    return max(1, min(inp.hardware.world, DEFAULT_CPU_PROCESSES, cpu_processes_limit()))


def check_request(inp: PlanInput, options: VerifyOptions, gpus_visible: int | None = None,
                  on_this_node: bool = True) -> None:
    """Refuse what cannot run, with what to type instead (LaunchError, one line).

    `gpus_visible` is what nvidia-smi lists in GPU mode (None: unknown, and preflight says
    so when the run starts). `on_this_node` False (SLURM): the processes run on the job's
    nodes, whose cores and GPUs are not this machine's; the job's preflight checks them."""
    if options.timeout_s is not None and options.timeout_s <= 0:
        raise LaunchError(f"--timeout {options.timeout_s:g}: give seconds above 0 (default "
                          f"{DEFAULT_TIMEOUT_S:.0f})")
    if options.steps < 1:
        raise LaunchError("--steps must be at least 1")
    if options.restart_drill:
        save_at = options.drill_step()
        if save_at < 1:
            raise LaunchError(f"--save-at {save_at}: the restart drill saves after a step; use "
                              f"--save-at 1 to {options.steps - 1} (or leave it out: half-way)")
        if save_at >= options.steps:
            raise LaunchError(f"the restart drill saves at step {save_at} and needs steps after "
                              f"it: use --steps {save_at + 1} or more (or a --save-at below "
                              f"{options.steps})")
    elif options.save_at_step is not None:
        raise LaunchError("--save-at only applies to the restart drill: add --restart-drill")
    if options.emulate:
        if inp.hardware.world < 2:
            raise LaunchError("--emulate runs rank 0 of a multi-GPU plan on one GPU; this plan has "
                              "one GPU: leave out --emulate")
        if options.processes not in (None, 1):
            raise LaunchError("--emulate runs one process (rank 0 of the plan's "
                              f"{inp.hardware.world} GPUs): leave out --processes")
        if options.restart_drill:
            raise LaunchError("--emulate cannot drill a restart (only rank 0's checkpoint is "
                              "written): leave out --restart-drill, or drill on the real GPUs")
    processes = world_for(inp, options)
    if processes < 1:
        raise LaunchError("--processes must be at least 1")
    hf_config_to_build(inp, options)  # a model verify cannot build: refused here, in one line, not in the run
    if not on_this_node:
        return
    if options.cpu:
        cores = cpu_processes_limit()
        if processes > cores:
            raise LaunchError(f"--processes {processes}: this machine has {cores} usable cores "
                              f"and CPU mode runs one process per core; use --processes {cores} "
                              "or fewer")
    elif gpus_visible and processes > gpus_visible:
        raise LaunchError(f"--processes {processes}: this node has {gpus_visible} GPUs; use "
                          f"--processes {gpus_visible} or fewer (or run on a bigger node)")


def hf_config_to_build(inp: PlanInput, options: VerifyOptions) -> dict[str, Any] | None:
    """The config.json the ranks build (`hfconfig.config_to_build`), None without one; LaunchError
    (one line) where transformers would not build the model planned."""
    if not options.hf_config:
        return None
    from zlayout.hfconfig import HfConfigError, config_to_build

    try:
        return config_to_build(options.hf_config, inp.model)
    except HfConfigError as exc:
        raise LaunchError(str(exc)) from None


def input_for_run(inp: PlanInput, processes: int, emulate: bool = False) -> PlanInput:
    """The plan's input at the size this node runs: one node of `processes` GPUs (emulating:
    the plan's own world, which its one process stands rank 0 of).

    The prediction is recomputed for that world, so measured and predicted describe the same
    run (a ZeRO shard on 2 GPUs is not the shard on 16)."""
    hw = inp.hardware
    if emulate or (hw.nodes == 1 and hw.gpus_per_node == processes):
        return inp
    return inp.model_copy(update={"hardware": hw.model_copy(update={"gpus_per_node": processes,
                                                                    "nodes": 1})})


def default_out_dir(layout: Layout) -> Path:
    """$XDG_CACHE_HOME/zlayout/verify/<time>-<layout> (checkpoints are large: not the work tree)."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-%f")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "zlayout" / "verify" / f"{stamp}-{layout.key}"


def checkpoint_bytes(inp: PlanInput) -> int:
    """bf16 weights + fp32 master weights and two Adam moments: what save_checkpoint writes."""
    return 14 * inp.model.params


def resolved_dirs(layout: Layout, options: VerifyOptions) -> tuple[Path, Path, bool]:
    """(output directory, checkpoint directory, whether the output one is the default)."""
    default = options.out_dir is None
    out_dir = (options.out_dir or default_out_dir(layout)).resolve()
    checkpoint_dir = (options.checkpoint_dir or out_dir / "checkpoint").resolve()
    return out_dir, checkpoint_dir, default


def check_runnable(inp: PlanInput, layout: Layout, cpu: bool) -> None:
    """Refuse (LaunchError, one line) a layout that cannot run on a GPU whatever its memory:
    ZeRO-3 on one GPU of a model whose grouped-experts weights DeepSpeed misaligns
    (core.tensors.grouped_gemm_refusal). CPU's grouped GEMM takes a misaligned weight, so a CPU
    check runs it."""
    if cpu:
        return
    from zlayout.core.tensors import grouped_gemm_refusal

    if (refusal := grouped_gemm_refusal(inp, layout)) is not None:
        raise LaunchError(refusal)
