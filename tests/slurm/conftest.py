"""The real-SLURM suite: a session-wide two-node cluster on this machine (see cluster.py),
shared by pytest-xdist's workers.

Skipped, with the reason, only where SLURM is not installed (.ci/run installs slurm-wlm and
munge with apt-get) or the tests do not run as root (slurmd must). ZLAYOUT_REQUIRE_SLURM=1
(set by .ci/run) turns that skip into a failure, so CI never passes without running it.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest

from .cluster import SlurmCluster, missing_programs


def _unavailable() -> str | None:
    missing = missing_programs()
    if missing:
        return (f"SLURM is not installed ({', '.join(missing)} missing): "
                "apt-get install -y slurm-wlm munge (as .ci/run does)")
    if os.geteuid() != 0:
        return "slurmd needs root: run the SLURM suite as root (as .ci/run does)"
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups (it appends them to node ids)
def pytest_collection_modifyitems(config, items):
    """The suite's jobs share one cluster of two 2-CPU nodes: on one pytest-xdist worker
    (`--dist loadgroup`), one job at a time, so a test that needs the node to itself (two
    verifications at once, the two-node drill) gets it."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents:
            item.add_marker(pytest.mark.xdist_group("slurm"))


@contextmanager
def _locked(path: Path):
    with path.open("a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _shared_dir(tmp_path_factory) -> Path:
    """A directory every pytest-xdist worker of this run sees, and only they: the run's
    temporary home (tests/conftest.py; not pytest's basetemp, which another pytest session of
    the same user may delete while this one runs), else the basetemp's parent under xdist."""
    home = os.environ.get("ZLAYOUT_TESTS_HOME")
    if home and Path(home).is_dir():
        return Path(home)
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """One cluster per test run: under pytest-xdist the first worker to need it starts it
    (under a file lock), the others use it, and the last one done stops it by its PIDs."""
    reason = _unavailable()
    if reason:
        if os.environ.get("ZLAYOUT_REQUIRE_SLURM") == "1":
            pytest.fail(f"ZLAYOUT_REQUIRE_SLURM=1 but {reason}")
        pytest.skip(reason)
    shared = _shared_dir(tmp_path_factory)
    lock, state_file = shared / "slurm-cluster.lock", shared / "slurm-cluster.json"
    with _locked(lock):
        state = json.loads(state_file.read_text()) if state_file.exists() else None
        if state is None:
            # Not pytest's tmp_path: slurmd's spool and munge's socket want a short path.
            cluster = SlurmCluster(Path(tempfile.mkdtemp(prefix="zlayout-slurm-")))
            try:
                cluster.start()
            except BaseException:
                cluster.stop()
                shutil.rmtree(cluster.root, ignore_errors=True)
                raise
            state = {"root": str(cluster.root), "node": cluster.node, "second": cluster.second,
                     "cpus": cluster.cpus, "pids": cluster.pids, "users": 0}
        else:
            cluster = SlurmCluster(Path(state["root"]), node=state["node"], cpus=state["cpus"],
                                   second=state["second"], pids=dict(state["pids"]))
        state["users"] += 1
        state_file.write_text(json.dumps(state))
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)  # sbatch/scontrol in zlayout find the cluster
    try:
        yield cluster
    finally:
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
        with _locked(lock):
            try:
                state = json.loads(state_file.read_text())
            except (OSError, ValueError):  # the record is gone: stop what this process knows of
                state = {"users": 1, "pids": cluster.pids}
            state["users"] -= 1
            if state["users"] <= 0:
                cluster.pids = dict(state["pids"])
                cluster.stop()
                shutil.rmtree(cluster.root, ignore_errors=True)
                state_file.unlink(missing_ok=True)
            else:
                state_file.write_text(json.dumps(state))
