#!/bin/bash
# Call 2: `setup` (fused Adam, then CPU Adam for call 3's offloaded lines, before any timed run), then
# batch q (eight GPU-resident held-out lines).
F=benchmarks/measurements/h200-2026-12-31f
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then G=h200; else G=h100; fi
DEADLINE=${DEADLINE:-570} bash benchmarks/measurements/tools/device_call.sh setup fam:$F/batch-q-$G.txt
