"""Preflight: can this node run the layout? Checked before any rank starts.

Each check prints one line, pass or fail, with the number and, on failure, what to do.
Blocking failures (no GPUs, torch/deepspeed missing, a DeepSpeed op that cannot be built, a
directory that cannot be written, host RAM below what the run must hold: the optimizer states
it keeps in RAM) stop the verification; the other memory checks only warn, since the run
itself is the real test (an out-of-memory is then reported as `does-not-fit`).

The planner process never imports torch: GPUs come from `nvidia-smi`; versions, DeepSpeed's
parse of TORCH_CUDA_ARCH_LIST and the op builds from one subprocess (`zlayout.verify.probe`)
that runs with the ranks' environment, so what passes here is what the ranks get. It builds
the ops the layout uses into DeepSpeed's op cache (FusedAdam on the GPU, CPU Adam for optimizer
offload, AIO for NVMe), timed: a cold node pays the build here, once, not inside a rank.
Preflight writes nothing: directories are checked at their nearest existing parent.
"""

from __future__ import annotations

import json
import os
import resource
import shlex
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from zlayout.catalog import format_params
from zlayout.messages import printable
from zlayout.core.card import LINEAR_ATTENTION_FLA
from zlayout.core.memory import estimate_memory
from zlayout.spec import GiB, Layout, PlanInput
from zlayout.verify import oplocks
from zlayout.verify.environment import fla_hopper_refusal, worker_env, worker_env_notes
from zlayout.verify.options import VerifyOptions, checkpoint_bytes

PROBE_MODULE = "zlayout.verify.probe"
PROBE_MARKER = "ZLAYOUT_PROBE "
VERSIONS_TIMEOUT_S = 180.0
OP_BUILD_TIMEOUT_S = 1200.0  # a cold CPU Adam build took 115-123 s on an H200 node


def install_fix(python: str) -> str:
    """How to install torch and DeepSpeed into the ranks' Python, as zlayout was installed
    (`pip install -e` from a checkout: 'zlayout[verify]' is not on PyPI for a clone)."""
    from zlayout.install import pip_install_command

    return f"install them: {pip_install_command('verify', python)} (torch, deepspeed==0.19.8)"


def gpus_from_torch(facts: dict[str, Any]) -> list[GpuInfo]:
    """Where nvidia-smi is missing (some containers): the devices torch sees, free = total."""
    names = facts.get("cuda_names") or []
    totals = facts.get("cuda_total_bytes") or []
    return [GpuInfo(i, name, total, total, "unknown (no nvidia-smi)")
            for i, (name, total) in enumerate(zip(names, totals))]


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    blocking: bool = True
    seconds: float | None = None  # time the check took where that is a finding (op builds)

    def line(self) -> str:
        mark = "PASS" if self.ok else ("FAIL" if self.blocking else "WARN")
        text = f"preflight {mark} {self.name}: {self.detail}"
        return f"{text} -> {self.fix}" if not self.ok and self.fix else text

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)



# How far the plan's host peak may be over what it measures: offloaded layouts' worst error,
# 8.6% over 30 measured rows (benchmarks/host_accuracy.py, 2026-12-02). An offloaded run whose
# prediction is further above what is free is a run the kernel will kill; one within it, a
# GPU-resident one (host figures up to 68% off) or an emulated rank (its host is not the run's)
# only warns.
HOST_PREDICTION_SLACK = 0.09

@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    memory_total_bytes: int
    memory_free_bytes: int
    driver: str


def query_gpus(timeout_s: float = 20.0) -> list[GpuInfo]:
    """The GPUs `nvidia-smi` sees (respecting CUDA_VISIBLE_DEVICES); empty if there is none."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name,memory.total,memory.free,driver_version",
             "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=timeout_s, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for row in out.strip().splitlines():
        parts = [p.strip() for p in row.split(",")]
        if len(parts) != 5:
            continue
        try:
            gpus.append(GpuInfo(int(parts[0]), parts[1], int(float(parts[2])) * 2**20,
                                int(float(parts[3])) * 2**20, parts[4]))
        except ValueError:
            continue
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() and all(v.strip().isdigit() for v in visible.split(",")):
        wanted = [int(v) for v in visible.split(",")]
        gpus = [g for g in gpus if g.index in wanted]
    elif visible is not None and not visible.strip():
        gpus = []
    return gpus


def probe(python: str, env: dict[str, str], ops: list[str],
          timeout_s: float | None = None) -> tuple[dict[str, Any], str | None]:
    """Run `zlayout.verify.probe` with the ranks' environment: (facts, why it failed)."""
    command = [python, "-P", "-m", PROBE_MODULE] + (["--ops", ",".join(ops)] if ops else [])
    timeout_s = timeout_s or (OP_BUILD_TIMEOUT_S if ops else VERSIONS_TIMEOUT_S)
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=env,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {}, f"{python} did not answer in {timeout_s:.0f} s"
    except (OSError, subprocess.SubprocessError) as exc:
        return {}, f"could not run {python}: {exc}"
    lines = [x for x in proc.stdout.splitlines() if x.startswith(PROBE_MARKER)]
    if proc.returncode != 0 or not lines:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {}, f"not importable with {python}: {last}"
    return json.loads(lines[-1][len(PROBE_MARKER):]), None


def check_versions(python: str, cpu: bool, ops: list[str] | None = None,
                   env: dict[str, str] | None = None) -> tuple[Check, dict[str, Any]]:
    if env is None:
        env = worker_env(VerifyOptions(cpu=cpu, python=python))
    facts, failure = probe(python, env, ops or [])
    if failure and ops and "did not answer" in failure:
        # torch's extension builder waits forever on a lock a killed build left behind.
        return Check("torch+deepspeed", False, f"{failure} building {', '.join(ops)}",
                     "a stale lock from an interrupted build? remove "
                     "~/.cache/torch_extensions/*/<op>/lock (or $TORCH_EXTENSIONS_DIR's) and "
                     "rerun"), {}
    if failure:
        return Check("torch+deepspeed", False, failure, install_fix(python)), {}
    ok = facts.get("deepspeed") == "0.19.8"
    detail = f"torch {facts['torch']} (CUDA {facts.get('cuda')}), deepspeed {facts['deepspeed']}"
    fix = "" if ok else f"the memory model follows DeepSpeed 0.19.8: {shlex.quote(python)} -m pip install deepspeed==0.19.8"
    return Check("torch+deepspeed", True, detail, fix) if ok else \
        Check("torch+deepspeed", False, detail, fix, blocking=False), facts


def check_linear_attention_kernels(inp: PlanInput, facts: dict[str, Any]) -> list[Check]:
    """Where the card priced flash-linear-attention's kernels (Qwen3.5's GDN blocks), whether
    they can train on these GPUs with this Triton (environment.fla_hopper_refusal): checked
    before the engine is built, not in the first backward."""
    card = getattr(inp.model, "card", None)
    if getattr(card, "linear_attention", None) != LINEAR_ATTENTION_FLA or not facts.get("cuda_devices"):
        return []
    refusal = fla_hopper_refusal(facts.get("cuda_capability_majors") or [], facts.get("triton"),
                                 bool(facts.get("tilelang")))
    detail = f"Triton {printable(facts.get('triton') or 'not installed')}, tilelang {'installed' if facts.get('tilelang') else 'not installed'}"
    if refusal is None:
        return [Check("linear attention kernels", True, detail)]
    return [Check("linear attention kernels", False, refusal)]


def ops_for(layout: Layout, cpu: bool) -> list[str]:
    """The JIT ops the worker's DeepSpeed engine loads for this layout."""
    # CPU mode trains with torch's AdamW (torch_adam): no Adam op is built, but deepspeed.comm
    # builds its shared-memory collectives at start-up (a stale lock there hung every rank).
    ops = ["shm_comm"] if cpu else []
    if not cpu:
        ops.append("fused_adam" if layout.offload_optimizer == "gpu" else "cpu_adam")
    if "nvme" in (layout.offload_optimizer, layout.offload_param):
        ops.append("async_io")
    return ops


def check_arch_list(options: VerifyOptions, facts: dict[str, Any]) -> list[Check]:
    """TORCH_CUDA_ARCH_LIST as DeepSpeed parses it: corrected for the ranks (a note), and the
    corrected value proven by DeepSpeed's own parser in the probe."""
    notes = worker_env_notes(options)
    arch = facts.get("arch")
    if arch is None:  # unset for the ranks (nothing parseable was left) or never set
        return [Check("TORCH_CUDA_ARCH_LIST", False, notes[0], "nothing to do (corrected for "
                      "this run); DeepSpeed builds for the GPUs it sees", blocking=False)] \
            if notes else []
    if not arch.get("ok"):
        return [Check("TORCH_CUDA_ARCH_LIST", False,
                      f"DeepSpeed 0.19.8 cannot parse {arch['value']}: {arch.get('error')}",
                      "set it to numbers DeepSpeed reads, e.g. export TORCH_CUDA_ARCH_LIST=9.0")]
    parsed = f"DeepSpeed reads {arch['value']} as {arch.get('deepspeed_list')}"
    if notes:
        return [Check("TORCH_CUDA_ARCH_LIST", False, f"{notes[0]}; {parsed}",
                      f"nothing to do (corrected for this run); to silence it: "
                      f"export TORCH_CUDA_ARCH_LIST={arch['value']}", blocking=False)]
    return [Check("TORCH_CUDA_ARCH_LIST", True, parsed)]


def _cuda_major(version: str | None) -> str | None:
    return version.split(".")[0] if version else None


def op_failure_fix(op: dict[str, Any], facts: dict[str, Any], cpu: bool, python: str) -> str:
    """What to type when an op cannot be built: the toolchain gap, most specific first."""
    tools = facts.get("toolchain") or {}
    torch_cuda, nvcc_cuda = facts.get("cuda"), tools.get("nvcc_cuda")
    prebuilt = ("or install DeepSpeed with its ops prebuilt: "
                f"DS_BUILD_OPS=1 {shlex.quote(python)} -m pip install deepspeed==0.19.8")
    if not tools.get("ninja", True):
        return f"install ninja for the ranks' Python: {shlex.quote(python)} -m pip install ninja"
    if not cpu and torch_cuda is None:
        return (f"torch {facts.get('torch')} is a CPU build: install a CUDA one, e.g. "
                f"{shlex.quote(python)} -m pip install torch --index-url https://download.pytorch.org/whl/cu128")
    if not cpu and nvcc_cuda is None:
        return (f"no nvcc (CUDA_HOME={tools.get('cuda_home')}): load the CUDA {torch_cuda} "
                f"toolkit torch was built with (module load cuda/{torch_cuda}, or export "
                f"CUDA_HOME=/usr/local/cuda-{torch_cuda}), {prebuilt}")
    if not cpu and _cuda_major(nvcc_cuda) != _cuda_major(torch_cuda):
        return (f"nvcc is CUDA {nvcc_cuda}, torch was built with CUDA {torch_cuda}: load CUDA "
                f"{torch_cuda} (module load cuda/{torch_cuda}, or export CUDA_HOME=/usr/local/"
                f"cuda-{torch_cuda}), or install torch built for CUDA {nvcc_cuda}")
    if op["name"] == "shm_comm":
        return (f"see the build log: DS_ACCELERATOR=cpu {shlex.quote(python)} -c 'from "
                "deepspeed.comm.torch import build_shm_op; build_shm_op()'")
    builder = {"fused_adam": "FusedAdamBuilder", "cpu_adam": "CPUAdamBuilder",
               "async_io": "AsyncIOBuilder"}[op["name"]]
    hint = ("install libaio (apt-get install libaio-dev) and retry; "
            if op["name"] == "async_io" else "")
    return (f"{hint}see the build log: {python} -c 'from deepspeed.ops.op_builder import "
            f"{builder}; {builder}().load(verbose=True)'")


def check_ops(ops: list[str], facts: dict[str, Any], cpu: bool, python: str) -> list[Check]:
    if not ops:
        return [Check("deepspeed ops", True, "none to build: CPU mode trains with torch's AdamW",
                      seconds=0.0)] if cpu else []
    checks = []
    for op in facts.get("ops", []):
        where = "prebuilt" if op.get("prebuilt") else "op cache"
        if op.get("skipped"):
            checks.append(Check(f"op {op['name']}", True, "not used by DeepSpeed here", seconds=0.0))
        elif op.get("ok"):
            checks.append(Check(f"op {op['name']}", True,
                                f"loaded from the {where} in {op['load_s']:.1f} s",
                                seconds=op["load_s"]))
        else:
            checks.append(Check(f"op {op['name']}", False,
                                f"cannot be built ({op['load_s']:.1f} s): {op.get('error', '')[:300]}",
                                op_failure_fix(op, facts, cpu, python), seconds=op["load_s"]))
    return checks


def check_op_locks(env: dict[str, str]) -> list[Check]:
    """Op-build locks an interrupted build left (oplocks): removed, with a note; one that
    cannot be removed blocks, since every build of its op would wait on it forever."""
    checks = []
    for note in oplocks.remove_stale_locks(env):
        removed = note.startswith("removed")
        checks.append(Check("op-build lock", False, note,
                            "nothing to do (removed)" if removed else
                            "remove the lock file by hand and rerun", blocking=not removed))
    return checks


def check_gpus(inp: PlanInput, layout: Layout, processes: int,
               gpus: list[GpuInfo]) -> list[Check]:
    mem = estimate_memory(inp, layout)
    if not gpus:
        return [Check("gpus", False, f"none visible (the layout needs {processes})",
                      "run on a GPU node (check nvidia-smi and CUDA_VISIBLE_DEVICES), "
                      "or add --cpu to check the configuration on CPU")]
    checks = []
    names = sorted({g.name for g in gpus})
    if len(gpus) < processes:
        checks.append(Check("gpus", False, f"{len(gpus)} visible, the layout needs {processes}",
                            f"add --processes {len(gpus)} to verify on fewer GPUs, "
                            "or run on a node with more"))
    else:
        checks.append(Check("gpus", True, f"{len(gpus)} visible ({', '.join(names)}), "
                            f"{processes} used"))
    planned = inp.hardware.gpu.name.lower().replace("-", "").replace(" ", "")
    seen = " ".join(names).lower().replace("-", "").replace(" ", "")
    if planned not in seen:
        checks.append(Check("gpu kind", False, f"planned for {inp.hardware.gpu.name}, "
                            f"found {', '.join(names)}",
                            "plan with --gpu matching this node's GPUs", blocking=False))
    least_free = min(g.memory_free_bytes for g in gpus[:processes])
    need = mem.gpu_needed_bytes  # the least the peak runs in; device use grows into what is free
    checks.append(Check(
        "gpu memory", least_free >= need,
        f"{least_free / GiB:.1f} GiB free on the fullest GPU, the run needs "
        f"{need / GiB:.1f} GiB (peak allocated {mem.gpu_peak_allocated_bytes / GiB:.1f} GiB)",
        "free the GPUs (nvidia-smi shows who holds them) or pick a layout that fits",
        blocking=False))
    return checks


def host_available_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


OPTIMIZER_STATE_BYTES_PER_PARAM = 12  # fp32 master weights + Adam's two fp32 moments


def host_floor_bytes(inp: PlanInput, layout: Layout, cpu: bool) -> int:
    """Host RAM the run cannot do without, whatever the estimate's error: the fp32 master
    weights and Adam moments of every parameter (12 bytes each) where they live in RAM: in
    CPU mode (every "device" tensor is host memory) unless the optimizer goes to NVMe, and
    with the optimizer offloaded to the CPU. `inp` is the run's input: one node, so the whole
    world's share is on this machine. The worker builds the planned model at full size (its
    parameter count is asserted), in CPU mode too. 0 where the states are not in RAM."""
    in_ram = (cpu and layout.offload_optimizer != "nvme") or layout.offload_optimizer == "cpu"
    return OPTIMIZER_STATE_BYTES_PER_PARAM * inp.model.params if in_ram else 0


def check_host(inp: PlanInput, layout: Layout, processes: int, cpu: bool = False,
               emulate: bool = False) -> list[Check]:
    """Host RAM against what the run needs: FAIL (blocking) when even its floor (the optimizer
    states held in RAM, `host_floor_bytes`) exceeds what is available, so no rank is started
    to exhaust a shared node; WARN when only the prediction does (the run decides). In CPU
    mode the ranks' device memory is host memory too and is added to the prediction.
    `emulate`: one process as rank 0 of the plan's world holds one rank's share (ZeRO 1-3
    partition the states over the world; a node's host figure is its GPUs' ranks)."""
    mem = estimate_memory(inp, layout)
    checks = []
    available = host_available_bytes()
    node_host = mem.host_peak_bytes // max(1, inp.hardware.gpus_per_node) if emulate else mem.host_peak_bytes
    predicted = node_host + (processes * mem.gpu_peak_allocated_bytes if cpu else 0)
    shown = (f"predicted host peak {predicted / GiB:.1f} GiB (with the ranks' device memory: "
             "host memory in CPU mode)" if cpu else
             f"predicted host peak {node_host / GiB:.1f} GiB" + (" (rank 0's share)" if emulate else ""))
    floor = host_floor_bytes(inp, layout, cpu)
    offloaded = layout.offload_optimizer != "gpu" or layout.offload_param != "gpu"
    if emulate and layout.stage >= 1:
        floor //= max(1, inp.hardware.world)
    if available is None:
        checks.append(Check("host ram", True, "/proc/meminfo unreadable; not checked"))
    elif floor > available:
        checks.append(Check(
            "host ram", False,
            f"{available / GiB:.1f} GiB available; this run holds at least {floor / GiB:.1f} GiB "
            f"in RAM (fp32 weights and Adam moments of {format_params(inp.model.params)} parameters, "
            f"12 bytes each, on this one machine), {shown}",
            "not started: verify a smaller model here (fewer --layers, a smaller --hidden) "
            "or run on the planned nodes", blocking=True))
    elif offloaded and not emulate and predicted > available * (1 + HOST_PREDICTION_SLACK):
        # The plan's own host peak beyond what is available by more than its error: the kernel
        # kills a rank part-way (2026-12-02: llama3-8b-1xh200-offload, 142.8 GiB planned on a
        # 125.0 GiB node, SIGKILL after init), the GPU time spent for nothing.
        checks.append(Check(
            "host ram", False, f"{available / GiB:.1f} GiB available, {shown}",
            "not started: free host memory, use fewer processes per node, offload to NVMe, or run "
            "on nodes with more RAM (--no-preflight runs it anyway)", blocking=True))
    else:  # within the prediction's error of what is free: the run decides
        checks.append(Check(
            "host ram", available >= predicted, f"{available / GiB:.1f} GiB available, {shown}",
            "free host memory, use fewer processes per node, or offload to NVMe", blocking=False))
    if offloaded and inp.zero.pin_memory:
        soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        pinned_per_rank = mem.host_peak_bytes // max(1, inp.hardware.gpus_per_node)
        unlimited = soft == resource.RLIM_INFINITY
        shown = "unlimited" if unlimited else f"{soft / GiB:.2f} GiB"
        checks.append(Check(
            "pinned memory (ulimit -l)", unlimited or soft >= pinned_per_rank,
            f"{shown} per process, offload pins up to {pinned_per_rank / GiB:.1f} GiB per rank",
            "raise it: `ulimit -l unlimited` (or memlock in /etc/security/limits.conf; "
            "in containers --ulimit memlock=-1)", blocking=False))
    return checks


def existing_ancestor(path: Path) -> Path:
    """`path` or its nearest parent that exists (what a later mkdir -p would write into)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_writable_dir(name: str, path: Path, need_bytes: int, fix: str,
                       must_exist: bool = False) -> list[Check]:
    """Writable with room, checked where the directory would be created: nothing is made."""
    if must_exist and not path.is_dir():
        return [Check(name, False, f"{path} does not exist", fix)]
    base = existing_ancestor(path)
    if not base.is_dir():
        return [Check(name, False, f"{base} is not a directory", fix)]
    if not os.access(base, os.W_OK | os.X_OK):
        return [Check(name, False, f"{path} is not writable ({base} is read-only to you)", fix)]
    free = shutil.disk_usage(base).free
    return [Check(name, free >= need_bytes,
                  f"{path} writable, {free / GiB:.1f} GiB free, needs {need_bytes / GiB:.1f} GiB",
                  fix, blocking=need_bytes > 0 and free < need_bytes)]


def run_checks(inp: PlanInput, layout: Layout, options: VerifyOptions, processes: int,
               on_line: Callable[[str], None] | None = None) -> list[Check]:
    """Every preflight check for this run, in the order they print.

    The cheap checks come first: when one of them blocks, the ops are not built (a build can
    take minutes and the run could not start anyway)."""
    lock_checks = check_op_locks(worker_env(options, processes))
    smi_gpus = [] if options.cpu else query_gpus()
    gpu_checks = (check_gpus(inp, layout, processes, smi_gpus) if smi_gpus else [])
    host_checks = check_host(inp, layout, processes, options.cpu, options.emulate)
    dir_checks: list[Check] = []
    if "nvme" in (layout.offload_optimizer, layout.offload_param):
        mem = estimate_memory(inp, layout)
        dir_checks += check_writable_dir("nvme path", Path(options.nvme_path), mem.nvme_bytes,
                                         "mount the NVMe there or pass --nvme-path DIR",
                                         must_exist=True)
    out_dir = options.out_dir or Path.cwd() / "zlayout-verify"
    ckpt_dir = options.checkpoint_dir or Path(out_dir) / "checkpoint"
    need = checkpoint_bytes(inp) if options.restart_drill else 0
    dir_checks += check_writable_dir("checkpoint dir", Path(ckpt_dir), need,
                                     "pass --out DIR (or --checkpoint-dir DIR) on a writable file "
                                     "system with room")
    blocked = any(not c.ok and c.blocking for c in gpu_checks + host_checks + dir_checks)

    ops = ops_for(layout, options.cpu)
    build = ops if not blocked else []
    if build and on_line is not None:
        on_line(f"preflight: loading DeepSpeed ops {', '.join(build)} (built into the op cache "
                "the first time on a node: 1-2 min each)")
    version_check, facts = check_versions(options.python, options.cpu, build,
                                          worker_env(options, processes))
    checks: list[Check] = list(lock_checks)
    if options.cpu:
        checks.append(Check("gpus", True, "skipped: CPU mode (--cpu) runs on gloo, no GPU needed"))
    else:
        checks += gpu_checks or check_gpus(inp, layout, processes, gpus_from_torch(facts))
    checks.append(version_check)
    if facts:
        checks += check_arch_list(options, facts)
        checks += check_linear_attention_kernels(inp, facts)
        if ops and not build:
            checks.append(Check("deepspeed ops", False, f"{', '.join(ops)} not built",
                                "fix the FAIL lines first", blocking=False))
        else:
            checks += check_ops(ops, facts, options.cpu, options.python)
    return checks + host_checks + dir_checks
