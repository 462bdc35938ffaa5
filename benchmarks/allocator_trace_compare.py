"""Line the allocator replay's request sequence up against a recorded allocator trace.

    python benchmarks/allocator_trace_compare.py benchmarks/measurements/h200-2026-12-01b/traces/z0-L16-h2048.json.gz
    python benchmarks/allocator_trace_compare.py TRACE.json.gz --phase step1.step --show 40

The trace (benchmarks/measurements/tools/allocator_trace.py) is replayed as recorded: its large requests
(over 1 MiB, the pool `allocator_sim` replays) and the segments the real allocator made. The
same layout (the trace's argv, as `zlayout verify` reads it, planned with the cards its batch ran
with: `measurements.batch_cards`, or `--cards DIR`) is written by
`allocator_sim.allocation_sequence` and served by `allocator_sim.CachingAllocator`, one per
stream. Per phase (built, initialize, stepN.forward/backward/step) it prints: the number of
large requests and their bytes, reserved at the phase's end (less what empty_cache returned), the segments each side made
(with the request that made it), and the first places where the two request sequences
differ (sizes in MiB, `difflib` opcodes), so a missing, extra or reordered tensor shows where
it first appears.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from measurements import read_trace, trace_input  # noqa: E402
from zlayout.core.allocator_sim import (  # noqa: E402
    DEFAULT_STREAM, SMALL_SIZE, CachingAllocator, _Seq, allocation_sequence)

MiB = 2**20


def mib(x: int) -> float:
    return round(x / MiB, 1)


def trace_phases(doc: dict) -> dict[str, dict]:
    """Per phase, the recorded large requests (MiB), the segments made (size, index of the
    request that made it, its size) and reserved at the phase's end (all pools, large only)."""
    ALLOC, SEG = doc["actions"]["alloc"], doc["actions"]["segment_alloc"]
    SEG_FREE = doc["actions"]["segment_free"]
    trace = doc["trace"]
    bounds = [0] + [i for _, i in doc["phase_marks"]]
    names = [name for name, _ in doc["phase_marks"]]
    out: dict[str, dict] = {}
    reserved = 0
    for k, name in enumerate(names):
        reqs: list[float] = []
        segs: list[tuple[float, int, float]] = []
        rows = trace[bounds[k]:bounds[k + 1]]
        for j, (action, _addr, size, *_stream) in enumerate(rows):
            if action == ALLOC and size > SMALL_SIZE:
                reqs.append(mib(size))
            elif action == SEG and size > 2 * MiB:
                # the segment is made for the alloc that follows it
                nxt = next((r[2] for r in rows[j + 1:] if r[0] == ALLOC), 0)
                segs.append((mib(size), len(reqs), mib(nxt)))
                reserved += size
            elif action == SEG_FREE and size > 2 * MiB:  # empty_cache
                reserved -= size
        merged = out.setdefault(replay_phase(name, names), {"reqs": [], "segs": []})
        base = len(merged["reqs"])
        merged["reqs"] += reqs
        merged["segs"] += [(size, base + i, req) for size, i, req in segs]
        merged["reserved"] = reserved
    return out


def replay_phase(name: str, names: list[str]) -> str:
    """The replay's phase for a traced one. Under gradient accumulation the trace marks every
    micro-step (stepN.mK.forward/backward/step); the replay marks only the last (the boundary),
    so micro-steps 1..K-1 and the last forward are its stepN.forward."""
    parts = name.split(".")
    if len(parts) != 3:
        return name
    step, micro, phase = parts
    last = max(int(n.split(".")[1][1:]) for n in names if n.startswith(step + ".m"))
    return f"{step}.{phase}" if int(micro[1:]) == last else f"{step}.forward"


def replay_phases(events: list[tuple], marks: list[tuple[str, int]]) -> dict[str, dict]:
    """The same per-phase figures for the replayed sequence."""
    pools: dict[int, CachingAllocator] = {}
    handles: dict[object, tuple[CachingAllocator, object]] = {}
    bounds = [0] + [i for _, i in marks]
    out: dict[str, dict] = {}
    for k, (name, _) in enumerate(marks):
        reqs: list[float] = []
        segs: list[tuple[float, int, float]] = []
        for event in events[bounds[k]:bounds[k + 1]]:
            if event[0] == "a":
                stream = event[3] if len(event) > 3 else DEFAULT_STREAM
                pool = pools.setdefault(stream, CachingAllocator())
                before = len(pool.segment_sizes)
                handles[event[1]] = (pool, pool.malloc(event[2]))
                if event[2] > SMALL_SIZE:
                    reqs.append(mib(event[2]))
                if len(pool.segment_sizes) > before:
                    segs.append((mib(pool.segment_sizes[-1]), len(reqs) - 1,
                                 mib(event[2]) if stream == DEFAULT_STREAM else f"{mib(event[2])}@s{stream}"))
            elif event[0] == "f":
                pool, handle = handles.pop(event[1])
                pool.free(handle)
            else:  # empty_cache
                for pool in pools.values():
                    pool.empty_cache()
        out[name] = {"reqs": reqs, "segs": segs, "reserved": sum(p.reserved for p in pools.values())}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--phase", action="append", help="only these phases (repeatable)")
    ap.add_argument("--show", type=int, default=6, help="differing stretches shown per phase")
    ap.add_argument("--segments", type=int, default=12, help="segment creations shown per side and phase")
    ap.add_argument("--cards", type=Path, help="plan with this cards folder (default: the cards the trace's "
                    "batch ran with, measurements.batch_cards)")
    a = ap.parse_args()
    doc = read_trace(a.trace)
    inp, layout = trace_input(a.trace, a.cards)
    inp = inp.model_copy(update={"headroom_fraction": 0.0})
    seq = _Seq()
    if allocation_sequence(inp, layout, steps=2, _seq=seq) is None:
        print("this layout is not replayed")
        return 1
    real, sim = trace_phases(doc), replay_phases(seq.events, seq.marks)
    print(f"{doc['name']}: {doc['argv']}")
    print(f"measured max reserved {doc['max_reserved_bytes'] / 2**30:.2f} GiB; replay {sim[seq.marks[-1][0]]['reserved'] / 2**30:.2f} GiB (large pools)")
    for name in real:  # the trace's own phase order (stepN.mK.* under accumulation)
        if a.phase and name not in a.phase:
            continue
        r, s = real[name], sim.get(name, {"reqs": [], "segs": [], "reserved": 0})
        print(f"\n== {name}: requests {len(r['reqs'])} real / {len(s['reqs'])} replay; "
              f"MiB {sum(r['reqs']):.0f} / {sum(s['reqs']):.0f}; reserved at end "
              f"{r['reserved'] / 2**30:.2f} / {s['reserved'] / 2**30:.2f} GiB")
        for label, side in (("real", r), ("replay", s)):
            segs = side["segs"]
            shown = ", ".join(f"{size:g}@#{i}({req})" for size, i, req in segs[:a.segments])
            more = f" ... +{len(segs) - a.segments}" if len(segs) > a.segments else ""
            print(f"  segments {label:6s} {len(segs):3d} = {sum(x[0] for x in segs):8.0f} MiB: {shown}{more}")
        ops = [op for op in difflib.SequenceMatcher(None, r["reqs"], s["reqs"], autojunk=False).get_opcodes()
               if op[0] != "equal"]
        for tag, i1, i2, j1, j2 in ops[:a.show]:
            print(f"  {tag:7s} real #{i1}-{i2} {r['reqs'][i1:min(i2, i1 + 12)]}{'...' if i2 - i1 > 12 else ''}"
                  f"  replay #{j1}-{j2} {s['reqs'][j1:min(j2, j1 + 12)]}{'...' if j2 - j1 > 12 else ''}")
        if len(ops) > a.show:
            print(f"  ... {len(ops) - a.show} more differing stretches")
    return 0


if __name__ == "__main__":
    sys.exit(main())
