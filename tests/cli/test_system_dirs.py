"""export and learn never write into a system or home directory (found by hand: `zlayout export
--out /` and `--out /etc` wrote eight files there and exited 0; `zlayout learn --out /` wrote
/KEY.toml). verify refuses the same directories (tests/verify/test_guard.py)."""

import os
from pathlib import Path

import pytest

from zlayout.cli import main

HF_CONFIG = Path(__file__).resolve().parents[1] / "hf" / "configs" / "published" / "gpt2.json"


@pytest.mark.parametrize("out", ["/", "/etc", "/etc/zlayout-profile", "/usr/lib/x.toml", "~"])
def test_export_refuses_system_and_home_directories(out, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    before = set(os.listdir("/")), set(os.listdir("/etc"))
    code = main(["export", "--preset", "llama3-8b", "--stage", "2", "--out", os.path.expanduser(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert "is a system or home directory" in err and "--out profiles/llama3-8b" in err
    assert len(err.strip().splitlines()) <= 2
    assert (set(os.listdir("/")), set(os.listdir("/etc"))) == before


def test_learn_refuses_a_system_directory_before_tracing(capsys):
    before = set(os.listdir("/"))
    code = main(["learn", "--hf-config", str(HF_CONFIG), "--out", "/"])
    err = capsys.readouterr().err
    assert code == 2 and "is a system or home directory" in err
    assert set(os.listdir("/")) == before


def test_export_into_a_directory_of_its_own_still_writes(tmp_path, capsys):
    out = tmp_path / "profiles" / "llama3-8b"
    assert main(["export", "--preset", "llama3-8b", "--stage", "2", "--out", str(out)]) == 0
    assert (out / "profile.toml").is_file()


@pytest.mark.parametrize("path", ["/", "/etc", "/usr/lib/x.toml"])
def test_the_apps_export_path_is_refused_by_the_same_rule(path):
    """The app exports through export_profile too (tui/backends.py): the rule lives in the export
    target's resolution, not in the command line's flag handling."""
    from zlayout.profile import ProfileError
    from zlayout.profile.export import inspect_target

    with pytest.raises(ProfileError, match="is a system or home directory"):
        inspect_target(path)
