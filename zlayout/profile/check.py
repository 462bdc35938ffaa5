"""The pre-run checklist: does this machine match the profile, right now?

Reads the machine through `nvidia-smi` (never torch: this runs on login and compute nodes
before anything heavy is installed or imported), /proc/meminfo, the NVMe path and the
checkpoint directory. Each check is one line with a verdict and what to do about a failure.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from zlayout.profile.schema import Profile
from zlayout.profile.summary import free_gpu_memory_needed, gib

Verdict = Literal["pass", "fail", "warn", "skip"]
MiB = 2**20
GPU_MEMORY_TOLERANCE = 0.03
HOST_RAM_TOLERANCE = 0.05  # MemTotal is a little below the DIMMs' size (kernel, firmware reservations)  # nvidia-smi's memory.total differs a little between SKUs and drivers
NVIDIA_SMI_QUERY = ["--query-gpu=name,memory.total,memory.free,driver_version", "--format=csv,noheader"]


@dataclass(frozen=True, slots=True)
class GpuInfo:
    name: str
    memory_total_bytes: int
    memory_free_bytes: int
    driver: str | None = None


@dataclass(frozen=True, slots=True)
class CheckItem:
    name: str
    verdict: Verdict
    detail: str


class NoGpus(Exception):
    """nvidia-smi is missing or failed; the message says which."""


def query_gpus(nvidia_smi: str | None = None, timeout_s: float = 20.0) -> list[GpuInfo]:
    """The GPUs this process would see (CUDA_VISIBLE_DEVICES applied), via nvidia-smi."""
    exe = nvidia_smi or shutil.which("nvidia-smi")
    if exe is None:
        raise NoGpus("nvidia-smi not found: no NVIDIA driver on this machine (a login node?); "
                     "run `zlayout check` on a GPU node, e.g. through srun")
    try:
        done = subprocess.run([exe, *NVIDIA_SMI_QUERY], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NoGpus(f"nvidia-smi failed to run: {exc}") from None
    if done.returncode != 0:
        message = (done.stderr or done.stdout).strip().splitlines()
        raise NoGpus(f"nvidia-smi failed (exit {done.returncode}): {message[0] if message else 'no output'}")
    gpus = []
    for line in done.stdout.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        try:
            total = float(re.sub(r"[^0-9.]", "", parts[1]))
            free = float(re.sub(r"[^0-9.]", "", parts[2]))
        except (IndexError, ValueError):
            raise NoGpus(f"cannot read nvidia-smi's output line {line!r}") from None
        driver = parts[3] if len(parts) > 3 and parts[3] else None
        gpus.append(GpuInfo(parts[0], int(total * MiB), int(free * MiB), driver))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and all(p.strip().isdigit() for p in visible.split(",") if p.strip()):
        indices = [int(p) for p in visible.split(",") if p.strip()]
        gpus = [gpus[i] for i in indices if i < len(gpus)]
    return gpus


def _compact(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def gpu_matches(profile: Profile, gpu: GpuInfo) -> bool:
    """Same GPU model: the profile's name in nvidia-smi's and the memory within a few percent."""
    spec = profile.inputs.hardware.gpu
    model = _compact(spec.name.split("-")[0])
    same_memory = abs(gpu.memory_total_bytes - spec.memory_bytes) <= GPU_MEMORY_TOLERANCE * spec.memory_bytes
    return same_memory and model in _compact(gpu.name)


def _meminfo() -> dict[str, int]:
    out = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            fields = rest.split()
            if fields and fields[0].isdigit():
                out[key] = int(fields[0]) * 1024
    except OSError:
        pass
    return out


def check_gpus(profile: Profile, gpus: list[GpuInfo]) -> list[CheckItem]:
    hw = profile.inputs.hardware
    need = hw.gpus_per_node
    items = []
    if not gpus:
        return [CheckItem("GPUs visible", "fail", "nvidia-smi lists no GPU (check CUDA_VISIBLE_DEVICES)")]
    if len(gpus) < need:
        items.append(CheckItem("GPUs visible", "fail",
                               f"{len(gpus)} visible, the profile runs {need} per node: "
                               "ask for a full node (e.g. --gpus-per-node) or re-plan with "
                               f"--gpus-per-node {len(gpus)} and re-export"))
    else:
        extra = f" (the launch scripts use {need} of them)" if len(gpus) > need else ""
        items.append(CheckItem("GPUs visible", "pass", f"{len(gpus)} x {gpus[0].name}{extra}"))
    wrong = [g for g in gpus[:need] if not gpu_matches(profile, g)]
    if wrong:
        items.append(CheckItem("GPU model", "fail",
                               f"the profile is for {hw.gpu.name} ({gib(hw.gpu.memory_bytes)}), this machine has "
                               f"{wrong[0].name} ({gib(wrong[0].memory_total_bytes)}): re-plan with "
                               "--gpu for this machine and re-export, or run on the profile's hardware"))
    else:
        validated = profile.verification.gpus
        note = f"; validated on {validated}" if validated else ""
        items.append(CheckItem("GPU model", "pass", f"matches {hw.gpu.name}{note}"))
    need_bytes = free_gpu_memory_needed(profile)
    short = [(i, g) for i, g in enumerate(gpus[:need]) if g.memory_free_bytes < need_bytes]
    if short:
        i, g = short[0]
        items.append(CheckItem("GPU free memory", "fail",
                               f"GPU {i} has {gib(g.memory_free_bytes)} free, the run needs {gib(need_bytes)} "
                               "(the least its peak runs in): another process holds memory, see `nvidia-smi`"))
    else:
        least = min(g.memory_free_bytes for g in gpus[:need])
        items.append(CheckItem("GPU free memory", "pass",
                               f"at least {gib(least)} free on each GPU, the run needs {gib(need_bytes)} "
                               "(the least its peak runs in)"))
    return items


def _host_advice(profile: Profile) -> str:
    """What to change, from the host term that is largest."""
    terms = [t for t in profile.prediction.terms if t.where == "host"]
    largest = max(terms, key=lambda t: t.bytes, default=None)
    if largest is not None and largest.name == "model_construction":
        return ("the training script builds the model in fp32 on the host on every rank "
                f"({gib(largest.bytes)} per node): build it under deepspeed.zero.Init, in bf16 on the GPU "
                "or on the meta device (re-plan with --init zero-init|bf16-gpu|meta)")
    return "free memory, or choose a layout with less offload"


def check_host(profile: Profile, meminfo: dict[str, int] | None = None) -> CheckItem:
    info = _meminfo() if meminfo is None else meminfo
    need = profile.alerts.host_memory.peak_bytes
    available = info.get("MemAvailable")
    if available is None:
        return CheckItem("host memory", "skip", "cannot read /proc/meminfo")
    if available < need:
        return CheckItem("host memory", "fail",
                         f"{gib(available)} available of {gib(info.get('MemTotal', 0))}, the run needs {gib(need)} "
                         f"per node: {_host_advice(profile)}")
    planned, total = profile.inputs.hardware.host_ram_bytes, info.get("MemTotal")
    if total is not None and total < planned * (1 - HOST_RAM_TOLERANCE):
        source = "assumed (not given at export)" if profile.host_ram_source == "assumed" else "given at export"
        return CheckItem("host memory", "warn",
                         f"{gib(available)} available, the run needs {gib(need)} per node; this node has "
                         f"{gib(total)} in all where the profile's host RAM is {gib(planned)}, {source}: re-export "
                         f"with --host-ram-gib {total / 2**30:.0f} so the host figures and alerts are this node's")
    return CheckItem("host memory", "pass", f"{gib(available)} available, the run needs {gib(need)} per node")


def check_nvme(profile: Profile) -> CheckItem | None:
    layout = profile.layout
    if "nvme" not in (layout.offload_optimizer, layout.offload_param):
        return None
    path = Path(profile.run.nvme_path)
    if not path.is_dir():
        return CheckItem("NVMe offload path", "fail",
                         f"{path} does not exist: mount the NVMe there or re-export with --nvme-path")
    if not os.access(path, os.W_OK):
        return CheckItem("NVMe offload path", "fail", f"{path} is not writable by this user")
    free = shutil.disk_usage(path).free
    need = profile.prediction.nvme_bytes
    if free < need:
        return CheckItem("NVMe offload path", "fail", f"{path} has {gib(free)} free, the run writes {gib(need)}")
    return CheckItem("NVMe offload path", "pass", f"{path}: {gib(free)} free, the run writes {gib(need)}")


def _latest_checkpoint(directory: Path) -> Path | None:
    """DeepSpeed writes the newest tag into `latest`; else the newest subdirectory."""
    latest = directory / "latest"
    if latest.is_file():
        tag = latest.read_text().strip()
        return directory / tag
    candidates = [p for p in directory.iterdir() if p.is_dir() and any(p.glob("*.pt"))]
    return max(candidates, key=lambda p: p.stat().st_mtime) if candidates else None


def _readable(path: Path, probe_bytes: int = 1 << 20) -> str | None:
    """None when the file can be opened and its first and last MiB read; else the reason."""
    try:
        size = path.stat().st_size
        if size == 0:
            return "empty"
        with path.open("rb") as handle:
            handle.read(probe_bytes)
            handle.seek(max(0, size - probe_bytes))
            handle.read(probe_bytes)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def check_checkpoint(profile: Profile, checkpoint_dir: str | None = None) -> CheckItem | None:
    directory = checkpoint_dir or profile.run.checkpoint_dir
    if not directory:
        return None
    root = Path(directory)
    if not root.is_dir():
        return CheckItem("last checkpoint", "fail",
                         f"checkpoint directory {root} does not exist (not mounted?): create it or fix run.checkpoint_dir")
    try:
        tag_dir = _latest_checkpoint(root)
    except OSError as exc:
        return CheckItem("last checkpoint", "fail", f"cannot read {root}: {exc.strerror or exc}")
    if tag_dir is None:
        return CheckItem("last checkpoint", "pass", f"no checkpoint in {root} yet: the job starts from scratch")
    if not tag_dir.is_dir():
        return CheckItem("last checkpoint", "fail",
                         f"{root / 'latest'} names {tag_dir.name}, which is missing: the last save was cut short; "
                         "point `latest` at the previous tag")
    files = sorted(p for p in tag_dir.rglob("*") if p.is_file())
    if not files:
        return CheckItem("last checkpoint", "fail", f"{tag_dir} is empty: the last save was cut short")
    for f in files:
        problem = _readable(f)
        if problem:
            return CheckItem("last checkpoint", "fail", f"{f} is not readable ({problem})")
    model_states = [f for f in files if f.name.endswith("model_states.pt")]
    if not model_states:
        return CheckItem("last checkpoint", "fail",
                         f"{tag_dir} has no *model_states.pt: not a DeepSpeed checkpoint, or the save was cut short")
    optim = [f for f in files if f.name.endswith("optim_states.pt")]
    world = profile.inputs.hardware.world
    if profile.layout.stage >= 1 and optim and len(optim) != world:
        return CheckItem("last checkpoint", "warn",
                         f"{tag_dir.name}: written by {len(optim)} ranks, this profile runs {world}: "
                         "resuming at a different world size needs DeepSpeed's universal checkpoint conversion")
    total = sum(f.stat().st_size for f in files)
    return CheckItem("last checkpoint", "pass", f"{tag_dir} readable: {len(files)} files, {gib(total)}")


def check_driver(profile: Profile, gpus: list[GpuInfo] | None) -> CheckItem | None:
    """The driver the profile was verified with against this node's: a different driver (and the
    CUDA runtime it brings) can move the CUDA context and NCCL buffers, so it is a warning."""
    verified = profile.verification.driver
    here = next((g.driver for g in gpus or [] if g.driver), None)
    if not verified or not here:
        return None
    if here == verified:
        return CheckItem("driver", "pass", f"{here}, as verified")
    return CheckItem("driver", "warn", f"{here} here, verified with {verified}: re-run `zlayout verify` "
                                       "to confirm the memory figures on this driver")


def run_checks(profile: Profile, gpus: list[GpuInfo] | None = None, no_gpu_reason: str | None = None,
               meminfo: dict[str, int] | None = None, checkpoint_dir: str | None = None) -> list[CheckItem]:
    """Every check, in the order a person reads them. `gpus` None means nvidia-smi gave nothing."""
    items: list[CheckItem] = []
    if gpus is None:
        items.append(CheckItem("GPUs visible", "fail", no_gpu_reason or "no NVIDIA GPU on this machine"))
    else:
        items.extend(check_gpus(profile, gpus))
    items.append(check_host(profile, meminfo))
    for extra in (check_driver(profile, gpus), check_nvme(profile), check_checkpoint(profile, checkpoint_dir)):
        if extra is not None:
            items.append(extra)
    status = profile.verification.status
    if status == "validated":
        items.append(CheckItem("profile verified", "pass", "validated by a real run"))
    elif status == "unverified":
        items.append(CheckItem("profile verified", "warn",
                               "unverified: figures are predictions; run `zlayout verify` first"))
    elif status == "mismatch":
        items.append(CheckItem("profile verified", "warn",
                               "ran, but measured memory is off the prediction: alerts follow the measurement"))
    elif status == "cpu-ok":
        items.append(CheckItem("profile verified", "warn",
                               "only run on CPU: GPU memory not measured; run `zlayout verify` on GPUs"))
    else:
        items.append(CheckItem("profile verified", "fail",
                               f"the verification run ended {status}: re-plan before launching"))
    return items
