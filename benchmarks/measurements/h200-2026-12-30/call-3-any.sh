#!/bin/bash
# Batch c: nine more families never run on a GPU (afmoe, exaone_moe, flex_olmo, glm4_moe_lite, laguna, sarvam_moe,
# minimax_m2: MoE; olmo3, seed_oss: dense), transformers' default configs, learned from their own code; predicted
# before any run (predictions-c-*.jsonl). `setup` builds fused Adam, then CPU Adam, before the first timed run.
F=benchmarks/measurements/h200-2026-12-30
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then G=h200; else G=h100; fi
DEADLINE=${DEADLINE:-570} bash benchmarks/measurements/tools/device_call.sh setup fam:$F/batch-c-$G.txt
