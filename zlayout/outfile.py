"""The one rule for replacing a file zlayout writes (export's profile, calibrate's TOML).

A path that does not exist is written. A symbolic link is never replaced (the rename would
replace the link with a plain file and leave its target as it was): give the target's path. A
link that loops or points nowhere is reported as such. An existing file is replaced only when
zlayout can read it as its own kind (`read` accepts it) and the caller asked (`--force`);
anything else (README.md, pyproject.toml, a profile given to calibrate) is never replaced.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Callable, TypeVar

T = TypeVar("T")


# Directories no command writes into (export's profile, learn's card, verify's results): the
# filesystem's own trees, and the roots that hold other users' or the system's folders.
SYSTEM_TREES = ("/etc", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/boot", "/dev",
                "/proc", "/sys", "/run", "/var/lib", "/var/spool", "/var/log")
SYSTEM_DIRS = ("/", "/home", "/root", "/var", "/opt", "/tmp", "/srv", "/mnt", "/media")


def is_system_dir(path: str | os.PathLike[str]) -> bool:
    """Whether `path` (resolved, absolute) is a system directory or inside a system tree."""
    text = str(Path(os.path.abspath(path)).resolve())
    return text in SYSTEM_DIRS or text in SYSTEM_TREES or any(
        text.startswith(tree + "/") for tree in SYSTEM_TREES)


def refuse_system_dir(flag: str, path: str | os.PathLike[str], example: str) -> None:
    """OutFileError (one line, what to type instead) when `path` is a system or home directory.
    A path that cannot be resolved (a symlink loop) is left to the caller, which names the loop."""
    try:
        resolved = Path(os.path.abspath(path)).resolve()
    except (OSError, RuntimeError):  # RuntimeError: pathlib's "Symlink loop" before Python 3.13
        return
    if is_system_dir(resolved) or resolved == Path.home().resolve():
        raise OutFileError(f"{flag} {str(resolved)!r} is a system or home directory: give a directory "
                           f"of its own, e.g. {flag} {example}")


class OutFileError(ValueError):
    """The path must not be written; the message is one line saying why and what to do."""


class OutFileExists(OutFileError):
    """The path holds a readable file of the right kind and replacing it was not asked for."""


def link_problem(path: str | os.PathLike[str]) -> str | None:
    """'symlink loop at PATH' / 'PATH is a broken symlink (...)' when `path` cannot be followed
    for one of those reasons; None otherwise (it exists, or simply is not there)."""
    try:
        os.stat(path)
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return f"symlink loop at {path}: fix or remove the link, or give another path"
        if exc.errno == errno.ENOENT and os.path.islink(path):
            try:
                target = os.readlink(path)
            except OSError:  # pragma: no cover - removed meanwhile
                target = "?"
            return (f"{path} is a broken symlink (it points to {target}, which does not exist): "
                    "fix or remove the link, or give another path")
        return None


def check_replaceable(path: Path, read: Callable[[Path], T], *, replace: bool, not_ours: str,
                      exists_message: Callable[[T], str],
                      unreadable: Callable[[Exception], bool] = lambda exc: True) -> T | None:
    """What is at `path` now: None (nothing there: write it), or what `read` made of the file
    when `replace` is True. Raises OutFileExists when it is readable and `replace` is False, and
    OutFileError for a link, a directory, or a file `read` refuses (an exception for which
    `unreadable` is True; its message, then `not_ours`). `exists_message(previous)` is the message
    for OutFileExists."""
    problem = link_problem(path)
    if problem is not None:
        raise OutFileError(problem)
    if os.path.islink(path):
        raise OutFileError(f"{path} is a symlink (to {os.readlink(path)}): zlayout does not replace "
                           "links: give the target's path instead")
    try:
        exists, is_dir = path.exists(), path.is_dir()
    except OSError as exc:
        raise OutFileError(f"{path}: {exc.strerror or exc}") from None
    if not exists:
        return None
    if is_dir:
        raise OutFileError(f"{path} is a directory: give a file name")
    try:
        previous = read(path)
    except Exception as exc:  # noqa: BLE001 - `unreadable` says which mean "not ours"
        if not unreadable(exc):
            raise
        raise OutFileError(f"{exc}. {not_ours}") from None
    if not replace:
        raise OutFileExists(exists_message(previous))
    return previous
