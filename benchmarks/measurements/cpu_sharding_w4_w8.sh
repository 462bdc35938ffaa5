#!/usr/bin/env bash
# ZeRO stages 1-3, with and without optimizer offload, at 4 and 8 ranks in CPU mode (gloo):
# what the CPUs allow while 4- and 8-GPU machines are not lent (issue 7). It checks that each
# layout runs end to end at that world size; it measures no GPU memory.
# Output: results.jsonl in the current directory.
for w in 4 8; do for s in "1" "1 --offload-optimizer cpu" "2" "2 --offload-optimizer cpu" "3" "3 --offload-optimizer cpu"; do
  start=$(date +%s.%N)
  timeout 600 zlayout verify --layers 2 --hidden 128 --heads 4 --vocab 1000 --seq 64 --micro-batch 2 --gpus-per-node $w --stage $s --cpu --processes $w --steps 3 --json 2>/dev/null | tail -1 > last.json
  end=$(date +%s.%N)
  python3 -c "
import json,sys; d=json.load(open('last.json')); m=d['measured']
print(json.dumps({'world': $w, 'layout': d['layout']['key'], 'status': d['status'], 'params': m.get('params'), 'host_peak_bytes': m.get('host_peak_bytes'), 'losses': m.get('losses'), 'wall_s': round($end-$start,1)}))" >> results.jsonl || echo "{\"world\": $w, \"stage\": \"$s\", \"status\": \"no result\"}" >> results.jsonl
done; done
