#!/bin/bash
# Seventeenth session, call 5: held-out batch r (predicted at 873b846, predictions-r.jsonl), shipped cards.
F=benchmarks/measurements/h200-2026-12-12
DEADLINE=${DEADLINE:-580} bash benchmarks/measurements/tools/device_call.sh setup fam:$F/batch-heldout-r.txt
ls -la $OUT
