#!/bin/bash
# Call 3: batch m (the step time of weights packed off a 16-byte boundary, and two more of the families),
# then zaya at ZeRO-0 through the allocator trace (verify refuses it: does FP16_Optimizer's packing break torch's
# grouped GEMM as ZeRO-3's did?) and gpt2-xl's step profile (batch k line 1, +18.3%). `setup` builds fused Adam, then
# CPU Adam, first. The device tool returns at most 8 files: the output is packed into one archive.
F=benchmarks/measurements/h200-2026-12-31d
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then G=h200; else G=h100; fi
DEADLINE=${DEADLINE:-570} bash benchmarks/measurements/tools/device_call.sh setup fam:$F/batch-m-$G.txt \
  trace:$F/trace-zaya-z0-h200.txt:1 prof:$F/batch-k-h200.txt:1
