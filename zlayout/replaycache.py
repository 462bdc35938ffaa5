"""The allocator replay's answers kept between commands, in the user's cache folder.

`zlayout plan` replays PyTorch's caching allocator for each of its 13 layouts
(`zlayout.core.allocator_sim`): 15 ms for a small model, about 0.3 s for llama3-70b, every time
the same for the same inputs. A replay's answer depends only on the inputs its key holds and on
the planner's code, so the answers are kept in `$XDG_CACHE_HOME/zlayout/replay.json` (default
`~/.cache/zlayout/`) under a digest of the key, next to a digest of the planner's source files
(`zlayout/core/**.py`, `zlayout/spec.py`): any change to that code starts an empty cache.

The core itself reads and writes no file: `lasting()` lends it a memo for one command. The
file is read whole and trusted only when it is this module's own format with well-formed
entries; one that is not (unreadable, foreign, a symbolic link) is neither used nor replaced.
It is written atomically (a temporary file renamed over it), and a cache that cannot be read
or written never changes a plan or fails a command: the replay simply runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sys
import tempfile
import threading
from pathlib import Path
from typing import Callable, Iterator, TypeVar

CACHE_FILE_NAME = "replay.json"
FORMAT = 1
MAX_ENTRIES = 4096  # about 100 bytes each: the file stays under half a MiB
MAX_FILE_BYTES = 1 << 20
_DIGEST = re.compile(r"[0-9a-f]{64}")
MAX_WORD = 200  # a record's text field (CapacityReplay.ran_out_in: "step 4's backward")
T = TypeVar("T")


def cache_file() -> Path:
    """$XDG_CACHE_HOME/zlayout/replay.json, as `zlayout verify` places its default output."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "zlayout" / CACHE_FILE_NAME


def code_digest() -> str | None:
    """A digest of the source files a replay's answer depends on; None when they cannot be read."""
    package = Path(__file__).resolve().parent
    files = sorted((package / "core").rglob("*.py")) + [package / "spec.py"]
    digest = hashlib.sha256()
    try:
        for path in files:
            digest.update(path.relative_to(package).as_posix().encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    except OSError:
        return None
    return digest.hexdigest()


def _entries_of(text: str, code: str) -> dict[str, object] | None:
    """The entries of a cache file's text when it is this module's format, for this code
    ({} when it was made by other code); None when it is not a cache file of ours."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not (isinstance(data, dict) and data.get("format") == FORMAT and isinstance(data.get("code"), str)
            and isinstance(data.get("entries"), dict)):
        return None
    entries = data["entries"]
    if not all(_DIGEST.fullmatch(key) and _well_formed(value) for key, value in entries.items()):
        return None
    return entries if data["code"] == code else {}


def _well_formed(value: object) -> bool:
    """An answer as the replay gives it: None (not replayed), a byte count, or a record's fields
    (counts, flags and short words: a card-filling replay names the phase it ran out in, and a
    record refused here was replayed again in the parent after a child had replayed it)."""
    if value is None or (type(value) is int and value >= 0):
        return True
    return type(value) is list and all(type(v) is bool or (type(v) is int and v >= 0)
                                       or (type(v) is str and len(v) <= MAX_WORD) for v in value)


class LastingMemo:
    """Replay answers by a digest of their key: what the file held, and what this command added."""

    def __init__(self, path: Path, code: str, entries: dict[str, object]) -> None:
        self.path = path
        self.code = code
        self.entries = entries
        self.added = 0

    def recall(self, key: object, replay: Callable[[], T], encode: Callable[[T], tuple] | None = None,
               decode: Callable[[list], T] | None = None) -> T:
        """The kept answer for `key` (a tuple of strings and numbers: its repr is stable), or
        `replay()`'s, kept. A record (a dataclass) is kept as `encode`'s tuple of its fields and
        made again by `decode`; a kept answer of the wrong kind (a record where a byte count is
        asked, fields `decode` refuses) is replayed."""
        digest = hashlib.sha256(repr(key).encode()).hexdigest()
        if digest in self.entries:
            kept = self.entries[digest]
            if kept is None or (decode is None and type(kept) is int):
                return kept  # type: ignore[return-value]
            if decode is not None:
                try:
                    return decode(kept)
                except (TypeError, ValueError):
                    pass
        value = replay()
        self.entries[digest] = list(encode(value)) if encode is not None and value is not None else value
        self.added += 1
        return value

    def save(self) -> None:
        """Write the file atomically when this command added answers; never raises."""
        if not self.added:
            return
        entries = dict(list(self.entries.items())[-MAX_ENTRIES:])  # the newest
        text = json.dumps({"format": FORMAT, "code": self.code, "entries": entries},
                          separators=(",", ":"))
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd, temporary = tempfile.mkstemp(prefix=".replay-", suffix=".tmp", dir=self.path.parent)
        except OSError:
            return
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(text)
            if _readable_as_ours(self.path):  # still ours (or still absent) just before the rename
                os.replace(temporary, self.path)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                os.unlink(temporary)


class _Absent:
    """No cache file yet."""


ABSENT = _Absent()


def _cache_text(path: Path) -> str | _Absent | None:
    """The cache file's text, ABSENT where there is none yet, None where it is not one to read
    (a symbolic link, over MAX_FILE_BYTES, unreadable)."""
    if path.is_symlink():
        return None
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            return None
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ABSENT
    except (OSError, UnicodeDecodeError):
        return None


def _readable_as_ours(path: Path) -> bool:
    """True when `path` is absent or holds a cache file of this module's format."""
    text = _cache_text(path)
    return text is ABSENT or (isinstance(text, str) and _entries_of(text, "") is not None)


def open_memo(path: Path | None = None) -> LastingMemo | None:
    """The memo the file at `path` (default: `cache_file()`) holds, or an empty one where there is
    none yet; None where the file is not one of ours or the planner's code cannot be read."""
    path = cache_file() if path is None else path
    code = code_digest()
    text = _cache_text(path)
    if code is None or text is None:
        return None
    entries = {} if text is ABSENT else _entries_of(text, code)
    return None if entries is None else LastingMemo(path, code, entries)


def usable_cpus() -> int:
    """The CPUs this process may run on (a job's share of a node, where it has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def warm_in_parallel(memo: LastingMemo | None, jobs: list[Callable[[], object]],
                     workers: int | None = None, results: dict[int, object] | None = None) -> int:
    """Run `jobs` (each plans something, filling `memo` with replay answers) split over at most
    one process a usable CPU: this one runs its share while forked children run theirs, and
    `memo` keeps the answers the children found: the caller's own planning then recalls them
    instead of replaying one layout after another (llama3-70b on 64 GPUs: four ZeRO-3 replays of
    80 layers, about 40 ms each). Returns the answers added to `memo`. Runs nothing where that is
    not safe or not faster: no memo to carry the answers, no fork (Windows), another thread
    running (a fork copies only the caller's), torch imported, fewer than two CPUs or jobs. A
    child that fails, or answers in another form, is left out: its layouts replay as before.

    The split is dynamic: each process takes the next job not yet taken, in the order given, when
    it is done with its last (a replay's length is known only once it has settled: gemma-2-2b's
    layouts take 24 to 40 ms, and a fixed every-other split left one process 131 ms of them and
    the other 90). Jobs that share replays must come as one job; the costliest first.

    With `results`, what each job returned is kept there by the job's index, whichever process
    ran it (a child's pickled back to this one: the caller then need not work it out again); a
    job left out (a child that failed, nothing run) has no entry."""
    if (memo is None or not hasattr(os, "fork") or threading.active_count() > 1 or "torch" in sys.modules
            or len(jobs) < 2):
        return 0
    workers = min(len(jobs), usable_cpus() if workers is None else workers)
    if workers < 2:
        return 0
    for stream in (sys.stdout, sys.stderr):  # a child must not print what the parent buffered
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
    added_before = memo.added
    # the queue: one byte a job, in a pipe every process reads one byte at a time from (a
    # pipe hands each byte to one reader); written whole and closed before the forks, so an
    # empty queue reads as its end
    queue, fill = os.pipe()
    try:
        os.write(fill, bytes(range(len(jobs))) if len(jobs) <= 256 else b"")
    finally:
        os.close(fill)

    def take() -> Iterator[int]:
        if len(jobs) > 256:  # more than one byte names: a fixed every-other split
            yield from range(index, len(jobs), workers)
            return
        while token := os.read(queue, 1):
            yield token[0]

    children = []
    try:
        for index in range(1, workers):
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: plan its share, send back what it added, never return
                code = 1
                try:
                    os.close(read)
                    known = set(memo.entries)
                    returned = {each: jobs[each]() for each in take()}
                    added = {key: value for key, value in memo.entries.items() if key not in known}
                    with os.fdopen(write, "wb") as out:
                        # the answers as JSON (checked as a cache file's are), then on the
                        # line after it what the jobs returned
                        out.write(json.dumps(added).encode() + b"\n")
                        if results is not None:
                            out.write(_pickle().dumps(returned, protocol=5))
                    code = 0
                finally:
                    os._exit(code)
            os.close(write)
            children.append((pid, read))
        index = 0
        for each in take():  # this process's share, while the children run theirs
            value = jobs[each]()
            if results is not None:
                results[each] = value
    finally:
        os.close(queue)
        for pid, read in children:
            _keep_answers(memo, pid, read, results, len(jobs))
    return memo.added - added_before


def _pickle():
    """pickle's C half, which the pickle module re-exports: without pickle.py's own imports
    (0.7 ms against 1.5, paid by a child at its end and the parent on its answers)."""
    try:
        import _pickle as pickle
    except ImportError:  # an interpreter without the accelerator
        import pickle
    return pickle


def _keep_answers(memo: LastingMemo, pid: int, read: int, results: dict[int, object] | None = None,
                  jobs: int = 0) -> None:
    """Wait for one child of `warm_in_parallel` and keep the well-formed answers it sent (and
    with `results`, what its jobs returned)."""
    with os.fdopen(read, "rb") as answers:
        data = answers.read()
    _, status = os.waitpid(pid, 0)
    text, _, returned = data.partition(b"\n")
    try:
        added = json.loads(text) if status == 0 else {}
    except ValueError:
        added = {}
    if results is not None and status == 0 and returned:
        try:
            values = _pickle().loads(returned)  # written by a fork of this very process
        except Exception:  # noqa: BLE001  (cut short: its jobs are simply done again)
            values = {}
        for each, value in values.items() if isinstance(values, dict) else ():
            if type(each) is int and 0 <= each < jobs:
                results.setdefault(each, value)
    for key, value in added.items() if isinstance(added, dict) else ():
        if _DIGEST.fullmatch(key) and _well_formed(value) and key not in memo.entries:
            memo.entries[key] = value
            memo.added += 1


@contextlib.contextmanager
def lasting(path: Path | None = None) -> Iterator[LastingMemo | None]:
    """Lend the allocator replay the kept answers for the duration of one command, then save
    the new ones. Without a usable cache file the replay runs as it would."""
    from zlayout.core import allocator_sim

    memo = open_memo(path)
    previous = allocator_sim.lasting_memo
    allocator_sim.lasting_memo = memo
    try:
        yield memo
    finally:
        allocator_sim.lasting_memo = previous
    if memo is not None:
        memo.save()
