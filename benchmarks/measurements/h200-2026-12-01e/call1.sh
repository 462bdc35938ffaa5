#!/bin/bash
# 2026-12-01, fourth session, call 1 on one H200 (16 cores), about 9 minutes:
# 1. benchmarks/measurements/h200-2026-12-01e/batch-h200-settle.txt: ZeRO-3 and MoE layouts for 16 steps each, alone on the GPU
#    (issue 13: how many steps ZeRO-3 needs before its step time is steady);
# 2. allocator traces (benchmarks/measurements/tools/allocator_trace.py), two at a time, of the device-used rows the
#    replay still misses (issue 11): hf ZeRO-1 with a 256000 vocabulary (+10.0%), zlayout ZeRO-3
#    L12 h3072 (-3.8%) and L24 h2048 (-3.1%).
source benchmarks/measurements/tools/h200_node_setup.sh call1
s=$SECONDS
for b in FusedAdamBuilder CPUAdamBuilder; do
  python3 -c "from zlayout.verify.environment import corrected_env as c; import os; os.environ.update(c(dict(os.environ))[0]); from deepspeed.ops.op_builder import $b as B; B().load()" > "$OUT/build-$b.log" 2>&1 &
done
wait; echo "op builds: $((SECONDS - s)) s"
timeout -s TERM 300 python3 -m zlayout verify --batch benchmarks/measurements/h200-2026-12-01e/batch-h200-settle.txt \
  --out /tmp/settle --deadline 280 > "$OUT/settle.log" 2>&1
cp /tmp/settle/results.jsonl "$OUT/settle-results.jsonl"
echo "settle done at ${SECONDS}s"
T=/tmp/traces; mkdir -p $T
H="--gpus-per-node 1 --gpu h200 --host-cores 16"
trace() { name=$1; shift; left=$(( 565 - SECONDS )); [ $left -gt 40 ] || { echo "$name: no time left"; return; }
  OUT=$T timeout -s TERM $(( left < 110 ? left : 110 )) torchrun --standalone --nproc_per_node 1 --master_port $((30100 + RANDOM % 500)) \
    benchmarks/measurements/tools/allocator_trace.py --name "$name" -- "$@" $H > "$T/$name.log" 2>&1
  echo "$name rc=$? $(grep -h '^TRACE' "$T/$name.log")"; }
trace t-z1-hf-v256000 --impl hf --stage 1 --layers 10 --hidden 2304 --heads 18 --kv-heads 2 --ffn 6144 --vocab 256000 --mlp swiglu --norm rmsnorm --no-bias --tie-embeddings --seq 2048 --micro-batch 2 &
trace t-z3-L12-h3072 --stage 3 --layers 12 --hidden 3072 --heads 24 --kv-heads 8 --ffn 8192 --vocab 32000 --mlp swiglu --norm rmsnorm --no-bias --seq 4096 --micro-batch 2 &
wait
trace t-z3-L24-h2048 --stage 3 --layers 24 --hidden 2048 --heads 16 --vocab 32000 --seq 2048 --micro-batch 4
tar czf "$OUT/traces.tgz" -C /tmp traces
echo "call1 finished at ${SECONDS}s"; grep -h "^verify \|^  step time\|Error" "$OUT/settle.log" | head -40; ls -la $OUT
