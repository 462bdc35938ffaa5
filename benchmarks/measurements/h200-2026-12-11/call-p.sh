#!/bin/bash
# Seventeenth session, call 1: held-out batch p (predicted at 9e11a13, predictions-p.jsonl), then allocator
# traces (no stacks) of its two rows as rank 0 of 8 emulated, for the replay's ZeRO-3 gathers on nn.Linear
# models (the head prefetch, record_stream reuse). Run from the repo root with .whl carried.
F=benchmarks/measurements/h200-2026-12-11
DEADLINE=${DEADLINE:-580} bash benchmarks/measurements/tools/device_call.sh setup-gpu fam:$F/batch-heldout-p.txt
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
  NVSHMEM_DISABLE_NVLS=1 HF_HUB_OFFLINE=1
trace() {  # name world args...
  local name=$1 world=$2; shift 2
  [ $SECONDS -lt 440 ] || { echo "$name: no time left"; return; }
  ZLAYOUT_CARDS_DIR=$PWD/$F/heldout/cards OUT=$OUT timeout 120 python benchmarks/measurements/tools/allocator_trace.py \
    --name $name --emulate-world $world -- "$@" > $OUT/$name.log 2>&1
  echo "$name rc=$? at ${SECONDS}s"; tail -3 $OUT/$name.log; }
trace trace-p-1-llama3-8b 8 --hf-config $F/heldout/configs/llama3-8b-L8.json --stage 3 --seq 4096 --micro-batch 2 \
  --gpus-per-node 8 --gpu h200 --loop deepspeed
trace trace-p-2-qwen2.5-1.5b 8 --hf-config $F/heldout/configs/qwen2.5-1.5b.json --stage 3 --seq 4096 --micro-batch 4 \
  --gpus-per-node 8 --gpu h200 --loop trainer
ls -la $OUT
