#!/bin/bash
# Twenty-first session, call 1: DeepSpeed's ops built first (fused Adam, then CPU Adam), then h200-2026-12-14's
# calibration batch c (its call 3) and this folder's held-out batch e. Predictions committed before the run.
DEADLINE=${DEADLINE:-575} bash benchmarks/measurements/tools/device_call.sh setup \
  fam:benchmarks/measurements/h200-2026-12-14/batch-calibrate-c.txt \
  fam:benchmarks/measurements/h200-2026-12-15/batch-heldout-e.txt
