#!/bin/bash
# Runs a verify batch on a one-GPU H200 machine (from the repo root; .whl/ holds DeepSpeed,
# pydantic and transformers with their needs). Usage: run.sh BATCH DEADLINE_S
# Records the host (GPU, cores, RAM, CPU model) beside the results.
name=$(basename "$1" .txt)
source benchmarks/measurements/tools/h200_node_setup.sh "$name"
timeout -s TERM $(( $2 + 80 )) python3 -m zlayout verify --batch "$1" --out /tmp/$name --deadline "$2" \
  > "$OUT/$name.log" 2>&1
cp /tmp/$name/results.jsonl "$OUT/$name-results.jsonl"
tar czf "$OUT/$name-ranks.tgz" --exclude=checkpoint -C /tmp $name
echo "finished at ${SECONDS}s"; grep -h "^verify \|^  GPU peak alloc\|^  GPU device\|^  step time\|Error\|error" "$OUT/$name.log" | head -80
