"""Every built-in preset loads, validates, and carries the published figures."""

from __future__ import annotations

import tomllib

import pytest

from zlayout import catalog
from zlayout.spec import GpuSpec, LinkSpec, ModelSpec

GPUS = ["a100-40gb", "a100-80gb", "b200", "h100", "h200", "l40s", "mi300x"]
LINKS = ["ethernet-100g", "ib-hdr", "ib-ndr", "infinity-fabric", "nvlink3", "nvlink4", "nvlink5",
         "pcie4", "pcie5", "roce-200g"]
MOE_MODELS = ["deepseek-v2-lite", "mixtral-8x7b", "qwen1.5-moe-a2.7b"]  # no family: they scale in depth
MODELS = ["gpt3-175b", "llama3-405b", "llama3-70b", "llama3-8b", "mistral-7b", "qwen2.5-72b",
          "qwen2.5-7b", "reference-gpt"]


def test_the_builtin_preset_names():
    assert catalog.list_presets("gpus") == GPUS
    assert catalog.list_presets("links") == LINKS
    assert catalog.list_presets("models") == sorted(MODELS + MOE_MODELS)


@pytest.mark.parametrize("kind", ["gpus", "links", "models"])
def test_every_builtin_file_has_a_description_and_a_source(kind):
    for name in catalog.list_presets(kind):
        path = catalog.preset_path(kind, name)
        assert path.parent == catalog.BUILTIN_PRESETS_DIR / kind
        table = tomllib.loads(path.read_text())
        assert table["description"].strip() and table["source"].strip(), path
        meta = catalog.preset_metadata(kind, name)
        assert meta["description"] == table["description"]


@pytest.mark.parametrize("name", GPUS)
def test_gpu_presets_load_and_name_a_link_that_exists(name):
    gpu = catalog.load_gpu(name)
    assert isinstance(gpu, GpuSpec) and gpu.name == name
    assert 40 * 2**30 <= gpu.memory_bytes < 200 * 2**30
    assert 300e12 <= gpu.peak_bf16_flops <= 2.5e15
    link = catalog.load_link(catalog.default_intra_link(name))
    assert isinstance(link, LinkSpec)


@pytest.mark.parametrize(("gpu", "memory_mib", "dense_bf16_tflops", "link"), [
    ("h100", 81559, 989, "nvlink4"),
    ("h200", 143771, 989, "nvlink4"),   # benchmarks/measurements/README.md: 143771 MiB each
    ("a100-40gb", 40960, 312, "nvlink3"),
    ("a100-80gb", 81920, 312, "nvlink3"),
    ("l40s", 46068, 362, "pcie4"),
    ("b200", 183359, 2250, "nvlink5"),
    ("mi300x", 196592, 1307, "infinity-fabric"),
])
def test_gpu_figures(gpu, memory_mib, dense_bf16_tflops, link):
    spec = catalog.load_gpu(gpu)
    assert spec.memory_bytes == memory_mib * 2**20
    assert spec.peak_bf16_flops == dense_bf16_tflops * 1e12
    assert catalog.default_intra_link(gpu) == link


@pytest.mark.parametrize(("link", "gbps"), [
    ("nvlink3", 300), ("nvlink4", 450), ("nvlink5", 900), ("infinity-fabric", 448),
    ("pcie4", 32), ("pcie5", 64), ("ib-hdr", 25), ("ib-ndr", 50), ("roce-200g", 25),
    ("ethernet-100g", 12.5),
])
def test_link_bandwidth_is_per_gpu_per_direction(link, gbps):
    spec = catalog.load_link(link)
    assert spec.bandwidth_gbps == gbps
    assert 0.5 <= spec.efficiency <= 0.9
    assert 0 < spec.latency_us < 50


# Published parameter counts (Hugging Face model cards / config.json; GPT-3 without its
# learned position embedding, which the spec does not model).
@pytest.mark.parametrize(("name", "params"), [
    ("llama3-8b", 8_030_261_248),
    ("llama3-70b", 70_553_706_496),
    ("llama3-405b", 405_853_388_800),
    ("mistral-7b", 7_241_732_096),
    ("qwen2.5-7b", 7_615_616_512),
    ("qwen2.5-72b", 72_706_203_648),
    ("reference-gpt", 1_873_190_912),
    ("mixtral-8x7b", 46_702_792_704),
    ("qwen1.5-moe-a2.7b", 14_315_784_192),
    ("deepseek-v2-lite", 15_706_484_224),
])
def test_model_params_match_the_published_count(name, params):
    model = catalog.load_model(name)
    assert isinstance(model, ModelSpec) and model.name == name
    assert model.params == params


def test_gpt3_is_175b_less_its_position_embedding():
    model = catalog.load_model("gpt3-175b")
    assert model.params + 2048 * 12288 == pytest.approx(175e9, rel=0.003)
    assert model.tie_embeddings and model.bias and model.mlp == "gelu"


def test_reference_gpt_matches_the_measured_model_formula():
    model = catalog.load_model("reference-gpt")
    L, h, V = 8, 4096, 32000
    assert (model.layers, model.hidden, model.heads, model.vocab) == (L, h, 32, V)
    assert model.params == 12 * L * h * h + 13 * L * h + 2 * V * h + 2 * h


def test_qwen_has_qkv_biases_only():
    model = catalog.load_model("qwen2.5-7b")
    assert model.bias is False and model.qkv_bias is True and model.kv_heads == 4


@pytest.mark.parametrize("name", MODELS)
def test_every_model_names_its_family(name):
    model = catalog.load_model(name)
    assert model.family in {"llama3", "mistral", "qwen2.5", "gpt3", "reference-gpt"}


def test_families():
    assert catalog.list_families() == ["gpt3", "llama3", "mistral", "qwen2.5", "reference-gpt"]
