#!/bin/bash
# Batch i: ten more families never run on a GPU (deepseek_v32 and glm_moe_dsa offloaded at their three dense blocks;
# iquestcoder checkpointed, granitemoe_swa, cpmant, mimo_v2_flash, zaya, sarvam_mla, aria_text, axk2 GPU-resident),
# transformers' default configs cut with --layers, learned from their own code (heldout/cards); predicted before any
# run (predictions-i-*.jsonl). `setup` builds fused Adam, then CPU Adam, first.
F=benchmarks/measurements/h200-2026-12-31c
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then G=h200; else G=h100; fi
DEADLINE=${DEADLINE:-570} bash benchmarks/measurements/tools/device_call.sh setup fam:$F/batch-i-$G.txt
