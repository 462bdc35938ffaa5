#!/bin/bash
# 2026-12-02, eighth session, call 2 on one H200 (16 cores): call 1's 14 families again (every one
# failed there: family_truth.py loaded fused Adam without verify's TORCH_CUDA_ARCH_LIST correction).
# Call 1's header, kept: Ground truth gathered before the
# session's models exist (nothing here is a prediction of the new code):
#  1. retry_cost.py: what a caching-allocator retry (free the cache, cudaMalloc again) costs (issue 28);
#  2. family_truth.py: 14 transformers families from their own config classes (2 layers), ZeRO-0,
#     both training loops, peak allocated and the allocator's trace of one step (issue 27);
#  3. ZeRO-3 with optimizer and weights on the CPU, one layout three times in separate processes
#     through `zlayout verify` (issue 28: device used, run to run).
source benchmarks/measurements/tools/h200_node_setup.sh call2
D=benchmarks/measurements/h200-2026-12-02c
T=/tmp/truth; mkdir -p $T
s=$SECONDS
python3 -c "from zlayout.verify.environment import corrected_env as c; import os; os.environ.update(c(dict(os.environ))[0]); from deepspeed.ops.op_builder import FusedAdamBuilder as B; B().load()" > "$T/build-fused.log" 2>&1
echo "fused adam build: $((SECONDS - s)) s"
fam() { name=$1; left=$(( 400 - SECONDS )); [ $left -gt 30 ] || { echo "$name: no time left"; return; }
  OUT=$T timeout -s TERM $(( left < 120 ? left : 120 )) torchrun --standalone --nproc_per_node 1 --master_port $((30100 + RANDOM % 800)) \
    $D/family_truth.py "$@" > "$T/$name.log" 2>&1; echo "$name rc=$? at ${SECONDS}s"; grep -h "^TRUTH" "$T/$name.log" >> $T/truth.jsonl; }
L2='{"num_hidden_layers": 2}'
( fam llama-ctl llama 4096 1 "$L2"; fam gpt2 gpt2 1024 8 "$L2"; fam phi3 phi3 4096 1 "$L2"; fam gemma gemma 4096 1 "$L2"
  fam qwen3 qwen3 4096 1 "$L2"; fam qwen3_moe qwen3_moe 4096 1 "$L2"; fam starcoder2 starcoder2 4096 1 "$L2" ) > $T/laneA.txt 2>&1 &
laneA=$!
( fam cohere cohere 4096 1 "$L2"; fam gpt_neox gpt_neox 2048 2 "$L2"; fam gemma2 gemma2 4096 1 "$L2"; fam olmo2 olmo2 4096 1 "$L2"
  fam phimoe phimoe 4096 1 "$L2"; fam gpt_bigcode gpt_bigcode 1024 8 "$L2"; fam gemma3_text gemma3_text 4096 1 "$L2" ) > $T/laneB.txt 2>&1 &
laneB=$!
wait $laneA $laneB
cat $T/laneA.txt $T/laneB.txt
echo "families done at ${SECONDS}s"
tar czf $OUT/call2-truth.tgz -C /tmp truth
cp $T/truth.jsonl $OUT/ 2>/dev/null
echo "call2 finished at ${SECONDS}s"
