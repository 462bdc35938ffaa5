"""Op-build locks an interrupted build left behind: removed with a note when no builder is
alive, kept while one may be (young, or a process works in the op's directory)."""

from __future__ import annotations

import os
import subprocess
import time

from zlayout.verify import oplocks
from zlayout.verify.preflight import check_op_locks


def make_lock(root, op: str, age_s: float):
    op_dir = root / "py311_cpu" / op
    op_dir.mkdir(parents=True)
    lock = op_dir / "lock"
    lock.write_text("")
    then = time.time() - age_s
    os.utime(lock, (then, then))
    return lock


def test_a_stale_shm_comm_lock_is_removed_with_a_note(tmp_path):
    env = {"TORCH_EXTENSIONS_DIR": str(tmp_path)}
    stale = make_lock(tmp_path, "deepspeed_shm_comm", 3600)
    young = make_lock(tmp_path, "cpu_adam", 5)  # a build may be starting: left alone
    notes = oplocks.remove_stale_locks(env)
    assert not stale.exists() and young.exists()
    assert len(notes) == 1 and "deepspeed_shm_comm" in notes[0] and "60 min old" in notes[0]


def test_a_lock_whose_builder_is_alive_is_kept(tmp_path):
    env = {"TORCH_EXTENSIONS_DIR": str(tmp_path)}
    lock = make_lock(tmp_path, "fused_adam", 3600)
    builder = subprocess.Popen(["sleep", "30"], cwd=lock.parent)  # ninja runs in the op's directory
    try:
        assert oplocks.remove_stale_locks(env) == [] and lock.exists()
    finally:
        builder.kill()
        builder.wait()
    assert oplocks.remove_stale_locks(env) and not lock.exists()


def test_the_default_cache_follows_xdg_cache_home(tmp_path):
    assert oplocks.extension_dirs({"XDG_CACHE_HOME": str(tmp_path)}) == [tmp_path / "torch_extensions"]


def test_preflight_reports_the_removal_as_a_warning_that_does_not_block(tmp_path):
    make_lock(tmp_path, "deepspeed_shm_comm", 7200)
    checks = check_op_locks({"TORCH_EXTENSIONS_DIR": str(tmp_path)})
    assert len(checks) == 1 and not checks[0].ok and not checks[0].blocking
    assert checks[0].line().startswith("preflight WARN op-build lock: removed a stale op-build lock")
