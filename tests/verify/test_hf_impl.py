"""`--impl hf`: the verify worker trains the transformers model class of the planned model
(real DeepSpeed engines on CPU with gloo): a Llama-like model under ZeRO-2, and a Mixtral-like
mixture of experts under ZeRO-3, whose class is imported before zero.Init patches tensor
construction. The worker asserts the built parameter count equals the plan's."""

from __future__ import annotations

import math

import pytest

from zlayout.spec import Layout
from zlayout.verify.options import VerifyOptions
from zlayout.verify.runner import run_verification

from .conftest import tiny_input

pytestmark = pytest.mark.slow


def hf_input(**model):
    inp = tiny_input(kv_heads=2, mlp="swiglu", norm="rmsnorm", ffn=96, bias=False, **model)
    return inp.model_copy(update={"training": inp.training.model_copy(update={"impl": "hf"})})


@pytest.mark.parametrize(("model", "layout"), [
    ({}, Layout(stage=2)),
    ({"experts": 4, "top_k": 2}, Layout(stage=3)),
], ids=["llama-zero2", "mixtral-zero3"])
def test_the_transformers_class_trains_with_the_planned_parameter_count(tmp_path, model, layout):
    inp = hf_input(**model)
    result = run_verification(inp, layout, VerifyOptions(cpu=True, out_dir=tmp_path, steps=2))
    assert result["status"] == "cpu-ok", result.get("cause")
    assert result["measured"]["params"] == inp.model.params
    assert all(math.isfinite(x) and x > 0 for x in result["measured"]["losses"])
    rank = next(tmp_path.glob("result.json.rank0.json")).read_text()
    assert '"impl": "hf"' in rank and '"transformers"' in rank
