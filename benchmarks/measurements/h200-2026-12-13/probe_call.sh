#!/bin/bash
# Eighteenth session, call 5: which op makes the large requests of one Gemma-2-2B block's step on CUDA
# (probe_op_memory.py; batch s's reserve, README), at batch s's shape (2 x 2048, eager attention).
F=benchmarks/measurements/h200-2026-12-13
source benchmarks/measurements/tools/h200_node_setup.sh "node-$(date +%H%M%S)"
timeout 300 python3 $F/probe_op_memory.py tests/hf/configs/published/gemma-2-2b.json 2048 2 eager \
  > $OUT/probe-gemma-2-2b.jsonl 2> $OUT/probe-gemma-2-2b.err; echo "probe rc=$? at ${SECONDS}s"
tail -3 $OUT/probe-gemma-2-2b.err; wc -l $OUT/probe-gemma-2-2b.jsonl
