"""Exporting a profile: the one code path `zlayout export` and the app's export share.

The rules (docs/profiles.md): an empty path is refused; a path that is not a zlayout profile
(pyproject.toml, a directory holding only a hand-written ds_config.json) is never replaced; a
profile zlayout cannot read is never replaced; a readable profile is replaced only when the
caller says so (`--force`, or the app's "Overwrite?" answered yes), and then its change log is
kept. A target is a directory (the whole set) or, for a name ending in .toml that is not a
directory, a single profile file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping

from pydantic import ValidationError

from zlayout.outfile import OutFileError, check_replaceable, link_problem, refuse_system_dir
from zlayout.smallfile import TooLarge, read_small_file
from zlayout.profile.build import build_profile
from zlayout.profile.launch import launch_scripts
from zlayout.profile.runbook import EXTRA_FILES
from zlayout.profile.schema import Profile, RunSettings, path_text
from zlayout.profile.store import (DS_CONFIG_FILE, HF_CONFIG_FILE, PROFILE_FILE, ProfileError, load_profile,
                                   save_profile, save_profile_dir)
from zlayout.spec import HardwareSpec, Layout, PlanInput


MAX_WHY_CHARS = 2000  # one change-log reason; with the profile's ~1 kB per entry, hundreds of exports fit


class ProfileExists(ProfileError):
    """The target holds a readable profile and the caller did not ask to replace it."""


@dataclass(frozen=True, slots=True)
class ExportTarget:
    path: Path  # as given
    profile_file: Path  # DIR/profile.toml, or the .toml file itself
    single_file: bool  # a .toml on its own: no ds_config.json or scripts
    previous: Profile | None  # the readable profile it would replace

    @property
    def replaces(self) -> bool:
        return self.previous is not None


def _set_names(profile: Profile | None = None) -> tuple[str, ...]:
    scripts = tuple(launch_scripts(profile)) if profile is not None else (
        "launch_deepspeed.sh", "launch_torchrun.sh", "launch_slurm.sbatch")
    return (DS_CONFIG_FILE, *scripts, *EXTRA_FILES, HF_CONFIG_FILE)


MAX_HF_CONFIG_BYTES = 256 * 1024  # a config.json is a few kB; the copy lives inside profile.toml


def _hf_config_copy(inp: PlanInput) -> tuple[PlanInput, str | None]:
    """With --hf-config, the config.json's text to keep inside the profile, and the inputs naming
    that copy (hf_config.json beside profile.toml) instead of a path of the exporting machine."""
    source = inp.model.hf_config
    if source is None or source == HF_CONFIG_FILE:
        return inp, None
    from zlayout.hfconfig import config_path

    try:
        path = config_path(source)
        try:
            text = read_small_file(path, MAX_HF_CONFIG_BYTES).decode("utf-8")
        except TooLarge:
            raise ProfileError(f"--hf-config {source}: over {MAX_HF_CONFIG_BYTES:,} bytes, too big to keep in the "
                               "profile: give the model's config.json") from None
        json.loads(text)
    except (OSError, ValueError, RecursionError) as exc:
        if isinstance(exc, ProfileError):
            raise
        raise ProfileError(f"--hf-config {source}: cannot keep a copy in the profile: "
                           f"{getattr(exc, 'strerror', None) or ' '.join(str(exc).split())[:120]}") from None
    model = inp.model.model_copy(update={"hf_config": HF_CONFIG_FILE})
    return inp.model_copy(update={"model": model}), text


NOT_OURS = ("Not replacing a profile zlayout cannot read, nor a file that is not a profile: "
            "fix it or move it aside, or choose another path")


def _previous(profile_file: Path) -> Profile | None:
    """The readable profile at `profile_file`, or None when nothing is there (zlayout.outfile's
    rule: links, loops, and files zlayout cannot read as a profile are refused)."""
    try:
        return check_replaceable(profile_file, load_profile, replace=True, not_ours=NOT_OURS, exists_message=str,
                                 unreadable=lambda exc: isinstance(exc, ProfileError))
    except OutFileError as exc:
        raise ProfileError(str(exc)) from None


def inspect_target(path: str | os.PathLike[str]) -> ExportTarget:
    """What exporting to `path` would do; ProfileError when it must not write there.

    A path ending in '/' is always a directory (profiles.toml/ is the directory profiles.toml)."""
    text = os.fspath(path)
    if not text.strip():
        raise ProfileError("the export path is empty: give a directory, e.g. profiles/llama3-8b")
    try:
        path_text(text, "the export path")
    except ValueError as exc:
        raise ProfileError(str(exc)) from None
    as_dir = text.endswith(("/", os.sep))
    p = Path(text).expanduser()
    problem = link_problem(p)
    if problem is not None:
        raise ProfileError(problem)
    try:
        is_dir, exists = p.is_dir(), p.exists() or p.is_symlink()
    except OSError as exc:
        raise ProfileError(f"{p}: {exc.strerror or exc}") from None
    single_file = not is_dir and p.suffix == ".toml" and not as_dir
    try:  # a profile set is 8+ files: never spread into / or /etc (the CLI's and the app's export)
        refuse_system_dir("--out", p.parent if single_file else p, "profiles/llama3-8b")
    except OutFileError as exc:
        raise ProfileError(str(exc)) from None
    if single_file:
        return ExportTarget(path=p, profile_file=p, single_file=True, previous=_previous(p))
    if exists and not is_dir:
        raise ProfileError(f"{p} is a file, not a directory: give a directory (or a .toml file name)")
    profile_file = p / PROFILE_FILE
    if is_dir:
        for name in _set_names():  # os.replace would swap a link for a plain file, target untouched
            problem = link_problem(p / name)
            if problem is None and (p / name).is_symlink():
                problem = (f"{p / name} is a symlink: zlayout does not replace links in a profile "
                           "directory: replace it with the file it points to, or choose another directory")
            if problem is not None:
                raise ProfileError(problem)
    if is_dir and (profile_file.exists() or profile_file.is_symlink()):
        return ExportTarget(path=p, profile_file=profile_file, single_file=False,
                            previous=_previous(profile_file))
    if is_dir:
        foreign = next((name for name in _set_names() if (p / name).exists() or (p / name).is_symlink()), None)
        if foreign is not None:
            raise ProfileError(f"{p / foreign} exists but {p} holds no profile.toml: it is not a zlayout "
                               "profile, so it is not replaced (move it aside or choose another directory)")
    return ExportTarget(path=p, profile_file=profile_file, single_file=False, previous=None)


@dataclass(frozen=True, slots=True)
class ExportResult:
    profile: Profile
    target: ExportTarget
    written: tuple[Path, ...]
    ds_config_notes: tuple[str, ...] = ()  # what zlayout set over the team's ds_config, what it kept


def _team_config(inp: PlanInput, layout: Layout, run: RunSettings, target: ExportTarget,
                 team_config: Mapping[str, Any] | None) -> tuple[dict[str, Any] | None, list[str]]:
    """The team's ds_config keys for the new profile and what to tell them: from --ds-config when
    given; else the replaced profile's, with hand edits of ds_config.json's team keys kept."""
    from zlayout.profile.ds_config import ds_config
    from zlayout.profile.team_config import (OWNED_KEYS, TeamConfigError, describe_edits, import_team_config, split,
                                             team_edits)

    ours = ds_config(inp, layout, nvme_path=run.nvme_path)
    if team_config is not None:
        try:
            team, replaced = import_team_config(team_config, ours)
        except TeamConfigError as exc:
            raise ProfileError(f"--ds-config: {exc}") from None
        kept = ", ".join(team) or "nothing"
        notes = [f"ds_config.json: kept yours: {kept}; zlayout set "
                 f"{', '.join(k for k in ours if k in OWNED_KEYS)} (the plan's ZeRO, batch and precision)"]
        notes += [f"ds_config.json: zlayout replaced {note}" for note in replaced]
        return team, notes
    if target.previous is None:
        return None, []
    team = target.previous.ds_config_team
    config_file = target.path / DS_CONFIG_FILE
    if target.single_file or not config_file.is_file():
        return team, []
    try:
        on_disk = split(json.loads(config_file.read_text(encoding="utf-8")))[1]
        edits = team_edits(split(target.previous.ds_config())[1], on_disk)
    except (OSError, ValueError, RecursionError, AttributeError) as exc:
        return team, [f"ds_config.json: its hand edits are not kept ({' '.join(str(exc).split())[:160]})"]
    if not edits:
        return team, []
    return on_disk, [f"ds_config.json: kept your hand edits: {describe_edits(edits)}"]


def _one_line(exc: ValidationError) -> str:
    return "; ".join(" ".join(str(e["msg"]).removeprefix("Value error, ").split()) for e in exc.errors())


def _unchanged_since_inspected(target: ExportTarget):
    """A check run with the target's directory locked: the profile there is still the one this
    export decided to replace (or still none). Another export that wrote meanwhile wins; this one
    refuses instead of silently replacing it."""
    def guard(profile_file: Path) -> None:
        try:
            now = load_profile(profile_file) if profile_file.exists() else None
            changed = now != target.previous
        except ProfileError:
            changed = True
        if changed:
            raise ProfileExists(f"{profile_file} was written by another export while this one ran: not replacing "
                                "it; look at it (`zlayout show`), then re-run with --force to replace it")
    return guard


def _keep_hand_edited_files(target: ExportTarget) -> list[str]:
    """The replaced set's files edited by hand since zlayout wrote them (their sha256 is not the
    previous manifest's), ds_config.json aside (its team keys are merged, `_team_config`), each
    copied to NAME.edited (NAME.edited.1, ... when taken) before the new set replaces it: a hand
    edit of a launch script is the user's, and re-exporting wrote over it unsaid. One note each."""
    from zlayout.profile.store import sha256_digest

    notes = []
    for name, digest in (target.previous.manifest if target.previous is not None else {}).items():
        if name == DS_CONFIG_FILE:
            continue
        path = target.path / name
        try:
            data = read_small_file(path, 64 * 2**20)
        except (OSError, TooLarge):
            continue  # gone or unreadable: nothing of the user's to keep
        if sha256_digest(data) == digest:
            continue
        for n in range(100):
            keep = path.with_name(f"{name}.edited" + (f".{n}" if n else ""))
            try:
                fd = os.open(keep, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                continue
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            notes.append(f"{name}: edited by hand since it was written; your version is kept as {keep.name}")
            break
        else:
            raise ProfileError(f"{path} was edited by hand and {name}.edited to {name}.edited.99 are taken: "
                               "move your edits aside, then export again")
    return notes


def export_profile(inp: PlanInput, layout: Layout, path: str | os.PathLike[str], *, replace: bool = False,
                   name: str | None = None, why: str | None = None,
                   run_settings: Mapping[str, Any] | None = None, now: datetime | None = None,
                   presets_dirs: tuple[str, ...] = (), team_config: Mapping[str, Any] | None = None,
                   host_ram_given: bool | None = None) -> ExportResult:
    """Build the profile for `layout` and write it to `path` under the rules above.

    `run_settings` (train_script, checkpoint_dir, nvme_path, master_port) override the replaced
    profile's; they are validated here, with every other value the scripts print, before any
    file is touched. `team_config` is the team's own ds_config.json (--ds-config): its optimizer,
    scheduler and other keys are kept, zlayout's ZeRO, batch and precision keys set over them, and a
    key that changes memory the plan does not price is refused. Raises ProfileExists (a profile is
    there, `replace` is False) or ProfileError. `host_ram_given`: whether the host RAM is the user's
    (--host-ram-gib) or zlayout's default; None: given when it is not the default.
    """
    from zlayout.core.tensors import grouped_gemm_refusal

    if (refusal := grouped_gemm_refusal(inp, layout)) is not None:  # a profile the training job would fail with at its first forward
        raise ProfileError(refusal)
    if why is not None and len(why) > MAX_WHY_CHARS:
        raise ProfileError(f"--why is {len(why):,} characters long; the change log keeps at most "
                           f"{MAX_WHY_CHARS:,} per entry: shorten it (link to a longer write-up instead)")
    target = inspect_target(path)
    if target.previous is not None and not replace:
        raise ProfileExists(f"{target.profile_file} already exists (profile {target.previous.name}): "
                            "add --force to replace it (its change log is kept) or choose another --out")
    base = target.previous.run if target.previous is not None else RunSettings()
    inp, hf_config_json = _hf_config_copy(inp)
    if hf_config_json is None and inp.model.hf_config == HF_CONFIG_FILE and target.previous is not None:
        hf_config_json = target.previous.hf_config_json  # re-exported from the profile's own copy
    try:
        run = RunSettings.model_validate({**base.model_dump(), **dict(run_settings or {})})
        team, notes = _team_config(inp, layout, run, target, team_config)
        kept_edits = [n.split(": ", 1)[1] for n in notes if n.startswith("ds_config.json: kept your hand edits")]
        if kept_edits and why is None:
            why = f"re-exported, keeping ds_config.json's hand edits ({kept_edits[0].removeprefix('kept your hand edits: ')})"
        profile = build_profile(inp, layout, name=name, why=why, previous=target.previous, run=run, now=now,
                                presets_dirs=presets_dirs)
        if host_ram_given is None:
            host_ram_given = inp.hardware.host_ram_bytes != HardwareSpec.model_fields["host_ram_bytes"].default
        profile = profile.model_copy(update={"hf_config_json": hf_config_json, "ds_config_team": team,
                                             "host_ram_source": "given" if host_ram_given else "assumed"})
        Profile.model_validate(profile.model_dump())  # the team keys pass the profile's own checks
    except ValidationError as exc:
        raise ProfileError(_one_line(exc)) from None
    guard = _unchanged_since_inspected(target)
    if target.single_file:
        written: tuple[Path, ...] = (save_profile(profile, target.profile_file, guard=guard),)
    else:
        notes = [*notes, *_keep_hand_edited_files(target)]
        written = tuple(save_profile_dir(profile, target.path, guard=guard))
    return ExportResult(profile=load_profile(target.profile_file), target=target, written=written,
                        ds_config_notes=tuple(notes))
