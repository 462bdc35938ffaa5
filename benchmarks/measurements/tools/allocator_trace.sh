#!/bin/bash
# Allocator traces of the layouts the replay misses most (benchmarks/measurements/tools/allocator_trace.py), on one
# H200, from the repo root with torch + DeepSpeed importable (as h200-2026-12-01-run.sh sets up:
# PYTHONPATH=/tmp/site:$PWD). About 3 minutes. Writes $OUT/<name>.json, each well under 16 MiB.
# Bring them back to benchmarks/measurements/h200-2026-12-01b/traces/.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/allocator-trace}; export OUT; mkdir -p "$OUT"
H200="--gpus-per-node 1 --gpu h200"
run() { name=$1; shift
  timeout -s TERM 75 torchrun --standalone --nproc_per_node 1 benchmarks/measurements/tools/allocator_trace.py --name "$name" -- "$@" $H200 \
    > "$OUT/$name.log" 2>&1; echo "$name rc=$? $(grep -h '^TRACE' "$OUT/$name.log")"; }
# ZeRO-3, optimizer and weights on the CPU: reserved 12.33 GiB measured, 8.83 modelled (fetch buffers?)
run z3-opt-param-cpu --stage 3 --offload-optimizer cpu --offload-param cpu --layers 8 --hidden 4096 --heads 32 --ffn 16384 --vocab 32000 --mlp gelu --norm layernorm --seq 2048 --micro-batch 2
# ZeRO-0 zlayout, the one stage-0 row the replay misses: 48.66 measured, 43.97 replayed (a 5th 4P segment)
run z0-L16-h2048 --stage 0 --layers 16 --hidden 2048 --heads 32 --kv-heads 8 --ffn 8192 --vocab 128256 --mlp swiglu --norm rmsnorm --no-bias --tie-embeddings --seq 4096 --micro-batch 2
# ZeRO-2 with checkpointing: 53.63 measured, 58.09 replayed (recompute order)
run z2-ckpt-L16-h3072 --stage 2 --checkpointing full --layers 16 --hidden 3072 --heads 24 --kv-heads 8 --ffn 8192 --vocab 128256 --mlp swiglu --norm rmsnorm --no-bias --seq 4096 --micro-batch 2
ls -la "$OUT"
