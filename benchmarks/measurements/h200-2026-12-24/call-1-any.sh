#!/bin/bash
# Allocator traces of the offloaded Mixtral-8x7B (ZeRO-3) and Phi-3-medium (ZeRO-2) rows, on whichever one-GPU machine comes.
F=benchmarks/measurements/h200-2026-12-24
DEADLINE=${DEADLINE:-540} bash benchmarks/measurements/tools/device_call.sh setup trace:$F/batch-offload-traces.txt:1 trace:$F/batch-offload-traces.txt:2
