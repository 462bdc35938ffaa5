#!/bin/bash
# Call 3, on the node call 2 left warm (its built ops in place; a fresh node builds them first):
# batch r (six offloaded held-out lines).
F=benchmarks/measurements/h200-2026-12-31f
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then G=h200; else G=h100; fi
DEADLINE=${DEADLINE:-570} bash benchmarks/measurements/tools/device_call.sh setup fam:$F/batch-r-$G.txt
