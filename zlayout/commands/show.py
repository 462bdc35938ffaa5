"""`zlayout show PROFILE`: a profile as a person reads it (or --json)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from zlayout.cli import UsageError
from zlayout.profile import PROFILE_FILE, Profile, ProfileError
from zlayout.profile.integrity import CheckedProfile, open_checked
from zlayout.profile.launch import launch_scripts
from zlayout.profile.runbook import EXTRA_FILES
from zlayout.profile.summary import format_profile
from zlayout.profile.store import DS_CONFIG_FILE, HF_CONFIG_FILE


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "show", help="summarize a profile: what lives where, why, the numbers",
        description="Print a profile's inputs, layout, predicted memory terms, verification, "
                    "alerts and change log. PROFILE is a profile.toml, its directory, or the name "
                    "of a ready profile shipped with zlayout.")
    parser.add_argument("profile", metavar="PROFILE")
    parser.add_argument("--json", action="store_true", help="the whole profile as one JSON object")
    parser.add_argument("--markdown", action="store_true",
                        help="the runbook (RUNBOOK.md as export writes it) on stdout")
    parser.set_defaults(func=run)


def _resolve(name: str) -> Path:
    path = Path(name)
    try:
        exists = path.exists()
    except OSError as exc:  # a name too long for the file system
        raise UsageError(f"{name[:80]}...: {exc.strerror or exc}: give a profile.toml or its directory") from None
    if exists:
        return path
    from zlayout.outfile import link_problem

    problem = link_problem(path)
    if problem is not None:
        raise UsageError(problem)
    from zlayout import catalog

    try:
        return catalog.preset_path("profiles", name)
    except (KeyError, ValueError, OSError):
        raise UsageError(f"no profile at {name}: give a profile.toml, its directory, or one of "
                         f"{', '.join(catalog.list_presets('profiles')) or '(no presets)'}") from None


def open_checked_profile(name: str) -> CheckedProfile:
    """Load PROFILE (path, directory, or preset name), refuse a set whose files disagree, and
    recompute its prediction; ProfileError becomes a UsageError (exit 2, one line)."""
    try:
        return open_checked(_resolve(name))
    except ProfileError as exc:
        raise UsageError(str(exc)) from None


def open_profile(name: str) -> tuple[Profile, Path]:
    """Load PROFILE as stored (its set checked); returns it and the file it was read from, which is
    where `verify --update-profile` saves it (DIR/profile.toml: the whole set; NAME.toml: that file
    alone, never a profile.toml beside it). Hand edits of ds_config.json's team keys (lr, the
    scheduler) are adopted, with a change-log entry, so saving it keeps them."""
    checked = open_checked_profile(name)
    return checked.with_hand_edits(), checked.path


def run(args: argparse.Namespace) -> int:
    if args.json and args.markdown:
        raise UsageError("give --json or --markdown, not both")
    checked = open_checked_profile(args.profile)
    profile, directory = checked.current, checked.directory
    if args.markdown:
        from zlayout.profile.runbook import render_runbook

        if checked.stale is not None:
            print(f"zlayout: warning: {checked.stale.line()}", file=sys.stderr)
        print(render_runbook(profile), end="")
        return 0
    if args.json:
        data = checked.profile.model_dump(mode="json", exclude_none=True)
        data["path"] = str(checked.path)
        if checked.hand_edits:
            data["hand_edits"] = [{"key": k, "stored": a, "now": b} for k, a, b in checked.hand_edits]
        if checked.stale is not None:
            data["stale_prediction"] = {
                "reason": checked.stale.reason,
                "differences": [{"figure": k, "stored": a, "now": b} for k, a, b in checked.stale.differences],
                "now": checked.stale.fresh.model_dump(mode="json", exclude_none=True)}
        print(json.dumps(data))
        return 0
    if checked.stale is not None:
        print(checked.stale.line())
    if checked.hand_edits_line() is not None:
        print(checked.hand_edits_line())
    print(format_profile(profile))
    if checked.path.name != PROFILE_FILE and not profile.manifest:
        print(f"A profile file on its own ({checked.path.name}): no ds_config.json, launch scripts or runbook")
        return 0
    expected = [DS_CONFIG_FILE, *launch_scripts(profile), *EXTRA_FILES,
                *([HF_CONFIG_FILE] if profile.hf_config_json is not None else [])]
    missing = [name for name in expected if not (directory / name).is_file()]
    print(f"Files in {directory}: " + ", ".join(expected)
          + (f" (MISSING: {', '.join(missing)}; re-export to restore them)" if missing else "")
          + ("" if missing or not profile.manifest else "; all match the manifest"))
    return 0
