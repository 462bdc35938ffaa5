#!/bin/bash
# Batch h: seven families never run on a GPU (granitemoeshared and mellum offloaded, ministral3, modernbert-decoder,
# apertus1p5_text, hyperclovax, granite_swa GPU-resident), transformers' default configs cut with --layers, learned
# from their own code (heldout/cards); predicted before any run (predictions-h-*.jsonl). `setup` builds fused Adam,
# then CPU Adam, first.
F=benchmarks/measurements/h200-2026-12-31c
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then G=h200; else G=h100; fi
DEADLINE=${DEADLINE:-570} bash benchmarks/measurements/tools/device_call.sh setup fam:$F/batch-h-$G.txt
