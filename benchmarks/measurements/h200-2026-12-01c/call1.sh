#!/bin/bash
# Diagnostics for the step-time and allocator models on one H200 (16 cores), written 2026-12-01
# when this session had no device time left (not yet run): one call, about 9 minutes.
# 1. torch.profiler of the step-time model's worst layouts (benchmarks/measurements/tools/steptime_profile.py), one at a
#    time: is each phase bound by the GPU or by the host (ZeRO-3's hooks, launches)? (issue 13)
# 2. allocator traces (benchmarks/measurements/tools/allocator_trace.py) of the device-used rows the replay misses most,
#    two at a time (each trace's own reserved and segments are per process; its device_used_bytes
#    is not, with two processes on the card) (issue 11).
source benchmarks/measurements/tools/h200_node_setup.sh diagnostics
P=/tmp/profiles; T=/tmp/traces; mkdir -p $P $T
s=$SECONDS
python3 -c "from zlayout.verify.environment import corrected_env as c; import os; os.environ.update(c(dict(os.environ))[0]); from deepspeed.ops.op_builder import FusedAdamBuilder as B; B().load()" > "$OUT/build-fused.log" 2>&1 &
python3 -c "from zlayout.verify.environment import corrected_env as c; import os; os.environ.update(c(dict(os.environ))[0]); from deepspeed.ops.op_builder import CPUAdamBuilder as B; B().load()" > "$OUT/build-cpu.log" 2>&1 &
wait; echo "op builds: $((SECONDS - s)) s"
H="--gpus-per-node 1 --gpu h200 --host-cores 16"
prof() { name=$1; shift; left=$(( 560 - SECONDS )); [ $left -gt 50 ] || { echo "$name: no time left"; return; }
  OUT=$P timeout -s TERM $(( left < 100 ? left : 100 )) torchrun --standalone --nproc_per_node 1 --master_port $((29500 + RANDOM % 500)) \
    benchmarks/measurements/tools/steptime_profile.py --name "$name" -- "$@" $H > "$P/$name.log" 2>&1
  echo "$name rc=$? $(grep -h '^PROFILE' "$P/$name.log")"; }
trace() { name=$1; shift; left=$(( 560 - SECONDS )); [ $left -gt 50 ] || { echo "$name: no time left"; return; }
  OUT=$T timeout -s TERM $(( left < 100 ? left : 100 )) torchrun --standalone --nproc_per_node 1 --master_port $((30100 + RANDOM % 500)) \
    benchmarks/measurements/tools/allocator_trace.py --name "$name" -- "$@" $H > "$T/$name.log" 2>&1
  echo "$name rc=$? $(grep -h '^TRACE' "$T/$name.log")"; }
prof p-z3-hf-L10 --impl hf --stage 3 --layers 10 --hidden 2048 --heads 16 --kv-heads 4 --ffn 8192 --vocab 64000 --mlp swiglu --norm rmsnorm --no-bias --seq 2048 --micro-batch 2
prof p-z3-hf-L16-ckpt --impl hf --stage 3 --checkpointing full --layers 16 --hidden 1536 --heads 12 --kv-heads 4 --ffn 4096 --vocab 50000 --mlp swiglu --norm rmsnorm --no-bias --seq 4096 --micro-batch 2
prof p-z3-L24 --stage 3 --layers 24 --hidden 2048 --heads 16 --vocab 32000 --seq 2048 --micro-batch 4
prof p-z3-L16-ckpt-b8 --stage 3 --checkpointing full --layers 16 --hidden 2048 --heads 16 --kv-heads 8 --ffn 5632 --vocab 32768 --mlp swiglu --norm rmsnorm --no-bias --seq 2048 --micro-batch 8
prof p-z2-hf-L24 --impl hf --stage 2 --layers 24 --hidden 1024 --heads 16 --kv-heads 2 --ffn 2816 --vocab 151936 --mlp swiglu --norm rmsnorm --no-bias --qkv-bias --tie-embeddings --seq 4096 --micro-batch 4
echo "profiles done at ${SECONDS}s"
trace t-z2-opt-cpu --stage 2 --offload-optimizer cpu --layers 8 --hidden 4096 --heads 32 --vocab 32000 --seq 2048 --micro-batch 2 &
trace t-z2-hf-ckpt-s8192 --impl hf --stage 2 --checkpointing full --layers 16 --hidden 2048 --heads 16 --kv-heads 8 --ffn 5632 --vocab 128256 --mlp swiglu --norm rmsnorm --no-bias --tie-embeddings --seq 8192 --micro-batch 1 &
wait
trace t-z2-moe --impl hf --stage 2 --layers 8 --hidden 1536 --heads 12 --kv-heads 4 --ffn 2048 --experts 8 --top-k 2 --vocab 32000 --mlp swiglu --norm rmsnorm --no-bias --seq 2048 --micro-batch 4 &
trace t-z0-hf-s6144 --impl hf --stage 0 --layers 8 --hidden 2560 --heads 20 --kv-heads 4 --ffn 6912 --vocab 49152 --mlp swiglu --norm rmsnorm --no-bias --seq 6144 --micro-batch 1 &
wait
trace t-z2-hf-h3584 --impl hf --stage 2 --layers 8 --hidden 3584 --heads 28 --kv-heads 4 --ffn 18944 --vocab 152064 --mlp swiglu --norm rmsnorm --no-bias --qkv-bias --seq 4096 --micro-batch 1 &
trace t-z1-hf-v32001 --impl hf --stage 1 --layers 12 --hidden 2048 --heads 16 --ffn 5504 --vocab 32001 --mlp swiglu --norm rmsnorm --no-bias --seq 4096 --micro-batch 2 &
trace t-z1-L6-h3072 --stage 1 --layers 6 --hidden 3072 --heads 24 --kv-heads 8 --ffn 8192 --vocab 65536 --mlp swiglu --norm rmsnorm --no-bias --seq 2048 --micro-batch 4 &
wait
tar czf "$OUT/profiles.tgz" -C /tmp profiles; tar czf "$OUT/traces.tgz" -C /tmp traces
echo "diagnostics finished at ${SECONDS}s"; ls -la $OUT
