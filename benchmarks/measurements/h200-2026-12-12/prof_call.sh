#!/bin/bash
# Seventeenth session, call 4: a step-time profile (torch.profiler, 3 timed steps, 1 profiled) of batch q's
# Falcon-7B --layers 6 ZeRO-2 row (step -16.0%: forward 0.094 s measured, 0.067 planned), and of the same
# row at 1024 tokens, where the math path's T x T tensors are a quarter the size.
F=benchmarks/measurements/h200-2026-12-12
DEADLINE=${DEADLINE:-580} bash benchmarks/measurements/tools/device_call.sh setup-gpu prof:$F/batch-heldout-q.txt:1 \
  prof:$F/batch-prof-falcon-1024.txt:1
cd $OUT && tar czf profiles.tgz prof-*.json 2>/dev/null; ls -la $OUT
