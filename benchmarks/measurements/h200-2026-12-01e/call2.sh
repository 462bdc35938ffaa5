#!/bin/bash
# 2026-12-01, fourth session, call 2 on one H200 (16 cores): held-out batch 4
# (benchmarks/measurements/h200-2026-12-01e/batch-h200-heldout4.txt), its predictions committed before this ran. Fused and CPU
# Adam are built first, in parallel (a bare node JIT-builds both: ~60 s), so no row's time
# includes a build.
source benchmarks/measurements/tools/h200_node_setup.sh heldout4
s=$SECONDS
for b in FusedAdamBuilder CPUAdamBuilder; do
  python3 -c "from zlayout.verify.environment import corrected_env as c; import os; os.environ.update(c(dict(os.environ))[0]); from deepspeed.ops.op_builder import $b as B; B().load()" > "$OUT/build-$b.log" 2>&1 &
done
wait; echo "op builds: $((SECONDS - s)) s"
left=$(( 575 - SECONDS ))
timeout -s TERM $(( left + 20 )) python3 -m zlayout verify --batch benchmarks/measurements/h200-2026-12-01e/batch-h200-heldout4.txt \
  --out /tmp/heldout4 --deadline "$(( left - 45 ))" > "$OUT/heldout4.log" 2>&1
cp /tmp/heldout4/results.jsonl "$OUT/heldout4-results.jsonl"
tar czf "$OUT/heldout4-ranks.tgz" --exclude=checkpoint -C /tmp heldout4
echo "finished at ${SECONDS}s"; grep -h "^verify \|^  GPU peak alloc\|^  GPU device\|^  step time\|Error\|error" "$OUT/heldout4.log" | head -80
