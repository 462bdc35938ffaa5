"""The preflight's probe: run in a subprocess with the ranks' environment, never imported by
the planner (it imports torch and deepspeed).

    python -m zlayout.verify.probe [--ops fused_adam,cpu_adam,async_io]

Prints one line `ZLAYOUT_PROBE {json}`: torch/deepspeed/CUDA versions and the GPUs torch sees;
when TORCH_CUDA_ARCH_LIST is set, what DeepSpeed's own `compute_capability_args` makes of it
(the parse that failed on Hopper nodes with `9.0a`); with --ops, the toolchain (ninja, nvcc)
and each op built or loaded through DeepSpeed's op cache, timed, so the ranks find it built.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import traceback
from typing import Any

MARKER = "ZLAYOUT_PROBE "
OP_BUILDERS = {"fused_adam": "FusedAdamBuilder", "cpu_adam": "CPUAdamBuilder",
               "async_io": "AsyncIOBuilder", "shm_comm": "ShareMemCommBuilder"}


def versions() -> dict[str, Any]:
    import deepspeed
    import torch

    from zlayout.verify.environment import triton_and_tilelang

    count = torch.cuda.device_count()
    triton, tilelang = triton_and_tilelang()
    return {"torch": torch.__version__, "deepspeed": deepspeed.__version__,
            "cuda": torch.version.cuda, "cuda_devices": count,
            "cuda_names": [torch.cuda.get_device_name(i) for i in range(count)],
            "cuda_total_bytes": [torch.cuda.get_device_properties(i).total_memory
                                 for i in range(count)],
            "cuda_capability_majors": [torch.cuda.get_device_capability(i)[0] for i in range(count)],
            "triton": triton, "tilelang": tilelang}


def arch_parse(value: str) -> dict[str, Any]:
    """DeepSpeed's parse of TORCH_CUDA_ARCH_LIST, in ahead-of-time and JIT mode, as the op
    builds will run it (it needs no GPU)."""
    from deepspeed.ops.op_builder.fused_adam import FusedAdamBuilder

    builder = FusedAdamBuilder()
    try:
        builder.jit_mode = False
        gencode = builder.compute_capability_args()
        builder.jit_mode = True
        builder.compute_capability_args()
        return {"value": value, "ok": True, "gencode": gencode,
                "deepspeed_list": os.environ.get("TORCH_CUDA_ARCH_LIST")}
    except Exception as exc:  # noqa: BLE001 - the failure is the finding
        return {"value": value, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
    finally:
        os.environ["TORCH_CUDA_ARCH_LIST"] = value  # compute_capability_args rewrites it


def toolchain() -> dict[str, Any]:
    from torch.utils import cpp_extension

    facts: dict[str, Any] = {"ninja": cpp_extension.is_ninja_available(),
                             "cuda_home": cpp_extension.CUDA_HOME, "nvcc_cuda": None}
    if cpp_extension.CUDA_HOME:
        try:
            out = subprocess.run([os.path.join(cpp_extension.CUDA_HOME, "bin", "nvcc"), "-V"],
                                 capture_output=True, text=True, timeout=60).stdout
            found = re.search(r"release (\d+\.\d+)", out)
            facts["nvcc_cuda"] = found.group(1) if found else None
        except (OSError, subprocess.SubprocessError):
            pass
    return facts


def build_op(name: str) -> dict[str, Any]:
    """Build (first time on a node) or load (op cache warm) one op, as DeepSpeed will."""
    import deepspeed.ops.op_builder as op_builder
    from deepspeed.git_version_info import installed_ops

    result: dict[str, Any] = {"name": name, "prebuilt": bool(installed_ops.get(name))}
    builder_class = getattr(op_builder, OP_BUILDERS[name], None)
    started = time.time()
    if name == "shm_comm":  # what deepspeed.comm builds at start-up on CPU (build_shm_op)
        import deepspeed.ops
        from deepspeed.accelerator import get_accelerator

        shm = get_accelerator().create_op_builder(OP_BUILDERS[name])
        if shm is None or not deepspeed.ops.__compatible_ops__.get(shm.NAME, False):
            return {**result, "ok": True, "skipped": True, "load_s": 0.0}
        builder_class = type(shm)
    try:
        if builder_class is None:
            raise RuntimeError(f"DeepSpeed has no {OP_BUILDERS[name]} for this accelerator")
        builder_class().load(verbose=False)
        result["ok"] = True
    except BaseException as exc:  # noqa: BLE001 - SystemExit from a build is a failure too
        result["ok"] = False
        result["error"] = f"{type(exc).__name__}: {exc}"[-1500:]
        result["traceback"] = traceback.format_exc()[-2000:]
    result["load_s"] = round(time.time() - started, 3)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zlayout.verify.probe")
    parser.add_argument("--ops", default="", help="comma-separated: " + ", ".join(OP_BUILDERS))
    args = parser.parse_args(argv)
    facts = versions()
    arch = os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip()
    if arch:
        facts["arch"] = arch_parse(arch)
    ops = [op for op in args.ops.split(",") if op]
    if ops:
        facts["toolchain"] = toolchain()
        facts["ops"] = [build_op(op) for op in ops]
    sys.stdout.flush()
    print(MARKER + json.dumps(facts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
