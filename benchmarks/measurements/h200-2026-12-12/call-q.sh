#!/bin/bash
# Seventeenth session, call 2: held-out batch q (predicted at dcddfd6, predictions-q.jsonl). The cards are
# the shipped ones (presets/cards): this folder has no heldout/cards, so the cache lookup finds nothing first.
F=benchmarks/measurements/h200-2026-12-12
DEADLINE=${DEADLINE:-580} bash benchmarks/measurements/tools/device_call.sh setup-gpu fam:$F/batch-heldout-q.txt
ls -la $OUT
