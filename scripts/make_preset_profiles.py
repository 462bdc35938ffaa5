"""Regenerate the ready profiles shipped in presets/profiles/ with zlayout's own export.

    .venv/bin/python scripts/make_preset_profiles.py          # rewrite them
    .venv/bin/python scripts/make_preset_profiles.py --check  # exit 1 if any is stale

Each preset is a directory as `zlayout export` writes it (profile.toml, ds_config.json, launch
scripts). The layout is the planner's recommendation for the scenario (among offload layouts
where the scenario asks for offload), so the presets follow the planner when it improves.
The export time is fixed, so regenerating with an unchanged planner gives identical files.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from zlayout import catalog
from zlayout.core.plan import make_plan
from zlayout.profile import build_profile, save_profile_dir
from zlayout.spec import HardwareSpec, Layout, PlanInput, TrainingSpec, all_layouts

PRESETS_DIR = Path(__file__).resolve().parent.parent / "presets" / "profiles"
EXPORTED_AT = datetime(2026, 11, 30, 0, 0, 0, tzinfo=timezone.utc)


@dataclass(frozen=True)
class Scenario:
    name: str
    model: str
    gpu: str
    gpus_per_node: int
    nodes: int
    seq: int
    micro_batch: int
    grad_accum: int
    offload_only: bool = False  # choose among layouts that offload the optimizer state

    def plan_input(self) -> PlanInput:
        hw = HardwareSpec(
            gpu=catalog.load_gpu(self.gpu), gpus_per_node=self.gpus_per_node, nodes=self.nodes,
            intra_link=catalog.load_link(catalog.default_intra_link(self.gpu)),
            inter_link=catalog.load_link("ib-ndr") if self.nodes > 1 else None)
        return PlanInput(model=catalog.load_model(self.model), hardware=hw,
                         training=TrainingSpec(seq=self.seq, micro_batch=self.micro_batch,
                                               grad_accum=self.grad_accum, checkpointing="full"))


SCENARIOS = (
    Scenario("llama3-8b-8xh100", "llama3-8b", "h100", 8, 1, seq=8192, micro_batch=1, grad_accum=8),
    Scenario("llama3-70b-64xh100", "llama3-70b", "h100", 8, 8, seq=8192, micro_batch=1, grad_accum=4),
    Scenario("llama3-8b-1xh200-offload", "llama3-8b", "h200", 1, 1, seq=8192, micro_batch=1,
             grad_accum=16, offload_only=True),
)


def choose(scenario: Scenario, inp: PlanInput) -> tuple[Layout, str]:
    layouts = tuple(lay for lay in all_layouts()
                    if not scenario.offload_only or lay.offload_optimizer == "cpu")
    rec = make_plan(inp, layouts=layouts, with_breakeven=False).recommendation
    if rec.layout is None:
        raise SystemExit(f"{scenario.name}: no layout fits ({rec.reason})")
    return rec.layout, rec.reason


def write(scenario: Scenario, root: Path) -> Path:
    inp = scenario.plan_input()
    layout, reason = choose(scenario, inp)
    profile = build_profile(inp, layout, name=scenario.name, now=EXPORTED_AT,
                            why=f"preset made by scripts/make_preset_profiles.py: {reason}")
    save_profile_dir(profile, root / scenario.name)
    return root / scenario.name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the shipped files instead of writing")
    args = parser.parse_args(argv)
    if not args.check:
        for scenario in SCENARIOS:
            out = write(scenario, PRESETS_DIR)
            print(f"wrote {out.relative_to(PRESETS_DIR.parent.parent.parent)}")
        return 0
    stale = []
    with tempfile.TemporaryDirectory() as tmp:
        for scenario in SCENARIOS:
            fresh = write(scenario, Path(tmp))
            for path in sorted(fresh.iterdir()):
                shipped = PRESETS_DIR / scenario.name / path.name
                if not shipped.is_file() or shipped.read_bytes() != path.read_bytes():
                    stale.append(str(shipped))
    for path in stale:
        print(f"stale: {path}")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
