#!/bin/bash
# 2026-12-02, sixth session, call 1 on one H200 (16 cores):
# 1. An allocator trace of held-out batch 7's zlayout ZeRO-0 L6 h3072 s4096 mb2 row (device used
#    -8.3% against the plan: a fifth fp32-flat-sized segment the replay does not make).
# 2. The host floor (benchmarks/measurements/h200-2026-12-02/batch-h200-hostfloor.txt): five layouts at 128 tokens a micro-step,
#    run alone on the GPU after the trace.
source benchmarks/measurements/tools/h200_node_setup.sh call1
s=$SECONDS
python3 -c "from zlayout.verify.environment import corrected_env as c; import os; os.environ.update(c(dict(os.environ))[0]); from deepspeed.ops.op_builder import FusedAdamBuilder as B; B().load()" > "$OUT/build-fused.log" 2>&1
echo "op build: $((SECONDS - s)) s"
T=/tmp/traces; mkdir -p $T
OUT=$T timeout -s TERM 150 torchrun --nproc_per_node 1 benchmarks/measurements/tools/allocator_trace.py --name b7-z0-L6-h3072 --steps 3 -- \
  --stage 0 --layers 6 --hidden 3072 --heads 24 --kv-heads 8 --ffn 8192 --vocab 32000 --mlp swiglu --norm rmsnorm \
  --no-bias --seq 4096 --micro-batch 2 --gpus-per-node 1 --gpu h200 --host-cores 16 > "$T/b7-z0-L6-h3072.log" 2>&1
echo "trace done at ${SECONDS}s"; tail -3 $T/b7-z0-L6-h3072.log
tar czf "$OUT/traces.tgz" -C /tmp traces
timeout -s TERM 330 python3 -m zlayout verify --batch benchmarks/measurements/h200-2026-12-02/batch-h200-hostfloor.txt --out /tmp/hostfloor \
  --deadline 300 > "$OUT/hostfloor.log" 2>&1
cp /tmp/hostfloor/results.jsonl "$OUT/hostfloor-results.jsonl"
echo "finished at ${SECONDS}s"; grep -h "^verify \|^  step time\|^  step phases" "$OUT/hostfloor.log"
