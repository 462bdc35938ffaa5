#!/bin/bash
# Call 1: batch k (six GPU-resident held-out lines), then 12-31c's open questions: cpmant's allocator trace (its
# device used was 13.2% under), batch j (zaya at ZeRO-2 with parameter_alignment; its ZeRO-3 line is refused by
# verify now), apertus1p5_text's step profile (-24.8%). `setup-gpu` builds fused Adam first.
F=benchmarks/measurements/h200-2026-12-31d; C=benchmarks/measurements/h200-2026-12-31c
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then G=h200; else G=h100; fi
DEADLINE=${DEADLINE:-570} bash benchmarks/measurements/tools/device_call.sh setup-gpu fam:$F/batch-k-$G.txt \
  trace:$C/batch-i-h200.txt:5 fam:$C/batch-j-$G.txt prof:$C/batch-h-h200.txt:5
