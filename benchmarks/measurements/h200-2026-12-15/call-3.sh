#!/bin/bash
# Twenty-first session, call 3 (about 470 s of device time left): the rest of h200-2026-12-14's batch d (after
# 835913d), allocator traces of batch e's starcoderbase-1b row (peak allocated +3.1%, the one held-out row of this
# folder outside 3%) and Gemma-7B row (reserve -4.3%), then Qwen3-0.6B's ZeRO-3 row over 10 steps, as time allows.
DEADLINE=${DEADLINE:-450} bash benchmarks/measurements/tools/device_call.sh setup \
  fam:benchmarks/measurements/h200-2026-12-15/batch-heldout-d-rest.txt \
  trace:benchmarks/measurements/h200-2026-12-15/batch-heldout-e.txt:6 \
  trace:benchmarks/measurements/h200-2026-12-15/batch-heldout-e.txt:4 \
  fam:benchmarks/measurements/h200-2026-12-15/batch-steps-h.txt
