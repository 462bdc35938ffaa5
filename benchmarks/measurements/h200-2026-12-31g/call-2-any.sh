#!/bin/bash
# Call 2, on the node call 1 left warm (a fresh node builds the ops first): batch t.
F=benchmarks/measurements/h200-2026-12-31g
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then G=h200; else G=h100; fi
DEADLINE=${DEADLINE:-570} bash benchmarks/measurements/tools/device_call.sh setup fam:$F/batch-t-$G.txt
