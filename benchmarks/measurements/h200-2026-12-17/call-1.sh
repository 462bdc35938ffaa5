#!/bin/bash
# Twenty-fourth session, call 1: Qwen3.5's gated-delta-rule blocks on one H200 with flash-linear-attention and
# causal-conv1d (built here for sm_90 before any timed run), predicted before the run (predictions-gdn-a.jsonl);
# an allocator trace of the first line; then that line with both hidden (verify must refuse before training).
G=benchmarks/measurements/h200-2026-12-17
DEADLINE=${DEADLINE:-580} bash benchmarks/measurements/tools/device_call.sh \
  setup-fla setup-gpu wait-fla fam:$G/batch-gdn-a.txt trace:$G/batch-gdn-a.txt:1 nofla fam:$G/batch-gdn-fallback.txt
