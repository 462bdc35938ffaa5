"""The longer fuzz run of plan, breakeven and export (tests/cli/test_fuzz.py is the short one).

    python benchmarks/fuzz_cli.py                 # 2,000 command lines, random seed
    python benchmarks/fuzz_cli.py -n 20000 --seed 7

Prints how many ended in success and in a one-line error, the slowest command line and its
time, and every failure (a traceback, more than one error line, exit codes other than 0/2,
JSON with Infinity or NaN). Exit 1 if any failed.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "cli"))

from hypothesis import HealthCheck, given, settings  # noqa: E402

from cli_fuzz import command_lines, run_and_check  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--examples", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    counts: Counter[str] = Counter()
    failures: list[str] = []
    slowest = (0.0, [])

    @settings(max_examples=args.examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(argv=command_lines())
    def one(argv):
        nonlocal slowest
        if argv[0] == "export":
            argv = [*argv, "--out", "p", "--force"]
        started = time.perf_counter()
        try:
            code, _ = run_and_check(argv)
            counts[f"{argv[0]} exit {code}"] += 1
        except Exception:  # noqa: BLE001 - every failure is reported, the run goes on
            failures.append(f"{argv!r}\n{traceback.format_exc(limit=3)}")
        elapsed_s = time.perf_counter() - started
        if elapsed_s > slowest[0]:
            slowest = (elapsed_s, argv)

    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        started = time.perf_counter()
        settings.register_profile("fuzz", settings(database=None))
        one_seeded = __import__("hypothesis").seed(seed)(one)
        one_seeded()
        total_s = time.perf_counter() - started
    print(f"seed {seed}: {sum(counts.values())} command lines in {total_s:.1f} s")
    for key, count in sorted(counts.items()):
        print(f"  {key}: {count}")
    print(f"slowest: {slowest[0] * 1000:.0f} ms for {' '.join(slowest[1])!r}")
    print(f"failures: {len(failures)}")
    for failure in failures[:20]:
        print(failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
