"""How long `zlayout learn` takes, and how much memory, on a 70B-class config (the target: at
most 60 s and 4 GiB on a 2-core machine; issue 27).

    python benchmarks/learn_speed.py [CONFIG.json ...]

Each config is learned by the real command in a fresh process (transformers' import
included), writing into a temporary cards folder; the figures are the process's wall time and
its peak resident memory (ru_maxrss).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = [ROOT / "tests" / "hf" / "configs" / "published" / "Meta-Llama-3.1-70B.json",
           ROOT / "tests" / "hf" / "configs" / "published" / "Mixtral-8x22B-v0.1.json"]


def learn_once(config: Path) -> tuple[float, float, int]:
    """(wall seconds, peak RSS in GiB, exit code) of one `zlayout learn` process."""
    with tempfile.TemporaryDirectory() as cards_dir:
        env = {**os.environ, "ZLAYOUT_CARDS_DIR": cards_dir}
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        started = time.perf_counter()
        result = subprocess.run([sys.executable, "-m", "zlayout", "learn", "--hf-config", str(config)],
                                capture_output=True, text=True, env=env)
        wall = time.perf_counter() - started
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB on Linux: the largest child
        if result.returncode:
            print(f"  {config.name}: {result.stderr.strip().splitlines()[-1]}")
        return wall, max(peak, before) / 2**20, result.returncode


def main(argv: list[str]) -> int:
    configs = [Path(a) for a in argv] or DEFAULT
    print(f"zlayout learn, one process per config, {os.cpu_count()} CPUs (target: <= 60 s, <= 4 GiB)")
    worst = 0
    for config in configs:
        wall, rss, code = learn_once(config)
        worst = max(worst, code)
        print(f"  {config.stem:28} {wall:6.1f} s  {rss:5.2f} GiB peak RSS")
    return worst


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
