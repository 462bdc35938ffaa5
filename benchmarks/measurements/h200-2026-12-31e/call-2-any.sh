#!/bin/bash
# Call 2: batch p (four GPU-resident held-out lines), then batch o (four offloaded); what the
# deadline leaves out runs in call 3.
F=benchmarks/measurements/h200-2026-12-31e
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then G=h200; else G=h100; fi
DEADLINE=${DEADLINE:-570} bash benchmarks/measurements/tools/device_call.sh setup fam:$F/batch-p-$G.txt fam:$F/batch-o-$G.txt
