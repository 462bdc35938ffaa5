#!/bin/bash
# The session's one call: setup (fused Adam, CPU Adam), the Phi-3-medium allocator trace (3 steps: the
# prefetch runs from the second), batch u, then DeepSpeedCPUAdam's rate on this host (1 and 16 threads).
F=benchmarks/measurements/h200-2026-12-31h
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then G=h200; else G=h100; fi
DEADLINE=${DEADLINE:-480} bash benchmarks/measurements/tools/device_call.sh setup env:TRACE_STEPS=3 trace:$F/batch-trace-$G.txt:1 \
  fam:$F/batch-u-$G.txt adam
