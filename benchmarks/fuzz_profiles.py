"""A longer run of the corrupted-profile fuzz test (tests/profile/test_corrupt_fuzz.py).

    python benchmarks/fuzz_profiles.py [EXAMPLES]      # default 2000, fresh random draws

Prints pytest's verdict; any traceback or multi-line error is a failure with the shrunk example.
"""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

if __name__ == "__main__":
    examples = sys.argv[1] if len(sys.argv) > 1 else "2000"
    env = {**os.environ, "ZLAYOUT_FUZZ_EXAMPLES": examples, "PYTHONPATH": str(ROOT)}
    env.pop("CI", None)  # explore afresh
    sys.exit(subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              "tests/profile/test_corrupt_fuzz.py"], cwd=ROOT, env=env))
