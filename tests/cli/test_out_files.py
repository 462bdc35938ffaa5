"""Where calibrate writes (--out) and what it may replace: export's rule (zlayout.outfile)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from zlayout.cli import main

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "measurements" / "verify-h200-2026-11-30.jsonl"


def calibrate(out: str, *extra: str) -> int:
    return main(["calibrate", str(RESULTS), "--out", out, *extra])


@pytest.mark.parametrize("name, text", [
    ("README.md", "# my project\n"),
    ("pyproject.toml", '[project]\nname = "mine"\n'),
    ("profile.toml", "schema_version = 1\nname = \"p\"\n"),
])
def test_calibrate_never_replaces_a_file_that_is_not_a_calibration(tmp_path, capsys, name, text):
    target = tmp_path / name
    target.write_text(text)
    for extra in ((), ("--force",)):
        assert calibrate(str(target), *extra) == 2
        err = capsys.readouterr().err
        assert "Not replacing a file that is not a zlayout calibration" in err
        assert len(err.strip().splitlines()) == 1
        assert target.read_text() == text


def test_calibrate_replaces_its_own_file_only_with_force(tmp_path, capsys):
    out = tmp_path / "cal.toml"
    assert calibrate(str(out)) == 0
    first = out.read_bytes()
    capsys.readouterr()
    assert calibrate(str(out)) == 2
    assert "already exists (a zlayout calibration): add --force" in capsys.readouterr().err
    assert out.read_bytes() == first
    assert calibrate(str(out), "--force") == 0
    assert tomllib.loads(out.read_text())["schema"] == "zlayout-calibration/1"


def test_calibrate_refuses_to_replace_a_symlink(tmp_path, capsys):
    real = tmp_path / "real.toml"
    assert calibrate(str(real)) == 0
    link = tmp_path / "link.toml"
    link.symlink_to(real)
    before = real.read_bytes()
    capsys.readouterr()
    assert calibrate(str(link), "--force") == 2
    assert "is a symlink" in capsys.readouterr().err
    assert link.is_symlink() and real.read_bytes() == before


@pytest.mark.parametrize("out, message", [
    ("", "--out is empty: give a file name"),
    ("   ", "--out is empty: give a file name"),
])
def test_calibrate_empty_out_is_refused_clearly(capsys, out, message):
    assert calibrate(out) == 2
    err = capsys.readouterr().err
    assert message in err and "busy" not in err


def test_calibrate_out_a_directory_is_refused(tmp_path, capsys):
    assert calibrate(str(tmp_path)) == 2
    assert "is a directory: give a file name" in capsys.readouterr().err
    assert calibrate(str(tmp_path / "new") + "/") == 2
    assert "names a directory" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


def test_calibrate_out_a_symlink_loop_or_broken_link(tmp_path, capsys):
    loop = tmp_path / "loop.toml"
    loop.symlink_to(loop)
    assert calibrate(str(loop), "--force") == 2
    assert f"symlink loop at {loop}" in capsys.readouterr().err
    dangling = tmp_path / "dangling.toml"
    dangling.symlink_to(tmp_path / "nowhere.toml")
    assert calibrate(str(dangling), "--force") == 2
    assert f"{dangling} is a broken symlink" in capsys.readouterr().err
    assert not (tmp_path / "nowhere.toml").exists()


def test_calibrate_refuses_a_big_file_without_reading_it_all(tmp_path, capsys):
    big = tmp_path / "data.bin"
    with open(big, "wb") as handle:
        handle.truncate(64 * 2**20)
    assert calibrate(str(big), "--force") == 2
    err = capsys.readouterr().err
    assert "not a zlayout calibration" in err and big.stat().st_size == 64 * 2**20
