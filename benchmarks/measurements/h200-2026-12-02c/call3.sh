#!/bin/bash
# 2026-12-02, eighth session, call 3 on one H200 (16 cores): the held-out runs, predicted before they ran.
#  1. issue 28's edge (heldout/edge-predictions.txt): for two shapes and both allocators, the predicted
#     largest layer count N through `zlayout verify`, then N+1 (or N-1 when N fails), a third step while
#     the edge is not bracketed: break-even within one layer of the largest model that trains?
#  2. issue 27's families (heldout/batch-families.txt: 14 published configs of 14 model types, learned
#     cards in heldout/cards, predictions in heldout/families-predictions.jsonl).
source benchmarks/measurements/tools/h200_node_setup.sh call3
D=benchmarks/measurements/h200-2026-12-02c
export ZLAYOUT_CARDS_DIR=$PWD/$D/heldout/cards
R=/tmp/call3; mkdir -p $R
s=$SECONDS
python3 -c "from zlayout.verify.environment import corrected_env as c; import os; os.environ.update(c(dict(os.environ))[0]); from deepspeed.ops.op_builder import FusedAdamBuilder as B; B().load()" > "$R/build-fused.log" 2>&1
echo "fused adam build: $((SECONDS - s)) s"
( python3 -c "from zlayout.verify.environment import corrected_env as c; import os; os.environ.update(c(dict(os.environ))[0]); from deepspeed.ops.op_builder import CPUAdamBuilder as B; B().load()" > "$R/build-cpuadam.log" 2>&1; echo "cpu adam build done at ${SECONDS}s" ) &
cpubuild=$!
# one run at L layers: prints trains / oom / error
edge_run() { shape=$1 alloc=$2 L=$3; shift 3
  out=$R/edge-$shape-$alloc-L$L
  timeout -s TERM 120 python3 -m zlayout verify "$@" --layers $L --allocator $alloc --out $out > $out.log 2>&1
  st=$(python3 -c "import json,sys; print(json.load(open('$out/result.json'))['status'])" 2>/dev/null || echo error)
  case $st in validated|mismatch) v=trains;; does-not-fit) v=oom;; *) v=error;; esac
  echo "EDGE $shape $alloc L$L $v ($st) at ${SECONDS}s"; echo "$shape $alloc $L $v $st" >> $R/edge.txt
  [ -f $out/result.json ] && cp $out/result.json $R/edge-$shape-$alloc-L$L.json
  echo $v; }
grep -v '^#' $D/heldout/edge-predictions.txt | while read shape alloc N flags; do
  [ $(( 330 - SECONDS )) -gt 40 ] || { echo "EDGE $shape $alloc: no time left"; continue; }
  v=$(edge_run $shape $alloc $N $flags | tail -1)
  if [ "$v" = trains ]; then
    v2=$(edge_run $shape $alloc $((N + 1)) $flags | tail -1)
    [ "$v2" = trains ] && edge_run $shape $alloc $((N + 3)) $flags > /dev/null
  elif [ "$v" = oom ]; then
    v2=$(edge_run $shape $alloc $((N - 1)) $flags | tail -1)
    [ "$v2" = oom ] && edge_run $shape $alloc $((N - 3)) $flags > /dev/null
  fi
done
grep -h "^EDGE" $R/*.log 2>/dev/null | head -0; cat $R/edge.txt
wait $cpubuild
left=$(( 575 - SECONDS ))
echo "families from ${SECONDS}s with ${left}s left"
timeout -s TERM $left python3 -m zlayout verify --batch $D/heldout/batch-families.txt --out /tmp/families \
  --deadline $(( left - 40 )) > "$R/families.log" 2>&1
echo "families rc=$? at ${SECONDS}s"
cp /tmp/families/results.jsonl $R/families-results.jsonl 2>/dev/null
grep -E "^(PASS|FAIL|MISMATCH|VALIDATED|DOES)|verdict|result:" $R/families.log | tail -20
tar czf $OUT/call3.tgz -C /tmp call3
cp $R/edge.txt $R/families-results.jsonl $OUT/ 2>/dev/null
echo "call3 finished at ${SECONDS}s"
