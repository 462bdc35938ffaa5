"""Install hints match how zlayout was installed: from a source checkout `pip install -e` of
that checkout, from a package `pip install 'zlayout[verify]'`; always into the Python meant."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from zlayout.verify import preflight

ROOT = Path(__file__).resolve().parents[2]
HINT = "from zlayout.install import pip_install_command; print(pip_install_command('verify', '/opt/py 3/bin/python'))"


def _hint_from(package_root: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(package_root)}
    proc = subprocess.run([sys.executable, "-P", "-c", HINT], capture_output=True, text=True, env=env,
                          cwd=package_root, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_from_a_checkout_the_hint_installs_the_checkout_editable():
    assert _hint_from(ROOT) == f"'/opt/py 3/bin/python' -m pip install -e '{ROOT}[verify]'"


def test_from_a_package_the_hint_names_the_package(tmp_path):
    """A copy of the package with no pyproject.toml beside it is what a wheel installs."""
    shutil.copytree(ROOT / "zlayout", tmp_path / "zlayout", ignore=shutil.ignore_patterns("__pycache__"))
    assert _hint_from(tmp_path) == "'/opt/py 3/bin/python' -m pip install 'zlayout[verify]'"


def test_verify_preflight_without_torch_names_the_checkout_and_the_ranks_python(tmp_path):
    fake_python = tmp_path / "python"
    fake_python.write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named torch' >&2\nexit 1\n")
    fake_python.chmod(0o755)
    check, _ = preflight.check_versions(str(fake_python), cpu=True)
    assert check.fix == (f"install them: {fake_python} -m pip install -e '{ROOT}[verify]' "
                         "(torch, deepspeed==0.19.8)")
    assert "'zlayout[verify]'" not in check.fix


def test_every_extra_a_hint_names_exists():
    """learn's hint named 'zlayout[learn]', an extra pyproject.toml did not have (pip installs
    nothing for it and only warns)."""
    import re
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    named = set()
    for source in (ROOT / "zlayout").rglob("*.py"):
        text = source.read_text()
        named |= set(re.findall(r"pip_install_command\(['\"]([a-z,]+)['\"]", text))
        named |= set(re.findall(r"zlayout\[([a-z,]+)\]", text))
    assert {"verify", "learn"} <= named
    for extra in named:
        assert set(extra.split(",")) <= set(extras), extra
