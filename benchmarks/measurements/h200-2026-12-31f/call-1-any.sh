#!/bin/bash
# Call 1: the attention sweep (tools/attention_probe.py --sweep): SDPA's kernel times, causal, with and
# without dropout, over sequence length and head size. Torch alone: no wheels carried.
OUT=${OUT:-/tmp/out}; mkdir -p $OUT/probes
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  echo "cores $(nproc)"; grep -m1 "model name" /proc/cpuinfo; grep MemTotal /proc/meminfo
  python3 -c "import torch; print(torch.__version__, torch.version.cuda)"; } > $OUT/probes/sweep-host.txt 2>&1
cat $OUT/probes/sweep-host.txt
timeout 240 python3 benchmarks/measurements/tools/attention_probe.py --sweep --out $OUT/probes/attention-sweep.json > $OUT/probes/attention-sweep.log 2>&1
echo "sweep rc=$?"; tail -3 $OUT/probes/attention-sweep.log
