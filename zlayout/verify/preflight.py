"""Preflight: can this node run the layout? Checked before any rank starts.

Each check prints one line, pass or fail, with the number and, on failure, what to do.
Blocking failures (no GPUs, torch/deepspeed missing, a directory that cannot be written)
stop the verification; the memory checks only warn, since the run itself is the real test
(an out-of-memory is then reported as `does-not-fit`). The planner process never imports
torch: GPUs come from `nvidia-smi`, versions from a short `python -c` subprocess.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zlayout.core.memory import estimate_memory
from zlayout.spec import GiB, Layout, PlanInput

if TYPE_CHECKING:
    from zlayout.verify.launcher import VerifyOptions

VERSIONS_SNIPPET = (
    "import json, torch, deepspeed; "
    "print(json.dumps({'torch': torch.__version__, 'deepspeed': deepspeed.__version__, "
    "'cuda': torch.version.cuda, 'cuda_devices': torch.cuda.device_count(), "
    "'cuda_names': [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())], "
    "'cuda_total_bytes': [torch.cuda.get_device_properties(i).total_memory "
    "for i in range(torch.cuda.device_count())]}))"
)


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

    def line(self) -> str:
        mark = "PASS" if self.ok else ("FAIL" if self.blocking else "WARN")
        text = f"preflight {mark} {self.name}: {self.detail}"
        return f"{text} -> {self.fix}" if not self.ok and self.fix else text

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


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


def check_versions(python: str, cpu: bool, timeout_s: float = 180.0) -> tuple[Check, dict[str, Any]]:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), root) if p)
    if cpu:
        env["DS_ACCELERATOR"] = "cpu"
    try:
        proc = subprocess.run([python, "-c", VERSIONS_SNIPPET], capture_output=True, text=True,
                              timeout=timeout_s, env=env)
    except (OSError, subprocess.SubprocessError) as exc:
        return Check("torch+deepspeed", False, f"could not run {python}: {exc}",
                     "install them: pip install 'zlayout[verify]' (torch, deepspeed==0.19.8)"), {}
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode != 0 or not lines:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return Check("torch+deepspeed", False, f"not importable with {python}: {last}",
                     "install them: pip install 'zlayout[verify]' (torch, deepspeed==0.19.8)"), {}
    facts = json.loads(lines[-1])
    ok = facts.get("deepspeed") == "0.19.8"
    detail = f"torch {facts['torch']} (CUDA {facts.get('cuda')}), deepspeed {facts['deepspeed']}"
    fix = "" if ok else "the memory model follows DeepSpeed 0.19.8: pip install deepspeed==0.19.8"
    return Check("torch+deepspeed", True, detail, fix) if ok else \
        Check("torch+deepspeed", False, detail, fix, blocking=False), facts


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
    need = mem.gpu_device_used_bytes
    checks.append(Check(
        "gpu memory", least_free >= need,
        f"{least_free / GiB:.1f} GiB free on the fullest GPU, predicted use "
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


def check_host(inp: PlanInput, layout: Layout, processes: int) -> list[Check]:
    mem = estimate_memory(inp, layout)
    checks = []
    available = host_available_bytes()
    if available is None:
        checks.append(Check("host ram", True, "/proc/meminfo unreadable; not checked"))
    else:
        checks.append(Check(
            "host ram", available >= mem.host_peak_bytes,
            f"{available / GiB:.1f} GiB available, predicted host peak {mem.host_peak_bytes / GiB:.1f} GiB",
            "free host memory, use fewer processes per node, or offload to NVMe", blocking=False))
    offloaded = layout.offload_optimizer != "gpu" or layout.offload_param != "gpu"
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


def check_writable_dir(name: str, path: Path, need_bytes: int, fix: str,
                       create: bool = True) -> list[Check]:
    if create:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return [Check(name, False, f"cannot create {path}: {exc.strerror}", fix)]
    if not path.is_dir():
        return [Check(name, False, f"{path} does not exist", fix)]
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".zlayout-probe-"):
            pass
    except OSError as exc:
        return [Check(name, False, f"{path} is not writable: {exc.strerror}", fix)]
    free = shutil.disk_usage(path).free
    return [Check(name, free >= need_bytes,
                  f"{path} writable, {free / GiB:.1f} GiB free, needs {need_bytes / GiB:.1f} GiB",
                  fix, blocking=need_bytes > 0 and free < need_bytes)]


def checkpoint_bytes(inp: PlanInput) -> int:
    """bf16 weights + fp32 master weights and two Adam moments: what save_checkpoint writes."""
    return 14 * inp.model.params


def run_checks(inp: PlanInput, layout: Layout, options: "VerifyOptions",
               processes: int) -> list[Check]:
    """Every preflight check for this run, in the order they print."""
    checks: list[Check] = []
    version_check, facts = check_versions(options.python, options.cpu)
    if options.cpu:
        checks.append(Check("gpus", True, "skipped: CPU mode (--cpu) runs on gloo, no GPU needed"))
    else:
        checks += check_gpus(inp, layout, processes, query_gpus() or gpus_from_torch(facts))
    checks.append(version_check)
    checks += check_host(inp, layout, processes)
    if "nvme" in (layout.offload_optimizer, layout.offload_param):
        mem = estimate_memory(inp, layout)
        checks += check_writable_dir("nvme path", Path(options.nvme_path), mem.nvme_bytes,
                                     "mount the NVMe there or pass --nvme-path DIR", create=False)
    ckpt_dir = options.checkpoint_dir or Path(options.out_dir or ".") / "checkpoint"
    need = checkpoint_bytes(inp) if options.restart_drill else 0
    checks += check_writable_dir("checkpoint dir", Path(ckpt_dir), need,
                                 "pass --out DIR on a writable file system with room")
    return checks
