#!/bin/bash
# Call 1: setup (fused Adam, CPU Adam), then batch v (eight GPU-resident lines). The node's GPU picks the file.
F=benchmarks/measurements/h200-2026-12-31i
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then G=h200; else G=h100; fi
DEADLINE=${DEADLINE:-470} bash benchmarks/measurements/tools/device_call.sh setup fam:$F/batch-v-$G.txt
