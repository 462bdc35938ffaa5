#!/bin/bash
# Twenty-sixth session's batch (not yet run): one sequence's own requests (aa81fff), predicted before the run
# (predictions-one-sequence.jsonl).
F=benchmarks/measurements/h200-2026-12-18
DEADLINE=${DEADLINE:-400} bash benchmarks/measurements/tools/device_call.sh setup-gpu fam:$F/batch-one-sequence.txt
