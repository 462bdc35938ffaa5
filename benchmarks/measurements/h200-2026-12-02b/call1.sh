#!/bin/bash
# 2026-12-02, seventh session, call 1 on one H200 (16 cores): where ZeRO-3's passes spend the host's
# time on one GPU. benchmarks/measurements/tools/steptime_profile.py: per phase the host's issue time against the wall
# time (6 unprofiled steps), the GC's time, the GPU's busy time and the host's waits (2 profiled).
# Layouts: batch 9's miss (transformers ZeRO-3, backward 86 ms measured, 140 predicted), the same
# model at ZeRO-2 and at micro-batch 8, zlayout's GPT at ZeRO-3 (batch 2: forward 74 ms, 51 predicted),
# a 6-layer hidden-4096 transformers model (forward 60 ms, 39 predicted), ZeRO-3's two host floors.
source benchmarks/measurements/tools/h200_node_setup.sh call1
python3 -c "from zlayout.verify.environment import corrected_env as c; import os; os.environ.update(c(dict(os.environ))[0]); from deepspeed.ops.op_builder import FusedAdamBuilder as B; B().load()" > "$OUT/build-fused.log" 2>&1
echo "op build at ${SECONDS}s"
P=$OUT/profiles; mkdir -p $P
profile() { name=$1; shift; left=$(( 560 - SECONDS )); [ $left -gt 40 ] || { echo "$name: no time left"; return; }
  OUT=$P timeout -s TERM $(( left < 100 ? left : 100 )) torchrun --standalone --nproc_per_node 1 --master_port $((30100 + RANDOM % 500)) \
    benchmarks/measurements/tools/steptime_profile.py --name "$name" --steps 2 --timed-steps 6 -- "$@" --gpus-per-node 1 --gpu h200 --host-cores 16 > "$P/$name.log" 2>&1
  echo "$name rc=$? at ${SECONDS}s"; grep -h "^PROFILE" "$P/$name.log"; }
HF16="--impl hf --layers 16 --hidden 2048 --heads 16 --kv-heads 8 --ffn 5632 --vocab 32000 --mlp swiglu --norm rmsnorm --no-bias --seq 4096"
profile z3-hf-L16-b2 --stage 3 $HF16 --micro-batch 2
profile z3-zl-L16-b2 --stage 3 --layers 16 --hidden 2048 --heads 16 --kv-heads 4 --ffn 5632 --vocab 50304 --mlp swiglu --norm rmsnorm --no-bias --seq 4096 --micro-batch 2
profile z2-hf-L16-b2 --stage 2 $HF16 --micro-batch 2
profile z3-hf-floor --impl hf --stage 3 --layers 32 --hidden 1024 --heads 8 --ffn 2816 --vocab 32000 --mlp swiglu --norm rmsnorm --no-bias --tie-embeddings --seq 128 --micro-batch 1
profile z3-zl-floor --stage 3 --layers 32 --hidden 1024 --heads 8 --ffn 2816 --vocab 32000 --mlp swiglu --norm rmsnorm --no-bias --tie-embeddings --seq 128 --micro-batch 1
profile z3-hf-L6-h4096 --impl hf --stage 3 --layers 6 --hidden 4096 --heads 32 --kv-heads 8 --ffn 14336 --vocab 128256 --mlp swiglu --norm rmsnorm --no-bias --seq 2048 --micro-batch 1
profile z3-hf-L16-b8 --stage 3 $HF16 --micro-batch 8
echo "call1 finished at ${SECONDS}s"
