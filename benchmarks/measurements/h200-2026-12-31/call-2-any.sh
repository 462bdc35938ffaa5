#!/bin/bash
# Batch e: eleven more families never run on a GPU, all GPU-resident (openai-gpt and xglm with their float32
# buffers cast, 5adef3e), transformers' default configs, learned from their own code; predicted before any run
# (predictions-e-*.jsonl). `setup-gpu` builds fused Adam first where the node is fresh.
F=benchmarks/measurements/h200-2026-12-31
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then G=h200; else G=h100; fi
DEADLINE=${DEADLINE:-570} bash benchmarks/measurements/tools/device_call.sh setup-gpu fam:$F/batch-e-$G.txt
