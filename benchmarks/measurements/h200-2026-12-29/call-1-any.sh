#!/bin/bash
# Batch a: seven families never run on a GPU before (bloom, opt, gptj, gpt_neo, cohere2, biogpt, exaone4), learned
# from their own code, GPU optimizer; predicted before any run (predictions-a-*.jsonl). `setup-gpu` builds fused Adam first.
F=benchmarks/measurements/h200-2026-12-29
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then G=h200; else G=h100; fi
DEADLINE=${DEADLINE:-570} bash benchmarks/measurements/tools/device_call.sh setup-gpu fam:$F/batch-a-$G.txt
