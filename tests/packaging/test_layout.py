"""The repository's layout and the wheel's agree: presets/ at the top ships as zlayout/presets."""

from __future__ import annotations

import tomllib
from pathlib import Path

from zlayout import catalog

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_a_checkout_reads_the_top_level_presets():
    assert catalog.BUILTIN_PRESETS_DIR == ROOT / "presets"
    for kind in catalog.KINDS:
        assert (ROOT / "presets" / kind).is_dir(), kind
    assert not (ROOT / "zlayout" / "presets").exists(), "presets live at the top, not in the package"


def test_every_python_package_is_listed_for_the_wheel():
    # pyproject lists packages by hand (package-dir maps presets/ in); a new subpackage left
    # out of the list would be missing from an installed zlayout.
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    on_disk = {".".join(init.parent.relative_to(ROOT).parts)
               for init in (ROOT / "zlayout").rglob("__init__.py")}
    assert on_disk | {"zlayout.presets"} == listed
    assert PYPROJECT["tool"]["setuptools"]["package-dir"]["zlayout.presets"] == "presets"


def test_the_wheel_takes_every_preset_file():
    # package-data patterns, applied to the files under presets/, must cover all of them.
    patterns = PYPROJECT["tool"]["setuptools"]["package-data"]["zlayout.presets"]
    presets = ROOT / "presets"
    files = {p for p in presets.rglob("*") if p.is_file()}
    covered = {p for pattern in patterns for p in presets.glob(pattern) if p.is_file()}
    assert files and files == covered
