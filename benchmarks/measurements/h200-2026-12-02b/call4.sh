#!/bin/bash
# 2026-12-02, seventh session, call 4 on one H200 (16 cores): held-out batch 11
# (benchmarks/measurements/h200-2026-12-02b/batch-h200-heldout11.txt: five offloaded layouts), step time and memory predicted before
# it ran (heldout11-steptime-predictions.jsonl, heldout11-allocator-predictions.jsonl).
source benchmarks/measurements/tools/h200_node_setup.sh call4
s=$SECONDS
python3 -c "from zlayout.verify.environment import corrected_env as c; import os; os.environ.update(c(dict(os.environ))[0]); from deepspeed.ops.op_builder import CPUAdamBuilder as C, FusedAdamBuilder as B; B().load(); C().load()" > "$OUT/build-ops.log" 2>&1
echo "op build: $((SECONDS - s)) s"
timeout -s TERM 350 python3 -m zlayout verify --batch benchmarks/measurements/h200-2026-12-02b/batch-h200-heldout11.txt --out /tmp/heldout11 \
  --deadline 330 > "$OUT/heldout11.log" 2>&1
cp /tmp/heldout11/results.jsonl "$OUT/heldout11-results.jsonl"
echo "finished at ${SECONDS}s"; grep -h "^verify \|^  step time\|^  GPU device\|^  host peak\|^  step phases" "$OUT/heldout11.log"
