#!/bin/bash
# 2026-12-02, sixth session, call 4 on one H200 (16 cores): held-out batch 9
# (benchmarks/measurements/h200-2026-12-02/batch-h200-heldout9.txt, eight layouts), step time and memory predicted before it
# ran by main at d2a3b3f (heldout9-steptime-predictions.jsonl, heldout9-allocator-predictions.jsonl).
source benchmarks/measurements/tools/h200_node_setup.sh call4
s=$SECONDS
python3 -c "from zlayout.verify.environment import corrected_env as c; import os; os.environ.update(c(dict(os.environ))[0]); from deepspeed.ops.op_builder import CPUAdamBuilder as C, FusedAdamBuilder as B; B().load(); C().load()" > "$OUT/build-ops.log" 2>&1
echo "op build: $((SECONDS - s)) s"
timeout -s TERM 480 python3 -m zlayout verify --batch benchmarks/measurements/h200-2026-12-02/batch-h200-heldout9.txt --out /tmp/heldout9 \
  --deadline 450 > "$OUT/heldout9.log" 2>&1
cp /tmp/heldout9/results.jsonl "$OUT/heldout9-results.jsonl"
echo "finished at ${SECONDS}s"; grep -h "^verify \|^  step time\|^  GPU device\|^  step phases" "$OUT/heldout9.log"
