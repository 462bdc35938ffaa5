"""Does a profile agree with itself? Its files with its manifest, ds_config.json with its inputs,
its stored prediction with what the inputs give now.

A set a crash left half-swapped, or a file edited by hand, must not be trusted: `check_set`
raises a one-line `ProfileError` naming the file and the first difference. A stored prediction
that differs from the inputs' (profile.toml edited by hand, or written by another planner
version) is not an error but is flagged (`stale_prediction`), and the commands show the figures
the inputs give now.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zlayout.profile.launch import DEEPSPEED_SCRIPT, SLURM_SCRIPT, TORCHRUN_SCRIPT
from zlayout.profile.schema import (MEASURED_STATUSES, VALIDATED_TOLERANCE_FRACTION, Prediction, Profile,
                                    Verification)
from zlayout.profile.store import (DS_CONFIG_FILE, HF_CONFIG_FILE, PROFILE_FILE, ProfileError, ds_config_text,
                                   set_files, sha256_digest)
from zlayout.smallfile import NotARegularFile, TooLarge, read_small_file
from zlayout.profile.team_config import TeamConfigError, describe_edits, split, team_edits

MAX_SET_FILE_BYTES = 16 * 2**20  # ds_config.json and the scripts are a few kB
REEXPORT = "re-export the profile with `zlayout export ... --force` (its change log is kept) or restore the file"


def _read(path: Path) -> bytes | None:
    """The file's bytes, None when it is absent; a ProfileError when it cannot be read, is not a
    regular file or is larger than any file zlayout writes into a profile."""
    try:
        if not path.exists():
            return None
        return read_small_file(path, MAX_SET_FILE_BYTES)
    except TooLarge:
        raise ProfileError(f"{path}: over {MAX_SET_FILE_BYTES} bytes, not the file zlayout wrote: {REEXPORT}") from None
    except NotARegularFile:
        raise ProfileError(f"{path}: not a regular file, not the file zlayout wrote: {REEXPORT}") from None
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read: {exc.strerror or exc}") from None


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def json_differences(expected: Any, actual: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted key, expected, actual) for every leaf that differs; absent is None."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        out = []
        for key in [*expected, *(k for k in actual if k not in expected)]:
            path = f"{prefix}.{key}" if prefix else str(key)
            out += json_differences(expected.get(key), actual.get(key), path)
        return out
    if expected == actual and type(expected) is type(actual):
        return []
    if isinstance(expected, (int, float)) and isinstance(actual, (int, float)) \
            and not isinstance(expected, bool) and not isinstance(actual, bool) and expected == actual:
        return []
    return [(prefix or "(the whole file)", expected, actual)]


def _describe(differences: list[tuple[str, Any, Any]]) -> str:
    key, expected, actual = differences[0]
    more = f" (and {len(differences) - 1} more)" if len(differences) > 1 else ""
    shown = "absent" if actual is None else _short(actual)
    return f"{key} is {shown} where profile.toml's inputs give {'nothing' if expected is None else _short(expected)}{more}"


def is_set_member(profile_path: Path, profile: Profile) -> bool:
    """A profile.toml (or one with a manifest) has files beside it; any other .toml stands alone."""
    return profile_path.name == PROFILE_FILE or bool(profile.manifest)


def check_set(profile: Profile, profile_path: Path,
              hand_edits: list[tuple[str, Any, Any]] | None = None) -> list[str]:
    """Refuse (ProfileError, one line naming the file) a set whose files disagree with profile.toml.

    Checks every file the manifest lists (sha256), ds_config.json against the config the inputs
    give, and the launch scripts' training script, port, node and GPU counts against profile.toml's
    (the scripts match the manifest after profile.toml's run settings were edited). A profile.toml
    without its [manifest] is refused: nothing would tell an edited launch script from the exported
    one. A file the user removed is not a disagreement: its name is returned, and `show` says it is
    missing. ds_config.json's team keys (zlayout.profile.team_config) edited by hand are accepted when
    they change no memory (lr, betas, the scheduler): each lands in `hand_edits`.
    """
    directory = profile_path.parent
    if not is_set_member(profile_path, profile):
        return []
    if not profile.manifest:
        raise ProfileError(f"{profile_path}: its [manifest] is missing, so nothing tells the launch scripts and "
                           f"ds_config.json beside it from hand-edited ones: {REEXPORT}")
    missing: list[str] = []
    expected_config = json.loads(ds_config_text(profile))
    config_path = directory / DS_CONFIG_FILE
    data = _read(config_path)
    listed = profile.manifest.get(DS_CONFIG_FILE)
    if data is None:
        if listed:
            missing.append(DS_CONFIG_FILE)
    else:
        matches_manifest = listed is not None and sha256_digest(data) == listed
        try:
            actual = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            reason = " ".join(str(exc).split())[:120]
            raise ProfileError(f"{config_path}: not valid JSON ({reason}): DeepSpeed could not read it; "
                               f"{REEXPORT}") from None
        owned, team = split(expected_config)
        actual_owned, actual_team = split(actual) if isinstance(actual, dict) else ({}, actual)
        differences = json_differences(owned, actual_owned)
        team_differences = json_differences(team, actual_team)
        if team_differences and not differences and not matches_manifest and isinstance(actual, dict):
            try:  # the team's own keys edited by hand: accepted when they change no memory
                edits = team_edits(team, actual_team)
            except TeamConfigError as exc:
                raise ProfileError(f"{config_path}: changed after export: {exc}: {REEXPORT}") from None
            if hand_edits is not None:
                hand_edits.extend(edits)
            team_differences = []
        differences += team_differences
        if differences:
            if matches_manifest:  # the file is as exported: profile.toml changed after it
                raise ProfileError(f"{directory / PROFILE_FILE}: edited after export: {_describe(differences)} "
                                   f"in {DS_CONFIG_FILE} as exported; the files disagree: {REEXPORT}")
            raise ProfileError(f"{config_path}: changed after export (a hand edit, or an interrupted export): "
                               f"{_describe(differences)}; DeepSpeed would run another configuration: {REEXPORT}")
    copy = profile.hf_config_json
    listed_copy = profile.manifest.get(HF_CONFIG_FILE)
    if (copy is None) != (listed_copy is None) or (
            copy is not None and sha256_digest(copy.encode("utf-8")) != listed_copy):
        raise ProfileError(f"{directory / PROFILE_FILE}: edited after export: hf_config_json is not the "
                           f"{HF_CONFIG_FILE} its manifest lists: {REEXPORT}")
    for name, digest in profile.manifest.items():
        if name == DS_CONFIG_FILE:
            continue  # compared by content above: reformatting it is harmless
        path = directory / name
        data = _read(path)
        if data is None:
            missing.append(name)
        elif sha256_digest(data) != digest:
            expected = set_files(profile).get(name)
            why = ("edited after export" if expected is not None and sha256_digest(expected) == digest
                   else "not the file written with this profile.toml")
            raise ProfileError(f"{path}: {why} (its sha256 differs from profile.toml's manifest; "
                               f"a hand edit, or an interrupted export): {REEXPORT}")
        else:
            disagreement = script_disagreement(profile, name, data.decode("utf-8", "replace"))
            if disagreement is not None:
                raise ProfileError(f"{directory / PROFILE_FILE}: edited after export: {disagreement}; "
                                   f"the files disagree: {REEXPORT}")
    return missing


# ---------------------------------------------------------------- the scripts' settings

_SCRIPT_NUMBERS = {  # pattern -> the profile key it must equal
    r"--num_gpus (\d+)": "inputs.hardware.gpus_per_node",
    r"--nproc_per_node (\d+)": "inputs.hardware.gpus_per_node",
    r"#SBATCH --gpus-per-node=(\d+)": "inputs.hardware.gpus_per_node",
    r"--num_nodes (\d+)": "inputs.hardware.nodes",
    r"--nnodes (\d+)": "inputs.hardware.nodes",
    r"#SBATCH --nodes=(\d+)": "inputs.hardware.nodes",
    r"MASTER_PORT:-(\d+)": "run.master_port",
}


def script_disagreement(profile: Profile, name: str, text: str) -> str | None:
    """How launch script `name` (as the manifest lists it) disagrees with profile.toml on the
    training script, the master port, the nodes or the GPUs per node; None when it agrees.
    Read from the script's text, so a script written by an older zlayout with the same settings agrees."""
    if name not in (DEEPSPEED_SCRIPT, TORCHRUN_SCRIPT, SLURM_SCRIPT):
        return None
    hw = profile.inputs.hardware
    expected = {"inputs.hardware.gpus_per_node": hw.gpus_per_node, "inputs.hardware.nodes": hw.nodes,
                "run.master_port": profile.run.master_port}
    for pattern, key in _SCRIPT_NUMBERS.items():
        for found in re.findall(pattern, text):
            if int(found) != expected[key]:
                return f"{key} is {expected[key]} but {name} runs {pattern.split(' ')[0].split('(')[0]}{found}"
    if name != SLURM_SCRIPT and hw.nodes > 1 and not re.search(r"--(num_nodes|nnodes) \d", text):
        return f"inputs.hardware.nodes is {hw.nodes} but {name} runs on one node"
    for line in text.splitlines():
        if line.startswith("TRAIN_SCRIPT_DEFAULT="):
            try:
                script = shlex.split(line)[0].removeprefix("TRAIN_SCRIPT_DEFAULT=")
            except (ValueError, IndexError):
                return f"{name}'s TRAIN_SCRIPT_DEFAULT line cannot be read"
            if script != profile.run.train_script:
                return (f"run.train_script is {_short(profile.run.train_script)} but {name} runs "
                        f"{_short(script)}")
    return None


# ---------------------------------------------------------------- derived tables

DERIVED_HINT = ("it is derived from the profile's inputs, prediction and measurement, so a hand edit there is "
                "refused: restore the file, or re-export with `zlayout export ... --force` (its change log is kept)")


def _without_reasons(value: Any) -> Any:
    """An alert table without its `why` texts (their wording may change between zlayout versions;
    every figure in them comes from the numbers compared)."""
    if isinstance(value, dict):
        return {k: _without_reasons(v) for k, v in value.items() if k != "why"}
    return value


def verification_problem(v: Verification) -> str | None:
    """A stored verification status the stored measurement does not give (zlayout.verify's rule:
    validated when the measured peak allocated GPU memory is within the tolerance of the
    prediction, mismatch beyond it), or error fractions that are not the measured ones."""
    measured, predicted = v.measured.get("gpu_peak_allocated_bytes"), v.predicted.get("gpu_peak_allocated_bytes")
    if v.status in MEASURED_STATUSES:
        if not measured or predicted is None:
            return (f"verification.status is {v.status!r} but verification.measured and .predicted hold no "
                    "gpu_peak_allocated_bytes: only a completed run on GPUs gives that status")
        error = (predicted - measured) / measured
        status = "validated" if abs(error) <= VALIDATED_TOLERANCE_FRACTION else "mismatch"
        if status != v.status:
            return (f"verification.status is {v.status!r} but the measured peak ({measured:,} bytes) against the "
                    f"predicted ({predicted:,}) is {error:+.1%}, which is {status!r} "
                    f"(tolerance ±{VALIDATED_TOLERANCE_FRACTION:.0%})")
    elif v.status == "unverified" and v.measured:
        return "verification.status is 'unverified' but verification.measured holds a run's figures"
    errors = {k: round((v.predicted[k] - m) / m, 6) for k, m in v.measured.items()
              if k in v.predicted and m and k not in ("world", "params")}
    for key in [*errors, *(k for k in v.error_fraction if k not in errors)]:
        if not _same(errors.get(key), v.error_fraction.get(key)):
            return (f"verification.error_fraction.{key} is {v.error_fraction.get(key)} where the measured and "
                    f"predicted figures give {errors.get(key)}")
    return None


# Summary keys that describe the inputs: an edited input already makes the prediction stale (show,
# check and diff say so and show the figures the inputs give), so these follow it
_SUMMARY_OF_INPUTS = ("model", "hardware", "host_capacity_gib", "host_capacity_bytes")


def check_derived(profile: Profile, document: dict[str, Any], source: Path | str,
                  stale: "StalePrediction | None" = None) -> None:
    """Refuse (ProfileError naming the key) a profile whose [summary], [alerts] or verification
    status is not what its inputs, stored prediction and stored measurement give."""
    from zlayout.profile.alerts import derive_alerts

    problem = verification_problem(profile.verification)
    if problem is not None:
        raise ProfileError(f"{source}: {problem}; the status follows the stored measurement: restore the file, "
                           "or run `zlayout verify PROFILE --update-profile` again")
    expected = derive_alerts(profile.inputs, profile.prediction, profile.verification,
                             checkpoint_dir=profile.run.checkpoint_dir)
    differences = json_differences(_without_reasons(expected.model_dump(mode="json")),
                                   _without_reasons(profile.alerts.model_dump(mode="json")), "alerts")
    if differences:
        key, want, have = differences[0]
        raise ProfileError(f"{source}: {key} is {'absent' if have is None else _short(have)} where the profile "
                           f"gives {'nothing' if want is None else _short(want)}: {DERIVED_HINT}")
    if stale is None and profile.limits is not None:
        from zlayout.profile.build import limits

        fresh = limits(profile.inputs, profile.layout)
        # a family defined in an export's --presets-dir is not found here: its sizes cannot be rechecked
        if fresh.scaling == profile.limits.scaling:
            differences = json_differences(fresh.model_dump(mode="json"), profile.limits.model_dump(mode="json"),
                                           "limits")
            if differences:
                key, want, have = differences[0]
                raise ProfileError(f"{source}: {key} is {'absent' if have is None else _short(have)} where the "
                                   f"profile's inputs give {'nothing' if want is None else _short(want)}: "
                                   f"{DERIVED_HINT}")
    stored = document.get("summary")
    if isinstance(stored, dict):
        summary = profile.summary().model_dump(mode="python")
        for key, have in stored.items():
            if stale is not None and key in _SUMMARY_OF_INPUTS:
                continue
            want = summary.get(key)
            if not (_same(want, have) and type(want) is type(have)):
                raise ProfileError(f"{source}: summary.{key} is {_short(have)} where the profile gives "
                                   f"{'nothing' if want is None else _short(want)}: {DERIVED_HINT}")


# ---------------------------------------------------------------- stale prediction

_COMPARED = ("gpu_peak_allocated_bytes", "gpu_peak_reserved_bytes", "gpu_device_used_bytes", "host_peak_bytes",
             "nvme_bytes", "step_time_s", "tokens_per_s", "fits", "fits_gpu", "fits_host", "fits_nvme",
             "gpu_capacity_bytes", "gpu_usable_bytes", "host_capacity_bytes", "nvme_capacity_bytes",
             "compute_s", "comm_s", "offload_s", "mfu", "intra_node_bytes", "inter_node_bytes", "pcie_bytes",
             "nvme_read_bytes", "nvme_write_bytes", "checkpoint_bytes", "peak_phase", "host_overhead_s",
             "gpu_flushes_per_step")
# Figures a profile holds only since a later zlayout: absent from an older export, which is not a
# difference (host_overhead_s decides a host-bound step's wider alert, so a stored one is compared).
_NEWER_FIGURES = ("host_overhead_s", "gpu_flushes_per_step")


def _same(a: Any, b: Any) -> bool:
    """Equal, floats to within rounding; a hand-edited value of another kind (a string where a
    number was) is simply not the same."""
    def number(x: Any) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool)

    if (isinstance(a, float) or isinstance(b, float)) and number(a) and number(b):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


@dataclass(frozen=True, slots=True)
class StalePrediction:
    """The stored prediction differs from what the inputs give now."""

    stored_planner: str
    current_planner: str
    differences: tuple[tuple[str, Any, Any], ...]  # (figure, stored, now), headline figures first
    fresh: Prediction

    @property
    def reason(self) -> str:
        if self.stored_planner != self.current_planner:
            return f"made by {self.stored_planner}, this is {self.current_planner}"
        # same version string: the planner's model changed since export (development builds
        # keep the version), or the inputs were edited; the manifest check reports an edit
        return "this zlayout's model changed since export, or the inputs were edited"

    def line(self) -> str:
        from zlayout.profile.summary import figure

        shown = []
        for key, before, after in self.differences[:3]:
            if isinstance(before, (int, float)) and not isinstance(before, bool) and after is not None:
                shown.append(f"{key} {figure(key, before)} stored, {figure(key, after)} now")
            else:
                shown.append(f"{key} {before} stored, {after} now")
        more = f" (and {len(self.differences) - 3} more)" if len(self.differences) > 3 else ""
        return (f"STALE PREDICTION ({self.reason}): {'; '.join(shown)}{more}. The figures shown are "
                "recomputed from the inputs; re-export with --force to store them")


def stale_prediction(profile: Profile) -> StalePrediction | None:
    """Recompute the prediction from the profile's inputs; None when the stored one agrees."""
    from zlayout.profile.build import predict

    try:
        fresh = predict(profile.inputs, profile.layout)
    except (ValueError, ArithmeticError, RecursionError) as exc:
        raise ProfileError(f"the profile's inputs cannot be planned: {' '.join(str(exc).split())[:200]}") from None
    stored = profile.prediction
    differences = [(key, getattr(stored, key), getattr(fresh, key)) for key in _COMPARED
                   if not (key in _NEWER_FIGURES and getattr(stored, key) is None)
                   and not _same(getattr(stored, key), getattr(fresh, key))]
    stored_terms = {(t.where, t.name): t.bytes for t in stored.terms}
    fresh_terms = {(t.where, t.name): t.bytes for t in fresh.terms}
    for key in [*fresh_terms, *(k for k in stored_terms if k not in fresh_terms)]:
        if stored_terms.get(key) != fresh_terms.get(key):
            differences.append((f"{key[0]}:{key[1]}_bytes", stored_terms.get(key), fresh_terms.get(key)))
    if not differences:
        return None
    return StalePrediction(stored_planner=stored.planner, current_planner=fresh.planner,
                           differences=tuple(differences), fresh=fresh)


@dataclass(frozen=True, slots=True)
class CheckedProfile:
    profile: Profile  # as stored
    path: Path  # the profile.toml (or standalone .toml) read
    missing: tuple[str, ...]  # files the manifest lists that are gone
    stale: StalePrediction | None
    hand_edits: tuple[tuple[str, Any, Any], ...] = ()  # ds_config.json's team keys edited (no memory effect)

    def hand_edits_line(self) -> str | None:
        if not self.hand_edits:
            return None
        return (f"{DS_CONFIG_FILE} edited by hand, no effect on memory (accepted): {describe_edits(list(self.hand_edits))}; "
                "the next export --force or verify --update-profile records it in the change log")

    def with_hand_edits(self) -> Profile:
        """The stored profile adopting the hand edits of ds_config.json's team keys, with a change-log
        entry saying what changed (figures unchanged: those keys hold no memory)."""
        if not self.hand_edits:
            return self.profile
        from zlayout.profile.build import _figures
        from zlayout.profile.schema import ChangeEntry, utc_now

        p = self.profile
        _, team = split(json.loads((self.directory / DS_CONFIG_FILE).read_text(encoding="utf-8")))
        gpu, host, step = _figures(p)
        entry = ChangeEntry(when=utc_now(), why=f"{DS_CONFIG_FILE} edited by hand: {describe_edits(list(self.hand_edits))}"[:2000],
                            basis=p.alerts.gpu_memory.basis, layout_before=p.layout.label, layout_after=p.layout.label,
                            gpu_peak_bytes_before=gpu, gpu_peak_bytes_after=gpu, host_peak_bytes_before=host,
                            host_peak_bytes_after=host, step_time_s_before=step, step_time_s_after=step)
        return p.model_copy(update={"ds_config_team": team, "changelog": [*p.changelog, entry]})

    @property
    def directory(self) -> Path:
        return self.path.parent

    @property
    def current(self) -> Profile:
        """The profile with the prediction its inputs give now (the stored one when not stale),
        and the alerts that prediction gives (`check` compares the host with the alert's peak)."""
        if self.stale is None:
            return self.profile
        from zlayout.profile.alerts import derive_alerts

        p = self.profile
        alerts = derive_alerts(p.inputs, self.stale.fresh, p.verification, checkpoint_dir=p.run.checkpoint_dir)
        return p.model_copy(update={"prediction": self.stale.fresh, "alerts": alerts})


def open_checked(path: str | Path) -> CheckedProfile:
    """Load a profile, refuse a set whose files disagree, and recompute its prediction."""
    from zlayout.profile.store import load_profile_document, resolve_profile_path

    profile_path = resolve_profile_path(path)
    profile, document = load_profile_document(profile_path)
    edits: list[tuple[str, Any, Any]] = []
    missing = check_set(profile, profile_path, edits)
    stale = stale_prediction(profile)
    check_derived(profile, document, profile_path, stale)
    return CheckedProfile(profile=profile, path=profile_path, missing=tuple(missing), stale=stale,
                          hand_edits=tuple(edits))
