"""`zlayout show PROFILE`: a profile as a person reads it (or --json)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from zlayout.cli import UsageError
from zlayout.profile import PROFILE_FILE, Profile, ProfileError, load_profile
from zlayout.profile.launch import launch_scripts
from zlayout.profile.runbook import EXTRA_FILES
from zlayout.profile.summary import format_profile
from zlayout.profile.store import DS_CONFIG_FILE


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


def open_profile(name: str) -> tuple[Profile, Path]:
    """Load PROFILE (path, directory, or preset name); ProfileError becomes a UsageError (exit 2)."""
    path = Path(name)
    if not path.exists():
        from zlayout import catalog

        try:
            path = catalog.preset_path("profiles", name)
        except (KeyError, ValueError):
            raise UsageError(f"no profile at {name}: give a profile.toml, its directory, or one of "
                             f"{', '.join(catalog.list_presets('profiles')) or '(no presets)'}") from None
    try:
        profile = load_profile(path)
    except ProfileError as exc:
        raise UsageError(str(exc)) from None
    return profile, (path if path.is_dir() else path.parent)


def run(args: argparse.Namespace) -> int:
    if args.json and args.markdown:
        raise UsageError("give --json or --markdown, not both")
    profile, directory = open_profile(args.profile)
    if args.markdown:
        from zlayout.profile.runbook import render_runbook

        print(render_runbook(profile), end="")
        return 0
    if args.json:
        data = profile.model_dump(mode="json", exclude_none=True)
        data["path"] = str(directory / PROFILE_FILE)
        print(json.dumps(data))
        return 0
    print(format_profile(profile))
    expected = [DS_CONFIG_FILE, *launch_scripts(profile), *EXTRA_FILES]
    missing = [name for name in expected if not (directory / name).is_file()]
    print(f"Files in {directory}: " + ", ".join(expected)
          + (f" (MISSING: {', '.join(missing)}; re-export to restore them)" if missing else ""))
    return 0
