#!/bin/bash
# Mamba-2 and its hybrids (torch reference), held out, on whichever one-GPU machine comes (predicted before any run:
# predictions-*.jsonl). `setup` builds fused Adam and CPU Adam before the first timed run.
F=benchmarks/measurements/h200-2026-12-27
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then G=h200; else G=h100; fi
DEADLINE=${DEADLINE:-570} bash benchmarks/measurements/tools/device_call.sh setup fam:$F/batch-ssm-a-$G.txt fam:$F/batch-ssm-b-$G.txt
