#!/bin/bash
# 2026-12-01, fifth session, call 2 on one H200 (16 cores), about 5 minutes:
# 1. `zlayout verify --emulate` itself, the product's path (benchmarks/measurements/h200-2026-12-01f/batch-h200-emulate.txt):
#    Llama-3-70B's shape as rank 0 of 64, the 2-GPU ZeRO-3 row measured on two real H200s, and
#    Llama-3-8B's shape at ZeRO-1 as rank 0 of 8. Alone on the GPU (device used is card-wide).
# 2. The two gradient-accumulation rows of call 1 traced again, now accumulating
#    (allocator_trace.py runs every micro-step), against their real 2-GPU peaks.
source benchmarks/measurements/tools/h200_node_setup.sh call2
s=$SECONDS
python3 -c "from zlayout.verify.environment import corrected_env as c; import os; os.environ.update(c(dict(os.environ))[0]); from deepspeed.ops.op_builder import FusedAdamBuilder as B; B().load()" > "$OUT/build-fused.log" 2>&1
echo "op build: $((SECONDS - s)) s"
timeout -s TERM 420 python3 -m zlayout verify --batch benchmarks/measurements/h200-2026-12-01f/batch-h200-emulate.txt \
  --out /tmp/emulate-verify --deadline 360 > "$OUT/emulate-verify.log" 2>&1
cp /tmp/emulate-verify/results.jsonl "$OUT/emulate-verify-results.jsonl"
echo "verify --emulate done at ${SECONDS}s"
T=/tmp/emulated-gas; mkdir -p $T
python3 benchmarks/measurements/tools/emulated_world.py lines | grep gas4 > $T/lines.tsv
while IFS=$'\t' read -r name line; do
  OUT=$T timeout -s TERM 120 python3 benchmarks/measurements/tools/allocator_trace.py --name "$name" --steps 3 --emulate-world 2 \
    -- $line --host-cores 16 > "$T/$name.log" 2>&1 &
done < $T/lines.tsv
wait
python3 benchmarks/measurements/tools/emulated_world.py compare $T 2>&1 | grep -E "gas4|layout"
tar czf "$OUT/emulated-gas.tgz" -C /tmp emulated-gas
tar czf "$OUT/emulate-verify-ranks.tgz" --exclude=checkpoint -C /tmp emulate-verify
echo "call2 finished at ${SECONDS}s"
grep -h "^verify \|^  emulated\|^  GPU \|^  step time\|Error\|error:" "$OUT/emulate-verify.log" | head -40
