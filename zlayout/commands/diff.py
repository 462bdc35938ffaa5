"""`zlayout diff A B`: what changed between two profiles, and its effect on memory and step time."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from zlayout.cli import UsageError
from zlayout.commands.show import open_checked_profile
from zlayout.profile.diff import Effect, diff_profiles
from zlayout.profile.summary import figure


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "diff", help="what changed between two profiles and its effect",
        description="Compare profile A with profile B: inputs, layout and run settings that "
                    "differ, then the effect on peak memory and step time (predicted, and measured "
                    "when both were verified). A and B are profile.toml files or their directories.")
    parser.add_argument("a", metavar="A")
    parser.add_argument("b", metavar="B")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--markdown", action="store_true",
                        help="the before/after section of a change request, in markdown")
    parser.set_defaults(func=run)


def _value(v: object) -> str:
    return "(absent)" if v is None else str(v)


def _effect_line(e: Effect, label: str, absent_is_zero: bool = False) -> str:
    if absent_is_zero and e.delta is None:
        delta = (e.after or 0) - (e.before or 0)
        sign = "+" if delta >= 0 else "-"
        return (f"  {label:<34} {figure(e.figure, e.before):>14} -> {figure(e.figure, e.after):<14}"
                f" {sign}{figure(e.figure, abs(delta))}")
    if e.delta is None:
        return f"  {label:<34} {figure(e.figure, e.before):>14} -> {figure(e.figure, e.after):<14}"
    fraction = f" ({e.delta_fraction:+.1%})" if e.delta_fraction is not None else ""
    sign = "+" if e.delta >= 0 else "-"
    return (f"  {label:<34} {figure(e.figure, e.before):>14} -> {figure(e.figure, e.after):<14}"
            f" {sign}{figure(e.figure, abs(e.delta))}{fraction}")


def run(args: argparse.Namespace) -> int:
    if args.json and args.markdown:
        raise UsageError("give --json or --markdown, not both")
    checked_a, checked_b = open_checked_profile(args.a), open_checked_profile(args.b)
    # predictions recomputed from the inputs: a hand-edited input shows its effect
    # ds_config.json's team keys as the files hold them (hand edits accepted on load)
    a, b = (c.current.model_copy(update={"ds_config_team": c.with_hand_edits().ds_config_team}) if c.hand_edits
            else c.current for c in (checked_a, checked_b))
    if args.markdown:
        from zlayout.profile.runbook import diff_markdown

        print(diff_markdown(a, b), end="")
        return 0
    d = diff_profiles(a, b)
    stale = {side: c.stale.line() for side, c in (("A", checked_a), ("B", checked_b)) if c.stale is not None}
    if args.json:
        print(json.dumps({
            "stale_prediction": stale,
            "hand_edits": {side: c.hand_edits_line() for side, c in (("A", checked_a), ("B", checked_b))
                           if c.hand_edits},
            "changes": [asdict(c) for c in d.changes],
            "effects": [asdict(e) | {"delta": e.delta, "delta_fraction": e.delta_fraction} for e in d.effects],
            "term_changes": [asdict(e) | {"delta": e.delta} for e in d.term_changes],
            "status_before": d.status_before, "status_after": d.status_after,
        }))
        return 0
    print(f"A: {a.name} ({a.layout.label}, {d.status_before})")
    print(f"B: {b.name} ({b.layout.label}, {d.status_after})")
    for side, line in stale.items():
        print(f"{side}: {line}")
    for side, c in (("A", checked_a), ("B", checked_b)):
        if c.hand_edits_line() is not None:
            print(f"{side}: {c.hand_edits_line()}")
    if not d.changes:
        print("Configuration: identical (inputs, layout and run settings)")
    else:
        print("What changed")
        for c in d.changes:
            print(f"  {c.field:<44} {_value(c.before)} -> {_value(c.after)}")
    if d.effects:
        print("Effect")
        for e in d.effects:
            print(_effect_line(e, f"{e.figure} ({e.basis})"))
    else:
        print("Effect: none on the predicted figures")
    if d.term_changes:
        print("Memory terms that moved (predicted, largest first)")
        for e in d.term_changes[:12]:
            print(_effect_line(Effect(e.figure + "_bytes", e.basis, e.before, e.after), e.figure,
                                absent_is_zero=True))
    return 0
