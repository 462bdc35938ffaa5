#!/bin/bash
# Nineteenth session, call 1: where the host's time goes in a ZeRO-3 pass (probe_host.py), for the
# host-bound granite-3.0-1b-a400m row (h200-2026-12-13 prof-3: forward issued in 186-267 ms, plan 120),
# a dense Llama of the same width class, and a second MoE (OLMoE, 64 experts).
F=benchmarks/measurements/h200-2026-12-14
bash benchmarks/measurements/tools/device_call.sh setup-gpu
source benchmarks/measurements/tools/h200_node_setup.sh "node-$(date +%H%M%S)" > /dev/null
P=tests/hf/configs/published
run() {  # name config seq micro_batch stage [layers]
  local n=$1; shift
  timeout 240 torchrun --standalone --nproc_per_node 1 $F/probe_host.py "$@" > $OUT/host-$n.jsonl 2> $OUT/host-$n.err
  echo "$n rc=$? at ${SECONDS}s"; grep -c . $OUT/host-$n.jsonl; tail -2 $OUT/host-$n.err
}
run granite-z3 $P/granite-3.0-1b-a400m-base.json 4096 4 3
run llama-3.2-1b-z3 $P/Llama-3.2-1B.json 4096 4 3
run olmoe-l8-z3 $P/OLMoE-1B-7B-0924.json 4096 2 3 8
