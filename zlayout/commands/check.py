"""`zlayout check PROFILE`: the pre-run checklist on this machine; exit 1 on any mismatch."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from zlayout.commands.show import open_checked_profile
from zlayout.profile.check import NoGpus, query_gpus, run_checks

_MARKS = {"pass": "ok  ", "fail": "FAIL", "warn": "warn", "skip": "skip"}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "check", help="pre-run checklist: GPUs, free memory, hardware match, last checkpoint",
        description="Check this machine against a profile before launching: the GPUs nvidia-smi "
                    "lists (count, model, free memory), host memory, the NVMe path, the last "
                    "checkpoint. Exit 0 when all pass, 1 on any failure, 2 if the profile is unreadable.")
    parser.add_argument("profile", metavar="PROFILE")
    parser.add_argument("--checkpoint-dir", help="check this checkpoint directory instead of the profile's")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    checked = open_checked_profile(args.profile)
    profile = checked.current  # the free memory needed follows the inputs, not a stale figure
    gpus, reason = None, None
    try:
        gpus = query_gpus()
    except NoGpus as exc:
        reason = str(exc)
    items = run_checks(profile, gpus, no_gpu_reason=reason, checkpoint_dir=args.checkpoint_dir)
    failed = [item for item in items if item.verdict == "fail"]
    if args.json:
        print(json.dumps({"profile": profile.name, "ok": not failed, "checks": [asdict(i) for i in items],
                          "stale_prediction": checked.stale.line() if checked.stale else None,
                          "hand_edits": checked.hand_edits_line()}))
    else:
        print(f"Checking {profile.name} ({profile.description}) on this machine")
        if checked.stale is not None:
            print(f"  [warn] {checked.stale.line()}")
        if checked.hand_edits_line() is not None:
            print(f"  [ok  ] {checked.hand_edits_line()}")
        for item in items:
            print(f"  [{_MARKS[item.verdict]}] {item.name}: {item.detail}")
        print(f"{len(failed)} check(s) failed: do not launch yet" if failed else "ready to launch")
    return 1 if failed else 0
