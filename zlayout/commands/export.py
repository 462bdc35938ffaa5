"""`zlayout export [plan flags] --stage K --out DIR`: write a profile the team runs as is.

DIR receives profile.toml (inputs, layout, prediction, alerts, change log), ds_config.json
and the launch scripts, written as one set. The rules of what may be replaced live in
zlayout.profile.export (the app's export uses the same): an existing profile is replaced only
with --force, and then its change log is kept; anything else is never replaced.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys

from zlayout.catalog import PresetFileError
from zlayout.cli import UsageError, add_plan_arguments, layout_from_args, plan_input_from_args
from zlayout.profile import ProfileError
from zlayout.profile.export import MAX_WHY_CHARS, export_profile
from zlayout.spec import GiB


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "export", help="write DIR/profile.toml, ds_config.json, launch scripts and RUNBOOK.md for one layout",
        description="Plan one layout (--stage is required) and write the profile the team keeps "
                    "next to its training code: profile.toml, ds_config.json, launch_deepspeed.sh, "
                    "launch_torchrun.sh, launch_slurm.sbatch, and the handoff pack generated from the profile: "
                    "RUNBOOK.md, memory.svg (per-GPU memory chart) and alerts.yml (Prometheus rules).")
    add_plan_arguments(parser)
    out = parser.add_argument_group("profile")
    out.add_argument("--out", required=True, metavar="DIR", help="directory to write (created if missing); a name ending in .toml writes that profile file "
                          "alone (a trailing / always means a directory); a symlink is never replaced")
    out.add_argument("--force", action="store_true",
                     help="replace an existing profile in DIR (its change log is kept)")
    out.add_argument("--name", help="profile name (default: model-GPUsxgpu-layout)")
    out.add_argument("--why", help=f"the reason for this export, recorded in the change log (at most {MAX_WHY_CHARS} characters)")
    out.add_argument("--train-script", default=None,
                     help="your training script, the launch scripts' default (default train.py)")
    out.add_argument("--checkpoint-dir", default=None,
                     help="where the job saves checkpoints (`zlayout check` tests the latest is readable)")
    out.add_argument("--nvme-path", default=None, help="NVMe offload directory on every node (default /local_nvme)")
    out.add_argument("--ds-config", default=None, metavar="FILE",
                     help="your own ds_config.json: its optimizer, scheduler and other keys are kept; zlayout "
                          "sets the ZeRO, batch and precision keys (and lists them); a key that changes memory "
                          "zlayout does not price (another optimizer, 8-bit states, other offload) is refused")
    out.add_argument("--alert-labels", default=None, metavar="NAME=VALUE,...",
                     help="Prometheus labels of the job's targets (e.g. job=llama3-pretrain): every rule in "
                          "alerts.yml selects them, so no rule fires for another job's GPUs")
    parser.set_defaults(func=run)


MAX_DS_CONFIG_BYTES = 1 << 20


def read_team_config(path: str) -> dict:
    """--ds-config FILE parsed: one JSON object, at most 1 MiB and 32 levels deep."""
    from zlayout import tomlsafe

    from zlayout.smallfile import NotARegularFile, TooLarge, read_small_file

    try:
        text = read_small_file(path, MAX_DS_CONFIG_BYTES).decode("utf-8")
        tomlsafe.check_toml_limits(text, f"--ds-config {path}", max_chars=None)
        config = json.loads(text)
    except TooLarge:
        raise UsageError(f"--ds-config {path}: over {MAX_DS_CONFIG_BYTES:,} bytes, not a ds_config.json") from None
    except NotARegularFile:
        raise UsageError(f"--ds-config {path}: not a file; give your DeepSpeed config file") from None
    except OSError as exc:
        raise UsageError(f"--ds-config {path}: cannot read: {exc.strerror}") from None
    except tomlsafe.TomlLimitError as exc:
        raise UsageError(f"{exc}: not a ds_config.json") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"--ds-config {path}: not JSON ({' '.join(str(exc).split())[:100]}); give your "
                         "DeepSpeed config file") from None
    if not isinstance(config, dict):
        raise UsageError(f"--ds-config {path}: a ds_config.json holds one JSON object")
    return config


def parse_alert_labels(text: str) -> dict[str, str]:
    """`job=llama,cluster=a` -> {"job": "llama", "cluster": "a"}; the names and values are
    checked where the profile is built (RunSettings)."""
    labels: dict[str, str] = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"--alert-labels {text!r}: {part.strip()!r} is not NAME=VALUE; write e.g. "
                             "--alert-labels job=llama3-pretrain,cluster=a")
        if name.strip() in labels:
            raise UsageError(f"--alert-labels {text!r}: {name.strip()} is given twice; give each label once")
        labels[name.strip()] = value.strip()
    return labels


def run(args: argparse.Namespace) -> int:
    layout = layout_from_args(args)
    if layout is None:
        raise UsageError("export writes one layout: add --stage 0|1|2|3 "
                         "(and --offload-optimizer/--offload-param); `zlayout plan` compares them all")
    if not args.out.strip():
        raise UsageError("--out is empty: give a directory, e.g. --out profiles/llama3-8b")
    inp = plan_input_from_args(args)
    given = {key: value for key, value in (("train_script", args.train_script),
                                           ("checkpoint_dir", args.checkpoint_dir),
                                           ("nvme_path", args.nvme_path)) if value is not None}
    if args.alert_labels is not None:
        given["alert_labels"] = parse_alert_labels(args.alert_labels)
    team = read_team_config(args.ds_config) if args.ds_config is not None else None
    try:
        result = export_profile(inp, layout, args.out, replace=args.force, name=args.name, why=args.why,
                                run_settings=given, presets_dirs=tuple(args.presets_dir), team_config=team,
                                host_ram_given=args.host_ram_gib is not None)
    except (ProfileError, PresetFileError) as exc:  # the profile's limits read the family's presets
        raise UsageError(str(exc)) from None
    profile, out, written = result.profile, result.target.path, result.written
    pred = profile.prediction
    if args.json:
        print(json.dumps({"profile": str(result.target.profile_file), "files": [str(p) for p in written],
                          "layout": layout.key, "fits": pred.fits,
                          "gpu_peak_allocated_bytes": pred.gpu_peak_allocated_bytes,
                          "step_time_s": pred.step_time_s}))
    else:
        # the absolute path: a relative --out is easy to lose (profiles/ in a clone is git-ignored)
        print(f"wrote {out.resolve()}" + ("" if result.target.single_file else "/: " + ", ".join(p.name for p in written)))
        print(f"  {profile.description}: predicted peak {pred.gpu_peak_allocated_bytes / GiB:.1f} GiB "
              f"allocated per GPU of {pred.gpu_capacity_bytes / GiB:.1f} GiB; status unverified")
        for note in result.ds_config_notes:
            print(f"  {note}")
        print(f"  next: zlayout show {shlex.quote(str(out))}   zlayout check {shlex.quote(str(out))}")
    if args.host_ram_gib is None:
        print(f"zlayout: warning: no --host-ram-gib: the host figures assume {pred.host_capacity_bytes / GiB:,.0f} "
              "GiB per node (zlayout's default), and the profile says so; give the nodes' RAM, or let "
              "`zlayout check` compare it on a node", file=sys.stderr)
    if not pred.fits:
        print(f"zlayout: warning: {layout.label} is predicted NOT to fit "
              f"(GPU {'ok' if pred.fits_gpu else 'over'}, host {'ok' if pred.fits_host else 'over'}, "
              f"NVMe {'ok' if pred.fits_nvme else 'over'}); see `zlayout show {shlex.quote(str(out))}`", file=sys.stderr)
    return 0
