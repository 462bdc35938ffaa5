#!/bin/bash
# Eighteenth session, call 2: allocator traces (tools/allocator_trace.py) of batch s's two rows whose
# reserve the replay under-planned: Gemma-2-2B L10 (reserved -7.7%: 49.40 planned, 53.42 device used) and
# Falcon-7B L8 at 4 x 2048 (-2.8%).
F=benchmarks/measurements/h200-2026-12-13
DEADLINE=${DEADLINE:-580} bash benchmarks/measurements/tools/device_call.sh trace:$F/batch-heldout-s.txt:4 \
  trace:$F/batch-heldout-s.txt:2
ls -la $OUT
