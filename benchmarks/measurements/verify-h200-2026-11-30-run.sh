#!/bin/bash
# The H200 verification batch of 2026-11-30 (run from the repo root on a 2x H200 machine;
# .whl/ holds DeepSpeed and pydantic wheels for the offline GPU machine). Lanes a and b run
# one-GPU layouts side by side (one per GPU), lane c the two-GPU layouts after them.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 NCCL_NVLS_ENABLE=0 \
  TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/verify-out}; mkdir -p "$OUT"; M=benchmarks/measurements/verify-h200-2026-11-30
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/nvidia-smi.txt"
CUDA_VISIBLE_DEVICES=0 timeout -s TERM ${LANE_S:-250} python3 -m zlayout verify --batch $M-lane-a.txt \
  --out /tmp/v/a --deadline $(( ${LANE_S:-250} - 80 )) > "$OUT/lane-a.log" 2>&1 &
CUDA_VISIBLE_DEVICES=1 timeout -s TERM ${LANE_S:-250} python3 -m zlayout verify --batch $M-lane-b.txt \
  --out /tmp/v/b --deadline $(( ${LANE_S:-250} - 100 )) > "$OUT/lane-b.log" 2>&1 &
wait
LEFT=$(( ${TOTAL_S:-480} - SECONDS ))
echo "lanes a+b done at ${SECONDS}s; lane c gets ${LEFT}s"
timeout -s TERM $LEFT python3 -m zlayout verify --batch $M-lane-c.txt --out /tmp/v/c \
  --deadline $(( LEFT - 90 )) > "$OUT/lane-c.log" 2>&1
cat /tmp/v/*/results.jsonl > "$OUT/results.jsonl"; cat /tmp/v/*/reference.jsonl > "$OUT/reference.jsonl"
echo "finished at ${SECONDS}s"; grep -h "^verify \|^  GPU peak alloc\|^  step time\|drill" "$OUT"/lane-*.log
