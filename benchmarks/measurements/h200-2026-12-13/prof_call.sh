#!/bin/bash
# Eighteenth session, call 2: a step-time profile of batch t's starcoder2-3b row at a sequence equal to its
# sliding window (line 3: the plan prices its attention as masked, over the full square), to see the
# attention kernel the run takes there.
F=benchmarks/measurements/h200-2026-12-13
DEADLINE=${DEADLINE:-580} bash benchmarks/measurements/tools/device_call.sh setup-gpu prof:$F/batch-heldout-t.txt:3
cd $OUT && tar czf profiles.tgz prof-*.json 2>/dev/null; ls -la $OUT
