#!/bin/bash
# 2026-12-02, sixth session, call 3 on one H200 (16 cores): an allocator trace (with streams) of
# held-out batch 8's ZeRO-1 row with accumulation over 2 micro-steps (peak allocated 2.3% above
# the plan, the one row of the batch off by more than 0.1%).
source benchmarks/measurements/tools/h200_node_setup.sh call3
s=$SECONDS
python3 -c "from zlayout.verify.environment import corrected_env as c; import os; os.environ.update(c(dict(os.environ))[0]); from deepspeed.ops.op_builder import FusedAdamBuilder as B; B().load()" > "$OUT/build-fused.log" 2>&1
echo "op build: $((SECONDS - s)) s"
T=/tmp/traces; mkdir -p $T
OUT=$T timeout -s TERM 150 torchrun --nproc_per_node 1 benchmarks/measurements/tools/allocator_trace.py --name h8-z1-gas2-L6-h3584 --steps 3 -- \
  --stage 1 --layers 6 --hidden 3584 --heads 28 --kv-heads 4 --ffn 9728 --vocab 65536 --mlp swiglu --norm rmsnorm \
  --no-bias --seq 2048 --micro-batch 2 --grad-accum 2 --gpus-per-node 1 --gpu h200 --host-cores 16 > "$T/h8-z1-gas2-L6-h3584.log" 2>&1
echo "trace done at ${SECONDS}s"; grep -h "^TRACE\|Error" $T/*.log
tar czf "$OUT/traces.tgz" -C /tmp traces
