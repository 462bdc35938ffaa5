#!/bin/bash
# Call 1 got no machine (seven tries). One call for both: the held-out lines of the families learned this session
# (predictions-learned-*.jsonl, committed before any run), then the Bamba trace of call 1, then the offloaded JetMoE
# line. `setup` builds fused Adam and CPU Adam before the first timed run.
F=benchmarks/measurements/h200-2026-12-28
B=benchmarks/measurements/h200-2026-12-27
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then G=h200; else G=h100; fi
DEADLINE=${DEADLINE:-570} bash benchmarks/measurements/tools/device_call.sh setup fam:$F/batch-learned-a-$G.txt \
  trace:$B/batch-ssm-b-$G.txt:1 fam:$F/batch-learned-b-$G.txt
