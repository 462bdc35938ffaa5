"""export's --out through the real command line: never an unreadable profile, links refused,
a trailing slash a directory, accurate messages for loops and broken links, a quoted hint."""

from __future__ import annotations

from pathlib import Path

from zlayout.cli import main
from zlayout.profile import load_profile, save_profile
MAX_WHY_CHARS = 2000  # the --why limit docs/profiles.md gives
from zlayout.profile.store import MAX_PROFILE_BYTES

EXPORT = ["export", "--preset", "llama3-8b", "--gpu", "h200", "--gpus-per-node", "8", "--stage", "2"]


def export(out: str | Path, *extra: str) -> int:
    return main([*EXPORT, "--out", str(out), *extra])


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_a_profile_that_would_be_too_long_to_read_is_not_written(tmp_path, capsys):
    out = tmp_path / "p"
    assert export(out) == 0
    # a change log grown by many exports: just under what zlayout reads
    profile = load_profile(out)
    entry = profile.changelog[0].model_copy(update={"why": "x" * MAX_WHY_CHARS})
    sizes = []
    for count in (100, 101):
        save_profile(profile.model_copy(update={"changelog": [entry] * count}), out)
        sizes.append((out / "profile.toml").stat().st_size)
    per_entry = sizes[1] - sizes[0]
    count = 101 + (MAX_PROFILE_BYTES - sizes[1]) // per_entry
    save_profile(profile.model_copy(update={"changelog": [entry] * count}), out)
    size = (out / "profile.toml").stat().st_size
    assert MAX_PROFILE_BYTES - per_entry < size <= MAX_PROFILE_BYTES, size
    before = snapshot(out)
    capsys.readouterr()
    assert export(out, "--force", "--why", "y" * MAX_WHY_CHARS) == 2
    err = capsys.readouterr().err
    assert "change log is too long" in err and f"{MAX_PROFILE_BYTES:,}" in err
    assert len(err.strip().splitlines()) == 1
    assert snapshot(out) == before  # nothing written, and what is there still reads
    assert main(["show", str(out)]) == 0


def test_why_over_the_limit_is_refused_before_writing(tmp_path, capsys):
    out = tmp_path / "p"
    assert export(out, "--why", "w" * (MAX_WHY_CHARS + 1)) == 2
    err = capsys.readouterr().err
    assert f"at most {MAX_WHY_CHARS:,}" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()
    assert export(out, "--why", "w" * MAX_WHY_CHARS) == 0
