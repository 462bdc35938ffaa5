"""profile.toml: round trips byte for byte, refuses corrupt files loudly, writes atomically."""

from __future__ import annotations

import os
import random
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zlayout import catalog
from zlayout.profile import (ProfileError, attach_verification, build_profile, dumps_profile, load_profile,
                             loads_profile, save_profile, save_profile_dir)
from zlayout.profile import store
from zlayout.spec import (HardwareSpec, ModelSpec, PlanInput, TrainingSpec, ZeroKnobs,
                          all_layouts)

WHEN = datetime(2026, 11, 30, 1, 2, 3, tzinfo=timezone.utc)


@st.composite
def models(draw) -> ModelSpec:
    heads = draw(st.sampled_from([4, 8, 16, 32, 64]))
    head_dim = draw(st.sampled_from([32, 64, 128]))
    kv = draw(st.sampled_from([h for h in (1, 2, 4, 8, heads) if heads % h == 0]))
    return ModelSpec(
        name=draw(st.text("abcdefghij-0123456789.", min_size=1, max_size=20)),
        layers=draw(st.integers(1, 128)), hidden=heads * head_dim, heads=heads,
        kv_heads=draw(st.one_of(st.none(), st.just(kv))),
        ffn=draw(st.one_of(st.none(), st.integers(64, 65536))),
        vocab=draw(st.integers(100, 256_000)), mlp=draw(st.sampled_from(["gelu", "swiglu"])),
        norm=draw(st.sampled_from(["layernorm", "rmsnorm"])), bias=draw(st.booleans()),
        qkv_bias=draw(st.one_of(st.none(), st.booleans())), tie_embeddings=draw(st.booleans()))


@st.composite
def plan_inputs(draw) -> PlanInput:
    gpu_name = draw(st.sampled_from(catalog.list_presets("gpus")))
    gpu = catalog.load_gpu(gpu_name)
    gpu = gpu.model_copy(update={"peak_bf16_flops": draw(st.floats(1e13, 5e15)),
                                 "memory_bytes": draw(st.integers(8 * 2**30, 200 * 2**30))})
    nodes = draw(st.integers(1, 16))
    links = catalog.list_presets("links")
    hw = HardwareSpec(gpu=gpu, gpus_per_node=draw(st.integers(1, 16)), nodes=nodes,
                      intra_link=catalog.load_link(draw(st.sampled_from(links))),
                      inter_link=(catalog.load_link(draw(st.sampled_from(links)))
                                  if nodes > 1 or draw(st.booleans()) else None),
                      host_ram_bytes=draw(st.integers(64 * 2**30, 4096 * 2**30)),
                      nvme_bytes=draw(st.sampled_from([0, 2**40, 7 * 2**40])),
                      nvme_gbps=draw(st.floats(0.5, 50)))
    training = TrainingSpec(seq=draw(st.integers(128, 131072)), micro_batch=draw(st.integers(1, 16)),
                            grad_accum=draw(st.integers(1, 64)),
                            precision=draw(st.sampled_from(["bf16", "fp16", "fp32"])),
                            checkpointing=draw(st.sampled_from(["none", "full"])),
                            flash_attention=draw(st.booleans()))
    zero = ZeroKnobs(overlap_comm=draw(st.booleans()),
                     reduce_bucket_size=draw(st.integers(1, 2_000_000_000)),
                     stage3_prefetch_bucket_size=draw(st.integers(0, 2_000_000_000)),
                     gradient_clipping=draw(st.floats(0, 10)))
    return PlanInput(model=draw(models()), hardware=hw, training=training, zero=zero,
                     headroom_fraction=draw(st.floats(0, 0.5)))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inp=plan_inputs(), layout=st.sampled_from(all_layouts()), verified=st.booleans(),
       scale=st.floats(0.5, 2.0))
def test_export_load_export_gives_the_same_file(inp, layout, verified, scale):
    profile = build_profile(inp, layout, now=WHEN)
    if verified:
        measured = {"gpu_peak_allocated_bytes": int(profile.prediction.gpu_peak_allocated_bytes * scale) + 1,
                    "host_peak_bytes": int(profile.prediction.host_peak_bytes * scale) + 1,
                    "step_time_s": scale}
        profile = attach_verification(profile, {
            "status": "validated", "measured": measured,
            "restart_drill": {"resumed_ok": True, "resume_s": scale},
            "environment": {"gpus": ["GPU X"] * 2, "torch": "2.5.1"}}, now=WHEN)
    with tempfile.TemporaryDirectory() as tmp:
        save_profile_dir(profile, tmp)
        first = (Path(tmp) / "profile.toml").read_bytes()
        ds_first = (Path(tmp) / "ds_config.json").read_bytes()
        loaded = load_profile(tmp)
        # the file adds only the manifest: the checksums of the files written beside it
        assert loaded == store.with_manifest(profile, store.set_files(profile))
        assert loaded.plan_input() == inp and loaded.layout == layout
        save_profile_dir(loaded, tmp)
        assert (Path(tmp) / "profile.toml").read_bytes() == first
        assert (Path(tmp) / "ds_config.json").read_bytes() == ds_first
    if not verified:  # exporting the loaded inputs again is the same export
        again = build_profile(loaded.plan_input(), loaded.layout, now=WHEN)
        assert dumps_profile(store.with_manifest(again, store.set_files(again))).encode() == first


def test_every_section_is_in_the_file(profile_8b, make_verify_result, tmp_path):
    profile = attach_verification(profile_8b, make_verify_result(profile_8b))
    text = save_profile(profile, tmp_path).read_text()
    for header in ("[summary]", "[limits]", "[[limits.layouts]]", "[inputs.model]", "[inputs.hardware.gpu]", "[inputs.training]", "[inputs.zero]",
                   "[layout]", "[run]", "[prediction]", "[[prediction.terms]]", "[verification]",
                   "[verification.measured]", "[verification.error_fraction]", "[restart_drill]",
                   "[[changelog]]", "[alerts.gpu_memory]", "[alerts.host_memory]", "[alerts.step_time]",
                   "[alerts.loss_spike]"):
        assert header in text, header
    assert text.startswith("schema_version = 2\n")
    assert "null" not in text and "None" not in text


def test_no_null_in_toml_optional_keys_are_omitted(profile_8b):
    text = dumps_profile(profile_8b)
    assert "inter_link" not in text  # one node: no inter-node link
    assert "checkpoint_dir" not in text
    assert "[restart_drill]" not in text
    assert loads_profile(text).inputs.hardware.inter_link is None


# ------------------------------------------------------------------ corrupt and hand-edited files

def _edit(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


def _line_number(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if line.startswith(needle))


@pytest.mark.parametrize("old,new,expected", [
    ("hidden = 4096", 'hidden = "big"', "inputs.model.hidden"),
    ("hidden = 4096", "hiden = 4096", "inputs.model.hiden: unknown key"),
    ("stage = 3", "stage = 5", "layout.stage"),
    ('offload_optimizer = "cpu"', 'offload_optimizer = "disk"', "layout.offload_optimizer"),
    ("seq = 2048", "seq = -1", "inputs.training.seq"),
    ('status = "unverified"', 'status = "great"', "verification.status"),
    ("gpus_per_node = 8", "gpus_per_node = 8.5", "inputs.hardware.gpus_per_node"),
])
def test_hand_edit_errors_name_the_line_and_field(profile_8b, old, new, expected):
    text = _edit(dumps_profile(profile_8b), old, new)
    with pytest.raises(ProfileError) as err:
        loads_profile(text, source="p/profile.toml")
    message = str(err.value)
    assert message.startswith("p/profile.toml")
    assert expected in message
    assert f"line {_line_number(text, new)}:" in message


def test_rule_breaking_layout_says_what_to_do(profile_8b):
    text = _edit(dumps_profile(profile_8b), "stage = 3", "stage = 2")
    text = _edit(text, 'offload_param = "gpu"', 'offload_param = "cpu"')
    with pytest.raises(ProfileError, match="parameter offload needs ZeRO stage 3"):
        loads_profile(text)


def test_missing_key_names_its_table_line(profile_8b):
    text = dumps_profile(profile_8b)
    text = "\n".join(line for line in text.splitlines() if not line.startswith("layers = "))
    with pytest.raises(ProfileError) as err:
        loads_profile(text)
    assert f"line {_line_number(text, '[inputs.model]')}: inputs.model.layers: missing" in str(err.value)


def test_syntax_error_names_the_line(profile_8b):
    text = _edit(dumps_profile(profile_8b), "vocab = 128256", "vocab = = 128256")
    with pytest.raises(ProfileError, match=rf"not valid TOML: .*line {_line_number(text, 'vocab = =')}"):
        loads_profile(text)


@pytest.mark.parametrize("text,expected", [
    ("", "schema_version is missing"),
    ("schema_version = 3\n", "newer zlayout"),
    ('schema_version = "1"\n', "schema_version must be an integer"),
    ("schema_version = 1\n", "name: missing"),
])
def test_not_a_profile(text, expected):
    with pytest.raises(ProfileError, match=expected):
        loads_profile(text)


def test_binary_garbage_is_refused(tmp_path):
    (tmp_path / "profile.toml").write_bytes(b"schema_version = 1\n\xff\xfe\x00garbage")
    with pytest.raises(ProfileError, match="not UTF-8"):
        load_profile(tmp_path)


def test_every_truncation_is_refused(profile_8b, make_verify_result):
    """A file cut short anywhere (a crash, a full disk, a bad copy) never loads as a profile."""
    text = dumps_profile(attach_verification(profile_8b, make_verify_result(profile_8b)))
    line_ends = [i + 1 for i, c in enumerate(text) if c == "\n"][:-1]
    rng = random.Random(6)
    cuts = set(line_ends) | set(range(len(text) - 400, len(text) - 1)) | set(rng.sample(range(len(text) - 1), 150))
    for cut in sorted(cuts):
        with pytest.raises(ProfileError):
            loads_profile(text[:cut])
    assert loads_profile(text[:-1]) == loads_profile(text)  # only the final newline: nothing lost


def test_missing_profile_says_what_to_give(tmp_path):
    with pytest.raises(ProfileError, match="export --out"):
        load_profile(tmp_path)


# ------------------------------------------------------------------ atomic writes

def test_failed_write_leaves_the_old_file_and_no_temp(profile_8b, tmp_path, monkeypatch):
    path = save_profile(profile_8b, tmp_path)
    before = path.read_bytes()
    changed = profile_8b.model_copy(update={"name": "changed"})

    def crash(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store.os, "replace", crash)
    with pytest.raises(ProfileError, match="No space left"):
        save_profile(changed, tmp_path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [  # the whole set, and no temporary
        "RUNBOOK.md", "alerts.yml", "ds_config.json", "launch_deepspeed.sh", "launch_slurm.sbatch",
        "launch_torchrun.sh", "memory.svg", "profile.toml"]


def test_write_replaces_by_rename(profile_8b, tmp_path):
    path = save_profile(profile_8b, tmp_path)
    inode = os.stat(path).st_ino
    save_profile(profile_8b.model_copy(update={"name": "changed"}), tmp_path)
    assert os.stat(path).st_ino != inode  # a new file renamed over the old, never rewritten in place
    assert load_profile(path).name == "changed"
    assert oct(os.stat(path).st_mode & 0o777) == oct(0o644)
