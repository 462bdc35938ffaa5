"""export's --out through the real command line: never an unreadable profile, links refused,
a trailing slash a directory, accurate messages for loops and broken links, a quoted hint."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

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


def test_a_trailing_slash_means_a_directory(tmp_path, capsys):
    out = tmp_path / "dir.toml"
    assert export(f"{out}/") == 0
    assert out.is_dir() and (out / "profile.toml").is_file() and (out / "ds_config.json").is_file()
    assert load_profile(out).layout.stage == 2


def test_a_symlinked_toml_is_not_replaced(tmp_path, capsys):
    real = tmp_path / "real.toml"
    assert export(real) == 0
    link = tmp_path / "link.toml"
    link.symlink_to(real)
    before = real.read_bytes()
    capsys.readouterr()
    assert export(link, "--force", "--seq", "8192") == 2
    err = capsys.readouterr().err
    assert f"{link} is a symlink" in err and "does not replace links" in err
    assert link.is_symlink() and real.read_bytes() == before


def test_a_symlinked_profile_toml_in_a_directory_is_not_replaced(tmp_path, capsys):
    real = tmp_path / "real.toml"
    assert export(real) == 0
    out = tmp_path / "p"
    assert export(out) == 0
    (out / "profile.toml").unlink()
    (out / "profile.toml").symlink_to(real)
    capsys.readouterr()
    assert export(out, "--force") == 2
    assert "is a symlink" in capsys.readouterr().err
    assert (out / "profile.toml").is_symlink()


def test_the_next_hint_is_shell_quoted(tmp_path, capsys):
    out = tmp_path / "with space" / "prof"
    assert export(out) == 0
    printed = capsys.readouterr().out
    hint = next(line for line in printed.splitlines() if "next:" in line)
    assert f"zlayout show {shlex.quote(str(out))}" in hint
    command = shlex.split(hint.split("next:", 1)[1].split("   ")[0])
    assert command == ["zlayout", "show", str(out)]


def test_symlink_loops_and_broken_links_are_named(tmp_path, capsys):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    loop_toml = tmp_path / "loop.toml"
    loop_toml.symlink_to(loop_toml)
    dangling = tmp_path / "dangling.toml"
    dangling.symlink_to(tmp_path / "nowhere.toml")
    for argv, message in [
        ([*EXPORT, "--out", str(loop), "--force"], f"symlink loop at {loop}"),
        ([*EXPORT, "--out", str(loop_toml), "--force"], f"symlink loop at {loop_toml}"),
        ([*EXPORT, "--out", str(dangling), "--force"], f"{dangling} is a broken symlink"),
        (["show", str(loop)], f"symlink loop at {loop}"),
        (["check", str(loop_toml)], f"symlink loop at {loop_toml}"),
        (["show", str(dangling)], f"{dangling} is a broken symlink"),
    ]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err, err
        assert "no such file" not in err.lower() and "no profile at" not in err and "is a file" not in err
        assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "nowhere.toml").exists()


# ---------------------------------------------------------------- two exports at once

def test_an_export_that_finds_the_directory_written_meanwhile_refuses(tmp_path, make_input):
    from zlayout.profile import load_profile
    from zlayout.profile.build import build_profile
    from zlayout.profile.export import ProfileExists, _unchanged_since_inspected, export_profile, inspect_target
    from zlayout.profile.store import save_profile_dir
    from zlayout.spec import Layout

    out = tmp_path / "new"
    late = inspect_target(out)  # both exports inspect the new directory before either writes
    first = export_profile(make_input(), Layout(stage=2), out, name="first")
    with pytest.raises(ProfileExists, match="written by another export"):
        save_profile_dir(build_profile(make_input(), Layout(stage=3), name="second"), out,
                         guard=_unchanged_since_inspected(late))
    assert load_profile(out).name == "first" == first.profile.name


def test_two_export_processes_into_one_new_directory_one_wins(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "new"
    argv = [sys.executable, "-m", "zlayout", "export", "--layers", "2", "--hidden", "128", "--heads", "4",
            "--vocab", "1000", "--seq", "64", "--gpu", "h200", "--out", str(out)]
    runs = [subprocess.Popen([*argv, "--stage", str(stage), "--name", f"s{stage}"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for stage in (2, 3)]
    done = [(r.wait(timeout=120), r.stderr.read()) for r in runs]
    codes = sorted(code for code, _ in done)
    assert codes == [0, 2], done
    loser = next(err for code, err in done if code == 2)
    assert "already exists" in loser or "written by another export" in loser
