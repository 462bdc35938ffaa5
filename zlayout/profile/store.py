"""Reading and writing profiles: nothing lost, nothing half-written.

Every file is written to a temporary file beside it, flushed to disk and renamed over the
old one, so a crash leaves either the old file or the new one. Loading parses with tomllib
and validates with pydantic; any problem becomes a `ProfileError` whose message names the
line and the field, and the file is left as it is.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import tomli_w
from pydantic import ValidationError

from zlayout import tomlsafe
from zlayout.profile.launch import launch_scripts
from zlayout.profile.runbook import extra_files
from zlayout.profile.schema import SCHEMA_VERSION, Profile

PROFILE_FILE = "profile.toml"
DS_CONFIG_FILE = "ds_config.json"


class ProfileError(Exception):
    """A profile that cannot be read or written; the message says where and what to do."""


# ---------------------------------------------------------------- text <-> Profile

def _drop_empty(value: Any) -> Any:
    """TOML has no null: omit None and empty tables so the file holds only what is known."""
    if isinstance(value, dict):
        cleaned = {k: _drop_empty(v) for k, v in value.items() if v is not None}
        return {k: v for k, v in cleaned.items() if not (isinstance(v, dict) and not v)}
    if isinstance(value, (list, tuple)):
        return [_drop_empty(v) for v in value]
    return value


def dumps_profile(profile: Profile) -> str:
    """The profile as TOML text (deterministic: same profile, same bytes)."""
    return tomli_w.dumps(_drop_empty(profile.model_dump(mode="python")))


def loads_profile(text: str, source: str = PROFILE_FILE) -> Profile:
    """Parse and validate profile text; raises ProfileError naming the line and field."""
    try:
        data = tomlsafe.loads(text, source)
    except tomlsafe.TomlLimitError as exc:
        raise ProfileError(str(exc)) from None
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{source}: not valid TOML: {exc}; fix that line "
                           "(or restore the file from version control)") from None
    version = data.get("schema_version")
    if version is None:
        raise ProfileError(f"{source}: schema_version is missing: this is not a zlayout profile, "
                           f"or its first line was lost (a profile starts with schema_version = {SCHEMA_VERSION})")
    if not isinstance(version, int) or isinstance(version, bool):
        raise ProfileError(f"{source} line {_line_of(text, ('schema_version',)) or '?'}: "
                           f"schema_version must be an integer such as {SCHEMA_VERSION}")
    if version > SCHEMA_VERSION:
        raise ProfileError(f"{source}: schema_version {version} was written by a newer zlayout "
                           f"(this one reads {SCHEMA_VERSION}): upgrade zlayout")
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        raise ProfileError(f"{source}: {describe_validation_error(exc, text)}") from None


def describe_validation_error(exc: ValidationError, text: str | None = None) -> str:
    """pydantic's errors as 'line N: field.path: what is wrong', one per error."""
    parts = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        field = ".".join(str(p) for p in loc)
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "missing":
            message = "missing (required)"
        elif err["type"] == "extra_forbidden":
            message = "unknown key (misspelt? remove it or use a field zlayout knows)"
        line = _line_of(text, loc) if text else None
        parts.append(f"line {line}: {field}: {message}" if line else f"{field}: {message}")
    return "; ".join(parts)


_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(r'^\s*("[^"]*"|[A-Za-z0-9_-]+)\s*=')


def _line_of(text: str, loc: tuple[Any, ...]) -> int | None:
    """The 1-based line that holds `loc` (a key or its table), for error messages."""
    seen: dict[tuple[Any, ...], int] = {}
    aot_counts: dict[tuple[Any, ...], int] = {}
    table: tuple[Any, ...] = ()
    for number, line in enumerate(text.splitlines(), start=1):
        header = _HEADER.match(line)
        if header:
            names = tuple(p.strip().strip('"') for p in header.group(2).split("."))
            if header.group(1) == "[[":
                index = aot_counts.get(names, 0)
                aot_counts[names] = index + 1
                seen.setdefault(names, number)
                table = (*names, index)
            else:
                table = names
            seen.setdefault(table, number)
            continue
        key = _KEY.match(line)
        if key:
            seen.setdefault((*table, key.group(1).strip('"')), number)
    for end in range(len(loc), 0, -1):
        if loc[:end] in seen:
            return seen[loc[:end]]
    return None


# ---------------------------------------------------------------- files

def resolve_profile_path(path: str | os.PathLike[str]) -> Path:
    """PROFILE may be the profile.toml or the directory `zlayout export --out` wrote."""
    p = Path(path)
    if p.is_dir():
        p = p / PROFILE_FILE
    if not p.is_file():
        raise ProfileError(f"no profile at {path}: give a profile.toml or the directory "
                           "`zlayout export --out DIR` wrote")
    return p


def load_profile(path: str | os.PathLike[str]) -> Profile:
    """Read and validate a profile (file or its directory); raises ProfileError."""
    p = resolve_profile_path(path)
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProfileError(f"{p}: not UTF-8 text (byte {exc.start}): the file is corrupt; "
                           "restore it from version control") from None
    except OSError as exc:
        raise ProfileError(f"{p}: cannot read: {exc.strerror}") from None
    return loads_profile(text, source=str(p))


def atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write `data` to `path` through a temporary file and a rename: all or nothing."""
    path = Path(path)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as tmp:
            tmp.write(data)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.chmod(tmp_name, mode)
        os.replace(tmp_name, path)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def save_profile(profile: Profile, path: str | os.PathLike[str]) -> Path:
    """Write profile.toml atomically (a directory means DIR/profile.toml). Returns the path.

    A file named profile.toml gets the runbook, its chart and alerts.yml rewritten beside it
    first (runbook.extra_files), so they never describe another version of the profile."""
    p = Path(path)
    if p.is_dir() or p.suffix != ".toml":
        p.mkdir(parents=True, exist_ok=True)
        p = p / PROFILE_FILE
    try:
        if p.name == PROFILE_FILE:
            for name, text in extra_files(profile).items():
                atomic_write(p.parent / name, text.encode("utf-8"))
        atomic_write(p, dumps_profile(profile).encode("utf-8"))
    except OSError as exc:
        raise ProfileError(f"cannot write {p}: {exc.strerror or exc}") from None
    return p


def ds_config_text(profile: Profile) -> str:
    return json.dumps(profile.ds_config(), indent=2) + "\n"


def save_profile_dir(profile: Profile, directory: str | os.PathLike[str]) -> list[Path]:
    """Write profile.toml, ds_config.json and the launch scripts into `directory`.

    profile.toml is written last, so a crash part way leaves the old profile in place.
    Overwrites without asking: callers decide whether replacing is allowed.
    """
    d = Path(directory)
    try:
        d.mkdir(parents=True, exist_ok=True)
        written = []
        atomic_write(d / DS_CONFIG_FILE, ds_config_text(profile).encode("utf-8"))
        written.append(d / DS_CONFIG_FILE)
        for name, text in launch_scripts(profile).items():
            atomic_write(d / name, text.encode("utf-8"), mode=0o755)
            written.append(d / name)
    except OSError as exc:
        raise ProfileError(f"cannot write into {d}: {exc.strerror or exc}") from None
    written.append(save_profile(profile, d / PROFILE_FILE))
    return written
