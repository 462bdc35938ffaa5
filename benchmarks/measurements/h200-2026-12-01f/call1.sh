#!/bin/bash
# 2026-12-01, fifth session, call 1 on one H200 (16 cores), under 10 minutes:
# 1. issue 11: every layout measured on two real H200s (benchmarks/measurements/tools/emulated_world.py lines), run
#    again as rank 0 of 2 on this one GPU (allocator_trace.py --emulate-world: torch's fake
#    process group), 3 steps each with the allocator's trace; two lanes at once (each process
#    has its own allocator; the lanes' largest rows sum to 114 GiB of 140). Plus a 4- and an
#    8-GPU ZeRO-3 layout no real host measured (--extra).
# 2. issue 13: torch.profiler of the transformers ZeRO-0 row the step model misses most
#    (heldout3: 32 layers of hidden 1024, -21.8%) and of zlayout's model of the same shape.
source benchmarks/measurements/tools/h200_node_setup.sh call1
s=$SECONDS
for b in FusedAdamBuilder CPUAdamBuilder; do
  python3 -c "from zlayout.verify.environment import corrected_env as c; import os; os.environ.update(c(dict(os.environ))[0]); from deepspeed.ops.op_builder import $b as B; B().load()" > "$OUT/build-$b.log" 2>&1 &
done
wait; echo "op builds: $((SECONDS - s)) s"
T=/tmp/emulated; mkdir -p $T
python3 benchmarks/measurements/tools/emulated_world.py lines --extra > $T/lines.tsv
trace() { name=$1; line=$2; left=$(( 470 - SECONDS )); [ $left -gt 30 ] || { echo "$name: no time left"; return; }
  w=$(sed -E 's/.*--gpus-per-node ([0-9]+).*/\1/' <<< "$line")
  OUT=$T timeout -s TERM $(( left < 150 ? left : 150 )) python3 benchmarks/measurements/tools/allocator_trace.py --name "$name" \
    --steps 3 --emulate-world "$w" -- $line --host-cores 16 > "$T/$name.log" 2>&1
  echo "$name rc=$? $(grep -h '^TRACE' "$T/$name.log") $(grep -h 'Error' "$T/$name.log" | tail -1)"; }
lane() { grep -E "$1" $T/lines.tsv | while IFS=$'\t' read -r name line; do trace "$name" "$line"; done; }
# lane A: the 72-GiB row and the rows up to 30 GiB; lane B: the rows of 30-41 GiB, then the rest
lane '^(w2-z3-opt-L8-h4096|w2-z3-L32|w2-z1-L2|w2-z1-L8|w2-z2-L8|w2-z3-L8-h4096-s2048-b2|w2-z3-opt-param|w2-z0-L6|x-z3-w4)' > $T/laneA.txt &
lane '^(w2-z3-L16-h3072-s4096-b2-ckpt|w2-z3-L16-h3072-s4096-b1|w2-z1-L16|w2-z3-L8-h4096-s2048-b8|w2-z2-opt-L16|w2-z3-opt-L12|w2-z3-opt-L32|w2-z2-L6|x-z3-w8)' > $T/laneB.txt &
wait
cat $T/laneA.txt $T/laneB.txt
echo "traces done at ${SECONDS}s"
python3 benchmarks/measurements/tools/emulated_world.py compare $T 2>&1 | tail -25
P=/tmp/profiles; mkdir -p $P
profile() { name=$1; shift; left=$(( 580 - SECONDS )); [ $left -gt 40 ] || { echo "$name: no time left"; return; }
  OUT=$P timeout -s TERM $(( left < 90 ? left : 90 )) torchrun --standalone --nproc_per_node 1 --master_port $((30100 + RANDOM % 500)) \
    benchmarks/measurements/tools/steptime_profile.py --name "$name" --steps 3 -- "$@" --gpus-per-node 1 --gpu h200 --host-cores 16 > "$P/$name.log" 2>&1
  echo "$name rc=$?"; }
Z0="--stage 0 --layers 32 --hidden 1024 --heads 8 --ffn 2816 --vocab 151936 --mlp swiglu --norm rmsnorm --no-bias --tie-embeddings --seq 4096 --micro-batch 2"
profile p-z0-hf-L32-h1024 --impl hf $Z0
profile p-z0-zl-L32-h1024 --impl zlayout $Z0
tar czf "$OUT/emulated.tgz" -C /tmp emulated profiles
echo "call1 finished at ${SECONDS}s"; ls -la $OUT
