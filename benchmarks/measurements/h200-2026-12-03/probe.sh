#!/bin/bash
# 2026-12-03, on one H200: probe_blocks.py on CUDA for the held-out rows the plan missed (falcon's
# math attention, deepseek-v3, mixtral-8x22b) and two that it met (controls), then the same on meta
# (the learner's view) for the side-by-side. No DeepSpeed op is built or used.
D=benchmarks/measurements/h200-2026-12-03
C=benchmarks/measurements/h200-2026-12-02e/heldout/configs
[ -f /tmp/site/.probe-ready ] && export PYTHONPATH=/tmp/site:$PWD OUT=${OUT:-/tmp/verify-out} || { source benchmarks/measurements/tools/h200_node_setup.sh "probe-$(date +%H%M%S)" && touch /tmp/site/.probe-ready; }
for dev in ${DEVS:-cuda meta}; do
  while read cfg mb seq; do
    timeout 120 python3 $D/probe_blocks.py --device $dev --config $C/$cfg.json --micro-batch $mb --seq $seq \
      --out $OUT/probe-blocks.jsonl 2>&1 | grep -v Warning | tail -3
  done <<'ROWS'
falcon-7b-L8 2 2048
deepseek-v3-L3-e16-m1536 1 2048
mixtral-8x22b-L2 1 4096
qwen2.5-0.5b 4 4096
pythia-6.9b-L8 4 2048
ROWS
done
