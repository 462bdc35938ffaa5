#!/bin/bash
# Eighteenth session, call 3: step-time profiles (torch.profiler, 3 timed steps, 1 profiled) of batch-prof-u.txt's
# three rows: the GPU-resident runs the relearned cards still plan beyond 15%.
F=benchmarks/measurements/h200-2026-12-13
DEADLINE=${DEADLINE:-580} bash benchmarks/measurements/tools/device_call.sh setup-gpu prof:$F/batch-prof-u.txt:1 \
  prof:$F/batch-prof-u.txt:2 prof:$F/batch-prof-u.txt:3
cd $OUT && tar czf profiles.tgz prof-*.json 2>/dev/null; ls -la $OUT
