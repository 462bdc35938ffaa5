#!/bin/bash
# 2026-12-02, sixth session, call 5 on one H200 (16 cores): ZeRO-3's host floor, the last two
# lines of benchmarks/measurements/h200-2026-12-02/batch-h200-hostfloor.txt (128 tokens a micro-step: each pass the host's time).
source benchmarks/measurements/tools/h200_node_setup.sh call5
python3 -c "from zlayout.verify.environment import corrected_env as c; import os; os.environ.update(c(dict(os.environ))[0]); from deepspeed.ops.op_builder import FusedAdamBuilder as B; B().load()" > "$OUT/build-fused.log" 2>&1
echo "op build at ${SECONDS}s"
grep -- "--stage 3" benchmarks/measurements/h200-2026-12-02/batch-h200-hostfloor.txt > /tmp/z3floor.txt
timeout -s TERM 200 python3 -m zlayout verify --batch /tmp/z3floor.txt --out /tmp/z3floor --deadline 180 > "$OUT/hostfloor-z3.log" 2>&1
cp /tmp/z3floor/results.jsonl "$OUT/hostfloor-z3-results.jsonl"
echo "finished at ${SECONDS}s"; grep -h "^verify \|^  step time\|^  step phases" "$OUT/hostfloor-z3.log"
