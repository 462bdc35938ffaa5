#!/bin/bash
# Twenty-second session, call 2: held-out batch b (families and shapes no batch has run), predicted before the run.
F=benchmarks/measurements/h200-2026-12-16
DEADLINE=${DEADLINE:-575} bash benchmarks/measurements/tools/device_call.sh setup fam:$F/batch-heldout-b.txt
