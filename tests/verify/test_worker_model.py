"""The worker's model has exactly the planned architecture: its parameter count is
ModelSpec.params for every shape option, and it trains (forward, backward) on CPU."""

from __future__ import annotations

import pytest

import torch  # noqa: E402  (the test extras install it)

from zlayout.spec import ModelSpec  # noqa: E402
from zlayout.verify.worker_model import build_model, count_parameters  # noqa: E402

SHAPES = [
    dict(layers=2, hidden=64, heads=4, vocab=128),  # reference GPT style
    dict(layers=3, hidden=64, heads=8, kv_heads=2, vocab=100, mlp="swiglu", norm="rmsnorm",
         ffn=96, bias=False),  # Llama style
    dict(layers=1, hidden=48, heads=6, kv_heads=3, vocab=77, mlp="swiglu", bias=False,
         qkv_bias=True, tie_embeddings=True),  # Qwen style
    dict(layers=2, hidden=32, heads=2, vocab=64, norm="rmsnorm", tie_embeddings=True, ffn=40),
    dict(layers=1, hidden=32, heads=4, vocab=50, mlp="gelu", bias=True, qkv_bias=False),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s.get('mlp', 'gelu')}-{s.get('norm', 'ln')}"
                         f"-kv{s.get('kv_heads')}-tie{s.get('tie_embeddings', False)}")
def test_parameter_count_equals_the_plan(shape):
    spec = ModelSpec(**shape)
    model = build_model(spec, checkpointing=False)
    assert count_parameters(model) == spec.params


def test_reference_gpt_count_matches_the_reference_measurements():
    # benchmarks/measurements/README.md: 12*L*h^2 + 13*L*h + 2*V*h + 2*h = 1,873,190,912 for L=8, h=4096, V=32000
    spec = ModelSpec(layers=8, hidden=4096, heads=32, vocab=32000)
    assert spec.params == 1_873_190_912
    with torch.device("meta"):
        model = build_model(spec, checkpointing=False)
    assert count_parameters(model) == 1_873_190_912


@pytest.mark.parametrize("checkpointing", [False, True])
def test_trains_on_cpu_with_and_without_checkpointing(checkpointing):
    torch.manual_seed(0)
    spec = ModelSpec(layers=2, hidden=32, heads=4, kv_heads=2, vocab=64, mlp="swiglu", norm="rmsnorm")
    model = build_model(spec, checkpointing=checkpointing)
    ids = torch.randint(0, spec.vocab, (2, 16))
    loss = model(ids)
    assert loss.dim() == 0 and loss.dtype == torch.float32
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_checkpointing_gives_the_same_loss_and_gradients():
    spec = ModelSpec(layers=2, hidden=32, heads=4, vocab=64)
    torch.manual_seed(0)
    plain = build_model(spec, checkpointing=False)
    torch.manual_seed(0)
    checkpointed = build_model(spec, checkpointing=True)
    ids = torch.randint(0, spec.vocab, (2, 16))
    a, b = plain(ids), checkpointed(ids)
    a.backward()
    b.backward()
    assert torch.allclose(a, b)
    assert torch.allclose(plain.blocks[0].fc1.weight.grad, checkpointed.blocks[0].fc1.weight.grad)


def test_the_deepspeed_loop_gets_the_logits_to_hold_and_the_trainer_loop_the_loss():
    """TrainingSpec.loop: "deepspeed" returns the outputs (loss and the logits it came from),
    which the worker holds until its next forward; "trainer" returns the loss alone."""
    from zlayout.verify.worker_model import builder

    spec = ModelSpec(**SHAPES[0])
    ids = torch.randint(0, spec.vocab, (2, 16))
    torch.manual_seed(0)
    kept = builder(spec, False, loop="deepspeed")()(ids)
    torch.manual_seed(0)
    loss = builder(spec, False, loop="trainer")()(ids)
    assert kept.logits.shape == (2, 16, spec.vocab) and kept.logits.requires_grad
    assert loss.dim() == 0 and torch.equal(kept.loss, loss)  # the same loss either way
