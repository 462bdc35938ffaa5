#!/bin/bash
# 2026-12-01, second session, call 4 on one H200 (16 cores): the held-out line call 3 skipped,
# then the two allocator traces that failed in call 2 on the node's TORCH_CUDA_ARCH_LIST=9.0a
# (benchmarks/measurements/tools/allocator_trace.py now applies verify's correction itself).
bash benchmarks/measurements/h200-2026-12-01-run.sh benchmarks/measurements/h200-2026-12-01b/heldout2-rest.txt 60
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
  NVSHMEM_DISABLE_NVLS=1 HF_HUB_OFFLINE=1
T=/tmp/traces; mkdir -p $T
trace() { name=$1; shift; left=$(( 285 - SECONDS )); [ $left -gt 40 ] || { echo "$name: no time left"; return; }
  OUT=$T timeout -s TERM $left torchrun --standalone --nproc_per_node 1 benchmarks/measurements/tools/allocator_trace.py --name "$name" -- "$@" \
    --gpus-per-node 1 --gpu h200 > "$T/$name.log" 2>&1; echo "$name rc=$? $(grep -h '^TRACE' "$T/$name.log")"; }
trace z2-ckpt-L16-h3072 --stage 2 --checkpointing full --layers 16 --hidden 3072 --heads 24 --kv-heads 8 --ffn 8192 --vocab 128256 --mlp swiglu --norm rmsnorm --no-bias --seq 4096 --micro-batch 2
trace z0-L16-h2048 --stage 0 --layers 16 --hidden 2048 --heads 32 --kv-heads 8 --ffn 8192 --vocab 128256 --mlp swiglu --norm rmsnorm --no-bias --tie-embeddings --seq 4096 --micro-batch 2
tar czf "$OUT/traces.tgz" -C /tmp traces
echo "call 4 finished at ${SECONDS}s"
