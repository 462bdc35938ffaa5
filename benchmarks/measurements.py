"""Load measured layouts (benchmarks/measurements/*.jsonl) as plan inputs.

Every row carries the shape, the training setup, the layout and what torch measured; this
module turns one into the `PlanInput` + `Layout` zlayout predicts for, so every benchmark
holds the same prediction against the same measurement. A row names the host it ran on
(`host`, described in measurements/hosts.toml; rows without one are from the 32-core
2-GPU host where the first measurements were taken). A row of a config.json model names its model
card by key and is planned with the cards its batch was predicted and run with (`batch_cards`).
"""

from __future__ import annotations

import json
import os
import tomllib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from zlayout import catalog
from zlayout.cards import CARDS_DIR_ENV, SHIPPED_CARDS_DIR
from zlayout.core.calibrate import MeasuredStep
from zlayout.core.steptime import steady_step_s
from zlayout.profile.calibration import read_results
from zlayout.spec import (LOOP_OF_UNMARKED_RECORDS, GiB, HardwareSpec, Layout, ModelSpec, PlanInput, TrainingSpec,
                          recorded_inputs)

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [ROOT / "benchmarks" / "measurements"]
MEASURED = SOURCES[0]
HOSTS = tomllib.loads((ROOT / "benchmarks" / "measurements" / "hosts.toml").read_text())
DEFAULT_HOST = "h200-32core"


@dataclass(frozen=True)
class MeasuredLayout:
    source: str
    row: dict
    inp: PlanInput
    layout: Layout

    @property
    def label(self) -> str:
        r = self.row
        shape = f"L{r['layers']} h{r['hidden']} s{r['seq']} b{r['mbs']}"
        extra = (" ckpt" if r.get("ckpt") else "") + (f" gas{r['gas']}" if r.get("gas", 1) > 1 else "")
        return f"{self.layout.label} w{r['world']} | {shape}{extra}"

    @property
    def host(self) -> str:
        return self.row.get("host", DEFAULT_HOST)

    @property
    def cpu_threads_per_rank(self) -> int:
        """The threads each rank's CPU optimizer ran with: as recorded, else torchrun's default
        (OMP_NUM_THREADS=1 when it starts several processes; unset for one: all the cores)."""
        for key in ("cpu_threads", "omp_num_threads"):
            if self.row.get(key):
                return int(self.row[key])
        return 1 if self.row["world"] > 1 else HOSTS[self.host]["host_cores"]

    @property
    def peak_allocated_bytes(self) -> int:
        return int(max(self.row["peak_gib"]) * GiB)

    @property
    def host_maxrss_bytes(self) -> int | None:
        value = self.row.get("host_maxrss_gib")
        return None if value is None else int(value * GiB)

    @property
    def steady_step_s(self) -> float | None:
        if self.row.get("steady_step_s_runs"):  # runs reported as their steady step times only
            runs = self.row["steady_step_s_runs"]
            return sum(runs) / len(runs)
        return steady_step_s(self.row.get("step_s") or [])


def row_to_input(row: dict) -> tuple[PlanInput, Layout]:
    heads = row.get("heads", 32)
    model = ModelSpec(
        name=row.get("tag") or "measured", layers=row["layers"], hidden=row["hidden"], heads=heads,
        kv_heads=row.get("kv_heads") or heads, ffn=row.get("ffn") or 4 * row["hidden"],
        vocab=row["vocab"], mlp=row.get("mlp", "gelu"), norm=row.get("norm", "layernorm"),
        bias=row.get("bias", True), tie_embeddings=bool(row.get("tie", 0)))
    host = HOSTS[row.get("host", DEFAULT_HOST)]
    hardware = HardwareSpec(gpu=catalog.load_gpu("h200"), gpus_per_node=row["world"],
                            intra_link=catalog.load_link("nvlink4"), host_cores=host["host_cores"],
                            host_mem_gbps=host.get("host_mem_gbps", 500.0))
    training = TrainingSpec(seq=row["seq"], micro_batch=row["mbs"], grad_accum=row.get("gas", 1),
                            checkpointing="full" if row.get("ckpt") else "none",
                            loop=LOOP_OF_UNMARKED_RECORDS)  # every row ran the loss-only wrapper
    layout = Layout(stage=row["stage"], offload_optimizer=row.get("offload_opt", "none"),
                    offload_param=row.get("offload_param", "none"))
    return PlanInput(model=model, hardware=hardware, training=training), layout


# Runs whose GPU built another model than the one planned, so they judge an old verify bug, not
# the plan: (batch folder, config file name) -> the results files holding those runs. Until it was
# fixed in h200-2026-12-02d (that batch's README) the worker built `to_hf_config(model)`, the class's
# defaults over the plan's shape, not the user's config.json:
# - h200-2026-12-02d call 1 (fam-1, fam-2 and their merge `families`): santacoder's gelu_fast became
#   gelu_pytorch_tanh (+59.3% peak allocated; the re-run, fam-rerun-results.jsonl, is within 1.3%);
#   gemma-3-1b's 512-token window became 4096 (the same memory, another attention kernel: step
#   0.322 s there, 0.386 s in the re-run); starcoder2-3b-L8's 4096-token window became none, so at
#   4,096 tokens it ran unmasked flash where the user's config masks every call (transformers masks
#   from kv_length >= the window): 0.150 s against the masked plan's 0.205.
# - h200-2026-12-02c call 3's phi3-mini-L8: Phi3Config's defaults, no 2047-token window (found in
#   31263ee), so its attention took no mask where the plan prices the config's (+6.0% once the card
#   priced cuDNN's masked calls).
NOT_THE_PLANNED_MODEL = {
    ("h200-2026-12-02d", "santacoder.json"): {"fam-2-results.jsonl", "families-results.jsonl"},
    ("h200-2026-12-02d", "gemma-3-1b.json"): {"fam-2-results.jsonl", "families-results.jsonl"},
    ("h200-2026-12-02d", "starcoder2-3b-L8.json"): {"fam-1-results.jsonl", "families-results.jsonl"},
    ("h200-2026-12-02c", "phi3-mini-L8.json"): {"call3-families-results.jsonl"},
}


def _planned_model_ran(path: Path, r: dict) -> bool:
    config = str(((r.get("inputs") or {}).get("model") or {}).get("hf_config") or "")
    batch = next((part for part in path.relative_to(SOURCES[0]).parts if part.startswith("h200-")), "")
    return path.name not in NOT_THE_PLANNED_MODEL.get((batch, config.rsplit("/", 1)[-1]), ())


def verify_results(emulated: bool = False):
    """Every `zlayout verify` result kept under benchmarks/measurements/ (any depth), as (its
    file, the result object): the JSON lines that carry "inputs" (batch results, single results;
    prediction files and benchmark rows have none), less the runs of another model than the
    planned one (NOT_THE_PLANNED_MODEL). Runs of `verify --emulate` (rank 0 of the plan's world on
    one GPU: no step time, host or NCCL figures of the real run) only with `emulated=True`, and
    then only they."""
    for path in sorted(SOURCES[0].rglob("*.jsonl")):
        for line in path.read_text().splitlines():
            if not line.strip().startswith("{"):
                continue
            r = json.loads(line)
            if "inputs" in r and bool(r.get("emulated_world")) == emulated and _planned_model_ran(path, r):
                yield path, r


# ------------------------------------------------------------------ which cards a row plans with

# A verify result (or an allocator trace) of a config.json model names its model card by key; the
# planner reads KEY.toml from $ZLAYOUT_CARDS_DIR, then from the shipped cards (zlayout/cards.py).
# Each batch was predicted and run with ZLAYOUT_CARDS_DIR at heldout/cards beside its batch file
# (tools/device_call.sh; the earlier call.sh scripts export the same), so a row is planned with
# the cards of the batch that ran it, never one folder for all: a key kept in two batches may be
# two learners' cards (Falcon-7B-L8's in h200-2026-12-02c/heldout/cards, learned before attention
# kernels were priced, planned h200-2026-12-09's trace at 21.71 GiB reserved for 71.78). A batch
# folder without heldout/cards (h200-2026-12-12, every batch before h200-2026-12-02c) ran with the
# shipped cards only; an empty one (h200-2026-12-14, h200-2026-12-16) is the same.
#
# The rows whose cards are not heldout/cards beside their own file, each with where its README or
# call script says so (paths under benchmarks/measurements/; a folder covers what it holds):
CARDS_NOT_BESIDE = {
    # call.sh exported ../h200-2026-12-02c/heldout/cards: the eighth session's held-out lines left over
    "h200-2026-12-02d": "h200-2026-12-02c/heldout/cards",
    # the calls ran with CARDS=cards-bias (the product's learner; heldout/cards is the learner before it)
    "h200-2026-12-04": "h200-2026-12-04/heldout/cards-bias",
    # trace_call.sh: batch m's line (h200-2026-12-10), traced in this session with its batch's cards
    "h200-2026-12-11/traces/trace-m-1-falcon-40b.json.gz": "h200-2026-12-10/heldout/cards",
    # h200-2026-12-14's batches c and d, run from that folder (its heldout/cards is empty: the shipped cards)
    "h200-2026-12-15/results/batch-calibrate-c-results.jsonl": "h200-2026-12-14/heldout/cards",
    "h200-2026-12-15/results-call2/batch-heldout-d-results.jsonl": "h200-2026-12-14/heldout/cards",
}


def batch_cards(path: Path) -> Path:
    """The cards folder the row(s) in `path` were predicted and run with: a results file or a trace
    under benchmarks/measurements/ (CARDS_NOT_BESIDE, else heldout/cards in its batch folder), the
    shipped cards where that folder has none."""
    rel = Path(path).resolve().relative_to(MEASURED).as_posix()
    named = next((folder for where, folder in CARDS_NOT_BESIDE.items()
                  if rel == where or rel.startswith(where + "/")), None)
    folder = MEASURED / (named or f"{rel.split('/', 1)[0]}/heldout/cards")
    return folder if folder.is_dir() else SHIPPED_CARDS_DIR


def row_cards(r: dict, results: Path | None = None) -> Path:
    """The cards folder a verify result was planned with: its results file's batch's (`batch_cards`);
    without the file, that of the batch folder holding its recorded config, else the shipped cards.
    The config path is recorded absolute on the machine that ran it: read from its
    benchmarks/measurements/ part on."""
    if results is not None:
        return batch_cards(results)
    config = str(((r.get("inputs") or {}).get("model") or {}).get("hf_config") or "")
    marker = "benchmarks/measurements/"
    return batch_cards(MEASURED / config.split(marker, 1)[1]) if marker in config else SHIPPED_CARDS_DIR


def card_file(folder: Path, key: str) -> Path | None:
    """KEY.toml as the planner finds it with $ZLAYOUT_CARDS_DIR at `folder`: there, else shipped."""
    return next((f / f"{key}.toml" for f in (folder, SHIPPED_CARDS_DIR) if (f / f"{key}.toml").is_file()), None)


@contextmanager
def planned_with(folder: Path):
    """$ZLAYOUT_CARDS_DIR at `folder` while the block reads cards (a plan input reads its card when
    validated), the caller's value back after it."""
    saved = os.environ.get(CARDS_DIR_ENV)
    os.environ[CARDS_DIR_ENV] = str(folder)
    try:
        yield folder
    finally:
        if saved is None:
            os.environ.pop(CARDS_DIR_ENV, None)
        else:
            os.environ[CARDS_DIR_ENV] = saved


def result_input(r: dict, results: Path | None = None) -> tuple[PlanInput, Layout]:
    """A verify result's plan input and layout (its "layout" also holds the label and the flags
    the Layout model does not take), its card read from the cards its batch ran with (`row_cards`)."""
    layout = Layout.model_validate({k: r["layout"][k] for k in ("stage", "offload_optimizer", "offload_param")})
    with planned_with(row_cards(r, results)):
        return PlanInput.model_validate(recorded_inputs(r["inputs"])), layout


def read_batch_results(paths) -> tuple[list[MeasuredStep], list[str]]:
    """`zlayout.profile.calibration.read_results` of each results file with its batch's cards."""
    steps: list[MeasuredStep] = []
    skipped: list[str] = []
    for path in paths:
        with planned_with(batch_cards(path)):
            s, k = read_results([path])
        steps += s
        skipped += k
    return steps, skipped


def trace_input(path: Path, cards: Path | None = None):
    """An allocator trace's plan input and layout, from its argv as `zlayout verify` reads it, with
    `cards`, by default its batch's (`batch_cards`; a trace kept elsewhere: the caller's
    $ZLAYOUT_CARDS_DIR). Traces recorded before --loop existed ran the loss-only wrapper (the
    trainer loop); later ones name their loop in argv."""
    from zlayout.cli import build_parser, layout_from_args, plan_input_from_args

    argv = read_trace(path)["argv"]
    loop = [] if "--loop" in argv.split() else ["--loop", "trainer"]
    args = build_parser().parse_args(["verify", *argv.split(), *loop])
    if cards is None and Path(path).resolve().is_relative_to(MEASURED):
        cards = batch_cards(path)
    if cards is None:
        return plan_input_from_args(args), layout_from_args(args)
    with planned_with(cards):
        return plan_input_from_args(args), layout_from_args(args)


def load_measured(with_memory: bool = True) -> list[MeasuredLayout]:
    """Every measured row; `with_memory=False` adds those that measured step time only."""
    out = []
    for folder in SOURCES:
        for path in sorted(folder.glob("*.jsonl")):
            for line in path.read_text().splitlines():
                if not line.strip():
                    continue
                row = json.loads(line)
                if "peak_gib" not in row and (with_memory or "steady_step_s_runs" not in row):
                    continue  # a failed run (kept for the record), or step time only
                inp, layout = row_to_input(row)
                out.append(MeasuredLayout(path.name, row, inp, layout))
    return out


def read_trace(path: Path) -> dict:
    """An allocator trace (`benchmarks/measurements/tools/allocator_trace.py`), kept gzipped: <name>.json.gz."""
    import gzip

    return json.loads(gzip.decompress(path.read_bytes()))


# --------------------------------------------------------------------------- step rows

# The hosts whose rows the step model's constants were fitted on (benchmarks/steptime_fit.py)
FITTED_ON = ("h200-32core", "h200-16core")


def as_step(m: MeasuredLayout) -> MeasuredStep:
    # benchmark rows: steps only (no phases); alloc_retries where the row has the field
    return MeasuredStep(label=m.label, inp=m.inp, layout=m.layout, measured_step_s=m.steady_step_s,
                        cpu_threads_per_rank=m.cpu_threads_per_rank, source=m.source,
                        alloc_retries=m.row.get("alloc_retries"))


class Row:
    """A measured step on a named host: a benchmark row or a verify result."""

    def __init__(self, host: str, step: MeasuredStep, world: int, held_out: bool = False, floor: bool = False):
        self.host, self.step, self.world, self.held_out, self.floor = host, step, world, held_out, floor
        self.label, self.inp, self.layout, self.source = step.label, step.inp, step.layout, step.source
        self.steady_step_s = step.measured_step_s
        self.cpu_threads_per_rank = step.cpu_threads_per_rank or step.inp.hardware.cpu_threads_per_rank
        if step.inp.training.model_dump().get("impl", "zlayout") != "zlayout":
            self.label = f"{self.label} ({step.inp.training.impl})"


def load_rows() -> list[Row]:
    """Every measured step on a named host: the benchmark rows, then each host's verify results (its
    held-out batches and host-floor rows marked)."""
    rows = [Row(m.host, as_step(m), m.row["world"]) for m in load_measured(with_memory=False) if m.steady_step_s]
    for host, desc in HOSTS.items():
        for key, flags in (("verify_results", {}), ("heldout_results", {"held_out": True}),
                           ("host_floor_results", {"floor": True})):
            for f in desc.get(key, []):
                if (path := MEASURED / f).exists():
                    with planned_with(batch_cards(path)):
                        steps, _ = read_results([path], default_host_cores=desc["host_cores"])
                    rows += [Row(host, s, s.inp.hardware.world, **flags) for s in steps]
    return rows
