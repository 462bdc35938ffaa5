#!/bin/bash
# Seventeenth session, call 3: allocator traces (no stacks, each event's stream) of batch q's Qwen3-8B-L6
# ZeRO-3 row as rank 0 of 8 (reserved -11.9% against the replay), and of the same row at micro-batch 1,
# for the replay's frees of ZeRO-3's gathered weights (record_stream).
source benchmarks/measurements/tools/h200_node_setup.sh "node-$(date +%H%M%S)"
P=tests/hf/configs/published
trace() {  # name world args...
  local name=$1 world=$2; shift 2
  [ $SECONDS -lt 440 ] || { echo "$name: no time left"; return; }
  OUT=$OUT timeout 150 python benchmarks/measurements/tools/allocator_trace.py \
    --name $name --emulate-world $world -- "$@" > $OUT/$name.log 2>&1
  echo "$name rc=$? at ${SECONDS}s"; tail -3 $OUT/$name.log; }
python3 -c "from zlayout.verify.environment import corrected_env as c; import os; os.environ.update(c(dict(os.environ))[0]); from deepspeed.ops.op_builder import FusedAdamBuilder as B; B().load()" > $OUT/build.log 2>&1; echo "build rc=$? at ${SECONDS}s"
trace trace-q-3-qwen3-8b-L6 8 --hf-config $P/Qwen3-8B.json --layers 6 --stage 3 --seq 4096 --micro-batch 2 \
  --gpus-per-node 8 --gpu h200 --loop deepspeed
trace trace-q-3-qwen3-8b-L6-mb1 8 --hf-config $P/Qwen3-8B.json --layers 6 --stage 3 --seq 4096 --micro-batch 1 \
  --gpus-per-node 8 --gpu h200 --loop deepspeed
ls -la $OUT
