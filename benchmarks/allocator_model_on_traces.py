"""The caching-allocator model fed each recorded run's own requests: is a reserve miss the
allocator's or the requests'?

    python benchmarks/allocator_model_on_traces.py [--only NAME]

`benchmarks/allocator_trace_compare.py` lines the planner's request sequence up against a
recorded allocator trace (benchmarks/measurements/*/traces/). This one leaves the planner out: it
replays the trace's own large requests (over 1 MiB: the pool the planner replays) through
`zlayout.core.caching_allocator.CachingAllocator`, one pool a stream, releasing every free
segment where the run did (`segment_free`: empty_cache), and frees each block either where the
run asked (`free_requested`) or where the allocator could take it back (`free_completed`: a block
a `record_stream` holds waits for that stream's event; DeepSpeed records the compute stream on
ZeRO-3's gathered weights and the reduce stream on gradients). Per trace: the run's max reserved,
then the model's at each. Traces recorded before the tracer kept each request's stream
(h200-2026-12-01*) are replayed in one pool: where a side stream took requests (ZeRO-1/2's
reduce stream, ZeRO-3's gathers) they are not comparable and are marked so. Where the model at `free_completed` matches the run, the allocator model
is right and any miss of the planner's replay is its request sequence; the two modes' difference
is what record_stream's deferral costs, which depends on how far the GPU runs behind the host.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from measurements import read_trace  # noqa: E402
from zlayout.core.caching_allocator import SMALL_SIZE, CachingAllocator  # noqa: E402

GiB = 2**30
TRACES = sorted((ROOT / "benchmarks" / "measurements").glob("*/traces/*.json.gz"))


def max_reserved(doc: dict, free_at: str) -> int:
    """The model's max reserved (large pools) over the trace's own requests, blocks freed at
    `free_at` ("free_requested" or "free_completed")."""
    actions = doc["actions"]
    alloc, free, segment_free = actions["alloc"], actions[free_at], actions["segment_free"]
    pools: dict[int, CachingAllocator] = {}
    live: dict[int, tuple[CachingAllocator, object]] = {}
    peak = 0
    for row in doc["trace"]:
        action, address, size = row[0], row[1], row[2]
        if action == alloc and size > SMALL_SIZE:
            pool = pools.setdefault(row[3] if len(row) > 3 else 0, CachingAllocator())
            live[address] = (pool, pool.malloc(size))
            peak = max(peak, sum(p.reserved for p in pools.values()))
        elif action == free and address in live:
            pool, block = live.pop(address)
            pool.free(block)
        elif action == segment_free:  # the run's empty_cache: every free segment goes back
            for pool in pools.values():
                pool.empty_cache()
    return peak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="traces whose file name contains this")
    args = parser.parse_args()
    print(f"{'trace':44s} {'run':>8s} {'requested':>10s} {'completed':>10s}  (max reserved, GiB; large pools)")
    errors = []
    for path in TRACES:
        if args.only and args.only not in path.name:
            continue
        doc = read_trace(path)
        run = doc["max_reserved_bytes"] / GiB
        asked, taken = (max_reserved(doc, mode) / GiB for mode in ("free_requested", "free_completed"))
        streams = any(len(row) > 3 for row in doc["trace"])
        error = 100 * (taken - run) / run
        if streams:
            errors.append(abs(error))
        print(f"{path.parent.parent.name + '/' + path.name.removesuffix('.json.gz'):44s} {run:8.2f} "
              f"{asked:10.2f} {taken:10.2f}  {error:+.1f}%{'' if streams else '  (no streams recorded: one pool)'}")
    if errors:
        print(f"traces with streams: {len(errors)}, |error| at free_completed: worst {max(errors):.1f}%, "
              f"mean {sum(errors) / len(errors):.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
