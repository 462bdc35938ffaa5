#!/bin/bash
# 2026-12-03, eleventh session, on one H200 (16 cores). One script, called once per device call with
# the parts to run; the node keeps /tmp/site and the built DeepSpeed ops while it stays warm, and
# each part does its set-up only when the node lacks it (a fresh node after a release gets it again).
#   setup      install the carried wheels, record the host, build fused Adam, then CPU Adam
#   fam:FILE   zlayout verify --batch FILE (held-out family lines, predicted before: see README)
#   edge       edge-predictions.txt: for each shape and allocator, the predicted largest layer count
#              N, then N+1 when N trains or N-1 when it runs out of memory (break-even within one layer?)
# Every part stops 30 s before DEADLINE (seconds from the start of this call).
D=benchmarks/measurements/h200-2026-12-03
DEADLINE=${DEADLINE:-570}
R=/tmp/call; mkdir -p $R
if [ ! -f /tmp/site/.zlayout-ready ]; then
  source benchmarks/measurements/tools/h200_node_setup.sh "node-$(date +%H%M%S)" && touch /tmp/site/.zlayout-ready
else
  export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 \
    TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 HF_HUB_OFFLINE=1
  OUT=${OUT:-/tmp/verify-out}; mkdir -p "$OUT"
fi
export ZLAYOUT_CARDS_DIR=${ZLAYOUT_CARDS_DIR:-$PWD/benchmarks/measurements/h200-2026-12-03/heldout/cards}
left() { echo $(( DEADLINE - SECONDS )); }
build() {  # name builder: as the verify worker loads it (corrected TORCH_CUDA_ARCH_LIST)
  [ -f /tmp/built-$1 ] && return
  local s=$SECONDS
  python3 -c "from zlayout.verify.environment import corrected_env as c; import os; os.environ.update(c(dict(os.environ))[0]); from deepspeed.ops.op_builder import $2 as B; B().load()" > "$R/build-$1.log" 2>&1 \
    && touch /tmp/built-$1; echo "build $1: rc $? in $((SECONDS - s)) s"; }
edge_run() {  # shape alloc L flags...: prints trains / oom / error
  local shape=$1 alloc=$2 L=$3; shift 3
  local out=$R/edge-$shape-$alloc-L$L
  timeout -s TERM 150 python3 -m zlayout verify "$@" --layers $L --allocator $alloc --out $out > $out.log 2>&1
  local st; st=$(python3 -c "import json; print(json.load(open('$out/result.json'))['status'])" 2>/dev/null || echo error)
  case $st in validated|mismatch) v=trains;; does-not-fit) v=oom;; *) v=error;; esac
  echo "$shape $alloc $L $v $st at ${SECONDS}s" >> $R/edge.txt
  [ -f $out/result.json ] && cp $out/result.json $OUT/edge-$shape-$alloc-L$L.json
  cp $out.log $OUT/ 2>/dev/null
  echo $v; }
for part in "$@"; do
  case $part in
    setup)
      build fused FusedAdamBuilder
      build cpuadam CPUAdamBuilder ;;
    fam:*)
      f=${part#fam:}; n=$(basename $f .txt)
      [ $(left) -gt 90 ] || { echo "$n: no time left"; continue; }
      timeout -s TERM $(( $(left) - 10 )) python3 -m zlayout verify --batch $f --out /tmp/$n \
        --deadline $(( $(left) - 100 )) > $OUT/$n.log 2>&1
      echo "$n rc=$? at ${SECONDS}s"
      cp /tmp/$n/results.jsonl $OUT/$n-results.jsonl 2>/dev/null
      tail -5 $OUT/$n.log ;;
    math)  # the math attention's requests on CUDA, in order (probe_math_attention.py)
      timeout 120 python3 $D/probe_math_attention.py --device cuda $OUT/math-cuda.json 2>&1 | tail -4 ;;
    trace:*)  # an allocator trace of one batch line: trace:FILE:LINE (tools/allocator_trace.py)
      spec=${part#trace:}; f=${spec%:*}; n=${spec##*:}
      [ $(left) -gt 150 ] || { echo "trace $spec: no time left"; continue; }
      args=$(grep -v '^#' $f | sed -n "${n}p" | sed 's/--loop [a-z]*//; s/--gpus-per-node 1 --gpu h200//; s/--host-cores 16//; s/--steps 4//')
      OUT=$OUT timeout -s TERM $(( $(left) - 20 )) torchrun --standalone --nproc_per_node 1 \
        benchmarks/measurements/tools/allocator_trace.py --name trace-$n-$(basename $f .txt) -- $args \
        --gpus-per-node 1 --gpu h200 > $OUT/trace-$n.log 2>&1
      echo "trace $spec rc=$? $(grep -h '^TRACE' $OUT/trace-$n.log)" ;;
    edge*)  # edge or edge:SHAPE (one shape only)
      only=${part#edge}; only=${only#:}
      grep -v '^#' $D/edge-predictions.txt | while read shape alloc N flags; do
        [ -z "$only" ] || [ "$only" = "$shape" ] || continue
        grep -q "^$shape $alloc " $R/edge.txt 2>/dev/null && { echo "edge $shape $alloc: done before"; continue; }
        [ $(left) -gt 150 ] || { echo "edge $shape $alloc: no time left"; continue; }
        v=$(edge_run $shape $alloc $N $flags | tail -1)
        [ $(left) -gt 150 ] || continue
        if [ "$v" = trains ]; then edge_run $shape $alloc $((N + 1)) $flags > /dev/null
        elif [ "$v" = oom ]; then edge_run $shape $alloc $((N - 1)) $flags > /dev/null; fi
      done
      cat $R/edge.txt; cp $R/edge.txt $OUT/ ;;
  esac
done
cp $R/build-*.log $OUT/ 2>/dev/null
echo "call finished at ${SECONDS}s"
