#!/bin/bash
# 2026-12-01, second session, call 1 on one H200 (16 cores), the node's environment as it came.
# 1. build the ops the runs need (fused Adam for the batch, CPU Adam for the scaling run), timed;
# 2. the held-out step-time batch (predictions committed before: heldout-steptime-predictions.jsonl);
# 3. CPU Adam's per-parameter time at 1, 16, 8, 4, 2 threads (issue 13's 16-core curve).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 \
  TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/verify-out}; mkdir -p "$OUT"; D=benchmarks/measurements/h200-2026-12-01b
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  echo "cores $(nproc)"; grep -m1 "model name" /proc/cpuinfo; grep MemTotal /proc/meminfo
  echo "TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST-unset}"
  python3 -c "import torch, deepspeed, transformers; print(torch.__version__, deepspeed.__version__, transformers.__version__)"
} > "$OUT/call1-host.txt" 2>&1
cat "$OUT/call1-host.txt"
python3 -c "from transformers import AutoModelForCausalLM" || { echo "transformers does not import: stop"; exit 1; }
s=$SECONDS
python3 -c "from deepspeed.ops.op_builder import FusedAdamBuilder as B; B().load()" > "$OUT/build-fused.log" 2>&1 &
python3 -c "from deepspeed.ops.op_builder import CPUAdamBuilder as B; B().load()" > "$OUT/build-cpu.log" 2>&1 &
wait; echo "op builds (fused Adam, CPU Adam in parallel): $((SECONDS - s)) s"
timeout -s TERM 400 python3 -m zlayout verify --batch benchmarks/measurements/h200-2026-12-01b/batch-h200-heldout-steptime.txt \
  --out /tmp/heldout --deadline 320 > "$OUT/heldout-steptime.log" 2>&1
cp /tmp/heldout/results.jsonl "$OUT/heldout-steptime-results.jsonl"
tar czf "$OUT/heldout-steptime-ranks.tgz" --exclude=checkpoint -C /tmp heldout
echo "batch done at ${SECONDS}s"
timeout 110 python3 benchmarks/measurements/tools/cpu_adam_scaling.py --host h200-16core --out "$OUT/cpu-adam-16core.jsonl" \
  > "$OUT/cpu-adam.txt" 2>&1
echo "finished at ${SECONDS}s"; cat "$OUT/cpu-adam.txt" | tail -8
grep -h "^verify \|^  GPU peak alloc\|^  GPU device\|^  step time\|Error\|error" "$OUT/heldout-steptime.log" | head -60
