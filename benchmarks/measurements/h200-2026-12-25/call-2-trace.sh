#!/bin/bash
# An allocator trace of line 4 (Mixtral-8x7B L2 ZeRO-3, 2 x 2048), whose reserve the plan puts 3.67 GiB over.
F=benchmarks/measurements/h200-2026-12-25
DEADLINE=${DEADLINE:-300} bash benchmarks/measurements/tools/device_call.sh setup-gpu trace:$F/batch-attention-h100.txt:4
