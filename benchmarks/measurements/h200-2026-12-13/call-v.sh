#!/bin/bash
# Eighteenth session, call 4: held-out batch v (predicted at 8d6248f before the run: predictions-v.jsonl;
# GPU-resident only).
F=benchmarks/measurements/h200-2026-12-13
DEADLINE=${DEADLINE:-580} bash benchmarks/measurements/tools/device_call.sh setup-gpu fam:$F/batch-heldout-v.txt
ls -la $OUT
