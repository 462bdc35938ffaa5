#!/bin/bash
# Call 1: `setup` (fused Adam, then CPU Adam for call 2's offloaded lines, before any timed run), batch s.
F=benchmarks/measurements/h200-2026-12-31g
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then G=h200; else G=h100; fi
DEADLINE=${DEADLINE:-570} bash benchmarks/measurements/tools/device_call.sh setup fam:$F/batch-s-$G.txt
