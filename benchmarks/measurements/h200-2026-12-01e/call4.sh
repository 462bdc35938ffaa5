#!/bin/bash
# 2026-12-01, fourth session, call 4 on one H200 (16 cores): one transformers MoE block against a
# dense MLP of the same active FLOPs (benchmarks/measurements/tools/moe_block_bench.py), five shapes (issue 13).
source benchmarks/measurements/tools/h200_node_setup.sh moe
timeout -s TERM 300 python3 benchmarks/measurements/tools/moe_block_bench.py > "$OUT/moe-block.jsonl" 2> "$OUT/moe-block.err"
echo "rc=$?"; cat "$OUT/moe-block.jsonl"; tail -5 "$OUT/moe-block.err"
