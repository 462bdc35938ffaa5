#!/bin/bash
# Call 1 was taken back for other work after about 300 s with nothing returned; with 700 s of device time left,
# the GPU-optimizer batch alone (fused Adam only), its four lines predicted before any run.
F=benchmarks/measurements/h200-2026-12-27
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then G=h200; else G=h100; fi
DEADLINE=${DEADLINE:-450} bash benchmarks/measurements/tools/device_call.sh setup-gpu fam:$F/batch-ssm-a-$G.txt
