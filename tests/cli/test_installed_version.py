"""`zlayout plan` reads transformers' version for its card note without importlib.metadata (its
imports cost a carded plan 10-13 ms): it must answer what importlib.metadata answers."""

from __future__ import annotations

import sys
from importlib import metadata

import pytest

from zlayout.cli import _dist_info_version, _installed


@pytest.mark.parametrize("name", ["pydantic", "pydantic_core", "Pydantic-Core", "pip", "transformers",
                                  "zlayout", "no-such-distribution-here"])
def test_the_version_is_importlib_metadatas(name):
    try:
        expected = metadata.version(name)
    except metadata.PackageNotFoundError:
        expected = None
    assert _installed(name) == expected
    assert _dist_info_version(name) in (None, expected)  # None: left to importlib.metadata


def test_the_first_folder_on_the_path_wins_and_a_folded_header_is_left_to_the_email_parser(tmp_path, monkeypatch):
    first, second = tmp_path / "a", tmp_path / "b"
    for folder, version in ((first, "1.2.3"), (second, "9.9.9")):
        info = folder / f"fake_pkg-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fake-pkg\nVersion: {version}\n\nbody\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "missing"), str(first), str(second)])
    assert _dist_info_version("Fake.Pkg") == "1.2.3" == metadata.version("Fake.Pkg")
    (first / "fake_pkg-1.2.3.dist-info" / "METADATA").write_text("Name: fake-pkg\nVersion: 1.2.3\n  folded\n")
    assert _dist_info_version("fake-pkg") is None
