"""Profiles and their commands start without torch, deepspeed or textual (login nodes, fast CLI)."""

from __future__ import annotations

import subprocess
import sys

MODULES = ("zlayout.profile", "zlayout.profile.check", "zlayout.profile.diff", "zlayout.profile.summary",
           "zlayout.commands.export", "zlayout.commands.show", "zlayout.commands.check",
           "zlayout.commands.diff")


def test_no_heavy_imports():
    code = ("import sys\n"
            + "".join(f"import {m}\n" for m in MODULES)
            + "heavy = sorted(m for m in ('torch', 'deepspeed', 'textual') if m in sys.modules)\n"
            + "print(','.join(heavy))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ""
