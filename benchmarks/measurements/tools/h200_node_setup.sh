#!/bin/bash
# Sourced by the scripts that run on the one-GPU H200 device machine, from the repo root:
# installs the carried wheels (.whl/: DeepSpeed, pydantic, transformers and their needs) into
# /tmp/site, sets the environment the runs share, and records the host (GPU, cores, RAM, CPU
# model, versions) in $OUT/$1-host.txt. Stops the caller if transformers does not import.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 \
  TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/verify-out}; mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  echo "cores $(nproc)"; grep -m1 "model name" /proc/cpuinfo; grep MemTotal /proc/meminfo
  echo "TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST-unset}"
  python3 -c "import torch, deepspeed, transformers; print(torch.__version__, deepspeed.__version__, transformers.__version__)"
} > "$OUT/$1-host.txt" 2>&1
cat "$OUT/$1-host.txt"
python3 -c "from transformers import AutoModelForCausalLM" || { echo "transformers does not import: stop"; exit 1; }
