#!/bin/bash
# Twenty-first session, call 3: the rest of h200-2026-12-14's batch d (after 835913d), an allocator trace of batch
# e's Gemma-7B row (its reserve -4.3%), and Qwen3-0.6B's ZeRO-3 row over 10 steps.
DEADLINE=${DEADLINE:-500} bash benchmarks/measurements/tools/device_call.sh setup-gpu \
  fam:benchmarks/measurements/h200-2026-12-15/batch-heldout-d-rest.txt \
  trace:benchmarks/measurements/h200-2026-12-15/batch-heldout-e.txt:4 \
  fam:benchmarks/measurements/h200-2026-12-15/batch-steps-h.txt
