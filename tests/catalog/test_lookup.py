"""Finding presets by name: aliases, user directories that override the built-ins, errors that
list what exists, and files that are not valid."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from zlayout import catalog

MY_GPU = textwrap.dedent("""\
    description = "a lab's own card"
    source = "our measurements"
    memory_bytes = 25769803776
    peak_bf16_flops = 100e12
    default_intra_link = "pcie5"
    """)


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.mark.parametrize(("typed", "kind", "canonical"), [
    ("H100", "gpus", "h100"),
    ("h100-sxm", "gpus", "h100"),
    ("H100_SXM5", "gpus", "h100"),
    (" h200 ", "gpus", "h200"),
    ("a100-80", "gpus", "a100-80gb"),
    ("A100_SXM4_40GB", "gpus", "a100-40gb"),
    ("llama-3-8b", "models", "llama3-8b"),
    ("Llama-3.1-70B", "models", "llama3-70b"),
    ("qwen-2.5-7b", "models", "qwen2.5-7b"),
    ("Reference_GPT", "models", "reference-gpt"),
    ("IB-NDR", "links", "ib-ndr"),
    ("roce-200g", "links", "roce-200g"),
])
def test_names_are_case_insensitive_and_accept_aliases(typed, kind, canonical):
    assert catalog.preset_path(kind, typed).name == f"{canonical}.toml"
    loader = {"gpus": catalog.load_gpu, "links": catalog.load_link, "models": catalog.load_model}[kind]
    assert loader(typed).name == canonical


@pytest.mark.parametrize(("load", "label", "some_name"), [
    (catalog.load_gpu, "GPU", "a100-40gb"),
    (catalog.load_link, "link", "nvlink4"),
    (catalog.load_model, "model", "llama3-8b"),
])
def test_unknown_names_list_the_available_ones(load, label, some_name):
    with pytest.raises(KeyError) as caught:
        load("h300")
    message = str(caught.value)
    assert message.startswith(f"unknown {label} 'h300'")
    assert "; available: " in message and "\n" not in message
    assert some_name in message
    assert isinstance(caught.value, ValueError)  # callers may catch either


def test_unknown_gpu_message_is_the_sorted_list():
    with pytest.raises(ValueError, match=r"^unknown GPU 'h300' \(did you mean h200\?\); available: a100-40gb, a100-80gb, b200, "
                                         r"h100, h200, l40s, mi300x$"):
        catalog.load_gpu("h300")


def test_unknown_kind_is_rejected():
    with pytest.raises(ValueError, match="gpus, links, models, profiles"):
        catalog.list_presets("cpus")


def test_a_user_directory_extends_and_overrides_the_builtins(tmp_path):
    write(tmp_path / "gpus" / "lab-card.toml", MY_GPU)
    write(tmp_path / "gpus" / "h100.toml", MY_GPU.replace("100e12", "700e12"))
    assert "lab-card" in catalog.list_presets("gpus", [tmp_path])
    assert catalog.list_presets("gpus", [tmp_path]).count("h100") == 1
    assert catalog.load_gpu("lab-card", [tmp_path]).memory_bytes == 24 * 2**30
    assert catalog.load_gpu("H100-SXM", [tmp_path]).peak_bf16_flops == 700e12
    assert catalog.default_intra_link("lab-card", [tmp_path]) == "pcie5"
    # without the directory, the built-in is back and the user's card is unknown
    assert catalog.load_gpu("h100").peak_bf16_flops == 989e12
    with pytest.raises(KeyError, match="lab-card"):
        catalog.load_gpu("lab-card")


def test_extra_dirs_are_searched_in_order(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    write(first / "gpus" / "card.toml", MY_GPU.replace("100e12", "1e12"))
    write(second / "gpus" / "card.toml", MY_GPU.replace("100e12", "2e12"))
    assert catalog.load_gpu("card", [first, second]).peak_bf16_flops == 1e12
    assert catalog.load_gpu("card", [second, first]).peak_bf16_flops == 2e12


def test_the_environment_variable_and_the_config_dir(tmp_path, monkeypatch):
    env_a, env_b, config = tmp_path / "a", tmp_path / "b", tmp_path / "config"
    write(env_b / "gpus" / "env-card.toml", MY_GPU)
    write(config / "zlayout" / "presets" / "gpus" / "config-card.toml", MY_GPU)
    write(config / "zlayout" / "presets" / "gpus" / "env-card.toml", MY_GPU.replace("100e12", "3e12"))
    monkeypatch.setenv("ZLAYOUT_PRESETS_DIR", os.pathsep.join([str(env_a), str(env_b)]))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    assert {"env-card", "config-card"} <= set(catalog.list_presets("gpus"))
    assert catalog.load_gpu("env-card").peak_bf16_flops == 100e12  # the env var wins over config
    assert catalog.load_gpu("config-card").name == "config-card"
    # an extra dir wins over both
    write(tmp_path / "extra" / "gpus" / "env-card.toml", MY_GPU.replace("100e12", "5e12"))
    assert catalog.load_gpu("env-card", [tmp_path / "extra"]).peak_bf16_flops == 5e12


def test_home_config_dir_without_xdg(tmp_path, monkeypatch):
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    write(tmp_path / ".config" / "zlayout" / "presets" / "links" / "my-link.toml",
          'description = "x"\nsource = "y"\nbandwidth_gbps = 7.5\n')
    assert catalog.load_link("my-link").bandwidth_gbps == 7.5


def test_a_user_model_joins_its_family(tmp_path):
    write(tmp_path / "models" / "tiny.toml", textwrap.dedent("""\
        family = "tinyfam"
        layers = 4
        hidden = 512
        heads = 8
        vocab = 1000
        """))
    assert "tinyfam" in catalog.list_families([tmp_path])
    model = catalog.model_for_size(100e6, "tinyfam", [tmp_path])
    assert model.family == "tinyfam" and model.head_dim == 64
    assert model.params == pytest.approx(100e6, rel=0.03)


def test_malformed_toml_names_the_file_and_line(tmp_path):
    path = write(tmp_path / "gpus" / "broken.toml", 'description = "x"\nmemory_bytes = = 3\n')
    with pytest.raises(ValueError) as caught:
        catalog.load_gpu("broken", [tmp_path])
    message = str(caught.value)
    assert str(path) in message and "line 2" in message


def test_a_malformed_user_file_does_not_hide_other_presets(tmp_path):
    write(tmp_path / "gpus" / "broken.toml", "memory_bytes = [\n")
    assert catalog.load_gpu("h200", [tmp_path]).name == "h200"
    assert "broken" in catalog.list_presets("gpus", [tmp_path])


@pytest.mark.parametrize(("text", "field"), [
    ('memory_bytes = -1\npeak_bf16_flops = 1e12\n', "memory_bytes"),
    ('memory_bytes = 1\npeak_bf16_flops = 1e12\nmemory_gb = 80\n', "memory_gb"),
    ('peak_bf16_flops = 1e12\n', "memory_bytes"),
])
def test_invalid_fields_name_the_file_and_the_field(tmp_path, text, field):
    path = write(tmp_path / "gpus" / "bad.toml", text)
    with pytest.raises(ValueError) as caught:
        catalog.load_gpu("bad", [tmp_path])
    assert str(path) in str(caught.value) and field in str(caught.value)


def test_a_name_key_must_match_the_file_name(tmp_path):
    write(tmp_path / "links" / "mine.toml", 'name = "other"\nbandwidth_gbps = 1.0\n')
    with pytest.raises(ValueError, match="mine.toml"):
        catalog.load_link("mine", [tmp_path])
    write(tmp_path / "links" / "same.toml", 'name = "same"\nbandwidth_gbps = 1.0\n')
    assert catalog.load_link("same", [tmp_path]).bandwidth_gbps == 1.0


def test_an_edited_file_is_read_again(tmp_path):
    path = write(tmp_path / "links" / "edit-me.toml", "bandwidth_gbps = 1.0\n")
    assert catalog.load_link("edit-me", [tmp_path]).bandwidth_gbps == 1.0
    path.write_text("bandwidth_gbps = 2.0\n")
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # coarse-mtime filesystems
    assert catalog.load_link("edit-me", [tmp_path]).bandwidth_gbps == 2.0


def test_a_gpu_without_a_default_link_falls_back_to_pcie(tmp_path):
    write(tmp_path / "gpus" / "bare.toml", "memory_bytes = 85899345920\npeak_bf16_flops = 1e12\n")
    assert catalog.default_intra_link("bare", [tmp_path]) == "pcie4"


def test_profiles_are_listed_by_name(tmp_path):
    (tmp_path / "profiles" / "team-a").mkdir(parents=True)
    write(tmp_path / "profiles" / "team-b.toml", "[model]\n")
    write(tmp_path / "profiles" / "notes.txt", "not a profile")
    names = catalog.list_presets("profiles", [tmp_path])
    assert {"team-a", "team-b"} <= set(names) and "notes" not in names
    assert catalog.preset_path("profiles", "TEAM-A", [tmp_path]).is_dir()


def test_catalog_imports_no_ui_or_torch():
    code = ("import sys, zlayout.catalog as c; c.load_gpu('h200'); c.model_for_size(13e9);"
            "print(sorted(m for m in ('textual', 'torch', 'deepspeed') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_broken_model_file_is_named_when_scaling_a_family(tmp_path):
    path = write(tmp_path / "models" / "half-written.toml", 'family = "llama3"\nlayers = \n')
    with pytest.raises(ValueError, match=str(path)):
        catalog.model_for_size(13e9, "llama3", [tmp_path])
    assert catalog.model_for_size(13e9, "llama3").family == "llama3"  # the built-ins alone are fine


@pytest.mark.parametrize(("typed", "canonical"), [
    ("NVIDIA A100-SXM4-80GB", "a100-80gb"), ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
    ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"), ("AMD Instinct MI300X", "mi300x"),
])
def test_the_names_nvidia_smi_and_rocm_smi_print_find_their_card(typed, canonical):
    assert catalog.load_gpu(typed).name == canonical


def test_a_preset_of_your_own_named_with_a_vendor_keeps_its_name(tmp_path):
    write(tmp_path / "gpus" / "nvidia-lab.toml", MY_GPU)
    assert catalog.load_gpu("nvidia-lab", [tmp_path]).name == "nvidia-lab"


@pytest.mark.parametrize("typed", ["a100", "A100", "a100-sxm4", "NVIDIA A100"])
def test_a_name_of_two_cards_is_a_question_not_a_pick(typed):
    with pytest.raises(ValueError, match=r"is more than one card: a100-40gb \(40 GiB\) or a100-80gb \(80 GiB\)\? "
                                         r"give its full name$"):
        catalog.load_gpu(typed)


def test_your_own_a100_preset_is_used_as_named(tmp_path):
    write(tmp_path / "gpus" / "a100.toml", MY_GPU)
    assert catalog.load_gpu("a100", [tmp_path]).memory_bytes == 24 * 2**30
