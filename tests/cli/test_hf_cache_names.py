"""A config.json in the Hugging Face cache (`models--ORG--NAME/snapshots/HASH/config.json`, a
symlink into `blobs/`) names its model ORG/NAME: in the plan's header, the profile's name and
the recorded path. Resolving the link named every such model "blobs"."""

from __future__ import annotations

import json
import tomllib

from zlayout.cli import main

CONFIG = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4,
          "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1000,
          "tie_word_embeddings": False}


def cached_snapshot(root, repo="models--meta-llama--Llama-3.2-1B", config=CONFIG):
    """The layout huggingface_hub writes: the file lives in blobs/, the snapshot links to it."""
    blobs = root / "hub" / repo / "blobs"
    snapshot = root / "hub" / repo / "snapshots" / "0cb88a4f764b7a12671c53f0838cd831a0843b95"
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (blobs / "1b8b1c6a0f9c3f0c9c5a2f1e4d6b7a8c9d0e1f2a").write_text(json.dumps(config))
    (snapshot / "config.json").symlink_to("../../blobs/1b8b1c6a0f9c3f0c9c5a2f1e4d6b7a8c9d0e1f2a")
    return snapshot


def test_the_plan_header_names_the_cached_model_org_slash_name(tmp_path, capsys):
    snapshot = cached_snapshot(tmp_path)
    for given in (snapshot, snapshot / "config.json"):
        assert main(["plan", "--hf-config", str(given), "--stage", "1", "--gpus-per-node", "1"]) == 0
        header = capsys.readouterr().out.splitlines()[0]
        assert header.startswith("meta-llama/Llama-3.2-1B: ") and "blobs" not in header
        assert main(["plan", "--hf-config", str(given), "--stage", "1", "--gpus-per-node", "1", "--json"]) == 0
        model = json.loads(capsys.readouterr().out)["model"]
        assert model["name"] == "meta-llama/Llama-3.2-1B"


def test_the_exported_profile_is_named_by_the_cache_repo_and_carries_the_config(tmp_path, capsys):
    snapshot = cached_snapshot(tmp_path)
    out = tmp_path / "profile"
    assert main(["export", "--hf-config", str(snapshot), "--stage", "2", "--gpus-per-node", "8",
                 "--gpu", "h100", "--out", str(out)]) == 0
    capsys.readouterr()
    profile = tomllib.loads((out / "profile.toml").read_text())
    assert profile["name"] == "meta-llama/Llama-3.2-1B-8xh100-z2-opt_gpu-param_gpu"
    assert profile["inputs"]["model"]["name"] == "meta-llama/Llama-3.2-1B"
    # the config travels inside the profile (a copy beside profile.toml), never as a path
    assert profile["inputs"]["model"]["hf_config"] == "hf_config.json"
    assert json.loads((out / "hf_config.json").read_text()) == json.loads((snapshot / "config.json").read_text())
    assert main(["check", str(out), "--json"]) in (0, 1)  # the set reads back (unverified: 1)
    assert "blobs" not in (out / "profile.toml").read_text()


def test_outside_the_cache_a_linked_config_is_named_by_its_own_folder(tmp_path, capsys):
    """A symlink elsewhere keeps the folder the user named, not the link target's."""
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "x.json").write_text(json.dumps(CONFIG))
    (tmp_path / "my-model").mkdir()
    (tmp_path / "my-model" / "config.json").symlink_to(tmp_path / "store" / "x.json")
    assert main(["plan", "--hf-config", str(tmp_path / "my-model"), "--stage", "1", "--json"]) == 0
    model = json.loads(capsys.readouterr().out)["model"]
    assert model["name"] == "my-model"


def test_an_org_less_cache_repo_is_its_name(tmp_path, capsys):
    snapshot = cached_snapshot(tmp_path, repo="models--gpt2")
    assert main(["plan", "--hf-config", str(snapshot), "--stage", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"]["name"] == "gpt2"
