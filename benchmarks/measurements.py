"""Load measured layouts (benchmarks/measurements/*.jsonl) as plan inputs.

Every row carries the shape, the training setup, the layout and what torch measured; this
module turns one into the `PlanInput` + `Layout` zlayout predicts for, so every benchmark
holds the same prediction against the same measurement.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from zlayout import catalog
from zlayout.spec import GiB, HardwareSpec, Layout, ModelSpec, PlanInput, TrainingSpec

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [ROOT / "benchmarks" / "measurements"]


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
    def peak_allocated_bytes(self) -> int:
        return int(max(self.row["peak_gib"]) * GiB)

    @property
    def host_maxrss_bytes(self) -> int | None:
        value = self.row.get("host_maxrss_gib")
        return None if value is None else int(value * GiB)

    @property
    def steady_step_s(self) -> float | None:
        steps = self.row.get("step_s") or []
        later = steps[1:] or steps
        return sum(later) / len(later) if later else None


def row_to_input(row: dict) -> tuple[PlanInput, Layout]:
    heads = row.get("heads", 32)
    model = ModelSpec(
        name=row.get("tag") or "measured", layers=row["layers"], hidden=row["hidden"], heads=heads,
        kv_heads=row.get("kv_heads") or heads, ffn=row.get("ffn") or 4 * row["hidden"],
        vocab=row["vocab"], mlp=row.get("mlp", "gelu"), norm=row.get("norm", "layernorm"),
        bias=row.get("bias", True), tie_embeddings=bool(row.get("tie", 0)))
    hardware = HardwareSpec(gpu=catalog.load_gpu("h200"), gpus_per_node=row["world"],
                            intra_link=catalog.load_link("nvlink4"))
    training = TrainingSpec(seq=row["seq"], micro_batch=row["mbs"], grad_accum=row.get("gas", 1),
                            checkpointing="full" if row.get("ckpt") else "none")
    layout = Layout(stage=row["stage"], offload_optimizer=row.get("offload_opt", "none"),
                    offload_param=row.get("offload_param", "none"))
    return PlanInput(model=model, hardware=hardware, training=training), layout


def load_measured() -> list[MeasuredLayout]:
    out = []
    for folder in SOURCES:
        for path in sorted(folder.glob("*.jsonl")):
            for line in path.read_text().splitlines():
                if not line.strip():
                    continue
                row = json.loads(line)
                if "peak_gib" not in row:  # a failed run (kept for the record)
                    continue
                inp, layout = row_to_input(row)
                out.append(MeasuredLayout(path.name, row, inp, layout))
    return out
