#!/bin/bash
# Eighteenth session, call 1: held-out batches s and t (predicted at 1d41dda before the run:
# predictions-s.jsonl, predictions-t.jsonl; GPU-resident only, so no CPU Adam build).
F=benchmarks/measurements/h200-2026-12-13
DEADLINE=${DEADLINE:-580} bash benchmarks/measurements/tools/device_call.sh setup-gpu fam:$F/batch-heldout-s.txt \
  fam:$F/batch-heldout-t.txt
ls -la $OUT
