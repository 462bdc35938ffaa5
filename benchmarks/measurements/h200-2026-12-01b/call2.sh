#!/bin/bash
# 2026-12-01, second session, call 2 on one H200 (16 cores): the held-out allocator batch
# (predictions committed before: heldout-allocator-predictions.jsonl), then allocator traces of
# the three worst-missed layouts (benchmarks/measurements/tools/allocator_trace.sh) in the time left.
bash benchmarks/measurements/h200-2026-12-01-run.sh benchmarks/measurements/h200-2026-12-01b/batch-h200-heldout-allocator.txt 330
export PYTHONPATH=/tmp/site:$PWD
left=$(( 570 - SECONDS )); echo "traces get ${left}s"
[ $left -gt 60 ] && OUT=/tmp/traces timeout -s TERM $left bash benchmarks/measurements/tools/allocator_trace.sh
tar czf "$OUT/traces.tgz" -C /tmp traces 2>/dev/null  # at most 8 files come back
echo "call 2 finished at ${SECONDS}s"
