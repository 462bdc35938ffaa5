"""Op-build locks with no builder behind them (no torch here).

torch's extension builder (torch.utils.cpp_extension, which DeepSpeed's op builder uses)
creates `<extensions dir>/<op>/lock` before it builds and removes it after; a build killed
on the way (a cancelled job, ctrl+c, a time limit) leaves the file, and every later build of
that op, in any job sharing the cache, waits on it forever. DeepSpeed builds
`deepspeed_shm_comm` at start-up on CPU too, so even `zlayout verify --cpu` hung silently.

A lock is stale when it is older than LOCK_GRACE_S and no process on this machine works in
its op's directory (ninja, the compiler and the Python that builds all run there or hold
files there). A builder on another node sharing the cache is not visible from here: the grace
covers the moment a build starts; a build that runs longer is waited for by its peers as
before, and a build has a time limit (preflight.OP_BUILD_TIMEOUT_S).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

LOCK_GRACE_S = 120.0


def extension_dirs(env: dict[str, str] | None = None) -> list[Path]:
    """Where torch keeps built ops: $TORCH_EXTENSIONS_DIR, else ~/.cache/torch_extensions
    (under $XDG_CACHE_HOME where set)."""
    env = os.environ if env is None else env
    if env.get("TORCH_EXTENSIONS_DIR"):
        return [Path(env["TORCH_EXTENSIONS_DIR"])]
    cache = Path(env.get("XDG_CACHE_HOME") or Path(env.get("HOME") or Path.home()) / ".cache")
    return [cache / "torch_extensions"]


def _busy_dirs() -> set[Path]:
    """Directories some process here runs in (cwd) or holds a file of."""
    busy: set[Path] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            busy.add(Path(os.readlink(proc / "cwd")))
        except OSError:
            pass
        try:
            for fd in (proc / "fd").iterdir():
                try:
                    busy.add(Path(os.readlink(fd)).parent)
                except OSError:
                    continue
        except OSError:
            continue
    return busy


def stale_locks(env: dict[str, str] | None = None, now: float | None = None) -> list[tuple[Path, float]]:
    """(lock, age in seconds) of every lock no live builder holds."""
    now = time.time() if now is None else now
    locks = []
    for root in extension_dirs(env):
        if root.is_dir():
            locks += [p for p in root.glob("**/lock") if p.is_file()]
    if not locks:
        return []
    busy = _busy_dirs()
    stale = []
    for lock in locks:
        try:
            age = now - lock.stat().st_mtime
        except OSError:
            continue
        op_dir = lock.parent
        in_use = any(d == op_dir or op_dir in d.parents for d in busy)
        if age > LOCK_GRACE_S and not in_use:
            stale.append((lock, age))
    return stale


def remove_stale_locks(env: dict[str, str] | None = None) -> list[str]:
    """Remove the stale locks; one note per lock removed (or that could not be)."""
    notes = []
    for lock, age in stale_locks(env):
        try:
            lock.unlink()
            notes.append(f"removed a stale op-build lock {lock} ({age / 60:.0f} min old, no "
                         "build running): an interrupted build left it, and every build of "
                         f"{lock.parent.name} would have waited on it forever")
        except FileNotFoundError:
            continue
        except OSError as exc:
            notes.append(f"a stale op-build lock {lock} ({age / 60:.0f} min old) cannot be "
                         f"removed ({exc.strerror}): remove it by hand, or every build of "
                         f"{lock.parent.name} waits on it")
    return notes
