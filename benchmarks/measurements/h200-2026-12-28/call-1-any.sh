#!/bin/bash
# Diagnostic, not a judgement: an allocator trace of h200-2026-12-27's Bamba-9B line (10 blocks, ZeRO-2, optimizer on
# the CPU; device used planned 27.12, measured 28.20 GiB), with the cards that batch was predicted from, then a
# step-time profile of its Mamba-2 8-block ZeRO-0 line (step +22.8%). `setup` builds fused and CPU Adam first.
B=benchmarks/measurements/h200-2026-12-27
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then G=h200; else G=h100; fi
DEADLINE=${DEADLINE:-540} bash benchmarks/measurements/tools/device_call.sh setup trace:$B/batch-ssm-b-$G.txt:1 prof:$B/batch-ssm-a-$G.txt:4
