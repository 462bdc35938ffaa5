#!/bin/bash
# Call 3 (one H200, 16 cores), with the node's Hopper environment: TORCH_CUDA_ARCH_LIST=9.0a.
# 1. time to a verdict for a 3B layout on a cold node (op build in preflight), then warm;
# 2. batch 3 (MoE through transformers, shape B's boundary); 3. step-time rows; 4. CPU Adam scaling.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 \
  TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 HF_HUB_OFFLINE=1 TORCH_CUDA_ARCH_LIST=9.0a
OUT=${OUT:-/tmp/verify-out}; mkdir -p "$OUT"; M=benchmarks/measurements/h200-2026-12-01
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; echo "cores $(nproc)"
  grep -m1 "model name" /proc/cpuinfo; grep MemTotal /proc/meminfo; echo "TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST"; } > "$OUT/call3-host.txt"
L3="--layers 28 --hidden 3072 --heads 24 --kv-heads 8 --ffn 8192 --vocab 128256 --mlp swiglu --norm rmsnorm --no-bias --tie-embeddings --seq 4096 --gpus-per-node 1 --gpu h200 --stage 2"
for run in cold warm; do
  /usr/bin/time -f "$run wall %e s" python3 -m zlayout verify $L3 --out /tmp/ttv-$run --json > "$OUT/ttv-$run.json" 2> "$OUT/ttv-$run.log"
  tail -1 "$OUT/ttv-$run.log"
done
timeout -s TERM $(( ${DEADLINE:-330} + 70 )) python3 -m zlayout verify --batch $M-batch3.txt --out /tmp/b3 \
  --deadline ${DEADLINE:-330} > "$OUT/batch3.log" 2>&1
[ -f benchmarks/measurements/batch-h200-steptime.txt ] && timeout -s TERM 150 python3 -m zlayout verify \
  --batch benchmarks/measurements/batch-h200-steptime.txt --out /tmp/st --deadline 90 > "$OUT/steptime.log" 2>&1
cat /tmp/b3/results.jsonl /tmp/st/results.jsonl > "$OUT/call3-results.jsonl" 2>/dev/null
[ -f benchmarks/measurements/tools/cpu_adam_scaling.py ] && timeout 100 python3 benchmarks/measurements/tools/cpu_adam_scaling.py --host h200-16core > "$OUT/cpu-adam.txt" 2>&1
tar czf "$OUT/call3-ranks.tgz" --exclude=checkpoint -C /tmp b3 st ttv-cold ttv-warm 2>/dev/null
echo "finished at ${SECONDS}s"; grep -h "^verify \|^  GPU peak alloc\|^  GPU device\|^  step time\|phase\|arch" "$OUT"/*.log | head -60
