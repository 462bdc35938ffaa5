#!/bin/bash
# 2026-12-02, seventh session, call 3 on one H200 (16 cores): held-out batch 10
# (benchmarks/measurements/h200-2026-12-02b/batch-h200-heldout10.txt: six layouts, each twice in separate processes), step time and
# memory predicted before it ran (heldout10-steptime-predictions.jsonl, heldout10-allocator-predictions.jsonl).
source benchmarks/measurements/tools/h200_node_setup.sh call3
s=$SECONDS
python3 -c "from zlayout.verify.environment import corrected_env as c; import os; os.environ.update(c(dict(os.environ))[0]); from deepspeed.ops.op_builder import FusedAdamBuilder as B; B().load()" > "$OUT/build-fused.log" 2>&1
echo "op build: $((SECONDS - s)) s"
timeout -s TERM 520 python3 -m zlayout verify --batch benchmarks/measurements/h200-2026-12-02b/batch-h200-heldout10.txt --out /tmp/heldout10 \
  --deadline 500 > "$OUT/heldout10.log" 2>&1
cp /tmp/heldout10/results.jsonl "$OUT/heldout10-results.jsonl"
echo "finished at ${SECONDS}s"; grep -h "^verify \|^  step time\|^  GPU device\|^  step phases" "$OUT/heldout10.log"
