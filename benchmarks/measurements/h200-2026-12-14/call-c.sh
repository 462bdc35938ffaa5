#!/bin/bash
# Nineteenth session, call 3: the calibration rows (batch-calibrate-c.txt; the shipped model's predictions
# committed before the run: predictions-c.jsonl).
F=benchmarks/measurements/h200-2026-12-14
DEADLINE=${DEADLINE:-570} bash benchmarks/measurements/tools/device_call.sh setup-gpu fam:$F/batch-calibrate-c.txt
