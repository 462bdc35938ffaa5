"""Multi-GPU layouts' allocator on one GPU: rank 0 of N on torch's fake process group.

    python benchmarks/measurements/tools/emulated_world.py lines [--extra]   # name and verify arguments per layout
    python benchmarks/measurements/tools/emulated_world.py compare DIR       # DIR: the traces allocator_trace.py wrote
    python benchmarks/measurements/tools/emulated_world.py batch BATCH       # a held-out batch's lines, named
    python benchmarks/measurements/tools/emulated_world.py heldout BATCH PREDICTIONS DIR
    python benchmarks/measurements/tools/emulated_world.py verify            # the `zlayout verify --emulate` runs

Only one-GPU machines were lent for the allocator work, and the replay
(zlayout/core/allocator_sim.py) had no trace of a multi-GPU ZeRO-3 run: its gathers were a
labelled stand-in. `allocator_trace.py --emulate-world N` runs one process as rank 0 of N
(layout_on_gpu.start_distributed): DeepSpeed partitions, buckets and gathers as on N GPUs, the
collectives move nothing. Whether that is rank 0's real allocator is a measured question, not an
assumption: `lines` lists the layouts measured on two real H200s (benchmarks/measurements/, the
2-GPU host h200-32core), `compare` holds each emulated peak allocated and peak reserved against
the real one, and against the replay's prediction. `--extra` adds layouts no real multi-GPU host
measured (4 and 8 GPUs): traces for the replay, with no real figure to compare.
`batch`/`heldout`: a held-out batch of verify lines (benchmarks/measurements/h200-2026-12-01f/batch-emulated-heldout6.txt),
its replay predictions committed before it ran (benchmarks/measurements/tools/allocator_predict.py), held against
the emulated traces' peak reserved, for the committed predictions and for this model.
`verify`: every `zlayout verify --emulate` result under benchmarks/measurements/, measured
against this model's prediction as the product compares them (zlayout.verify.result.
emulated_figures: NCCL's communicator and buffers left out of device used).
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]  # the repository (this is benchmarks/measurements/tools/)
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # measurements.py: the measured rows
sys.path.insert(0, str(Path(__file__).resolve().parent))  # layout_on_gpu.py

from measurements import MeasuredLayout, load_measured, read_trace  # noqa: E402
from zlayout.spec import GiB, Layout, PlanInput  # noqa: E402

ON_GPU = ("none", "gpu")  # a Layout's offload fields: where the states stay

# Layouts of 4 and 8 GPUs that no real host measured: ZeRO-3 gathers and ZeRO-1/2 partitions at
# the world sizes users plan for (no real figure to compare; traces for the replay).
EXTRA = {
    "x-z3-w4-L8-h4096": "--stage 3 --layers 8 --hidden 4096 --heads 32 --ffn 16384 --vocab 32000 --mlp gelu "
                        "--norm layernorm --seq 2048 --micro-batch 2 --gpus-per-node 4 --gpu h200",
    "x-z3-w8-L16-h3072-ckpt": "--stage 3 --checkpointing full --layers 16 --hidden 3072 --heads 24 --kv-heads 8 "
                              "--ffn 8192 --vocab 128256 --mlp swiglu --norm rmsnorm --no-bias --seq 4096 "
                              "--micro-batch 2 --gpus-per-node 8 --gpu h200",
}


def verify_argv(inp: PlanInput, layout: Layout) -> list[str]:
    """`zlayout verify` arguments that plan this input and layout (zlayout's own model)."""
    m, t, hw = inp.model, inp.training, inp.hardware
    argv = ["--stage", str(layout.stage)]
    if layout.offload_optimizer not in ON_GPU:
        argv += ["--offload-optimizer", layout.offload_optimizer]
    if layout.offload_param not in ON_GPU:
        argv += ["--offload-param", layout.offload_param]
    if t.checkpointing == "full":
        argv += ["--checkpointing", "full"]
    argv += ["--layers", str(m.layers), "--hidden", str(m.hidden), "--heads", str(m.heads),
             "--kv-heads", str(m.kv_heads), "--ffn", str(m.ffn), "--vocab", str(m.vocab),
             "--mlp", m.mlp, "--norm", m.norm]
    if not m.bias:
        argv.append("--no-bias")
    if m.tie_embeddings:
        argv.append("--tie-embeddings")
    argv += ["--seq", str(t.seq), "--micro-batch", str(t.micro_batch)]
    if t.grad_accum > 1:
        argv += ["--grad-accum", str(t.grad_accum)]
    return argv + ["--gpus-per-node", str(hw.gpus_per_node), "--gpu", "h200"]


def name_of(m: MeasuredLayout) -> str:
    r = m.row
    lay = m.layout
    off = ("-opt" if lay.offload_optimizer not in ON_GPU else "") + ("-param" if lay.offload_param not in ON_GPU else "")
    extra = ("-ckpt" if r.get("ckpt") else "") + (f"-gas{r['gas']}" if r.get("gas", 1) > 1 else "")
    return f"w{r['world']}-z{lay.stage}{off}-L{r['layers']}-h{r['hidden']}-s{r['seq']}-b{r['mbs']}{extra}"


def multi_gpu_rows() -> dict[str, MeasuredLayout]:
    """The measured multi-GPU rows by name (one per distinct layout: the first file that has it)."""
    out: dict[str, MeasuredLayout] = {}
    for m in load_measured():
        if m.row["world"] > 1:
            out.setdefault(name_of(m), m)
    return out


def batch_lines(batch: Path) -> list[tuple[str, str]]:
    """(name, verify arguments) of each layout line of a batch file: h<batch number>-<index>."""
    tag = "".join(ch for ch in batch.stem.rsplit("heldout", 1)[-1] if ch.isdigit()) or "x"
    lines = [x.strip() for x in batch.read_text().splitlines() if x.strip() and not x.lstrip().startswith("#")]
    return [(f"h{tag}-{i:02d}", line) for i, line in enumerate(lines, 1)]


def heldout(batch: Path, predictions: Path, folder: Path) -> int:
    from zlayout.cli import build_parser, layout_from_args, plan_input_from_args
    from zlayout.core.memory import estimate_memory

    committed = {json.loads(x)["line"]: json.loads(x) for x in predictions.read_text().splitlines() if x.strip()}
    print(f"{'layout (rank 0 of N on one GPU)':34} {'N':>3} {'trace':>7} {'commit':>7} {'err':>6} {'model':>7} {'err':>6}")
    errs, model_errs = [], []
    for name, line in batch_lines(batch):
        args = build_parser().parse_args(["verify", *shlex.split(line), "--loop", "trainer"])  # traced: loss-only wrapper
        inp = plan_input_from_args(args).model_copy(update={"headroom_fraction": 0.0})
        layout = layout_from_args(args)
        path = folder / f"{name}.json.gz"
        if not path.exists():
            print(f"{name} {layout.label:26} (no trace)")
            continue
        resv = read_trace(path)["max_reserved_bytes"] / GiB
        model = estimate_memory(inp, layout).gpu_peak_reserved_bytes / GiB
        p = committed[line]["gpu_peak_reserved_gib"]
        errs.append((p - resv) / resv * 100)
        model_errs.append((model - resv) / resv * 100)
        print(f"{name} {layout.label[:18]:18} {inp.training.impl:7} {inp.hardware.world:>3} {resv:7.2f} {p:7.2f}"
              f" {errs[-1]:+6.1f} {model:7.2f} {model_errs[-1]:+6.1f}")
    for what, e in (("committed before the run", errs), ("this model", model_errs)):
        if e:
            print(f"peak reserved, {what}: {sum(map(abs, e)) / len(e):.1f}% mean, {max(map(abs, e)):.1f}% max, "
                  f"worst under {min(e):+.1f}% over {len(e)}")
    return 0


def emulated_verify_runs() -> int:
    from measurements import result_input, verify_results
    from zlayout.verify.result import emulated_figures, predicted_figures

    keys = ("gpu_peak_allocated_bytes", "gpu_peak_reserved_bytes", "gpu_device_used_bytes")
    print(f"{'verify --emulate run':46} {'world':>5}" + "".join(f" {k[4:-6]:>22}" for k in keys))
    errors: dict[str, list[float]] = {k: [] for k in keys}
    for path, r in verify_results(emulated=True):
        if r.get("status") != "validated":
            continue
        inp, layout = result_input(r)
        _, predicted = emulated_figures(inp, r["measured"], predicted_figures(inp, layout))
        cells = []
        for k in keys:
            measured = r["measured"][k]
            e = (predicted[k] - measured) / measured * 100
            errors[k].append(e)
            cells.append(f"{measured / GiB:7.2f} {predicted[k] / GiB:7.2f} {e:+6.1f}%")
        m = inp.model
        print(f"{f'ZeRO-{layout.stage} L{m.layers} h{m.hidden} ({path.parent.name})':46} {inp.hardware.world:5d} "
              + " ".join(cells))
    for k, e in errors.items():
        if e:
            print(f"{k[4:-6]}: {sum(map(abs, e)) / len(e):.1f}% mean, {max(map(abs, e)):.1f}% max over {len(e)}")
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["verify"]:
        return emulated_verify_runs()
    if argv[:1] == ["batch"] and len(argv) == 2:
        from zlayout.cli import build_parser, plan_input_from_args

        for name, line in batch_lines(Path(argv[1])):  # name, GPUs (nodes x per node), arguments
            world = plan_input_from_args(build_parser().parse_args(["verify", *shlex.split(line)])).hardware.world
            print(f"{name}\t{world}\t{line}")
        return 0
    if argv[:1] == ["heldout"] and len(argv) == 4:
        return heldout(Path(argv[1]), Path(argv[2]), Path(argv[3]))
    if argv[:1] == ["lines"]:
        for name, m in multi_gpu_rows().items():
            print(f"{name}\t{shlex.join(verify_argv(m.inp, m.layout))}")
        if "--extra" in argv:
            for name, line in EXTRA.items():
                print(f"{name}\t{line}")
        return 0
    if argv[:1] != ["compare"] or len(argv) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    from zlayout.core.memory import estimate_memory

    folder = Path(argv[1])
    print(f"{'layout (rank 0 of N, emulated on one GPU)':44} {'alloc':>7} {'emul':>7} {'err':>6}"
          f" {'resv':>7} {'emul':>7} {'err':>6} {'replay':>7} {'err':>6}")
    alloc_err, resv_err, replay_err = [], [], []
    for name, m in multi_gpu_rows().items():
        path = folder / f"{name}.json.gz"
        if not path.exists():
            print(f"{name:44} (no trace)")
            continue
        t = read_trace(path)
        alloc, resv = max(m.row["peak_gib"]), m.row["reserved_gib"]
        e_alloc, e_resv = t["max_allocated_bytes"] / GiB, t["max_reserved_bytes"] / GiB
        est = estimate_memory(m.inp.model_copy(update={"headroom_fraction": 0.0}), m.layout)
        replay = est.gpu_peak_reserved_bytes / GiB
        a, r, p = (e_alloc - alloc) / alloc * 100, (e_resv - resv) / resv * 100, (replay - resv) / resv * 100
        alloc_err.append(abs(a))
        resv_err.append(abs(r))
        replay_err.append(abs(p))
        print(f"{name:44} {alloc:7.2f} {e_alloc:7.2f} {a:+6.1f} {resv:7.2f} {e_resv:7.2f} {r:+6.1f}"
              f" {replay:7.2f} {p:+6.1f}")
    if alloc_err:
        n = len(alloc_err)
        print(f"\nemulated vs real, {n} layouts: peak allocated {sum(alloc_err) / n:.1f}% mean, {max(alloc_err):.1f}% max;"
              f" peak reserved {sum(resv_err) / n:.1f}% mean, {max(resv_err):.1f}% max")
        print(f"replay vs real reserved: {sum(replay_err) / n:.1f}% mean, {max(replay_err):.1f}% max")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
