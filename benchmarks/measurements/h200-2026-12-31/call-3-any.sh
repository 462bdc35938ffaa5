#!/bin/bash
# Batch f: the lines of batches d and e to run first (openai-gpt and xglm with their buffers cast; the four
# offloaded lines held out for be3c4dd's host terms), predicted before any run (predictions-f-*.jsonl, the same
# figures as predictions-d and -e). `setup` builds fused Adam, then CPU Adam, first.
F=benchmarks/measurements/h200-2026-12-31
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then G=h200; else G=h100; fi
DEADLINE=${DEADLINE:-570} bash benchmarks/measurements/tools/device_call.sh setup fam:$F/batch-f-$G.txt
