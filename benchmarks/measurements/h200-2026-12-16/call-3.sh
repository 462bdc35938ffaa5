#!/bin/bash
# Twenty-second session, call 3 (about 900 s of device time left): the edge-of-the-card batch c, predicted before the run.
F=benchmarks/measurements/h200-2026-12-16
DEADLINE=${DEADLINE:-330} bash benchmarks/measurements/tools/device_call.sh setup-gpu fam:$F/batch-edge-c.txt
