#!/bin/bash
# The HBM-factor batch on whichever one-GPU machine comes (predicted before any run: predictions-hbm-*.jsonl).
F=benchmarks/measurements/h200-2026-12-26
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then B=batch-hbm-h200; else B=batch-hbm-h100; fi
DEADLINE=${DEADLINE:-480} bash benchmarks/measurements/tools/device_call.sh setup-gpu fam:$F/$B.txt
