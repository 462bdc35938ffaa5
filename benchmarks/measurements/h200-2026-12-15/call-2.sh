#!/bin/bash
# Twenty-first session, call 2: h200-2026-12-14's held-out batch d (its call 4; calibration-c.toml, fitted on call 1's
# batch c, is the identity, so predictions-d-calibrated.jsonl equals predictions-d-uncalibrated.jsonl), this folder's
# batch f, then the Qwen3-0.6B ZeRO-3 row twice more.
DEADLINE=${DEADLINE:-520} bash benchmarks/measurements/tools/device_call.sh setup-gpu \
  fam:benchmarks/measurements/h200-2026-12-14/batch-heldout-d.txt \
  fam:benchmarks/measurements/h200-2026-12-15/batch-heldout-f.txt \
  fam:benchmarks/measurements/h200-2026-12-15/batch-repeat-g.txt
