#!/bin/bash
# Batch d: seven families never run on a GPU (exaone, glm, cwm, solar_open: offloaded, held out for the host
# terms of be3c4dd; jais2, bitnet, helium: GPU-resident), transformers' default configs, learned from their own
# code; predicted before any run (predictions-d-*.jsonl). `setup` builds fused Adam, then CPU Adam, first.
F=benchmarks/measurements/h200-2026-12-31
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then G=h200; else G=h100; fi
DEADLINE=${DEADLINE:-570} bash benchmarks/measurements/tools/device_call.sh setup fam:$F/batch-d-$G.txt
