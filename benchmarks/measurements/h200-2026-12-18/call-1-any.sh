#!/bin/bash
# Call 1 on whichever one-GPU machine comes: batch-one-sequence on an H200, its H100 copy (predicted before the run at
# 671f8ae, predictions-one-sequence-h100.jsonl: the same peaks, an H100's step times) on an H100.
F=benchmarks/measurements/h200-2026-12-18
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then B=batch-one-sequence; else B=batch-one-sequence-h100; fi
DEADLINE=${DEADLINE:-400} bash benchmarks/measurements/tools/device_call.sh setup-gpu fam:$F/$B.txt
