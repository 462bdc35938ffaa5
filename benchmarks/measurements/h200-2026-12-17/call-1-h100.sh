#!/bin/bash
# Call 1 on an H100 when no H200 is lent: batch-gdn-h100 (predicted before the run, predictions-gdn-h100.jsonl), then
# its first line with fla and causal_conv1d hidden. CPU Adam is built with fused Adam, while causal-conv1d builds.
G=benchmarks/measurements/h200-2026-12-17
DEADLINE=${DEADLINE:-580} bash benchmarks/measurements/tools/device_call.sh \
  setup-fla setup wait-fla fam:$G/batch-gdn-h100.txt nofla fam:$G/batch-gdn-fallback-h100.txt
