"""The environment every rank (and the preflight's op build) runs with (no torch here).

It is the user's environment with four changes, each for a failure seen on real nodes:
- `TORCH_CUDA_ARCH_LIST` rewritten where DeepSpeed 0.19.8's op builder cannot parse it
  (`compute_capability_args` does `int()` on each minor version: Hopper images set `9.0a`
  for sm_90a kernels, and every JIT op build then dies with "invalid literal for int()");
- `OMP_NUM_THREADS` split across the ranks instead of torchrun's 1;
- the interpreter's own bin directory first on PATH (pip's ninja lives there: a JIT build
  under a venv that is not activated finds no ninja);
- zlayout importable by the ranks (PYTHONPATH) and never shadowed by a `zlayout/` folder in
  the current directory (PYTHONSAFEPATH=1, Python's -P), CPU mode pinned to gloo and no GPU.
`PYTORCH_CUDA_ALLOC_CONF` and everything else pass through unchanged.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from zlayout.messages import printable
from zlayout.verify.options import VerifyOptions

# PyTorch's architecture names (torch.utils.cpp_extension._get_cuda_arch_flags): DeepSpeed
# parses numbers only, so a name becomes the numbers PyTorch would have used.
NAMED_ARCHES = {
    "Kepler+Tesla": "3.7", "Kepler": "3.5+PTX", "Maxwell+Tegra": "5.3", "Maxwell": "5.0;5.2+PTX",
    "Pascal": "6.0;6.1+PTX", "Volta+Tegra": "7.2", "Volta": "7.0+PTX", "Turing": "7.5+PTX",
    "Ampere+Tegra": "8.7", "Ampere": "8.0;8.6+PTX", "Ada": "8.9+PTX", "Hopper": "9.0+PTX",
    "Blackwell+Tegra": "11.0", "Blackwell": "10.0;10.3;12.0;12.1+PTX",
}
_DEEPSPEED_ARCH = re.compile(r"^\d+\.\d+(\+PTX)?$")  # what compute_capability_args accepts
_SUFFIXED_ARCH = re.compile(r"^(\d+)\.(\d+)([a-z]+)(\+PTX)?$")  # 9.0a, 10.0f+PTX


def deepspeed_arch_list(value: str) -> tuple[str | None, list[str]]:
    """`value` in the form DeepSpeed 0.19.8 parses, and what was changed (empty: unchanged).

    Architecture-specific suffixes go (9.0a -> 9.0: DeepSpeed's ops use no sm_90a feature),
    +PTX stays, names become their numbers, anything else is dropped. None when nothing is
    left: the variable is then unset and DeepSpeed builds for the GPUs it sees."""
    tokens = [t for t in re.split(r"[;\s]+", value.strip()) if t]
    if tokens and all(_DEEPSPEED_ARCH.match(t) for t in tokens):
        return value, []
    fixed: list[str] = []
    changes: list[str] = []
    for token in tokens:
        if _DEEPSPEED_ARCH.match(token):
            new = [token]
        elif (m := _SUFFIXED_ARCH.match(token)):
            new = [f"{m.group(1)}.{m.group(2)}{m.group(4) or ''}"]
        elif token in NAMED_ARCHES:
            new = NAMED_ARCHES[token].split(";")
        else:
            new = []
        if new != [token]:
            changes.append(f"{token} -> {';'.join(new)}" if new else f"{token} dropped")
        fixed += [t for t in new if t not in fixed]
    return (";".join(fixed) or None), changes


def arch_list_note(original: str, corrected: str | None, changes: list[str]) -> str:
    target = f"TORCH_CUDA_ARCH_LIST={corrected}" if corrected else "TORCH_CUDA_ARCH_LIST unset"
    return (f"TORCH_CUDA_ARCH_LIST={original} is not parsed by DeepSpeed 0.19.8's op builder "
            f"({', '.join(changes)}); the ranks run with {target}")


def corrected_env(base: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """`base` with the corrections DeepSpeed needs, and one note per correction made."""
    env = dict(base)
    notes: list[str] = []
    arch = env.get("TORCH_CUDA_ARCH_LIST")
    if arch is not None and arch.strip():
        corrected, changes = deepspeed_arch_list(arch)
        if changes:
            notes.append(arch_list_note(arch, corrected, changes))
            if corrected is None:
                del env["TORCH_CUDA_ARCH_LIST"]
            else:
                env["TORCH_CUDA_ARCH_LIST"] = corrected
    return env, notes


def worker_env(options: VerifyOptions, processes: int = 1,
               base: dict[str, str] | None = None) -> dict[str, str]:
    """The ranks' environment (see the module docstring); notes via `worker_env_notes`."""
    env = dict(os.environ) if base is None else dict(base)
    # torchrun pins OMP_NUM_THREADS to 1 when it starts several workers: DeepSpeed's CPU Adam
    # (optimizer offload) would then run on one core per rank, 4x slower than a real job's.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // max(1, processes))))
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), root) if p)
    bin_dir = str(Path(options.python).parent)
    if bin_dir and bin_dir not in env.get("PATH", "").split(os.pathsep):
        env["PATH"] = os.pathsep.join(p for p in (bin_dir, env.get("PATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    # Python's -P for every process of the run (torchrun starts the ranks without it): the
    # current directory is not put first on sys.path, so a `zlayout/` folder there cannot run
    # in place of zlayout's worker. PYTHONPATH (above) still counts.
    env["PYTHONSAFEPATH"] = "1"
    env.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
    if options.cpu:
        env["DS_ACCELERATOR"] = "cpu"
        env["CUDA_VISIBLE_DEVICES"] = ""
    env.update(options.extra_env)
    return corrected_env(env)[0]


def worker_env_notes(options: VerifyOptions, base: dict[str, str] | None = None) -> list[str]:
    """What `worker_env` changed that the user should know (printed before the run)."""
    env = dict(os.environ) if base is None else dict(base)
    env.update(options.extra_env)
    return corrected_env(env)[1]


# flash-linear-attention's gated-delta-rule backward on Hopper (sm_90): Triton 3.4.0 up to 3.7.1
# computes its `chunk_bwd_dqkwg` kernel wrong (fla issue #640), and fla 0.6.0 raises there
# (fla/ops/common/chunk_o.py) unless its TileLang backend (the `tilelang` package and nvcc) takes
# the kernel. Measured: an H100 with torch 2.11.0+cu130's Triton 3.6.0 and fla 0.6.0 built
# Qwen3.5's engine (92 s) and stopped in the first backward (h200-2026-12-17, results-h100-call2).
FLA_HOPPER_BAD_TRITON = ((3, 4, 0), (3, 7, 1))  # [from, to)


def _version_tuple(version: str) -> tuple[int, ...] | None:
    found = re.match(r"^(\d+)\.(\d+)(?:\.(\d+))?", version.strip())
    return tuple(int(part or 0) for part in found.groups()) if found else None


def triton_and_tilelang() -> tuple[str | None, bool]:
    """The installed Triton's version (read from its metadata: importing triton starts its driver)
    and whether tilelang is importable, as fla_hopper_refusal takes them."""
    import importlib.metadata
    import importlib.util

    try:
        triton = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        triton = None
    return triton, importlib.util.find_spec("tilelang") is not None


def fla_hopper_refusal(capability_majors: list[int], triton: str | None, tilelang: bool) -> str | None:
    """One line where flash-linear-attention's gated backward cannot train on these GPUs with this
    Triton (FLA_HOPPER_BAD_TRITON), None where it can or the node has no Hopper GPU."""
    version = _version_tuple(triton) if triton else None
    low, high = FLA_HOPPER_BAD_TRITON
    if 9 not in capability_majors or version is None or not low <= version < high or tilelang:
        return None
    return (f"flash-linear-attention's gated-delta-rule backward does not run on Hopper GPUs (sm_90) with "
            f"Triton {printable(triton)} (fla issue #640: Triton {'.'.join(map(str, low))} up to {'.'.join(map(str, high))} "
            "computes it wrong, and fla raises in the first backward): install tilelang (`pip install tilelang`, "
            "it needs nvcc), which fla runs that kernel with instead, or a torch built with Triton "
            f"{'.'.join(map(str, high))} or later")
