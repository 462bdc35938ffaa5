#!/bin/bash
# Gemma-3n's text model (learned this session with its per-block kinds), two held-out lines predicted before any run
# (predictions-gemma3n-*.jsonl). `setup-gpu` builds fused Adam first.
F=benchmarks/measurements/h200-2026-12-28
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then G=h200; else G=h100; fi
DEADLINE=${DEADLINE:-450} bash benchmarks/measurements/tools/device_call.sh setup-gpu fam:$F/batch-gemma3n-$G.txt
