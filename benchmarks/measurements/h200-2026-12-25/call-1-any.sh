#!/bin/bash
# The cuDNN-attention batch on whichever one-GPU machine comes (predicted before any run: predictions-attention-*.jsonl).
F=benchmarks/measurements/h200-2026-12-25
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then B=batch-attention-h200; else B=batch-attention-h100; fi
DEADLINE=${DEADLINE:-500} bash benchmarks/measurements/tools/device_call.sh setup-gpu fam:$F/$B.txt
