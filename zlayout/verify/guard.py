"""What verification may write, and what may reach a script (no torch here).

Two rules, each for harm seen on a real cluster:
- A value typed on the command line that ends up in the sbatch script or a printed command
  (partition, account, time limit, paths, the hostfile's first host) carries no control
  character: a newline in `--partition` became a command of the batch script and hid the
  `#SBATCH` lines after it. Values are refused, not cleaned, and then quoted (shlex.quote).
- Verification writes only where it wrote before or where nothing is: a directory it
  writes into holds a marker (MARKER) saying zlayout made it, the batch script starts with
  SCRIPT_MARKER, and a file or directory without them is never replaced (a user's own
  ds_config.json, a profile, pyproject.toml, a training run's checkpoint and its `latest`).
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

from zlayout.outfile import is_system_dir  # one list for every writer
from zlayout.verify.options import LaunchError

MARKER = ".zlayout-verify"  # in every directory verification made (output, checkpoint)
MARKER_TEXT = "written by zlayout verify: this directory's files may be replaced by the next run\n"
SCRIPT_MARKER = "# Written by `zlayout verify --slurm`"
# Names verification writes into the output directory: their presence without MARKER means
# the directory holds someone else's files of the same names.
OUTPUT_NAMES = ("spec.json", "ds_config.json", "result.json", "result.tmp", "job-exit",
                "logs-run", "logs-resume", "logs-result", "checkpoint")
# System directories (and everything under the first group): never an output directory.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# SLURM's names (partition, account): letters, digits and _.-+ (a comma lists several).
_SLURM_NAME = re.compile(r"^[A-Za-z0-9_.+-]+(,[A-Za-z0-9_.+-]+)*$")
# sbatch --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, or UNLIMITED.
_TIME_LIMIT = re.compile(r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d{1,2}(:\d{1,2}){0,2}"
                         r"|UNLIMITED|unlimited|INFINITE|infinite)$")
_MEMORY = re.compile(r"^\d+[KMGT]?$", re.IGNORECASE)


def shown(value: object) -> str:
    """A value as typed, quoted so that a newline or an escape shows as such."""
    return repr(str(value))


def no_control_characters(flag: str, value: object, instead: str) -> str:
    text = str(value)
    bad = _CONTROL.search(text)
    if bad:
        what = "a newline" if bad.group() == "\n" else f"control character {bad.group()!r}"
        raise LaunchError(f"{flag} {shown(text)} holds {what}, which would end up in a script "
                          f"or command: {instead}")
    return text


def slurm_name(flag: str, value: str) -> str:
    no_control_characters(flag, value, "type the name as `sinfo` (or `sacctmgr show assoc`) lists it")
    if not _SLURM_NAME.match(value):
        raise LaunchError(f"{flag} {shown(value)} is not a SLURM name: type it as `sinfo` (or "
                          "`sacctmgr show assoc`) lists it, letters, digits and _.-+ only")
    return value


def time_limit(value: str) -> str:
    no_control_characters("--time-limit", value, "type a time such as 00:30:00")
    if not _TIME_LIMIT.match(value):
        raise LaunchError(f"--time-limit {shown(value)} is not a SLURM time: type minutes (30), "
                          "HH:MM:SS (00:30:00) or D-HH:MM:SS (1-00:00:00)")
    return value


def memory(value: str) -> str:
    no_control_characters("--mem", value, "type a size such as 64G")
    if not _MEMORY.match(value) or int(re.sub(r"\D", "", value)) == 0:
        raise LaunchError(f"--mem {shown(value)} is not a SLURM memory size: type megabytes "
                          "(65536) or a size with its unit (64G), per node")
    return value.upper()


def path_value(flag: str, path: Path | str) -> Path:
    no_control_characters(flag, path, "rename the directory, or give another path")
    return Path(path)


def _resolved(path: Path) -> Path:
    return Path(os.path.abspath(path)).resolve()


def ours(directory: Path) -> bool:
    return (directory / MARKER).is_file()


def claim_dir(flag: str, directory: Path, names: tuple[str, ...] = OUTPUT_NAMES,
              write: bool = True) -> Path:
    """The resolved directory, refused where verification would replace what it did not write:
    a system directory, a file, or a directory without MARKER holding one of `names` (an empty
    `names`: holding anything). Marked (and created) when `write`."""
    directory = _resolved(path_value(flag, directory))
    if is_system_dir(directory) or directory == Path.home().resolve():
        raise LaunchError(f"{flag} {shown(directory)} is a system or home directory: give a "
                          f"directory of its own, e.g. {flag} ./verify-run")
    if directory.exists() and not directory.is_dir():
        raise LaunchError(f"{flag} {shown(directory)} is a file: give a directory (zlayout "
                          "creates it)")
    if directory.is_dir() and not ours(directory):
        present = sorted(p.name for p in directory.iterdir()
                         if not names or p.name in names)
        if present:
            raise LaunchError(f"{flag} {shown(directory)} holds {', '.join(present[:4])} that "
                              "zlayout verify did not write: give a new or empty directory, "
                              f"e.g. {flag} {shlex.quote(str(directory / 'zlayout-verify'))}")
    if write:
        directory.mkdir(parents=True, exist_ok=True)
        if not ours(directory):
            (directory / MARKER).write_text(MARKER_TEXT)
    return directory


def check_script_path(path: Path) -> Path:
    """`--slurm FILE`: written where nothing is, or over a script zlayout wrote (SCRIPT_MARKER
    in its first lines); never over anything else, a link or a directory."""
    path_value("--slurm", path)
    if os.path.islink(path):
        raise LaunchError(f"--slurm {shown(path)} is a symlink: zlayout does not replace links; "
                          "give a new file name, e.g. --slurm verify.sbatch")
    if path.is_dir():
        raise LaunchError(f"--slurm {shown(path)} is a directory: give a file name, e.g. "
                          f"--slurm {shlex.quote(str(path / 'verify.sbatch'))}")
    if path.exists():
        try:
            head = path.read_text(errors="replace")[:2000].splitlines()[:12]
        except OSError as exc:
            raise LaunchError(f"--slurm {shown(path)}: {exc.strerror}; give a new file name") from None
        if not any(line.startswith(SCRIPT_MARKER) for line in head):
            raise LaunchError(f"--slurm {shown(path)} exists and zlayout did not write it: give "
                              "a new file name, e.g. --slurm verify.sbatch")
    return path
