#!/bin/bash
# Batch b: seven more families never run on a GPU before (mpt, persimmon, smollm3, glm4, arcee, codegen, apertus):
# ZeRO-3, checkpointing, the optimizer on the CPU; predicted before any run (predictions-b-*.jsonl). `setup` builds
# fused Adam, then CPU Adam, before the first timed run.
F=benchmarks/measurements/h200-2026-12-29
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then G=h200; else G=h100; fi
DEADLINE=${DEADLINE:-570} bash benchmarks/measurements/tools/device_call.sh setup fam:$F/batch-b-$G.txt
