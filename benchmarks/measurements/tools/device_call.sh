#!/bin/bash
# The device script of the H200 measurement folders from h200-2026-12-03b on (the earlier folders
# keep the exact script their calls ran). Called once per device call, from the repository root,
# with the parts to run; the node keeps /tmp/site and the built DeepSpeed ops while it stays warm,
# and a fresh node gets them again.
#   setup            install the carried wheels, record the host, build fused Adam, then CPU Adam
#                    (before any timed run: a JIT build killed by a timeout leaves a lock)
#   setup-gpu        the same without CPU Adam (a batch with no optimizer on the CPU)
#   setup-cpu        CPU Adam alone (an offloaded trace or profile needs no fused Adam)
#   fam:FILE         zlayout verify --batch FILE (held-out lines, predicted before: see the folder's README)
#   trace:FILE:LINE  an allocator trace (tools/allocator_trace.py) of line LINE of batch FILE
#                    ($TRACE_STEPS training steps, 2 unless set: env:TRACE_STEPS=5 before it)
#   prof:FILE:LINE   a step-time profile (tools/steptime_profile.py: 3 timed steps, 1 profiled) of that line
#   env:NAME=VALUE   export NAME=VALUE for the parts after it (a profile's output is named -NAME after it)
#   setup-fla        install .whl/extra's einops and flash-linear-attention wheels, and start building
#                    causal-conv1d from its sdist for sm_90 only (its setup.py compiles 6-9 archs) in the background
#   wait-fla         wait for that build, then record triton, fla, causal_conv1d and what transformers
#                    resolves for Qwen3.5's linear attention ($OUT/linear-attention.txt)
#   adam             DeepSpeedCPUAdam's rate on this host at 1 and 16 threads (tools/cpu_adam_scaling.py, 100M
#                    parameters; after `setup`: the op loads with the environment it was built with) -> $OUT/cpu-adam.jsonl
#   nofla            the parts after it see neither fla nor causal_conv1d (a shadow package that raises on
#                    import): transformers resolves its torch fallback, as on a node without them
# A batch's cards are read from heldout/cards beside it (heldout/$CARDS when CARDS is set). Every part stops 30 s before DEADLINE
# (seconds from the start of this call).
DEADLINE=${DEADLINE:-570}
R=/tmp/call; mkdir -p $R
if [ ! -f /tmp/site/.zlayout-ready ]; then
  source benchmarks/measurements/tools/h200_node_setup.sh "node-$(date +%H%M%S)" && touch /tmp/site/.zlayout-ready
else
  export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 \
    TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 HF_HUB_OFFLINE=1
  OUT=${OUT:-/tmp/verify-out}; mkdir -p "$OUT"
fi
left() { echo $(( DEADLINE - SECONDS )); }
line_args() {  # the verify arguments of line $2 of batch $1 (comments skipped)
  grep -v '^#' "$1" | sed -n "${2}p"; }
build() {  # name builder: as the verify worker loads it (corrected TORCH_CUDA_ARCH_LIST)
  [ -f /tmp/built-$1 ] && return
  local s=$SECONDS
  python3 -c "from zlayout.verify.environment import corrected_env as c; import os; os.environ.update(c(dict(os.environ))[0]); from deepspeed.ops.op_builder import $2 as B; B().load()" > "$R/build-$1.log" 2>&1 \
    && touch /tmp/built-$1; echo "build $1: rc $? in $((SECONDS - s)) s"; }
for part in "$@"; do
  case $part in
    setup)
      build fused FusedAdamBuilder
      build cpuadam CPUAdamBuilder ;;
    setup-gpu)
      build fused FusedAdamBuilder ;;
    setup-cpu)
      build cpuadam CPUAdamBuilder ;;
    fam:*)
      f=${part#fam:}; n=$(basename $f .txt)
      [ $(left) -gt 90 ] || { echo "$n: no time left"; continue; }
      ZLAYOUT_CARDS_DIR=$PWD/$(dirname $f)/heldout/${CARDS:-cards} timeout -s TERM $(( $(left) - 10 )) \
        python3 -m zlayout verify --batch $f --out /tmp/$n --deadline $(( $(left) - 100 )) > $OUT/$n.log 2>&1
      echo "$n rc=$? at ${SECONDS}s"
      cp /tmp/$n/results.jsonl $OUT/$n-results.jsonl 2>/dev/null
      tail -5 $OUT/$n.log ;;
    trace:*)
      spec=${part#trace:}; f=${spec%:*}; n=${spec##*:}
      [ $(left) -gt 150 ] || { echo "trace $spec: no time left"; continue; }
      args=$(line_args $f $n | sed 's/--steps [0-9]*//')  # the line's own GPU: an H100 line is traced as one
      OUT=$OUT ZLAYOUT_CARDS_DIR=$PWD/$(dirname $f)/heldout/${CARDS:-cards} timeout -s TERM $(( $(left) - 20 )) \
        torchrun --standalone --nproc_per_node 1 benchmarks/measurements/tools/allocator_trace.py \
        --name trace-$n-$(basename $f .txt) --steps ${TRACE_STEPS:-2} -- $args > $OUT/trace-$n.log 2>&1
      echo "trace $spec rc=$? $(grep -h '^TRACE' $OUT/trace-$n.log)" ;;
    prof:*)
      spec=${part#prof:}; f=${spec%:*}; n=${spec##*:}
      [ $(left) -gt 150 ] || { echo "prof $spec: no time left"; continue; }
      args=$(line_args $f $n | sed 's/--steps [0-9]*//')
      OUT=$OUT ZLAYOUT_CARDS_DIR=$PWD/$(dirname $f)/heldout/${CARDS:-cards} timeout -s TERM $(( $(left) - 20 )) \
        torchrun --standalone --nproc_per_node 1 benchmarks/measurements/tools/steptime_profile.py \
        --name prof-$n-$(basename $f .txt)$SUFFIX --timed-steps ${TIMED_STEPS:-3} --steps 1 ${PROF_FLAGS:-} -- $args > $OUT/prof-$n$SUFFIX.log 2>&1
      echo "prof $spec$SUFFIX rc=$? $(grep -h '^PROFILE' $OUT/prof-$n$SUFFIX.log)" ;;
    setup-fla)
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
        .whl/extra/einops-*.whl .whl/extra/fla_core-*.whl .whl/extra/flash_linear_attention-*.whl 2>&1 | tail -2
      rm -rf /tmp/ccb && mkdir -p /tmp/ccb && tar xzf .whl/extra/causal_conv1d-*.tar.gz -C /tmp/ccb
      CCDIR=$(ls -d /tmp/ccb/causal_conv1d-*)  # not CC: that names the C compiler nvcc and triton use
      python3 - "$CCDIR/setup.py" <<'PY'
import sys
p = sys.argv[1]; s = open(p).read()
anchor = "    # HACK: The compiler flag"
assert anchor in s, "causal-conv1d's setup.py changed"
open(p, "w").write(s.replace(anchor, '    cc_flag = [f for f in cc_flag if not f.startswith(("-gencode", "arch="))] + ["-gencode", "arch=compute_90,code=sm_90"]\n' + anchor, 1))
PY
      ( cd $CCDIR && s=$SECONDS; CAUSAL_CONV1D_FORCE_BUILD=TRUE MAX_JOBS=8 python3 setup.py build_ext --inplace \
          > $R/build-causal-conv1d.log 2>&1; echo "rc $? in $((SECONDS - s)) s" > /tmp/causal-conv1d.done ) &
      export PYTHONPATH=$PYTHONPATH:$CCDIR
      echo "setup-fla: wheels installed, causal-conv1d building in $CCDIR" ;;
    wait-fla)
      # a later call on the warm node: the build's folder is not on PYTHONPATH yet (twenty-seventh session)
      CCDIR=$(ls -d /tmp/ccb/causal_conv1d-* 2>/dev/null | head -1)
      [ -n "$CCDIR" ] && case ":$PYTHONPATH:" in *":$CCDIR:"*) ;; *) export PYTHONPATH=$PYTHONPATH:$CCDIR ;; esac
      while [ ! -f /tmp/causal-conv1d.done ] && [ $(left) -gt 120 ]; do sleep 5; done
      echo "build causal-conv1d: $(cat /tmp/causal-conv1d.done 2>/dev/null || echo 'still running: no time left')"
      python3 - > $OUT/linear-attention.txt 2>&1 <<'PY'
import importlib, torch, triton
print("torch", torch.__version__, "triton", triton.__version__)
for name in ("fla", "causal_conv1d"):
    try:
        m = importlib.import_module(name); print(name, getattr(m, "__version__", "?"), m.__file__)
    except Exception as e:
        print(name, "does not import:", type(e).__name__, e)
from transformers.models.qwen3_5 import modeling_qwen3_5
from zlayout.verify.worker_model import linear_attention_implementation
print("transformers resolves", linear_attention_implementation(modeling_qwen3_5))
PY
      cat $OUT/linear-attention.txt ;;
    nofla)
      mkdir -p /tmp/nofla/fla /tmp/nofla/causal_conv1d
      for p in fla causal_conv1d; do echo "raise ImportError('hidden by device_call.sh nofla')" > /tmp/nofla/$p/__init__.py; done
      export PYTHONPATH=/tmp/nofla:$PYTHONPATH; SUFFIX="$SUFFIX-nofla"; echo "nofla: fla and causal_conv1d hidden" ;;
    adam)
      [ $(left) -gt 60 ] || { echo "adam: no time left"; continue; }
      timeout -s TERM $(( $(left) - 10 )) python3 -c "
import os, runpy, sys
from zlayout.verify.environment import corrected_env
os.environ.update(corrected_env(dict(os.environ))[0])
sys.argv = ['cpu_adam_scaling.py', '--threads', '1,16', '--params', '100e6', '--repeats', '3', '--deadline', '40',
            '--host', 'node-$(date +%H%M%S)', '--out', '$OUT/cpu-adam.jsonl']
runpy.run_path('benchmarks/measurements/tools/cpu_adam_scaling.py', run_name='__main__')" > $OUT/cpu-adam.log 2>&1
      echo "adam rc=$?"; tail -4 $OUT/cpu-adam.log ;;
    env:*)
      kv=${part#env:}; export "$kv"; SUFFIX="$SUFFIX-${kv%%=*}"; echo "exported $kv" ;;
    *) echo "unknown part $part" ;;
  esac
done
cp $R/build-*.log $OUT/ 2>/dev/null
echo "call finished at ${SECONDS}s"
