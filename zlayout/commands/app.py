"""`zlayout app [plan flags | PROFILE]`: the terminal app, opened on these inputs.

Plain `zlayout` opens it too (on Llama 3 8B, 8 H200s). With plan flags the app starts on
the model and hardware they describe (no model flag: Llama 3 8B on that hardware); with a
profile, on every input the profile carries. Without a terminal it prints one line and
exits 2 instead of drawing escape codes into a pipe.
"""

from __future__ import annotations

import argparse
import shlex

from zlayout.cli import UsageError, add_plan_arguments, plan_input_from_args
from zlayout.messages import exception_text

MODEL_FLAGS = ("preset", "hf_config", "params", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab")
DEFAULT_PRESET = "llama3-8b"


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("app", help="the terminal app, pre-filled from plan flags or a profile",
                            description=__doc__.splitlines()[0])
    parser.add_argument("profile", nargs="?", metavar="PROFILE",
                        help="a profile.toml (or its directory) whose inputs the app opens on")
    add_plan_arguments(parser, with_layout=False)
    parser.add_argument("--ds-config", metavar="FILE",
                        help="your DeepSpeed config: every export keeps its optimizer, scheduler and other "
                             "keys, as zlayout export --ds-config does")
    parser.set_defaults(func=lambda args: run(args, parser))


def _flags_given(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[str]:
    """The plan flags typed on the command line (those that differ from their default)."""
    return [name for name, value in vars(args).items()
            if name not in ("profile", "func", "command", "json", "ds_config")
            and value != parser.get_default(name)]


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from zlayout.tui.app import run_app

    given = _flags_given(args, parser)
    team = None
    if args.ds_config is not None:  # read (and refused in one line) before the screen opens
        from zlayout.commands.export import read_team_config

        team = read_team_config(args.ds_config)
    # --presets-dir reaches the app too: its preset lists, break-even and export read the
    # folders as `zlayout plan/breakeven/export --presets-dir` do
    dirs = tuple(args.presets_dir)
    if args.profile is not None:
        # --presets-dir is not a plan input: it says where presets live, with a profile too
        plan_flags = [name for name in given if name != "presets_dir"]
        if plan_flags:
            raise UsageError(f"give either a PROFILE or plan flags, not both (got {args.profile} "
                             f"and --{plan_flags[0].replace('_', '-')}); e.g. zlayout app {args.profile}")
        return run_app(_profile_input(args.profile), presets_dirs=dirs,
                       script_command=f"zlayout show {shlex.quote(args.profile)}", team_config=team)
    if not given:
        return run_app(team_config=team)
    if not any(getattr(args, name, None) is not None for name in MODEL_FLAGS):
        args.preset = DEFAULT_PRESET
        given = ["preset", *given]
    # without a terminal the app names the command that prints these inputs' plan (it named
    # llama3-8b whatever the flags said)
    command = shlex.join(["zlayout", "plan", *_flags_of(args, given), "--json"])
    inp = plan_input_from_args(args)
    notes, args.notes = getattr(args, "notes", []), []  # shown in the app, not after it
    return run_app(inp, presets_dirs=dirs, script_command=command, team_config=team, notes=notes)


def _flags_of(args: argparse.Namespace, names: list[str]) -> list[str]:
    """The command-line words of the flags `names` as parsed into `args`."""
    words: list[str] = []
    for name in names:
        flag, value = "--" + name.replace("_", "-"), getattr(args, name)
        if value is True:
            words.append(flag)
        elif isinstance(value, list):
            for item in value:
                words += [flag, str(item)]
        elif value not in (None, False):
            words += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    return words


def _profile_input(path: str):
    from zlayout import profile

    try:
        return profile.load_profile(path).plan_input()
    except (OSError, ValueError, KeyError) as exc:
        raise UsageError(f"cannot open {path} in the app: {exception_text(exc)} "
                         "(give a profile.toml or its directory, e.g. zlayout app profiles/llama3-8b)") from None
    except Exception as exc:  # a profile error class of zlayout.profile
        raise UsageError(f"cannot open {path} in the app: {exc}") from None
