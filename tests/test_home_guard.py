"""The suite never writes into the user's home: HOME and the XDG folders point at a temporary
home for the whole run (in subprocesses too), and the end-of-run check names anything new in
the real one (tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from zlayout.spec import Layout
from zlayout.verify.options import default_out_dir

SUITE_CONFTEST = Path(__file__).resolve().parent / "conftest.py"


@pytest.fixture
def guard(request):
    """tests/conftest.py as pytest loaded it (its helpers, not a second copy)."""
    return next(plugin for plugin in request.config.pluginmanager.get_plugins()
                if getattr(plugin, "__file__", None) == str(SUITE_CONFTEST))


def test_home_and_caches_are_a_temporary_folder_here_and_in_subprocesses():
    home = Path(os.environ["HOME"])
    assert home.name.startswith("zlayout-tests-home-")
    assert home.parent == Path(tempfile.gettempdir())
    assert Path.home() == home
    assert Path(os.environ["XDG_CACHE_HOME"]) == home / ".cache"
    assert Path(os.environ["XDG_CONFIG_HOME"]) == home / ".config"
    # verify without --out writes under the cache folder: the temporary one
    assert default_out_dir(Layout(stage=2)).is_relative_to(home / ".cache" / "zlayout" / "verify")
    child = subprocess.run([sys.executable, "-c", "from pathlib import Path; print(Path.home())"],
                           capture_output=True, text=True, check=True)
    assert child.stdout.strip() == str(home)


def test_the_check_names_new_entries_and_changes_under_a_zlayout_folder(guard, tmp_path):
    home = tmp_path / "home"
    (home / ".cache" / "zlayout" / "verify").mkdir(parents=True)
    (home / ".cache" / "zlayout" / "replay.json").write_text("{}")
    (home / ".cache" / "pip").mkdir()
    watched = [home, home / ".cache"]
    before = guard.snapshot(watched)
    assert guard.written(before, guard.snapshot(watched)) == []

    run = home / ".cache" / "zlayout" / "verify" / "20261202-z2"
    run.mkdir()
    (home / ".bash_history").write_text("")
    (home / ".cache" / "pip" / "http").mkdir()  # inside another program's folder: not looked at
    replay = home / ".cache" / "zlayout" / "replay.json"
    os.utime(replay, ns=(0, 0))  # rewritten
    assert guard.written(before, guard.snapshot(watched)) == sorted(
        [str(home / ".bash_history"), str(run), str(replay), str(run.parent)])


@pytest.mark.parametrize("ci", ["1", ""])
def test_a_run_whose_test_writes_into_the_real_home_fails_under_ci(tmp_path, ci):
    """The whole mechanism in a run of its own: the suite's conftest, a "real" home, and a test
    that writes into it by its path (not through HOME, which points elsewhere)."""
    real_home = tmp_path / "real-home"
    (real_home / ".cache").mkdir(parents=True)
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(SUITE_CONFTEST.read_text())
    (suite / "test_writes.py").write_text(
        "import os\nfrom pathlib import Path\n\n"
        f"REAL = Path({str(real_home)!r})\n\n"
        "def test_home_points_elsewhere():\n"
        "    assert Path.home() != REAL\n\n"
        "def test_writes_into_the_real_cache():\n"
        "    (REAL / '.cache' / 'zlayout' / 'verify').mkdir(parents=True)\n")
    env = {key: value for key, value in os.environ.items()
           if key not in ("ZLAYOUT_TESTS_HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME",
                          "XDG_STATE_HOME", "PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS")}
    env.update(HOME=str(real_home), CI=ci)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(suite)],
                         capture_output=True, text=True, env=env, cwd=suite, timeout=300)
    assert "2 passed" in run.stdout, run.stdout + run.stderr
    assert f"into the real home: {real_home / '.cache' / 'zlayout'}" in run.stdout
    assert run.returncode == (1 if ci else 0), run.stdout
    assert ("ERROR: " if ci else "WARNING: ") + "tests wrote outside" in run.stdout
