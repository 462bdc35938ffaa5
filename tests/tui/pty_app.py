"""The real app in a pseudo-terminal, driven by raw key bytes the way SSH delivers them.

Pilot waits for the app between keys, so it cannot show keys lost or reordered when they
arrive together; here a whole burst is one `write` to the terminal. The app's state is
read back through its f12 state dump ($ZLAYOUT_STATE_DUMP), which reports the fields, the
plan input on screen and every table cell.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import signal
import struct
import sys
import termios
import threading
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[2]

KEYS = {
    "tab": "\t", "shift+tab": "\x1b[Z", "backspace": "\x7f", "end": "\x1b[F", "home": "\x1b[H",
    "left": "\x1b[D", "right": "\x1b[C", "up": "\x1b[A", "down": "\x1b[B", "delete": "\x1b[3~", "f12": "\x1b[24~", "ctrl+z": "\x1a", "ctrl+q": "\x11",
    "enter": "\r", "pageup": "\x1b[5~", "pagedown": "\x1b[6~",
}


def keys(*parts: str) -> bytes:
    """Key names (from KEYS) and literal text, as the bytes a terminal sends."""
    return "".join(KEYS.get(part, part) for part in parts).encode()


class PtyApp:
    """`python -m zlayout ARGS` on a pseudo-terminal of `size` columns x rows."""

    def __init__(self, args: list[str], size: tuple[int, int], dump: Path) -> None:
        self.dump = dump
        env = {**os.environ, "TERM": "xterm-256color", "ZLAYOUT_STATE_DUMP": str(dump),
               "PYTHONPATH": str(REPO), "COLUMNS": str(size[0]), "LINES": str(size[1])}
        env.pop("TEXTUAL", None)
        pid, fd = pty.fork()
        if pid == 0:  # the child: the terminal is its stdin/stdout; give it its size first
            fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", size[1], size[0], 0, 0))
            os.chdir(REPO)
            os.execvpe(sys.executable, [sys.executable, "-m", "zlayout", *args], env)
        self.pid, self.fd = pid, fd
        self.output = bytearray()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        # the app blocks when nobody reads its frames: drain the terminal all along
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:
                return
            if not chunk:
                return
            self.output.extend(chunk)

    def write(self, data: bytes) -> None:
        """One write: the app reads these bytes together, as a burst."""
        os.write(self.fd, data)

    def state(self, timeout_s: float = 60.0,
              until: Callable[[dict[str, Any]], bool] = lambda s: True) -> dict[str, Any]:
        """Ask for a state dump (f12) until one satisfies `until`; return it."""
        deadline = time.monotonic() + timeout_s
        last: dict[str, Any] | None = None
        while time.monotonic() < deadline:
            before = self.dump.stat().st_mtime_ns if self.dump.exists() else 0
            self.write(keys("f12"))
            for _ in range(40):
                time.sleep(0.05)
                if self.dump.exists() and self.dump.stat().st_mtime_ns != before:
                    break
            if self.dump.exists():
                last = json.loads(self.dump.read_text())
                if until(last):
                    return last
        raise AssertionError(f"the app did not reach the expected state; last dump: {last}")

    def settled(self, timeout_s: float = 60.0, **extra: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """The state once its plan is on screen (nothing pending) and `extra` checks hold."""
        return self.state(timeout_s, lambda s: not s["pending"] and s["plan_input"] is not None
                          and all(check(s) for check in extra.values()))

    def focus(self, field: str, key: str = "shift+tab", limit: int = 40) -> None:
        """Move the focus with `key` (one at a time) until `field` has it."""
        for _ in range(limit):
            if self.state()["focused"] == field:
                return
            self.write(keys(key))
        raise AssertionError(f"could not reach {field} with {key}")

    def close(self) -> None:
        try:
            self.write(keys("ctrl+q"))
            for _ in range(100):
                done, _ = os.waitpid(self.pid, os.WNOHANG)
                if done:
                    break
                time.sleep(0.05)
            else:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
        except (OSError, ChildProcessError):
            pass
        try:
            os.close(self.fd)
        except OSError:
            pass
