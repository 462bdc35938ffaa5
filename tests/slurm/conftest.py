"""The real-SLURM suite: a session-wide single-node cluster (see cluster.py).

Skipped, with the reason, only where SLURM is not installed (.ci/run installs slurm-wlm and
munge with apt-get) or the tests do not run as root (slurmd must). ZLAYOUT_REQUIRE_SLURM=1
(set by .ci/run) turns that skip into a failure, so CI never passes without running it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
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


@pytest.fixture(scope="session")
def slurm_cluster():
    reason = _unavailable()
    if reason:
        if os.environ.get("ZLAYOUT_REQUIRE_SLURM") == "1":
            pytest.fail(f"ZLAYOUT_REQUIRE_SLURM=1 but {reason}")
        pytest.skip(reason)
    # Not pytest's tmp_path: slurmd's spool and munge's socket want a short path.
    root = Path(tempfile.mkdtemp(prefix="zlayout-slurm-"))
    cluster = SlurmCluster(root)
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)  # sbatch/scontrol in zlayout find the cluster
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
