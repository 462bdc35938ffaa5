"""The allocator replay's segments at the end of its steps beside a measured run's.

    python benchmarks/measurements/tools/replay_segments.py RESULTS.jsonl ROW 'VERIFY LINE' [STEPS]

ROW: the 0-based line of RESULTS.jsonl (verify's output) whose rank 0 recorded
`allocator_stats.segments_end` (the largest segments left, [size, allocated] bytes); VERIFY LINE: the
batch line that row ran. Prints both lists, largest first, in MiB: where a reserved figure misses, the
segments that differ say which tensors were placed differently (h200-2026-12-04 gemma-3-1b: the run
kept its step's held logits and its Adam moments in two 16 GiB segments, the replay in one). The
replay is unbounded (no card): a run that retried (`num_alloc_retries`) freed its free segments then.
"""

from __future__ import annotations

import collections
import json
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]  # the repository (this is benchmarks/measurements/tools/)
sys.path.insert(0, str(ROOT))

from zlayout.cli import build_parser, layout_from_args, plan_input_from_args  # noqa: E402
from zlayout.core.allocator_sim import allocation_sequence  # noqa: E402
from zlayout.core.caching_allocator import MiB, replay  # noqa: E402

SHOWN = 40  # verify records the 40 largest segments


def replayed_segments(line: str, steps: int) -> list[tuple[int, int]]:
    """(size, allocated) bytes of every large-pool segment the replay holds after `steps` steps."""
    args = build_parser().parse_args(["verify", *shlex.split(line)])
    events = allocation_sequence(plan_input_from_args(args), layout_from_args(args), steps)
    if events is None:
        raise SystemExit("this layout is not replayed (the per-phase rule gives its reserved figure)")
    rows = []
    for pool in replay(events).pools.values():
        free = collections.Counter()
        for block in pool.free_blocks.values():
            free[block.segment] += block.size
        rows += [(size, size - free[i]) for i, size in enumerate(pool.segment_sizes)]
    return sorted(rows, reverse=True)


def main() -> int:
    if len(sys.argv) not in (4, 5) or not sys.argv[2].isdigit() or (len(sys.argv) == 5 and not sys.argv[4].isdigit()):
        raise SystemExit(__doc__)
    rows = Path(sys.argv[1]).read_text().splitlines()
    row = int(sys.argv[2])
    if row >= len(rows):
        raise SystemExit(f"{sys.argv[1]} has {len(rows)} rows")
    stats = json.loads(rows[row])["ranks"][0].get("allocator_stats") or {}
    measured = stats.get("segments_end")
    if not measured:
        raise SystemExit("that row recorded no allocator_stats.segments_end")
    replayed = replayed_segments(sys.argv[3], int(sys.argv[4]) if len(sys.argv) == 5 else 2)

    def mib(pairs) -> str:
        return ", ".join(f"{size // MiB}:{used / MiB:.0f}" for size, used in pairs[:SHOWN])

    print(f"measured (size:allocated MiB; {stats.get('segment_count_end')} segments, "
          f"{stats.get('num_alloc_retries')} retries): {mib(measured)}")
    print(f"replayed ({len(replayed)} segments, {sum(s for s, _ in replayed) / 2**30:.2f} GiB): {mib(replayed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
