#!/bin/bash
# The next call (setup is skipped on a warm node, redone on a fresh one): batch v's two lines not reached, batch w
# (five offloaded lines), then DeepSpeedCPUAdam's own rate on this host (the offloaded steps' largest term).
F=benchmarks/measurements/h200-2026-12-31i
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then G=h200; else G=h100; fi
DEADLINE=${DEADLINE:-580} bash benchmarks/measurements/tools/device_call.sh setup fam:$F/batch-v3-$G.txt fam:$F/batch-w-$G.txt adam
