"""`zlayout export [plan flags] --stage K --out DIR`: write a profile the team runs as is.

DIR receives profile.toml (inputs, layout, prediction, alerts, change log), ds_config.json
and the launch scripts. An existing profile is replaced only with --force, and then its
change log is kept and this export appended to it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from zlayout.cli import UsageError, add_plan_arguments, layout_from_args, plan_input_from_args
from zlayout.profile import (DS_CONFIG_FILE, PROFILE_FILE, ProfileError, RunSettings, build_profile,
                             load_profile, save_profile_dir)
from zlayout.profile.launch import DEEPSPEED_SCRIPT, SLURM_SCRIPT, TORCHRUN_SCRIPT
from zlayout.profile.runbook import EXTRA_FILES
from zlayout.spec import GiB

SCRIPT_NAMES = (DEEPSPEED_SCRIPT, TORCHRUN_SCRIPT, SLURM_SCRIPT, *EXTRA_FILES)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "export", help="write DIR/profile.toml, ds_config.json, launch scripts and RUNBOOK.md for one layout",
        description="Plan one layout (--stage is required) and write the profile the team keeps "
                    "next to its training code: profile.toml, ds_config.json, launch_deepspeed.sh, "
                    "launch_torchrun.sh, launch_slurm.sbatch, and the handoff pack generated from the profile: "
                    "RUNBOOK.md, memory.svg (per-GPU memory chart) and alerts.yml (Prometheus rules).")
    add_plan_arguments(parser)
    out = parser.add_argument_group("profile")
    out.add_argument("--out", required=True, metavar="DIR", help="directory to write (created if missing)")
    out.add_argument("--force", action="store_true",
                     help="replace an existing profile in DIR (its change log is kept)")
    out.add_argument("--name", help="profile name (default: model-GPUsxgpu-layout)")
    out.add_argument("--why", help="the reason for this export, recorded in the change log")
    out.add_argument("--train-script", default=None,
                     help="your training script, the launch scripts' default (default train.py)")
    out.add_argument("--checkpoint-dir", default=None,
                     help="where the job saves checkpoints (`zlayout check` tests the latest is readable)")
    out.add_argument("--nvme-path", default=None, help="NVMe offload directory on every node (default /local_nvme)")
    parser.set_defaults(func=run)


def _run_settings(args: argparse.Namespace, base: RunSettings | None) -> RunSettings | None:
    given = {k: v for k, v in (("train_script", args.train_script), ("checkpoint_dir", args.checkpoint_dir),
                               ("nvme_path", args.nvme_path)) if v is not None}
    if not given:
        return base
    return (base or RunSettings()).model_copy(update=given)


def run(args: argparse.Namespace) -> int:
    layout = layout_from_args(args)
    if layout is None:
        raise UsageError("export writes one layout: add --stage 0|1|2|3 "
                         "(and --offload-optimizer/--offload-param); `zlayout plan` compares them all")
    inp = plan_input_from_args(args)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; give a directory")
    previous = None
    existing = [name for name in (PROFILE_FILE, DS_CONFIG_FILE, *SCRIPT_NAMES) if (out / name).exists()]
    if existing:
        if not args.force:
            raise UsageError(f"{out / existing[0]} already exists; add --force to replace it "
                             "(its change log is kept) or choose another --out")
        if (out / PROFILE_FILE).exists():
            try:
                previous = load_profile(out / PROFILE_FILE)
            except ProfileError as exc:
                raise UsageError(f"{exc}. Not replacing a profile zlayout cannot read: "
                                 "fix it or move it aside first") from None
    profile = build_profile(inp, layout, name=args.name, why=args.why, previous=previous,
                            run=_run_settings(args, previous.run if previous else None))
    try:
        written = save_profile_dir(profile, out)
    except ProfileError as exc:
        raise UsageError(str(exc)) from None
    pred = profile.prediction
    if args.json:
        print(json.dumps({"profile": str(out / PROFILE_FILE), "files": [str(p) for p in written],
                          "layout": layout.key, "fits": pred.fits,
                          "gpu_peak_allocated_bytes": pred.gpu_peak_allocated_bytes,
                          "step_time_s": pred.step_time_s}))
    else:
        # the absolute path: a relative --out is easy to lose (profiles/ in a clone is git-ignored)
        print(f"wrote {out.resolve()}/: " + ", ".join(p.name for p in written))
        print(f"  {profile.description}: predicted peak {pred.gpu_peak_allocated_bytes / GiB:.1f} GiB "
              f"allocated per GPU of {pred.gpu_capacity_bytes / GiB:.1f} GiB; status unverified")
        print(f"  next: zlayout show {out}   zlayout check {out}")
    if not pred.fits:
        print(f"zlayout: warning: {layout.label} is predicted NOT to fit "
              f"(GPU {'ok' if pred.fits_gpu else 'over'}, host {'ok' if pred.fits_host else 'over'}, "
              f"NVMe {'ok' if pred.fits_nvme else 'over'}); see `zlayout show {out}`", file=sys.stderr)
    return 0
