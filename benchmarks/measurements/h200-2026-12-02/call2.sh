#!/bin/bash
# 2026-12-02, sixth session, call 2 on one H200 (16 cores):
# 1. ZeRO-3 with the optimizer (and the weights) on the CPU traced again, now with each event's
#    CUDA stream (allocator_trace.py's fourth field): the 1-GPU L8 h4096 layout of the first
#    traces, a 1-GPU SwiGLU L16 h3072 one, and ranks 0 of 2 (emulated) with the optimizer, and
#    with optimizer and weights, on the CPU. Two at a time.
# 2. Held-out batch 8 (benchmarks/measurements/h200-2026-12-02/batch-h200-heldout8.txt), predictions committed first, alone on
#    the GPU after the traces.
source benchmarks/measurements/tools/h200_node_setup.sh call2
s=$SECONDS
python3 -c "from zlayout.verify.environment import corrected_env as c; import os; os.environ.update(c(dict(os.environ))[0]); from deepspeed.ops.op_builder import CPUAdamBuilder as C, FusedAdamBuilder as B; B().load(); C().load()" > "$OUT/build-ops.log" 2>&1
echo "op build: $((SECONDS - s)) s"
T=/tmp/traces; mkdir -p $T
trace() {  # name, emulated world (0: a real one-GPU run), verify arguments
  local name=$1 world=$2; shift 2
  if [ "$world" = 0 ]; then
    OUT=$T timeout -s TERM 200 torchrun --nproc_per_node 1 --master_port $((29500 + RANDOM % 1000)) \
      benchmarks/measurements/tools/allocator_trace.py --name "$name" --steps 2 -- "$@" > "$T/$name.log" 2>&1
  else
    OUT=$T timeout -s TERM 200 python3 benchmarks/measurements/tools/allocator_trace.py --name "$name" --steps 2 --emulate-world "$world" \
      -- "$@" > "$T/$name.log" 2>&1
  fi
}
G="--mlp gelu --norm layernorm --seq 2048 --micro-batch 2 --gpu h200 --host-cores 16"
trace s-z3-opt-param-cpu 0 --stage 3 --offload-optimizer cpu --offload-param cpu --layers 8 --hidden 4096 \
  --heads 32 --ffn 16384 --vocab 32000 $G --gpus-per-node 1 &
trace s-w2-z3-opt-L8-h4096 2 --stage 3 --offload-optimizer cpu --layers 8 --hidden 4096 --heads 32 --kv-heads 32 \
  --ffn 16384 --vocab 32000 $G --gpus-per-node 2 &
wait
trace s-z3-opt-param-L16-h3072 0 --stage 3 --offload-optimizer cpu --offload-param cpu --layers 16 --hidden 3072 \
  --heads 24 --kv-heads 8 --ffn 8192 --vocab 128256 --mlp swiglu --norm rmsnorm --no-bias --seq 4096 --micro-batch 1 \
  --gpus-per-node 1 --gpu h200 --host-cores 16 &
trace s-w2-z3-opt-param-L8-h4096 2 --stage 3 --offload-optimizer cpu --offload-param cpu --layers 8 --hidden 4096 \
  --heads 32 --kv-heads 32 --ffn 16384 --vocab 32000 $G --gpus-per-node 2 &
wait
echo "traces done at ${SECONDS}s"; grep -h "^TRACE\|Error" $T/*.log | head
tar czf "$OUT/traces.tgz" -C /tmp traces
timeout -s TERM 330 python3 -m zlayout verify --batch benchmarks/measurements/h200-2026-12-02/batch-h200-heldout8.txt --out /tmp/heldout8 \
  --deadline 300 > "$OUT/heldout8.log" 2>&1
cp /tmp/heldout8/results.jsonl "$OUT/heldout8-results.jsonl"
echo "finished at ${SECONDS}s"; grep -h "^verify \|^  GPU \|^  device" "$OUT/heldout8.log"
