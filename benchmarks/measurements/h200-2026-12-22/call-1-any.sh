#!/bin/bash
# The named-frees batch on whichever one-GPU machine comes (predicted before any run: predictions-frees-*.jsonl).
F=benchmarks/measurements/h200-2026-12-22
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then B=batch-frees-h200; else B=batch-frees-h100; fi
DEADLINE=${DEADLINE:-420} bash benchmarks/measurements/tools/device_call.sh setup-gpu fam:$F/$B.txt
