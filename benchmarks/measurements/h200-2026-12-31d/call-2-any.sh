#!/bin/bash
# Call 2: batch l (four offloaded held-out lines; `setup` builds fused Adam, then CPU Adam, first), then cpmant's
# allocator trace again (call 1's came back short: the device tool returns at most 8 files, so this call packs its
# output into one archive), granite_swa's step profile (-16.7%) and an allocator trace of batch j's ZeRO-3 line (zaya on
# one GPU, which verify refuses: does DeepSpeed's flat buffer really break torch's grouped GEMM there?).
F=benchmarks/measurements/h200-2026-12-31d; C=benchmarks/measurements/h200-2026-12-31c
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then G=h200; else G=h100; fi
DEADLINE=${DEADLINE:-570} bash benchmarks/measurements/tools/device_call.sh setup fam:$F/batch-l-$G.txt \
  trace:$C/batch-i-h200.txt:5 prof:$C/batch-h-h200.txt:7 trace:$C/batch-j-h200.txt:2
