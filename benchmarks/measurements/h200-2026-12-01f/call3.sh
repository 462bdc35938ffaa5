#!/bin/bash
# 2026-12-01, fifth session, call 3 on one H200 (16 cores), about 5 minutes: held-out batch 6
# (benchmarks/measurements/h200-2026-12-01f/batch-emulated-heldout6.txt), 10 layouts of 2 to 16 GPUs no host measured, each run
# as rank 0 of N on this GPU with the allocator's trace (allocator_trace.py --emulate-world N).
# The replay's predictions (heldout6-allocator-predictions.jsonl, main at e20806b: the multi-GPU
# ZeRO-3 replay merged) were committed before this ran. Three lanes at once (each process has its
# own allocator; the three largest predicted reserves sum to 102 GiB of 140).
source benchmarks/measurements/tools/h200_node_setup.sh call3
s=$SECONDS
for b in FusedAdamBuilder CPUAdamBuilder; do
  python3 -c "from zlayout.verify.environment import corrected_env as c; import os; os.environ.update(c(dict(os.environ))[0]); from deepspeed.ops.op_builder import $b as B; B().load()" > "$OUT/build-$b.log" 2>&1 &
done
wait; echo "op builds: $((SECONDS - s)) s"
T=/tmp/heldout6; mkdir -p $T
python3 benchmarks/measurements/tools/emulated_world.py batch benchmarks/measurements/h200-2026-12-01f/batch-emulated-heldout6.txt > $T/lines.tsv
trace() { name=$1; w=$2; line=$3; left=$(( 500 - SECONDS )); [ $left -gt 30 ] || { echo "$name: no time left"; return; }
  OUT=$T timeout -s TERM $(( left < 200 ? left : 200 )) python3 benchmarks/measurements/tools/allocator_trace.py --name "$name" \
    --steps 3 --emulate-world "$w" -- $line --host-cores 16 > "$T/$name.log" 2>&1
  echo "$name rc=$? $(grep -h '^TRACE' "$T/$name.log") $(grep -h 'Error' "$T/$name.log" | tail -1)"; }
for lane in 0 1 2; do
  awk -v l=$lane 'NR % 3 == l' $T/lines.tsv | while IFS=$'\t' read -r name w line; do trace "$name" "$w" "$line"; done > $T/lane$lane.txt &
done
wait
cat $T/lane*.txt
python3 benchmarks/measurements/tools/emulated_world.py heldout benchmarks/measurements/h200-2026-12-01f/batch-emulated-heldout6.txt \
  benchmarks/measurements/h200-2026-12-01f/heldout6-allocator-predictions.jsonl $T
tar czf "$OUT/heldout6.tgz" -C /tmp heldout6
echo "call3 finished at ${SECONDS}s"
