#!/bin/bash
# 2026-12-01, fifth session, call 4 on one H200 (16 cores), about 2.5 minutes: held-out batch 7
# (benchmarks/measurements/h200-2026-12-01f/batch-h200-heldout7.txt), three ZeRO-0 layouts for the step model's FP16_Optimizer
# pricing, predicted before it ran.
source benchmarks/measurements/tools/h200_node_setup.sh heldout7
python3 -c "from zlayout.verify.environment import corrected_env as c; import os; os.environ.update(c(dict(os.environ))[0]); from deepspeed.ops.op_builder import FusedAdamBuilder as B; B().load()" > "$OUT/build-fused.log" 2>&1
echo "op build at ${SECONDS}s"
timeout -s TERM 150 python3 -m zlayout verify --batch benchmarks/measurements/h200-2026-12-01f/batch-h200-heldout7.txt --out /tmp/heldout7 \
  --deadline 120 > "$OUT/heldout7.log" 2>&1
cp /tmp/heldout7/results.jsonl "$OUT/heldout7-results.jsonl"
echo "finished at ${SECONDS}s"; grep -h "^verify \|^  step time\|^  step phases" "$OUT/heldout7.log"
