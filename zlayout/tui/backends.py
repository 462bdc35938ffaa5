"""The app's default collaborators: the preset catalog, profile files, the verification run.

Each is passed into `ZLayoutApp` so tests hand it fakes; the defaults here bind them to the
real modules, imported lazily so the app starts without them (and never imports torch or
deepspeed: the verification runs in a child process, `zlayout verify`).
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from zlayout.install import zlayout_argv
from zlayout.spec import GiB, Layout, PlanInput, offload_flag
from zlayout.tui.form import Presets

if TYPE_CHECKING:  # the planner is imported after the app's first frame
    from zlayout.core.plan import Plan


@dataclass(frozen=True, slots=True)
class ProfileIO:
    """Profile files: `save(plan, layout, path)` writes, `load(path) -> PlanInput` reads.
    `exists(path)` says whether saving would replace something (the app asks first).
    Any object with `save` and `load` will do (`exists` defaults to "the path exists")."""

    save: Callable[[Plan, Layout, str], object]
    load: Callable[[str], PlanInput]
    exists: Callable[[str], bool] = lambda path: Path(path).exists()


def default_profile_io(presets_dirs: tuple[str, ...] = (), team_config: dict | None = None) -> ProfileIO | str:
    """zlayout.profile's functions, or why they are not available. `presets_dirs`: the
    `--presets-dir` folders the export's limits (break-even) read, as `zlayout export`'s do;
    `team_config`: `zlayout app --ds-config`'s file, whose optimizer, scheduler and other keys
    every export keeps (as `zlayout export --ds-config`)."""
    try:
        from zlayout import profile
    except ImportError as exc:  # pragma: no cover - the profile package ships with zlayout
        return f"profiles are not available: {exc}"
    needed = ("load_profile", "PROFILE_FILE")
    missing = [name for name in needed if not hasattr(profile, name)]
    if missing:
        return f"profiles are not available yet: zlayout.profile lacks {', '.join(missing)}"
    from zlayout.profile.export import export_profile, inspect_target

    def save(plan: Plan, layout: Layout, path: str) -> object:
        # the CLI's export path and rules: never replaces what is not a readable profile, keeps
        # the change log; the app has asked before replacing a profile (`exists`)
        return export_profile(plan.input, layout, path, replace=True, presets_dirs=presets_dirs,
                              team_config=team_config)

    def exists(path: str) -> bool:
        """A readable profile is there (the app asks first); a refused target is reported by save."""
        try:
            return inspect_target(path).replaces
        except profile.ProfileError:
            return False

    def load(path: str) -> PlanInput:
        return profile.load_profile(path).plan_input()

    return ProfileIO(save=save, load=load, exists=exists)


@lru_cache(maxsize=4)
def catalog_presets(presets_dirs: tuple[str, ...] = ()) -> Presets:
    """The preset names and loaders of zlayout.catalog (empty when it is missing), looking in
    `presets_dirs` (`--presets-dir`'s folders) first, as the CLI's `--presets-dir` does."""
    try:
        from zlayout import catalog
    except ImportError:
        def missing(name: str):
            raise LookupError(f"no preset catalog (zlayout.catalog is missing): cannot load {name!r}")

        return Presets(models=(), gpus=(), links=(), load_gpu=missing, load_link=missing)
    dirs = tuple(presets_dirs)
    return Presets(
        models=tuple(catalog.list_presets("models", dirs)),
        gpus=tuple(catalog.list_presets("gpus", dirs)),
        links=tuple(catalog.list_presets("links", dirs)),
        load_gpu=lambda name: catalog.load_gpu(name, dirs),
        load_link=lambda name: catalog.load_link(name, dirs),
        load_model=lambda name: catalog.load_model(name, dirs),
        model_of_size=lambda text: catalog.model_for_size(catalog.parse_size(text), extra_dirs=dirs),
        default_intra_link=lambda name: catalog.default_intra_link(name, dirs),
    )


def default_plan_input() -> PlanInput:
    """What the app shows first: Llama 3 8B on one node of 8 H200s."""
    from zlayout import catalog
    from zlayout.spec import HardwareSpec, TrainingSpec

    gpu = catalog.load_gpu("h200")
    hardware = HardwareSpec(gpu=gpu, gpus_per_node=8, nodes=1,
                            intra_link=catalog.load_link(catalog.default_intra_link("h200")),
                            inter_link=catalog.load_link("ib-ndr"),
                            host_ram_bytes=2048 * GiB)
    return PlanInput(model=catalog.load_model("llama3-8b"), hardware=hardware,
                     training=TrainingSpec(seq=2048, micro_batch=1))  # `zlayout plan`'s defaults


# ------------------------------------------------------------------------ verification

def verification_missing() -> str | None:
    """Why `zlayout verify` cannot run yet, or None when it can."""
    if importlib.util.find_spec("zlayout.commands.verify") is None:
        return ("verification is not available yet: `zlayout verify` "
                "(zlayout/commands/verify.py, issue 5) is missing")
    return None


def verify_flags(inp: PlanInput, layout: Layout) -> list[str]:
    """The `zlayout verify` flags that describe this plan input and layout: every input the
    app can change (the SLURM script runs later, elsewhere, from these flags alone: it left
    out model code, allocator, loop and host cores, so the job verified another plan).
    `tests/tui/test_one_default.py` reads them back through the CLI's own parser."""
    m, hw, t, z = inp.model, inp.hardware, inp.training, inp.zero
    flags = ["--layers", str(m.layers), "--hidden", str(m.hidden), "--heads", str(m.heads),
             "--vocab", str(m.vocab), "--mlp", m.mlp, "--norm", m.norm]
    if m.kv_heads is not None:
        flags += ["--kv-heads", str(m.kv_heads)]
    if m.ffn is not None:
        flags += ["--ffn", str(m.ffn)]
    if not m.bias:
        flags.append("--no-bias")
    if m.qkv_bias and not m.bias:
        flags.append("--qkv-bias")
    if m.tie_embeddings:
        flags.append("--tie-embeddings")
    if m.experts:
        flags += ["--experts", str(m.experts), "--top-k", str(m.top_k)]
        if m.expert_ffn is not None:
            flags += ["--expert-ffn", str(m.expert_ffn)]
    flags += ["--gpu", hw.gpu.name, "--gpus-per-node", str(hw.gpus_per_node),
              "--nodes", str(hw.nodes), "--intra-link", hw.intra_link.name,
              "--host-ram-gib", f"{hw.host_ram_bytes / GiB:g}", "--nvme-gib", f"{hw.nvme_bytes / GiB:g}",
              "--nvme-gbps", f"{hw.nvme_gbps:g}"]
    if hw.inter_link is not None:
        flags += ["--inter-link", hw.inter_link.name]
    if hw.host_cores is not None:
        flags += ["--host-cores", str(hw.host_cores)]
    flags += ["--seq", str(t.seq), "--micro-batch", str(t.micro_batch),
              "--grad-accum", str(t.grad_accum), "--precision", t.precision,
              "--checkpointing", t.checkpointing, "--impl", t.impl, "--allocator", t.allocator,
              "--init", t.init, "--loop", t.loop]
    flags += ["--reduce-bucket-size", str(z.reduce_bucket_size),
              "--allgather-bucket-size", str(z.allgather_bucket_size),
              "--prefetch-bucket-size", str(z.stage3_prefetch_bucket_size),
              "--max-live-parameters", str(z.stage3_max_live_parameters),
              "--persistence-threshold", str(z.stage3_param_persistence_threshold),
              "--headroom", repr(inp.headroom_fraction)]
    if not z.overlap_comm:
        flags.append("--no-overlap-comm")
    flags += ["--stage", str(layout.stage),
              "--offload-optimizer", offload_flag(layout.offload_optimizer),
              "--offload-param", offload_flag(layout.offload_param)]
    return flags


def cli_verifier(inp: PlanInput, layout: Layout, cancel: threading.Event,
                 cpu_processes: int | None = None, emulate: bool = False) -> Iterator[str]:
    """Run `zlayout verify` in its own process group and yield its output lines; on cancel
    (or when the caller closes this generator) the whole group is terminated. With
    `cpu_processes`, a CPU check: `--cpu --processes N` (gloo, no GPU needed); with `emulate`,
    rank 0 of the plan's GPUs on one GPU here (`--emulate`).

    The plan goes over as a temporary profile, so every input (DeepSpeed knobs, a GPU that
    is not a preset) reaches the run; the plan flags are the fallback."""
    with tempfile.TemporaryDirectory(prefix="zlayout-tui-verify-") as tmp:
        target = _temporary_profile(inp, layout, Path(tmp))
        args = [str(target)] if target is not None else verify_flags(inp, layout)
        command = [*zlayout_argv(), "verify", *args, "--json"]
        if cpu_processes:
            command += ["--cpu", "--processes", str(cpu_processes)]
        elif emulate:
            command.append("--emulate")
        yield "$ zlayout verify " + " ".join(command[len(zlayout_argv()) + 1:])
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, bufsize=1, start_new_session=True)
        finished = threading.Event()
        watcher = threading.Thread(target=_kill_on_cancel, args=(child, cancel, finished), daemon=True)
        watcher.start()
        try:
            assert child.stdout is not None
            for line in child.stdout:
                yield line.rstrip("\n")
            code = child.wait()
            if cancel.is_set():
                yield "cancelled"
            elif code:
                yield f"zlayout verify exited with code {code}"
        finally:
            finished.set()  # stops the watcher
            _terminate(child)


def _temporary_profile(inp: PlanInput, layout: Layout, directory: Path) -> Path | None:
    try:
        from zlayout.profile import build_profile, save_profile
    except ImportError:
        return None
    return save_profile(build_profile(inp, layout), directory / "profile.toml")


def _kill_on_cancel(child: subprocess.Popen, cancel: threading.Event,
                    finished: threading.Event) -> None:
    while not finished.is_set():
        if cancel.wait(0.2):
            _terminate(child)
            return


def _terminate(child: subprocess.Popen) -> None:
    if child.poll() is not None:
        return
    try:
        os.killpg(child.pid, signal.SIGTERM)
        child.wait(timeout=5)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
