"""Predicted vs measured host memory per node on every verify run, before and after the
host-transient model (zlayout.core.memory.host_init_transients).

    python benchmarks/host_accuracy.py

Rows: every `zlayout verify` result under benchmarks/measurements/ whose "measured" has
host_peak_bytes and host_maxrss_bytes_per_rank (ru_maxrss of each rank, read at the end of the
run: the peak of the whole process). Failed runs are left out (most died before the model was
built: 0.63 GiB). "before" is the model as it was: max(1 GiB + 4 bytes/param when the model is
built in fp32 on the host, 3 GiB + host model states); "after" is estimate_memory now.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from measurements import result_input, verify_results  # noqa: E402

from zlayout.core.memory import FP32_BYTES, HOST_BASE_BYTES, estimate_memory, model_init  # noqa: E402
from zlayout.spec import GiB, Layout, PlanInput  # noqa: E402

MEASURED = ROOT / "benchmarks" / "measurements"
TRANSIENTS = ("process_baseline", "model_construction", "defragment_staging")


def rows() -> list[tuple[str, dict, PlanInput, Layout]]:
    out = []
    for path, r in verify_results():
        m = r.get("measured") or {}
        if r.get("status") == "failed" or not m.get("host_peak_bytes") or not m.get("host_maxrss_bytes_per_rank"):
            continue
        inp, layout = result_input(r, path)
        out.append((str(path.relative_to(MEASURED)), m, inp, layout))
    return out


def before_bytes(inp: PlanInput, layout: Layout, est) -> int:
    """The host peak per node as the model had it before the transients."""
    ranks = inp.hardware.gpus_per_node
    states = sum(t.bytes for t in est.terms if t.where == "host" and t.name not in TRANSIENTS) // ranks
    built = FP32_BYTES * inp.model.params if model_init(inp.training.init, layout.stage) == "fp32-cpu" else 0
    return max(int(1.0 * GiB) + built, HOST_BASE_BYTES + states) * ranks


def summary(name: str, errs: list[float]) -> str:
    if not errs:
        return f"{name}: no rows"
    under = min(errs)
    return (f"{name} ({len(errs)} rows): mean |err| {sum(map(abs, errs)) / len(errs):.1f}%, "
            f"max |err| {max(map(abs, errs)):.1f}%, worst under {under:+.1f}%")


def main() -> int:
    table = rows()
    if not table:
        print("no measurements found")
        return 1
    errs: dict[tuple[str, str], list[float]] = {}
    print(f"{'source':44} {'layout':26} {'impl':7} {'shape':30} {'meas':>6} {'before':>6} {'err%':>6}"
          f" {'after':>6} {'err%':>6}  (GiB per node)")
    for source, m, inp, layout in table:
        est = estimate_memory(inp, layout, replay=False)
        # per node: the ranks of one node (every verify run is on one node)
        measured = sum(m["host_maxrss_bytes_per_rank"][:inp.hardware.gpus_per_node])
        old, new = before_bytes(inp, layout, est), est.host_peak_bytes
        e_old, e_new = (100.0 * (x - measured) / measured for x in (old, new))
        kind = "gpu" if layout.offload_optimizer == layout.offload_param == "gpu" else "offloaded"
        errs.setdefault((kind, "before"), []).append(e_old)
        errs.setdefault((kind, "after"), []).append(e_new)
        md, t = inp.model, inp.training
        shape = (f"L{md.layers} h{md.hidden} V{md.vocab}{' tied' if md.tie_embeddings else ''}"
                 f"{' ckpt' if t.checkpointing == 'full' else ''} w{inp.hardware.world}")
        print(f"{source[:44]:44} {layout.label:26} {t.impl:7} {shape:30} {measured / GiB:6.2f} {old / GiB:6.2f}"
              f" {e_old:+6.1f} {new / GiB:6.2f} {e_new:+6.1f}")
    print()
    for kind, title in (("gpu", "GPU-resident"), ("offloaded", "offloaded")):
        for when in ("before", "after"):
            print(summary(f"{title:12} {when:6}", errs.get((kind, when), [])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
