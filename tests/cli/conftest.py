"""Puts this folder on sys.path so the tests can import cli_fuzz (pytest runs with
--import-mode=importlib, which does not)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
