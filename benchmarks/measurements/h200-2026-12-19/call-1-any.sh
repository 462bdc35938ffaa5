#!/bin/bash
# The request_order batch on whichever one-GPU machine comes (predicted before any run: predictions-request-order-*.jsonl).
F=benchmarks/measurements/h200-2026-12-19
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then B=batch-request-order-h200; else B=batch-request-order-h100; fi
DEADLINE=${DEADLINE:-400} bash benchmarks/measurements/tools/device_call.sh setup-gpu fam:$F/$B.txt
