"""The host's cost of a kernel beyond an op's first (core.steptime HOST_S_PER_EXTRA_KERNEL), from
the host probe of h200-2026-12-14 (`probe_host.py`, call 1: each model alone, bf16, on one H200;
per ATen op its calls and the host's time inside them, a dispatch mode timing each call: the op's
dispatch, its allocations and its launches) and the kernels the learner counts for each op at the
probe's shapes (zlayout.learn.launches, through the ledger the cards are learned with).

    python benchmarks/host_extra_kernel.py

An op of k kernels costs the host its dispatch once and a launch for each of the k - 1 more. The
constant is solved from one op, the sort (granite's 24 a forward: 12 kernels, 182 us), against the
host floor's 27.5 us an op (HOST_S_PER_KERNEL): (182 - 27.5) / 11. Every other multi-kernel op the
probe timed is a check, not a fit: its time against the same probe's one-kernel ops' mean plus
(k - 1) extra kernels. Ops that wait for the GPU (the backward's accumulating index_put reads a
count back) or launch nothing (views) are left out; so is the probe's Llama-3.2-1B, whose only
multi-kernel ops are the backward's slice_backward, timed while the host waited on a full launch
queue (its backward's mm 166 us a call against 50 in granite's). An op the probe saw once a pass
(the loss's, the embedding's backward) is one sample, the backward's first op its engine's start too.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROBE = ROOT / "benchmarks" / "measurements" / "h200-2026-12-14" / "results-call1"
# (probe file, config, sequences, tokens)
RUNS = (("host-granite-z3.jsonl", "tests/hf/configs/published/granite-3.0-1b-a400m-base.json", 4, 4096),
        ("host-olmoe-l8-z3.jsonl", "tests/hf/configs/published/OLMoE-1B-7B-0924.json", 2, 4096))
# ops whose host time includes a wait on the GPU (probe README): not a launch's cost
WAITS = {"index_put", "_local_scalar_dense"}
SUFFIXES = ("_unaligned", "_strided", "_scatter", "_fp32")


def kernels_per_call(config_path: Path, sequences: int, tokens: int) -> dict[str, tuple[int, int]]:
    """Per ATen op the learner's (kernel launches, ops) in one step of two traced blocks and the head."""
    from zlayout import hfconfig
    from zlayout.learn.learner import _truncated, block_list, build_model, trace_step

    config, _ = hfconfig.read_config(config_path)
    model, _ = build_model(config)
    model.bfloat16()
    blocks = block_list(model)
    with _truncated(model, blocks, [0, 1]) as traced:
        step = trace_step(model, traced, tokens, False, sequences)
    launches: Counter = Counter()
    ops: Counter = Counter()
    for name, count in step["calls"].items():
        base = name
        for suffix in SUFFIXES:
            base = base.removesuffix(suffix)
        launches[base] += count
        ops[base] += step["ops"][name]
    return {name: (launches[name], ops[name]) for name in launches}


def slope_through_zero(rows: list[tuple[int, float, float, str]]) -> float:
    """Least squares through zero of (calls, further kernels, excess us, op) rows: us a further
    kernel, each op weighted by its calls."""
    return sum(w * x * y for w, x, y, _ in rows) / sum(w * x * x for w, x, _, _ in rows)


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from zlayout.core.steptime import HOST_S_PER_EXTRA_KERNEL, HOST_S_PER_KERNEL

    per_op_us, extra_us = HOST_S_PER_KERNEL * 1e6, HOST_S_PER_EXTRA_KERNEL * 1e6
    print(f"shipped: {per_op_us:.1f} us an op, {extra_us:.1f} us a further kernel")
    for probe, config, sequences, tokens in RUNS:
        counts = kernels_per_call(ROOT / config, sequences, tokens)
        timed = {}
        for line in (PROBE / probe).read_text().splitlines():
            row = json.loads(line)
            if row["kind"] == "ops":
                for name, calls, host_us in row["top"]:
                    timed[(row["phase"], name)] = (calls, host_us)
        one = [(calls, host_us) for (_, name), (calls, host_us) in timed.items()
               if name in counts and name not in WAITS and counts[name][0] == counts[name][1] and name != "mm"]
        one_us = sum(h for _, h in one) / sum(c for c, _ in one)
        repeated = []
        print(f"\n{probe} ({sequences} x {tokens}): one-kernel ops (no GEMM) {one_us:.1f} us a call, "
              f"{sum(c for c, _ in one)} calls")
        print(f"  {'op':34s} {'calls':>5s} {'kernels':>7s} {'host us':>8s} {'model us':>8s} "
              f"{'extra us (27.5)':>15s} {'extra us (one-kernel mean)':>26s}")
        for (phase, name), (calls, host_us) in sorted(timed.items()):
            if name not in counts or name in WAITS or counts[name][0] == counts[name][1]:
                continue
            launches, ops = counts[name]
            if ops == 0:
                continue
            k = launches / ops
            per_call = host_us / calls
            model = one_us + (k - 1) * extra_us
            print(f"  {phase + ' ' + name:34s} {calls:5d} {k:7.1f} {per_call:8.1f} {model:8.1f} "
                  f"{(per_call - per_op_us) / (k - 1):15.1f} {(per_call - one_us) / (k - 1):26.1f}")
            if calls >= 8:  # an op of every block
                repeated.append((calls, k - 1, per_call - one_us, name))
        two = [excess for _, extra, excess, _ in repeated if extra == 1]
        fit = slope_through_zero(repeated)
        fit_no_sort = slope_through_zero([r for r in repeated if r[3] != "sort"])
        print(f"  ops of every block: two-kernel ops {min(two):.1f}-{max(two):.1f} us over a one-kernel op "
              f"(mean {sum(two) / len(two):.1f}); least squares over all {fit:.1f} us a further kernel, "
              f"without the sort {fit_no_sort:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
