"""The ready profiles shipped in presets/profiles load, and their files agree with them."""

from __future__ import annotations

import json

import pytest

from zlayout import catalog
from zlayout.cli import main
from zlayout.profile import dumps_profile, load_profile
from zlayout.profile.launch import launch_scripts

PRESETS = ("llama3-8b-8xh100", "llama3-70b-64xh100", "llama3-8b-1xh200-offload")


def test_presets_are_listed():
    assert set(PRESETS) <= set(catalog.list_presets("profiles"))


@pytest.mark.parametrize("name", PRESETS)
def test_preset_profile_is_whole_and_consistent(name):
    directory = catalog.preset_path("profiles", name)
    profile = load_profile(directory)
    assert profile.name == name
    assert (directory / "profile.toml").read_text() == dumps_profile(profile)
    assert json.loads((directory / "ds_config.json").read_text()) == profile.ds_config()
    for script, text in launch_scripts(profile).items():
        assert (directory / script).read_text() == text
    assert profile.prediction.fits


def test_preset_shapes():
    eight = load_profile(catalog.preset_path("profiles", "llama3-8b-8xh100"))
    assert (eight.inputs.model.name, eight.world, eight.inputs.hardware.gpu.name) == ("llama3-8b", 8, "h100")
    seventy = load_profile(catalog.preset_path("profiles", "llama3-70b-64xh100"))
    assert (seventy.inputs.hardware.nodes, seventy.world) == (8, 64) and seventy.layout.stage == 3
    offload = load_profile(catalog.preset_path("profiles", "llama3-8b-1xh200-offload"))
    assert offload.world == 1 and offload.layout.offload_optimizer == "cpu"


def test_show_by_preset_name(capsys):
    assert main(["show", "llama3-70b-64xh100"]) == 0
    assert "8 node(s) x 8 h100" in capsys.readouterr().out


@pytest.mark.parametrize("name", PRESETS)
def test_preset_profile_holds_this_planners_prediction(name):
    """A shipped profile is not stale: `zlayout show` of a fresh clone must not say STALE
    (after a change to the planner: scripts/make_preset_profiles.py regenerates them)."""
    from zlayout.profile.integrity import stale_prediction

    stale = stale_prediction(load_profile(catalog.preset_path("profiles", name)))
    assert stale is None, f"{stale.line()} -- run scripts/make_preset_profiles.py"
