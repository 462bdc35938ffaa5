#!/bin/bash
# The LFM2 batch on whichever one-GPU machine comes (predicted before any run: predictions-lfm2-*.jsonl). The node has no
# causal-conv1d: transformers runs its torch convolution, which the card prices.
F=benchmarks/measurements/h200-2026-12-21
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then B=batch-lfm2-h200; else B=batch-lfm2-h100; fi
python3 -c "import causal_conv1d" 2>/dev/null && echo "causal_conv1d importable: the run takes the fused kernel" || echo "no causal_conv1d: torch convolution"
DEADLINE=${DEADLINE:-420} bash benchmarks/measurements/tools/device_call.sh setup-gpu fam:$F/$B.txt
