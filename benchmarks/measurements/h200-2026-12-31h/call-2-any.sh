#!/bin/bash
# If call 1 cannot start (the session's device time short): setup, then the Phi-3-medium allocator trace alone.
F=benchmarks/measurements/h200-2026-12-31h
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then G=h200; else G=h100; fi
DEADLINE=${DEADLINE:-200} bash benchmarks/measurements/tools/device_call.sh setup env:TRACE_STEPS=3 trace:$F/batch-trace-$G.txt:1
