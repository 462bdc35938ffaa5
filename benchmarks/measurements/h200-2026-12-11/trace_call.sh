#!/bin/bash
# Allocator traces (no stacks) of three Falcon rows of this folder, each as rank 0 of its emulated world:
# the checkpointed Falcon-180B-L2 (batch n3 line 2, +24.4%), the checkpointed Falcon-40B-L4 (batch n line 2)
# and h200-2026-12-10's Falcon-40B-L3 (batch m). Run after `device_call.sh setup-gpu` in the same call.
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
  NVSHMEM_DISABLE_NVLS=1 HF_HUB_OFFLINE=1
F=benchmarks/measurements/h200-2026-12-11
M=benchmarks/measurements/h200-2026-12-10
trace() {  # name world cards args...
  local name=$1 world=$2 cards=$3; shift 3
  ZLAYOUT_CARDS_DIR=$PWD/$cards OUT=$OUT timeout 170 python benchmarks/measurements/tools/allocator_trace.py \
    --name $name --emulate-world $world -- "$@" > $OUT/$name.log 2>&1
  echo "$name rc=$? at ${SECONDS}s"; tail -3 $OUT/$name.log; }
trace trace-n3-2-falcon-180b-ckpt 8 $F/heldout/cards --hf-config $F/heldout/configs/falcon-180b-L2.json --stage 3 \
  --checkpointing full --seq 4096 --micro-batch 1 --gpus-per-node 8 --gpu h200 --loop trainer
trace trace-n-2-falcon-40b-ckpt 4 $F/heldout/cards --hf-config $F/heldout/configs/falcon-40b-L4.json --stage 3 \
  --checkpointing full --seq 4096 --micro-batch 2 --gpus-per-node 4 --gpu h200 --loop trainer
trace trace-m-1-falcon-40b 8 $M/heldout/cards --hf-config $M/heldout/configs/falcon-40b-L3.json --stage 3 \
  --seq 2048 --micro-batch 2 --gpus-per-node 8 --gpu h200 --loop deepspeed
