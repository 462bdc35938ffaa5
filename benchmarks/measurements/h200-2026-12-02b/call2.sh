#!/bin/bash
# 2026-12-02, seventh session, call 2 on one H200 (16 cores): why one ZeRO-3 layout's host side is
# 85 ms a backward in one process (batch 9's verify) and 127-196 ms in another (call 1's profile).
# The same transformers ZeRO-3 layout, alternately with OpenMP's default threads (torch: one per
# core, what verify sets for one rank) and OMP_NUM_THREADS=1, each run recording its threads' CPU
# time, its context switches and the VM's steal share (steptime_profile.py's HOST line); then
# ZeRO-3's two host floors at OMP_NUM_THREADS=1.
source benchmarks/measurements/tools/h200_node_setup.sh call2
python3 -c "from zlayout.verify.environment import corrected_env as c; import os; os.environ.update(c(dict(os.environ))[0]); from deepspeed.ops.op_builder import FusedAdamBuilder as B; B().load()" > "$OUT/build-fused.log" 2>&1
echo "op build at ${SECONDS}s"
P=/tmp/profiles; mkdir -p $P
profile() { name=$1; omp=$2; shift 2; left=$(( 540 - SECONDS )); [ $left -gt 40 ] || { echo "$name: no time left"; return; }
  if [ "$omp" = default ]; then unset OMP_NUM_THREADS; else export OMP_NUM_THREADS=$omp; fi
  OUT=$P timeout -s TERM $(( left < 100 ? left : 100 )) torchrun --standalone --nproc_per_node 1 --master_port $((30100 + RANDOM % 500)) \
    benchmarks/measurements/tools/steptime_profile.py --name "$name" --steps 2 --timed-steps 6 -- "$@" --gpus-per-node 1 --gpu h200 --host-cores 16 > "$P/$name.log" 2>&1
  echo "$name (OMP_NUM_THREADS=$omp) rc=$? at ${SECONDS}s"; grep -h "^PROFILE\|^HOST" "$P/$name.log"; unset OMP_NUM_THREADS; }
HF16="--impl hf --stage 3 --layers 16 --hidden 2048 --heads 16 --kv-heads 8 --ffn 5632 --vocab 32000 --mlp swiglu --norm rmsnorm --no-bias --seq 4096 --micro-batch 2"
profile z3-hf-L16-b2-omp16 16 $HF16
profile z3-hf-L16-b2-omp1 1 $HF16
profile z3-hf-L16-b2-omp16-again 16 $HF16
profile z3-hf-L16-b2-omp1-again 1 $HF16
profile z3-zl-floor-omp1 1 --stage 3 --layers 32 --hidden 1024 --heads 8 --ffn 2816 --vocab 32000 --mlp swiglu --norm rmsnorm --no-bias --tie-embeddings --seq 128 --micro-batch 1
profile z3-hf-floor-omp1 1 --impl hf --stage 3 --layers 32 --hidden 1024 --heads 8 --ffn 2816 --vocab 32000 --mlp swiglu --norm rmsnorm --no-bias --tie-embeddings --seq 128 --micro-batch 1
tar czf "$OUT/profiles.tgz" -C /tmp profiles
echo "call2 finished at ${SECONDS}s"
