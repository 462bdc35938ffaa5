"""Suite-wide settings.

Under CI (CI=true) hypothesis draws the same examples on every run, so a submission's result
does not depend on the luck of one draw; locally it explores afresh.

No test writes outside its temporary directories: before any test runs, HOME and the XDG
directories point at one temporary home for the whole run (zlayout's caches, `verify`'s
default output, chromium's and DeepSpeed's files land there, in this process and in every
subprocess and xdist worker it starts). At the end, anything new at the top of the real home or
its cache/config/data folders, or under a `zlayout` folder there, fails the run under CI and is
a warning elsewhere (on a shared machine another process may have written it).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

SESSION_HOME_ENV = "ZLAYOUT_TESTS_HOME"  # set by the controller; xdist workers inherit it
XDG_DIRS = {"XDG_CACHE_HOME": ".cache", "XDG_CONFIG_HOME": ".config", "XDG_DATA_HOME": ".local/share",
            "XDG_STATE_HOME": ".local/state"}


def real_home_watch_list() -> list[Path]:
    """The folders whose new entries mean a test wrote into the user's home."""
    home = Path.home()
    folders = [home] + [Path(os.environ.get(var) or home / sub) for var, sub in XDG_DIRS.items()]
    return list(dict.fromkeys(folders))


def snapshot(folders: list[Path]) -> dict[str, int]:
    """Every entry at the top of `folders`, and everything under a `zlayout` folder there, with
    its modification time (ns)."""
    seen: dict[str, int] = {}
    for folder in folders:
        try:
            entries = list(folder.iterdir())
        except OSError:
            continue
        for entry in entries:
            try:
                seen[str(entry)] = entry.lstat().st_mtime_ns
            except OSError:
                continue
            if entry.name == "zlayout" and entry.is_dir() and not entry.is_symlink():
                for path in entry.rglob("*"):
                    try:
                        seen[str(path)] = path.lstat().st_mtime_ns
                    except OSError:
                        continue
    return seen


def written(before: dict[str, int], after: dict[str, int]) -> list[str]:
    """Entries that are new, or under a `zlayout` folder and modified, between two snapshots."""
    return sorted(path for path, mtime in after.items()
                  if path not in before or (f"{os.sep}zlayout{os.sep}" in path and before[path] != mtime))


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get(SESSION_HOME_ENV):  # an xdist worker: its controller set everything up
        return
    watched = real_home_watch_list()
    config.stash[_real_home_key] = (watched, snapshot(watched))
    home = Path(tempfile.mkdtemp(prefix="zlayout-tests-home-"))
    config.stash[_session_home_key] = home
    os.environ[SESSION_HOME_ENV] = str(home)
    os.environ["HOME"] = str(home)
    for var, sub in XDG_DIRS.items():
        (home / sub).mkdir(parents=True, exist_ok=True)
        os.environ[var] = str(home / sub)
    # DeepSpeed compiles its CPU shared-memory op on the first engine (about a minute on two
    # cores): one build per machine, kept in the system's temporary folder, not in every run's
    # new home. A TORCH_EXTENSIONS_DIR the caller set is left as it is.
    os.environ.setdefault("TORCH_EXTENSIONS_DIR",
                          str(Path(tempfile.gettempdir()) / f"zlayout-tests-torch-extensions-{os.getuid()}"))


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups in each worker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist (--dist loadgroup): the slow tests go first, and every test that uses one of
    this suite's session- or module-scoped fixtures runs on one worker, so that the SLURM
    cluster, a server or a DeepSpeed run several tests check is made once per run, not once per
    worker."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    # The long ones (real DeepSpeed engines) first, so that no worker is left with one of them
    # at the end while the other idles; the order within each part is kept.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        shared = sorted(f"{definition.baseid}::{name}"
                        for name, definitions in info.name2fixturedefs.items()
                        for definition in definitions[-1:]
                        if definition.scope in ("session", "module", "package")
                        and definition.baseid.startswith("tests"))  # the suite's, not a plugin's
        if shared:
            item.add_marker(pytest.mark.xdist_group(shared[0]))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    stashed = session.config.stash.get(_real_home_key, None)
    if stashed is None:  # an xdist worker: the controller checks once for the whole run
        return
    watched, before = stashed
    paths = written(before, snapshot(watched))
    if not paths:
        return
    shown = ", ".join(paths[:10]) + (f" and {len(paths) - 10} more" if len(paths) > 10 else "")
    message = (f"tests wrote outside their temporary directories, into the real home: {shown} "
               "(a test must write under tmp_path)")
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    # Under CI nothing else runs: the run fails. On a shared development machine another
    # process (a `zlayout plan` typed meanwhile) may have made them: a warning.
    if os.environ.get("CI"):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    elif reporter is not None:
        message += "; or another process on this machine did (CI=1 makes this an error)"
    if reporter is not None:
        reporter.write_line(f"{'ERROR' if os.environ.get('CI') else 'WARNING'}: {message}",
                            red=True, bold=True)


def pytest_unconfigure(config: pytest.Config) -> None:
    home = config.stash.get(_session_home_key, None)
    if home is not None:
        shutil.rmtree(home, ignore_errors=True)


_real_home_key = pytest.StashKey[tuple]()
_session_home_key = pytest.StashKey[Path]()
