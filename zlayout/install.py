"""The pip command that installs an extra into the zlayout the user is running.

`pip install 'zlayout[verify]'` fails from a clone (zlayout is not on PyPI there) and can
hit another Python than the one running; the command that works names this interpreter and,
for a source checkout or an editable install, the checkout itself.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path


def zlayout_argv() -> list[str]:
    """How zlayout starts itself: this interpreter, `-P -m zlayout`.

    -P (Python 3.11+): the current directory is not put first on sys.path, so a `zlayout/`
    folder where the user happens to be cannot run in place of zlayout; unlike -I it keeps
    PYTHONPATH (source checkouts and the tests rely on it)."""
    return [sys.executable, "-P", "-m", "zlayout"]


def source_checkout() -> Path | None:
    """The repository root when zlayout runs from a clone (editable or PYTHONPATH), else None."""
    root = Path(__file__).resolve().parent.parent
    pyproject = root / "pyproject.toml"
    try:
        is_ours = pyproject.is_file() and 'name = "zlayout"' in pyproject.read_text(errors="replace")
    except OSError:
        return None
    return root if is_ours else None


def pip_install_command(extra: str | None = None, python: str | None = None) -> str:
    """The pip command that installs `extra` into `python` (default: this interpreter), as
    zlayout was installed: from a source checkout (editable or on PYTHONPATH)
    `/venv/bin/python -m pip install -e '/src/zlayout[verify]'` (the checkout's path, so it
    works from any directory), from a package `/venv/bin/python -m pip install 'zlayout[verify]'`.
    Every hint that names an install comes from here (the verify preflight's, serve's)."""
    suffix = f"[{extra}]" if extra else ""
    root = source_checkout()
    python = shlex.quote(python or sys.executable)
    if root is not None:
        return f"{python} -m pip install -e {shlex.quote(f'{root}{suffix}')}"
    return f"{python} -m pip install {shlex.quote(f'zlayout{suffix}')}"
