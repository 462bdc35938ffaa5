"""Device memory and the fit verdict against `zlayout verify` runs on H200, by allocator.

    python benchmarks/allocator_accuracy.py

For every verify result in benchmarks/measurements/ (result objects, one per line), every row
the measurement scripts recorded before verify kept result objects (benchmarks/measurements/tools/measure.py and
the first probe, on one and two H200s: `script_rows`), and the
layer sweeps of Llama-3-8B's shape (shape A: ZeRO-0, seq 4096, micro-batch 1; the rows of
issue 11 and of 2026-12-01): predicted vs measured peak allocated, peak reserved and device
used, and the verdict with zero headroom (`fits`) against what happened (ran / out of memory).
A run that ran out of memory is held against what PyTorch said it needed: allocated at the
failure plus the request that failed. The expandable-segments run of 32 layers finished its
steps with 0.02 GiB left on the card, then failed to allocate 24 bytes for NCCL in the
worker's closing barrier (a one-rank run has no peers; the worker no longer makes that call):
it counts as having run.
Constants: TRAPPED_FRACTION and EXPANDABLE_SLACK_BYTES were read off two rows (shape A, 28
layers default and 32 layers expandable: the in-sample rows, marked *). The rule that only the
optimizer step's transient is trapped under pressure came from one more (shape B, 18 layers,
default: it ran where trapping its loss request would have said it cannot). Every other row
is held out from them; shape B's 17 layers and its expandable 18/19 were predicted before they ran.
Peak reserved of ZeRO 0-2 (the optimizer on the GPU or, stage 1/2, the CPU) and ZeRO-3 comes from replaying the allocator
(zlayout/core/allocator_sim.py, no fitted constant but the 20 MiB small pool); its request
order was written while looking at every row here, so these rows are not a hold-out for it.
The hold-out is benchmarks/measurements/h200-2026-12-01b/batch-h200-heldout-allocator.txt (rows tagged h, from
h200-2026-12-01b/heldout-allocator-results.jsonl), predicted in h200-2026-12-01b/heldout-allocator-predictions.jsonl
before it ran: reported against both the current model and those committed predictions.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from measurements import result_input, verify_results  # noqa: E402
from zlayout.core.memory import estimate_memory  # noqa: E402
from zlayout.spec import GiB, Layout, PlanInput  # noqa: E402

MEASURED = ROOT / "benchmarks" / "measurements"
# The batch written for the allocator replay and predicted before it ran
# (benchmarks/measurements/h200-2026-12-01b/batch-h200-heldout-allocator.txt): results the lead drops here are the hold-out.
HELDOUT = MEASURED / "h200-2026-12-01b" / "heldout-allocator-results.jsonl"
HELDOUT_PREDICTIONS = MEASURED / "h200-2026-12-01b" / "heldout-allocator-predictions.jsonl"
# The second hold-out (benchmarks/measurements/h200-2026-12-01b/batch-h200-heldout2.txt, `# allocator` and `# step time`
# lines), predicted after the replay learnt ZeRO-3 and gradient accumulation
# (heldout2-allocator-predictions.jsonl, committed before it ran): rows tagged H. Every row
# of the results file counts, step-time lines too (their memory is as held out).
HELDOUT2 = MEASURED / "h200-2026-12-01b" / "heldout2-results.jsonl"
HELDOUT2_PREDICTIONS = MEASURED / "h200-2026-12-01b" / "heldout2-allocator-predictions.jsonl"
# The third (benchmarks/measurements/h200-2026-12-01c/batch-h200-heldout3.txt, 13 shapes no earlier row had), predicted by
# main at c00c30b and by the replay then in progress (branch alloc5 at 1d42eff), both
# committed before it ran: rows tagged 3. The ZeRO-3 sub-group fix came after it, from its
# one under-predicted row and that row's trace (so "this model" is not a clean hold-out for
# that row).
HELDOUT3 = MEASURED / "h200-2026-12-01c" / "heldout3-results.jsonl"
HELDOUT3_PREDICTIONS = MEASURED / "h200-2026-12-01c" / "heldout3-allocator-predictions.jsonl"
HELDOUT3_PREDICTIONS_ALLOC5 = MEASURED / "h200-2026-12-01c" / "heldout3-allocator-predictions-alloc5-1d42eff.jsonl"
# The fourth (benchmarks/measurements/h200-2026-12-01e/batch-h200-heldout4.txt, 12 shapes), predicted by main at 5609f6d and
# committed before it ran: rows tagged 4.
HELDOUT4 = MEASURED / "h200-2026-12-01e" / "heldout4-results.jsonl"
HELDOUT4_PREDICTIONS = MEASURED / "h200-2026-12-01e" / "heldout4-allocator-predictions.jsonl"
# The fifth (benchmarks/measurements/h200-2026-12-01e/batch-h200-heldout5.txt, 5 shapes), predicted by main at 666d1ca after
# the replay's traced fixes, committed before it ran: rows tagged 5.
HELDOUT5 = MEASURED / "h200-2026-12-01e" / "heldout5-results.jsonl"
HELDOUT5_PREDICTIONS = MEASURED / "h200-2026-12-01e" / "heldout5-allocator-predictions.jsonl"
# The eighth (benchmarks/measurements/h200-2026-12-02/batch-h200-heldout8.txt, 7 shapes), predicted by main at 41fdcac after
# the sixth session's first two traced fixes, committed before it ran: rows tagged 8.
HELDOUT8 = MEASURED / "h200-2026-12-02" / "heldout8-results.jsonl"
HELDOUT8_PREDICTIONS = MEASURED / "h200-2026-12-02" / "heldout8-allocator-predictions.jsonl"
# The ninth (benchmarks/measurements/h200-2026-12-02/batch-h200-heldout9.txt, 8 shapes), predicted by main at d2a3b3f after
# every traced fix of the sixth session, committed before it ran: rows tagged 9.
HELDOUT9 = MEASURED / "h200-2026-12-02" / "heldout9-results.jsonl"
HELDOUT9_PREDICTIONS = MEASURED / "h200-2026-12-02" / "heldout9-allocator-predictions.jsonl"
# The tenth (benchmarks/measurements/h200-2026-12-02b/batch-h200-heldout10.txt, 6 shapes each run twice), predicted by main at
# 23711b6, committed before it ran: rows tagged 10.
HELDOUT10 = MEASURED / "h200-2026-12-02b" / "heldout10-results.jsonl"
HELDOUT10_PREDICTIONS = MEASURED / "h200-2026-12-02b" / "heldout10-allocator-predictions.jsonl"
# The eleventh (benchmarks/measurements/h200-2026-12-02b/batch-h200-heldout11.txt, 5 offloaded shapes), predicted by main at
# 2e45549, committed before it ran: rows tagged 11.
HELDOUT11 = MEASURED / "h200-2026-12-02b" / "heldout11-results.jsonl"
HELDOUT11_PREDICTIONS = MEASURED / "h200-2026-12-02b" / "heldout11-allocator-predictions.jsonl"
# The hold-outs reported by device used alone: (tag, results, predictions committed before the
# run and the model that made them, a second committed set or None and its model).
LATER_HELDOUTS = (
    ("3", HELDOUT3, HELDOUT3_PREDICTIONS, "main c00c30b", HELDOUT3_PREDICTIONS_ALLOC5, "replay on alloc5 1d42eff"),
    ("4", HELDOUT4, HELDOUT4_PREDICTIONS, "main 5609f6d", None, None),
    ("5", HELDOUT5, HELDOUT5_PREDICTIONS, "main 666d1ca", None, None),
    ("8", HELDOUT8, HELDOUT8_PREDICTIONS, "main 41fdcac", None, None),
    ("9", HELDOUT9, HELDOUT9_PREDICTIONS, "main d2a3b3f", None, None),
    ("10", HELDOUT10, HELDOUT10_PREDICTIONS, "main 23711b6", None, None),
    ("11", HELDOUT11, HELDOUT11_PREDICTIONS, "main 2e45549", None, None),
)
SHAPE_A = ("--stage 0 --hidden 3584 --heads 28 --kv-heads 4 --ffn 12544 --vocab 128256 --mlp swiglu "
           "--norm rmsnorm --no-bias --seq 4096 --micro-batch 1 --gpus-per-node 1 --gpu h200")
OOM_TEXT = re.compile(r"Tried to allocate ([\d.]+) GiB.*?([\d.]+) GiB is allocated by PyTorch", re.S)
IN_SAMPLE = {("A", 28, "default"), ("A", 32, "expandable")}


def zero_headroom(inp: PlanInput) -> PlanInput:
    return inp.model_copy(update={"headroom_fraction": 0.0})


def verify_rows() -> list[dict]:
    rows = []
    for path, r in verify_results():
        if r.get("mode") != "gpu" or r.get("status") not in ("validated", "does-not-fit", "failed", "mismatch"):
            continue
        measured = r.get("measured") or {}
        error = r.get("cause") or ""
        if r["status"] == "failed" and "Failed to CUDA calloc" not in json.dumps(r):
            continue  # a crash that says nothing about memory (e.g. a missing package)
        r["_source"], r["_results"] = path.name, str(path)
        r["_measured"] = measured = with_peak_device_used(r, measured)
        r["_error"] = error
        rows.append(r)
    return rows


def with_peak_device_used(r: dict, measured: dict) -> dict:
    """Rows verified before the worker read device use at the peak
    (zlayout.verify.worker.device_used_at_peak) report the card's use after the run; where the
    allocator retried (it frees its cached segments to do so) that is below the run's peak.
    The rank's cached segments at the end give the cache then (all of it when it lists every
    segment; else the part it lists, which makes the non-cache part an upper bound)."""
    if not (measured.get("alloc_retries") or 0) or not measured.get("gpu_device_used_bytes"):
        return measured
    peaks = []
    for rank in r.get("ranks") or []:
        stats = (rank or {}).get("allocator_stats") or {}
        if rank.get("device_used_at_end_bytes") or not stats.get("segments_end"):
            return measured  # verified by a worker that reads the peak itself, or nothing to go on
        cache_end = sum(size for size, _ in stats["segments_end"])
        peaks.append(rank["device_used_bytes"] - cache_end + rank["max_reserved_bytes"])
    return {**measured, "gpu_device_used_bytes": max(peaks)} if peaks else measured


def row_key(stage, opt, param, impl, layers, hidden, vocab, seq, micro_batch) -> tuple:
    return (stage, opt, param, impl, layers, hidden, vocab, seq, micro_batch)


def committed_predictions(path: Path = HELDOUT_PREDICTIONS) -> dict[tuple, dict]:
    """A predictions file by layout and shape (what was predicted before the run)."""
    if not path.exists():
        return {}
    import shlex

    from zlayout.cli import build_parser, layout_from_args, plan_input_from_args
    out = {}
    for line in path.read_text().splitlines():
        p = json.loads(line)
        args = build_parser().parse_args(["verify", *shlex.split(p["line"])])
        inp, lay = plan_input_from_args(args), layout_from_args(args)
        m, t = inp.model, inp.training
        out[row_key(lay.stage, lay.offload_optimizer, lay.offload_param, t.impl, m.layers, m.hidden,
                    m.vocab, t.seq, t.micro_batch)] = p
    return out


class HeldOut:
    """One held-out batch's errors: against this model and against its committed predictions."""

    def __init__(self, predictions: dict[tuple, dict], second: dict[tuple, dict] | None = None) -> None:
        self.predictions = predictions
        self.second = second or {}
        self.resv: list[float] = []
        self.used: list[float] = []
        self.signed_used: list[float] = []
        self.committed_resv: list[float] = []
        self.committed_used: list[float] = []
        self.committed_signed_used: list[float] = []
        self.second_used: list[float] = []
        self.second_signed_used: list[float] = []

    def add(self, est, layout: Layout, inp: PlanInput, resv: int, used: int) -> None:
        model, t = inp.model, inp.training
        self.resv.append(abs(est.gpu_peak_reserved_bytes - resv) / resv * 100)
        self.used.append(abs(est.gpu_device_used_bytes - used) / used * 100)
        self.signed_used.append((est.gpu_device_used_bytes - used) / used * 100)
        key = row_key(layout.stage, layout.offload_optimizer, layout.offload_param, t.impl,
                      model.layers, model.hidden, model.vocab, t.seq, t.micro_batch)
        p = self.predictions.get(key)
        if p:
            self.committed_resv.append(abs(p["gpu_peak_reserved_gib"] * GiB - resv) / resv * 100)
            self.committed_used.append(abs(p["gpu_device_used_gib"] * GiB - used) / used * 100)
            self.committed_signed_used.append((p["gpu_device_used_gib"] * GiB - used) / used * 100)
        q = self.second.get(key)
        if q:
            self.second_used.append(abs(q["gpu_device_used_gib"] * GiB - used) / used * 100)
            self.second_signed_used.append((q["gpu_device_used_gib"] * GiB - used) / used * 100)


def gib_cell(b: float | None) -> str:
    """A table cell: bytes as GiB, or a dash where there is no figure."""
    return f"{b / GiB:7.2f}" if b else "      -"


CARD_SHARED_BYTES = 3 * GiB  # device used beyond reserved that no CUDA context + NCCL explains


def script_rows() -> tuple[list[float], int, int]:
    """The rows measured by the scripts before `zlayout verify` kept result objects
    (benchmarks/measurements/tools/measure.py: h200-measure-a/b.jsonl; the first probe: h200-2026-11-29.jsonl), on one
    and two H200s; verify-h200-2026-11-30-raw.jsonl repeats verify results counted above. Prints
    each row's peak reserved and device used against the plan; returns the signed device-used
    errors (rows that recorded it) and the fit verdict (each ran): right, of."""
    from measurements import load_measured

    print(f"\n{'run (measure.py / first probe)':62} {'alloc':>7} {'pred':>7} {'resv':>7} {'pred':>7}"
          f" {'used':>7} {'pred':>7}")
    signed_used, resv_err, verdict_ok, verdict_all = [], [], 0, 0
    for m in load_measured():
        r = m.row
        if m.source == "verify-h200-2026-11-30-raw.jsonl" or not r.get("reserved_gib"):
            continue
        est = estimate_memory(zero_headroom(m.inp), m.layout)
        verdict_all += 1
        verdict_ok += est.fits_gpu
        resv = r["reserved_gib"] * GiB
        used = (r.get("device_used_gib") or 0) * GiB
        resv_err.append(abs(est.gpu_peak_reserved_bytes - resv) / resv * 100)
        # The card's use (mem_get_info) less this process's reserve is its CUDA context (1.29 GiB on
        # one GPU, 1.77-1.82 with NCCL on two, every other row); one row (ZeRO-2 opt->cpu, one GPU,
        # 32 layers) read 13.97: memory this process's allocator never held (another process on the
        # card while it ran), not the layout's. Printed, and left out of the device-used figures.
        shared = used and used - resv > CARD_SHARED_BYTES
        if used and not shared:
            signed_used.append((est.gpu_device_used_bytes - used) / used * 100)
        print(f"{m.label[:62]:62} {gib_cell(max(r['peak_gib']) * GiB)} {gib_cell(est.gpu_peak_allocated_bytes)} {gib_cell(resv)} "
              f"{gib_cell(est.gpu_peak_reserved_bytes)} {gib_cell(used)} {gib_cell(est.gpu_device_used_bytes)}"
              f"{f'  (card used {(used - resv) / GiB:.2f} GiB beyond this reserve: not counted)' if shared else ''}")
    worst = max(resv_err)
    print(f"these rows: peak reserved {sum(resv_err) / len(resv_err):.1f}% mean, {worst:.1f}% max over "
          f"{len(resv_err)}; device used over the {len(signed_used)} that recorded it joins 'every row' below")
    return signed_used, verdict_ok, verdict_all


def runs_out_after(est, steps_run: int) -> int | None:
    """The step the replay on the card runs out of memory in, when later than `steps_run`."""
    why = next((t.explanation for t in est.gpu_terms() if t.name == "allocator_reserve"), "")
    hit = re.search(r"in step (\d+)'s", why)
    return int(hit.group(1)) if hit and int(hit.group(1)) > steps_run else None


def main() -> int:
    print(f"{'run':62} {'alloc':>7} {'pred':>7} {'resv':>7} {'pred':>7} {'used':>7} {'pred':>7}"
          f" {'needs':>7} {'result':>6} {'fits':>5}")
    used_err, resv_err, verdict_ok, verdict_all, alloc_err = [], [], 0, 0, []
    ho, h2 = HeldOut(committed_predictions()), HeldOut(committed_predictions(HELDOUT2_PREDICTIONS))
    later = {tag: HeldOut(committed_predictions(first), committed_predictions(second) if second else None)
             for tag, _, first, _, second, _ in LATER_HELDOUTS}
    by_source = {HELDOUT.name: ("h", ho), HELDOUT2.name: ("H", h2),
                 **{results.name: (tag, later[tag]) for tag, results, *_ in LATER_HELDOUTS}}
    every_used: list[float] = []  # signed, every row that ran
    for r in verify_rows():
        inp, layout = result_input(r, Path(r["_results"]))
        inp = zero_headroom(inp)
        est = estimate_memory(inp, layout)
        m = r["_measured"]
        ran = r["status"] in ("validated", "mismatch") or (
            r["status"] == "failed" and len(m.get("gpu_peak_allocated_bytes_per_step") or []) == r.get("steps", 3))
        model, t = inp.model, inp.training
        key = ("A", model.layers, t.allocator) if model.hidden == 3584 and layout.stage == 0 else None
        held = by_source.get(r["_source"])  # (tag, its HeldOut) for a hold-out's row
        tag = "*" if key in IN_SAMPLE else (held[0] if held else " ")
        label = (f"{tag}{layout.label} {t.impl} {t.allocator[:3]} L{model.layers} h{model.hidden} "
                 f"s{t.seq} b{t.micro_batch}{' ckpt' if t.checkpointing == 'full' else ''} w{inp.hardware.world}")
        alloc = m.get("gpu_peak_allocated_bytes") or 0
        resv = m.get("gpu_peak_reserved_bytes")
        used = m.get("gpu_device_used_bytes")
        needs = "-"
        if r["status"] == "does-not-fit":
            hit = OOM_TEXT.search(json.dumps(r).replace("\\n", " "))
            if hit:
                needs = f"{float(hit.group(1)) + float(hit.group(2)):7.2f}"
        if ran and alloc:
            alloc_err.append(abs(est.gpu_peak_allocated_bytes - alloc) / alloc * 100)
        if ran and resv and tag == " ":
            resv_err.append(abs(est.gpu_peak_reserved_bytes - resv) / resv * 100)
        if ran and used and tag == " ":
            used_err.append(abs(est.gpu_device_used_bytes - used) / used * 100)
        if held and ran and resv and used:
            held[1].add(est, layout, inp, resv, used)
        if ran and used:
            every_used.append((est.gpu_device_used_bytes - used) / used * 100)
        # a run shorter than the step the replay runs out of memory in ran, as the plan says it
        # would (h200-2026-12-01's 3-step ZeRO-2 L18 ran; for 6 steps, h200-2026-12-08, step 4 ran out)
        out_in = ran and not est.fits_gpu and runs_out_after(est, len(m.get("gpu_peak_allocated_bytes_per_step") or []))
        right = est.fits_gpu == ran or bool(out_in)
        verdict_all += 1
        verdict_ok += right
        print(f"{label[:62]:62} {gib_cell(alloc)} {gib_cell(est.gpu_peak_allocated_bytes)} {gib_cell(resv)} "
              f"{gib_cell(est.gpu_peak_reserved_bytes)} {gib_cell(used)} {gib_cell(est.gpu_device_used_bytes)} {needs:>7} "
              f"{'ran' if ran else 'OOM':>6} {'yes' if est.fits_gpu else 'no':>5}{'' if right else '  <- WRONG'}"
              f"{f'  (ran its steps; out of memory in step {out_in})' if out_in else ''}")
    print()
    # the layer sweep of shape A as issue 11 reported it (runs not kept as result objects)
    from zlayout.cli import build_parser, plan_input_from_args
    for line in (MEASURED / "h200-2026-12-01" / "boundary-issue11.jsonl").read_text().splitlines():
        b = json.loads(line)
        args = build_parser().parse_args(["plan", *SHAPE_A.split(), "--layers", str(b["layers"]),
                                          "--allocator", b["allocator"], "--loop", "trainer"])
        est = estimate_memory(zero_headroom(plan_input_from_args(args)), Layout(stage=0))
        ran = b["result"] == "ran"
        verdict_all += 1
        verdict_ok += est.fits_gpu == ran
        print(f" issue 11: ZeRO-0 shape A L{b['layers']} {b['allocator']:10} {b['result']:4} "
              f"alloc {b.get('alloc_gib', '-')!s:>7} pred {est.gpu_peak_allocated_bytes / GiB:7.2f} "
              f"needs pred {est.gpu_needed_bytes / GiB:7.2f} -> {'fits' if est.fits_gpu else 'does not fit'}"
              f"{'' if est.fits_gpu == ran else '  <- WRONG'}")
    print()
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    print(f"peak allocated (runs that ran): mean |err| {mean(alloc_err):.1f}%, max {max(alloc_err):.1f}% "
          f"over {len(alloc_err)}")
    print(f"peak reserved (rows before the replay; in-sample): mean |err| {mean(resv_err):.1f}%, "
          f"max {max(resv_err):.1f}% over {len(resv_err)}")
    print(f"device used (rows before the replay; in-sample):   mean |err| {mean(used_err):.1f}%, "
          f"max {max(used_err):.1f}% over {len(used_err)}")
    if ho.used:
        print(f"held out (h, {HELDOUT.relative_to(ROOT)}), this model (in-sample for its ZeRO-3 and accumulation): reserved {mean(ho.resv):.1f}% mean, "
              f"{max(ho.resv):.1f}% max; device used {mean(ho.used):.1f}% mean, {max(ho.used):.1f}% max "
              f"over {len(ho.used)}")
    if ho.committed_used:
        print(f"held out, predictions committed before the run: reserved {mean(ho.committed_resv):.1f}% mean, "
              f"{max(ho.committed_resv):.1f}% max; device used {mean(ho.committed_used):.1f}% mean, "
              f"{max(ho.committed_used):.1f}% max over {len(ho.committed_used)}")
    elif not HELDOUT.exists():
        print(f"held out: {HELDOUT.relative_to(ROOT)} not there yet (batch-h200-heldout-allocator.txt)")
    if h2.used:
        print(f"held out 2 (H, {HELDOUT2.relative_to(ROOT)}), this model: reserved {mean(h2.resv):.1f}% mean, "
              f"{max(h2.resv):.1f}% max; device used {mean(h2.used):.1f}% mean, {max(h2.used):.1f}% max "
              f"over {len(h2.used)}")
    if h2.committed_used:
        print(f"held out 2, predictions committed before the run: reserved {mean(h2.committed_resv):.1f}% mean, "
              f"{max(h2.committed_resv):.1f}% max; device used {mean(h2.committed_used):.1f}% mean, "
              f"{max(h2.committed_used):.1f}% max over {len(h2.committed_used)}")
    if not HELDOUT2.exists():
        print(f"held out 2: {HELDOUT2.relative_to(ROOT)} not there yet (batch-h200-heldout2.txt)")
    for tag, results, _, made_by, _, second_by in LATER_HELDOUTS:
        h = later[tag]
        if not h.used:
            continue
        # worst under: the most negative error, under-predicted, the unsafe side
        print(f"held out {tag} ({tag}, {results.relative_to(ROOT)}), this model: device used {mean(h.used):.1f}% mean, "
              f"{max(h.used):.1f}% max, worst under {min(h.signed_used):+.1f}% over {len(h.used)}")
        print(f"held out {tag}, predictions committed before the run ({made_by}): device used "
              f"{mean(h.committed_used):.1f}% mean, {max(h.committed_used):.1f}% max, worst under "
              f"{min(h.committed_signed_used):+.1f}% over {len(h.committed_used)}")
        if second_by:
            print(f"held out {tag}, committed before the run ({second_by}): device used "
                  f"{mean(h.second_used):.1f}% mean, {max(h.second_used):.1f}% max, worst under "
                  f"{min(h.second_signed_used):+.1f}% over {len(h.second_used)}")
    script_used, script_ok, script_all = script_rows()
    every_used += script_used
    verdict_ok, verdict_all = verdict_ok + script_ok, verdict_all + script_all
    absolute = [abs(e) for e in every_used]
    print(f"device used, every row that ran ({len(every_used)}): {mean(absolute):.1f}% mean, {max(absolute):.1f}% max, "
          f"{sum(a <= 5 for a in absolute)} within 5%, worst under-prediction {min(every_used):+.1f}%")
    print(f"fit verdict at zero headroom:   {verdict_ok} of {verdict_all} right")
    return 0


if __name__ == "__main__":
    sys.exit(main())
