#!/bin/bash
# Nineteenth session, call 2: call 1's engine half failed (DeepSpeed's fused Adam build in the probe's own
# process read TORCH_CUDA_ARCH_LIST=9.0a, which zlayout's verify corrects and the probe did not); again with
# torch's AdamW, the engine only, granite at ZeRO-3 then at ZeRO-1 (what ZeRO-3 adds), per-op host times too.
F=benchmarks/measurements/h200-2026-12-14
source benchmarks/measurements/tools/h200_node_setup.sh "node-$(date +%H%M%S)" > /dev/null
P=tests/hf/configs/published
run() {  # name config seq micro_batch stage [layers]
  local n=$1; shift
  PROBE_ENGINE_ONLY=1 timeout 200 torchrun --standalone --nproc_per_node 1 $F/probe_host.py "$@" > $OUT/host-$n.jsonl 2> $OUT/host-$n.err
  echo "$n rc=$? at ${SECONDS}s"; grep -c . $OUT/host-$n.jsonl; grep -v Warn $OUT/host-$n.err | grep -m3 Error
}
run granite-engine-z3 $P/granite-3.0-1b-a400m-base.json 4096 4 3
run granite-engine-z1 $P/granite-3.0-1b-a400m-base.json 4096 4 1
run llama-3.2-1b-engine-z3 $P/Llama-3.2-1B.json 4096 4 3
