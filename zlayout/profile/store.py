"""Reading and writing profiles: nothing lost, nothing half-written.

A profile directory is a set (profile.toml, ds_config.json, launch scripts) written as one:
every file goes into a temporary directory beside them, is flushed to disk, and is renamed into
place, profile.toml last. profile.toml's [manifest] holds the sha256 of every other file, so a
set that a crash left half-swapped (new ds_config.json, old profile.toml) is detected on load
(`zlayout.profile.integrity`) instead of trusted. The next write cleans up leftover temporaries.
Loading parses with tomllib and validates with pydantic; any problem becomes a `ProfileError`
whose message names the line and the field, and the file is left as it is.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import shutil
import tempfile
import tomllib
from pathlib import Path
from typing import Any, Callable

import tomli_w
from pydantic import ValidationError

from zlayout import tomlsafe
from zlayout.outfile import link_problem
from zlayout.smallfile import NotARegularFile, TooLarge, read_small_file
from zlayout.profile.launch import DEEPSPEED_SCRIPT, SLURM_SCRIPT, TORCHRUN_SCRIPT, launch_scripts
from zlayout.profile.errors import describe_validation_error, line_of
from zlayout.profile.runbook import EXTRA_FILES, extra_files
from zlayout.profile.schema import SCHEMA_VERSION, Profile

PROFILE_FILE = "profile.toml"
DS_CONFIG_FILE = "ds_config.json"
HF_CONFIG_FILE = "hf_config.json"  # the copy of --hf-config's config.json (not config.json: a model folder has one)


TEMP_PREFIX = ".zlayout-tmp-"  # the set being written; removed by the next write if a crash left it
MAX_PROFILE_BYTES = tomlsafe.MAX_TOML_BYTES  # read no more than the parser would accept


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


def _unrepresentable_number(value: Any, loc: tuple[Any, ...]) -> tuple[tuple[Any, ...], Any] | None:
    """The first integer outside TOML's 64 bits (tomllib accepts any) or non-finite float."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return None if -2**63 <= value < 2**63 else (loc, value)
    if isinstance(value, float):
        return None if math.isfinite(value) else (loc, value)
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _unrepresentable_number(item, (*loc, key))
        if found is not None:
            return found
    return None


def loads_profile(text: str, source: str = PROFILE_FILE) -> Profile:
    """Parse and validate profile text; raises ProfileError naming the line and field."""
    return loads_profile_document(text, source)[0]


def loads_profile_document(text: str, source: str = PROFILE_FILE) -> tuple[Profile, dict[str, Any]]:
    """The validated profile and the parsed table it came from (which still holds the derived
    [summary] the Profile drops, for `zlayout.profile.integrity` to compare)."""
    try:
        data = tomlsafe.loads(text, source)
    except tomlsafe.TomlLimitError as exc:
        raise ProfileError(str(exc)) from None
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{source}: not valid TOML: {' '.join(str(exc).split())}; fix that line "
                           "(or restore the file from version control)") from None
    except RecursionError:
        raise ProfileError(f"{source}: nested too deeply to be a zlayout profile: "
                           "restore the file from version control") from None
    if not isinstance(data, dict):  # pragma: no cover - tomllib always returns a table
        raise ProfileError(f"{source}: not a TOML table")
    bad = _unrepresentable_number(data, ())
    if bad is not None:
        loc, value = bad
        line = line_of(text, loc)
        field = ascii(".".join(str(p) for p in loc))[1:-1][:200]
        shown = str(value) if len(str(value)) <= 20 else str(value)[:20] + "..."
        raise ProfileError(f"{source}{f' line {line}' if line else ''}: {field}: {shown} is "
                           "not a number a profile holds (TOML integers are 64-bit; no inf or nan): fix it "
                           "or restore the file from version control")
    version = data.get("schema_version")
    if version is None:
        raise ProfileError(f"{source}: schema_version is missing: this is not a zlayout profile, "
                           f"or its first line was lost (a profile starts with schema_version = {SCHEMA_VERSION})")
    if not isinstance(version, int) or isinstance(version, bool):
        raise ProfileError(f"{source} line {line_of(text, ('schema_version',)) or '?'}: "
                           f"schema_version must be an integer such as {SCHEMA_VERSION}")
    if version > SCHEMA_VERSION:
        raise ProfileError(f"{source}: schema_version {version} was written by a newer zlayout "
                           f"(this one reads {SCHEMA_VERSION}): upgrade zlayout")
    try:
        # strict: a number written as a string (hidden = "4096"), a boolean as 0 or "false",
        # a float where an integer belongs is an error naming the key, not a silent conversion
        return Profile.model_validate(data, strict=True), data
    except ValidationError as exc:
        raise ProfileError(f"{source}: {describe_validation_error(exc, text, data)}") from None
    except RecursionError:
        raise ProfileError(f"{source}: nested too deeply to be a zlayout profile") from None


# ---------------------------------------------------------------- files

def resolve_profile_path(path: str | os.PathLike[str]) -> Path:
    """PROFILE may be the profile.toml or the directory `zlayout export --out` wrote."""
    p = Path(path)
    problem = link_problem(p) or (link_problem(p / PROFILE_FILE) if os.path.isdir(p) else None)
    if problem is not None:
        raise ProfileError(problem)
    try:
        if p.is_dir():
            p = p / PROFILE_FILE
        found = p.is_file()
    except OSError as exc:  # a name too long, a loop of links
        raise ProfileError(f"{path}: {exc.strerror or exc}: give a profile.toml or its directory") from None
    if not found:
        raise ProfileError(f"no profile at {path}: give a profile.toml or the directory "
                           "`zlayout export --out DIR` wrote")
    return p


def load_profile(path: str | os.PathLike[str]) -> Profile:
    """Read and validate a profile (file or its directory); raises ProfileError."""
    return load_profile_document(path)[0]


def load_profile_document(path: str | os.PathLike[str]) -> tuple[Profile, dict[str, Any]]:
    """load_profile, and the parsed table as the file holds it (loads_profile_document)."""
    p = resolve_profile_path(path)
    try:
        text = read_small_file(p, MAX_PROFILE_BYTES).decode("utf-8")
    except TooLarge:
        raise ProfileError(f"{p}: over {MAX_PROFILE_BYTES:,} bytes, too long for a zlayout profile: "
                           "restore it from version control") from None
    except NotARegularFile:
        raise ProfileError(f"{p}: not a file; give a zlayout profile (.toml) or its folder") from None
    except UnicodeDecodeError as exc:
        raise ProfileError(f"{p}: not UTF-8 text (byte {exc.start}): the file is corrupt; "
                           "restore it from version control") from None
    except OSError as exc:
        raise ProfileError(f"{p}: cannot read: {exc.strerror or exc}") from None
    return loads_profile_document(text, source=str(p))


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
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    """Make the renames in `directory` durable (best effort: some file systems refuse)."""
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


@contextlib.contextmanager
def _locked(directory: Path):
    """One writer per directory at a time (flock on the directory itself, nothing left behind),
    so cleaning temporaries never removes a live writer's."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _is_temporary(name: str) -> bool:
    """A name only zlayout's writers use: the set's temporary directory, or a file's temporary
    (`.NAME.XXXX.tmp` from atomic_write) for one of the set's own file names."""
    if name.startswith(TEMP_PREFIX):
        return True
    return name.endswith(".tmp") and any(name.startswith(f".{own}.") for own in (
        PROFILE_FILE, DS_CONFIG_FILE, DEEPSPEED_SCRIPT, TORCHRUN_SCRIPT, SLURM_SCRIPT, HF_CONFIG_FILE, *EXTRA_FILES))


def clean_temporaries(directory: Path) -> list[str]:
    """Remove what an interrupted write left in `directory`; returns the names removed."""
    removed = []
    for entry in os.scandir(directory):
        if not _is_temporary(entry.name):
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
        removed.append(entry.name)
    return removed


def save_profile(profile: Profile, path: str | os.PathLike[str],
                 guard: Callable[[Path], None] | None = None) -> Path:
    """Write the profile (a directory means DIR/profile.toml). Returns the profile file's path.

    A file named profile.toml is part of a set: the whole set is rewritten as one
    (save_profile_dir), so RUNBOOK.md, memory.svg and alerts.yml never describe another version
    of the profile and the manifest stays true (ds_config.json and the scripts come out the same
    bytes when only the verification changed). Any other .toml is a profile on its own, written
    atomically with an empty manifest."""
    p = Path(path)
    try:
        if p.is_dir() or p.suffix != ".toml":
            p.mkdir(parents=True, exist_ok=True)
            p = p / PROFILE_FILE
        if p.name == PROFILE_FILE:
            return save_profile_dir(profile, p.parent, guard=guard)[-1]
        data = readable_profile_bytes(profile, p, manifest={})
        p.parent.mkdir(parents=True, exist_ok=True)
        with _locked(p.parent):
            if guard is not None:
                guard(p)
            clean_temporaries(p.parent)
            atomic_write(p, data)
    except OSError as exc:
        raise ProfileError(f"cannot write {p}: {exc.strerror or exc}") from None
    return p


def readable_profile_bytes(profile: Profile, target: Path, *, manifest: dict[str, str] | None = None) -> bytes:
    """The bytes of `profile` as written to `target`, checked to load again: over
    MAX_PROFILE_BYTES, or anything else load_profile refuses, raises ProfileError before any file
    is written, so a write never leaves a profile zlayout cannot read."""
    data = dumps_profile(profile if manifest is None else profile.model_copy(update={"manifest": manifest}))
    raw = data.encode("utf-8")
    if len(raw) > MAX_PROFILE_BYTES:
        raise ProfileError(
            f"not writing {target}: it would be {len(raw):,} bytes, over the {MAX_PROFILE_BYTES:,} zlayout "
            f"reads, because its change log is too long ({len(profile.changelog)} entries, "
            f"{sum(len(e.why) for e in profile.changelog):,} characters of reasons): remove old "
            "[[changelog]] entries from the profile (or move it aside and export afresh), then retry")
    try:
        loads_profile(data, source=str(target))
    except ProfileError as exc:
        raise ProfileError(f"not writing {target}: zlayout could not read it back: {exc}") from None
    return raw


def ds_config_text(profile: Profile) -> str:
    return json.dumps(profile.ds_config(), indent=2) + "\n"


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def set_files(profile: Profile) -> dict[str, bytes]:
    """The files written beside profile.toml: name -> bytes (ds_config.json, the scripts, and the
    handoff pack: RUNBOOK.md, memory.svg, alerts.yml)."""
    files = {DS_CONFIG_FILE: ds_config_text(profile).encode("utf-8")}
    files.update({name: text.encode("utf-8") for name, text in launch_scripts(profile).items()})
    files.update({name: text.encode("utf-8") for name, text in extra_files(profile).items()})
    if profile.hf_config_json is not None:
        files[HF_CONFIG_FILE] = profile.hf_config_json.encode("utf-8")
    return files


def with_manifest(profile: Profile, files: dict[str, bytes]) -> Profile:
    """`profile` whose [manifest] lists the sha256 of `files` (the set it is written with)."""
    return profile.model_copy(update={"manifest": {name: sha256_digest(data) for name, data in files.items()}})


def save_profile_dir(profile: Profile, directory: str | os.PathLike[str],
                     guard: Callable[[Path], None] | None = None) -> list[Path]:
    """Write profile.toml, ds_config.json and the launch scripts into `directory`, as one set.

    All files go into a temporary directory inside `directory` and are fsynced there, then
    renamed into place with profile.toml last; its manifest holds the others' checksums. A crash
    before the renames leaves the old set; during them, a set whose manifest disagrees (refused
    on load); after, the new set. Overwrites without asking: callers decide whether replacing is
    allowed (`zlayout.profile.export`), and pass `guard`, called with the profile.toml's path once
    the directory is locked, to refuse (raise) when what is there is no longer what they decided on:
    two exports into one new directory both find it empty, and the second must not replace the
    first. Returns the paths written, profile.toml last.
    """
    d = Path(directory)
    files = set_files(profile)
    files[PROFILE_FILE] = readable_profile_bytes(with_manifest(profile, files), d / PROFILE_FILE)
    try:
        d.mkdir(parents=True, exist_ok=True)
        with _locked(d):
            if guard is not None:
                guard(d / PROFILE_FILE)
            clean_temporaries(d)
            tmp = Path(tempfile.mkdtemp(dir=d, prefix=TEMP_PREFIX))
            try:
                for name, data in files.items():
                    fd = os.open(tmp / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                    with os.fdopen(fd, "wb") as handle:
                        handle.write(data)
                        handle.flush()
                        os.fsync(handle.fileno())
                    os.chmod(tmp / name, 0o755 if name.endswith((".sh", ".sbatch")) else 0o644)
                _fsync_dir(tmp)
                for name in files:  # profile.toml is the last key: the set is committed by it
                    os.replace(tmp / name, d / name)
                _fsync_dir(d)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    except OSError as exc:
        raise ProfileError(f"cannot write into {d}: {exc.strerror or exc}") from None
    return [d / name for name in files]
