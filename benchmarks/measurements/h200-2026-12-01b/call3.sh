#!/bin/bash
# 2026-12-01, second session, call 3 on one H200 (16 cores): the second held-out batch
# (benchmarks/measurements/h200-2026-12-01b/batch-h200-heldout2.txt: step-time and allocator lines, each model's predictions
# committed before: heldout2-steptime-predictions.jsonl, heldout2-allocator-predictions.jsonl).
bash benchmarks/measurements/h200-2026-12-01-run.sh benchmarks/measurements/h200-2026-12-01b/batch-h200-heldout2.txt ${DEADLINE:-430}
echo "call 3 finished at ${SECONDS}s"
