#!/bin/bash
# 2026-12-01, fourth session, call 3 on one H200 (16 cores): the ZeRO-3 micro-batch sweep
# (benchmarks/measurements/h200-2026-12-01e/batch-h200-z3-microbatch.txt), Fused and CPU
# Adam are built first, in parallel (a bare node JIT-builds both: ~60 s), so no row's time
# includes a build.
source benchmarks/measurements/tools/h200_node_setup.sh z3mb
s=$SECONDS
for b in FusedAdamBuilder CPUAdamBuilder; do
  python3 -c "from zlayout.verify.environment import corrected_env as c; import os; os.environ.update(c(dict(os.environ))[0]); from deepspeed.ops.op_builder import $b as B; B().load()" > "$OUT/build-$b.log" 2>&1 &
done
wait; echo "op builds: $((SECONDS - s)) s"
left=$(( 480 - SECONDS ))
timeout -s TERM $(( left + 20 )) python3 -m zlayout verify --batch benchmarks/measurements/h200-2026-12-01e/batch-h200-z3-microbatch.txt \
  --out /tmp/z3mb --deadline "$(( left - 45 ))" > "$OUT/z3mb.log" 2>&1
cp /tmp/z3mb/results.jsonl "$OUT/z3mb-results.jsonl"
tar czf "$OUT/z3mb-ranks.tgz" --exclude=checkpoint -C /tmp z3mb
echo "finished at ${SECONDS}s"; grep -h "^verify \|^  GPU peak alloc\|^  GPU device\|^  step time\|Error\|error" "$OUT/z3mb.log" | head -80
