#!/bin/bash
# Call 1 on whichever one-GPU machine comes: the H200 batch on an H200, the H100 one on an H100.
G=benchmarks/measurements/h200-2026-12-17
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then bash $G/call-1.sh; else bash $G/call-1-h100.sh; fi
