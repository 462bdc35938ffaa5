#!/bin/bash
# Runs a verify batch on a one-GPU H200 machine (from the repo root; .whl/ holds DeepSpeed,
# pydantic and transformers with their needs). Usage: run.sh BATCH DEADLINE_S
# Records the host (GPU, cores, RAM, CPU model) beside the results.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 \
  TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/verify-out}; mkdir -p "$OUT"; name=$(basename "$1" .txt)
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  echo "cores $(nproc)"; grep -m1 "model name" /proc/cpuinfo; grep MemTotal /proc/meminfo
  echo "TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST-unset}"
  python3 -c "import torch, deepspeed, transformers; print(torch.__version__, deepspeed.__version__, transformers.__version__)"
} > "$OUT/$name-host.txt" 2>&1
cat "$OUT/$name-host.txt"
python3 -c "from transformers import AutoModelForCausalLM" || { echo "transformers does not import: stop"; exit 1; }
timeout -s TERM $(( $2 + 80 )) python3 -m zlayout verify --batch "$1" --out /tmp/$name --deadline "$2" \
  > "$OUT/$name.log" 2>&1
cp /tmp/$name/results.jsonl "$OUT/$name-results.jsonl"
tar czf "$OUT/$name-ranks.tgz" --exclude=checkpoint -C /tmp $name
echo "finished at ${SECONDS}s"; grep -h "^verify \|^  GPU peak alloc\|^  GPU device\|^  step time\|Error\|error" "$OUT/$name.log" | head -80
