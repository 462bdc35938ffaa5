"""SIGKILL `zlayout export --force` at random moments; no mixed profile may be accepted.

Each try re-exports a profile directory with the other of two layouts (ZeRO-2 / ZeRO-3, other
names, so every file differs), kills the process after a random delay, and then reads the
directory the way show/check/diff/verify do (`zlayout.profile.integrity.open_checked`):

    accepted    the set loads and every file is what its profile.toml produces (old or new)
    refused     a one-line ProfileError naming a file (a half-swapped set): never trusted
    MIXED       accepted although a file disagrees with profile.toml: a bug (exit status 1)

It also counts the temporaries a kill left behind and checks that the next export removes them.

    python benchmarks/kill_export.py --tries 500          # prints the figures
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from zlayout.profile import ProfileError  # noqa: E402
from zlayout.profile.integrity import open_checked  # noqa: E402
from zlayout.profile.store import PROFILE_FILE, TEMP_PREFIX, set_files  # noqa: E402

TINY = ["--layers", "2", "--hidden", "128", "--heads", "4", "--vocab", "1000", "--seq", "64",
        "--gpus-per-node", "2", "--gpu", "h200"]
LAYOUTS = (["--stage", "2", "--name", "two"], ["--stage", "3", "--offload-optimizer", "cpu", "--name", "three"])


def export_argv(out: Path, which: int) -> list[str]:
    return [sys.executable, "-m", "zlayout", "export", *TINY, *LAYOUTS[which], "--out", str(out), "--force"]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def classify(directory: Path) -> tuple[str, str]:
    try:
        checked = open_checked(directory)
    except ProfileError as exc:
        return "refused", str(exc)
    expected = set_files(checked.profile)
    for name, data in expected.items():
        path = directory / name
        if path.exists() and path.read_bytes() != data:
            return "MIXED", f"{name} differs from what {PROFILE_FILE} ({checked.profile.name}) produces"
    return "accepted", checked.profile.name


def leftovers(directory: Path) -> list[str]:
    return [p.name for p in directory.iterdir() if p.name.startswith(TEMP_PREFIX) or p.name.endswith(".tmp")]


def _watch_write(directory: Path, proc: subprocess.Popen, limit_s: float = 30.0) -> tuple[float, float] | None:
    """Poll until the export's temporary directory appears (the write phase began); returns
    (monotonic time it appeared, time it was gone), or None when the process ended unseen."""
    appeared = None
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            present = any(e.name.startswith(TEMP_PREFIX) for e in os.scandir(directory))
        except FileNotFoundError:
            present = False
        now = time.monotonic()
        if present and appeared is None:
            appeared = now
        if appeared is not None and not present:
            return appeared, now
        if proc.poll() is not None:
            return (appeared, now) if appeared is not None else None
    return None


def _watch_write_start(directory: Path, proc: subprocess.Popen, limit_s: float = 30.0) -> bool:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if any(e.name.startswith(TEMP_PREFIX) for e in os.scandir(directory)):
                return True
        except FileNotFoundError:
            pass
    return False


def run(tries: int, seed: int, verbose: bool = False) -> dict[str, int | float]:
    rng = random.Random(seed)
    counts = {"tries": tries, "accepted": 0, "refused": 0, "MIXED": 0, "left_temporaries": 0,
              "temporaries_not_cleaned": 0, "accepted_old": 0, "accepted_new": 0}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "p"
        durations_s = []
        for which in (0, 1, 0):  # how long a whole export takes here: the window to aim the kills at
            start = time.monotonic()
            subprocess.run(export_argv(out, which), env=env(), check=True, capture_output=True)
            durations_s.append(time.monotonic() - start)
        whole_s = statistics.median(durations_s)
        windows_s = []
        for which in (1, 0, 1, 0, 1):  # how long the write phase (temporary directory to renames) lasts
            proc = subprocess.Popen(export_argv(out, which), env=env(), stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            seen = _watch_write(out, proc)
            proc.wait()
            if seen:
                windows_s.append(seen[1] - seen[0])
        window_s = max(statistics.median(windows_s) if windows_s else 0.0, 0.002)
        counts["export_s"] = round(whole_s, 3)
        counts["write_window_ms"] = round(window_s * 1000, 2)
        counts["kills_in_write_phase"] = 0
        current = 0
        for attempt in range(tries):
            target = 1 - current
            proc = subprocess.Popen(export_argv(out, target), env=env(), stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            if rng.random() < 0.2:  # anywhere in the run
                time.sleep(whole_s * rng.uniform(0.0, 1.05))
            else:  # most of an export is Python starting up: aim at the write phase itself
                if _watch_write_start(out, proc):
                    time.sleep(window_s * rng.uniform(0.0, 1.2))
                    counts["kills_in_write_phase"] += 1
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            verdict, detail = classify(out)
            counts[verdict] += 1
            if verdict == "accepted":
                counts["accepted_new" if detail == ("two", "three")[target] else "accepted_old"] += 1
            if verbose or verdict == "MIXED":
                print(f"try {attempt}: {verdict}: {detail}", file=sys.stderr)
            if leftovers(out):
                counts["left_temporaries"] += 1
            # the next (uninterrupted) export must clean up and leave a consistent set
            current = rng.randrange(2)
            subprocess.run(export_argv(out, current), env=env(), check=True, capture_output=True)
            if leftovers(out):
                counts["temporaries_not_cleaned"] += 1
            if classify(out)[0] != "accepted":
                counts["MIXED"] += 1
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=500)
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    counts = run(args.tries, args.seed, args.verbose)
    print(" ".join(f"{k}={v}" for k, v in counts.items()))
    return 1 if counts["MIXED"] or counts["temporaries_not_cleaned"] else 0


if __name__ == "__main__":
    sys.exit(main())
