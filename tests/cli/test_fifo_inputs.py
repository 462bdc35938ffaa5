"""A path that names a FIFO is refused in one line, never waited on (QA: `zlayout plan
--hf-config FIFO` hung forever: open() of a FIFO waits for a writer). Every reader of a user's
file goes through zlayout.smallfile.read_small_file."""

from __future__ import annotations

import os
import threading

import pytest

from zlayout.cli import main
from zlayout.smallfile import NotARegularFile, TooLarge, read_small_file


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


def run_with_watchdog(capsys, argv: list[str]) -> tuple[int, str]:
    """main(argv) in a thread: a hang fails the test (a writer then unblocks the FIFO) instead of
    stalling the suite."""
    result: dict = {}
    thread = threading.Thread(target=lambda: result.setdefault("code", main(argv)), daemon=True)
    thread.start()
    thread.join(20)
    if thread.is_alive():  # it is waiting on the FIFO: release it, then fail
        os.close(os.open(argv[-1], os.O_WRONLY | os.O_NONBLOCK))  # the FIFO is the last argument
        thread.join(5)
        pytest.fail(f"zlayout {' '.join(argv)} waited on a FIFO")
    return result["code"], capsys.readouterr().err


@pytest.mark.parametrize("flags, says", [
    (["plan", "--hf-config"], "not a file; give the model's config.json"),
    (["plan", "--preset", "llama3-8b", "--calibration"], "is not a file"),
    (["export", "--preset", "llama3-8b", "--stage", "2", "--out", "OUT", "--ds-config"], "--ds-config"),
    (["verify", "--batch"], "--batch"),
])
def test_a_fifo_is_refused_in_one_line(fifo, tmp_path, capsys, flags, says):
    argv = [str(tmp_path / "out") if f == "OUT" else f for f in flags] + [str(fifo)]
    code, err = run_with_watchdog(capsys, argv)
    assert code == 2
    assert says in err and "not a file" in err and err.count("\n") <= 2
    assert not (tmp_path / "out").exists()


def test_read_small_file_reads_regular_files_up_to_the_limit(tmp_path, fifo):
    f = tmp_path / "f"
    f.write_bytes(b"x" * 100)
    assert read_small_file(f, 100) == b"x" * 100
    with pytest.raises(TooLarge):
        read_small_file(f, 99)
    with pytest.raises(NotARegularFile):
        read_small_file(fifo, 100)
    with pytest.raises(NotARegularFile):
        read_small_file("/dev/zero", 100)
    with pytest.raises(NotARegularFile):
        read_small_file(tmp_path, 100)
    with pytest.raises(FileNotFoundError):
        read_small_file(tmp_path / "absent", 100)
