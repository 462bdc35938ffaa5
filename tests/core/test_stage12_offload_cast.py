"""Stage 1/2 with the optimizer on the host (DeepSpeed 0.19.8 stage_1_and_2.py): a gradient larger
than reduce_bucket_size is held whole and reduced alone at the next gradient's hook, where
copy_grads_in_partition takes the float64 norm of the whole partition (8 bytes an element, not in
parts as stage 3) before its fp32 cast. Two H200 rows peaked there: deepseek_v3 (an untied 129280 x
7168 head) and Llama-3-8B's shape with checkpointing (128256 x 4096). A tied embedding's gradient
is the backward's last, reduced by the epilogue once every activation is freed: gemma-2-9b-L8
(256000 x 3584, tied) peaked at the loss instead."""

from __future__ import annotations

from pathlib import Path

import pytest

from zlayout import cards
from zlayout.cli import build_parser, plan_input_from_args
from zlayout.core.memory import MISC_GPU_BYTES, estimate_memory, held_outputs_bytes, saved_activation_bytes
from zlayout.spec import Layout

MEASUREMENTS = Path(__file__).resolve().parents[2] / "benchmarks" / "measurements"
HELDOUT = MEASUREMENTS / "h200-2026-12-02e" / "heldout"
OFFLOAD = Layout(stage=2, offload_optimizer="cpu")


def plan(*flags: str):
    args = build_parser().parse_args(["plan", "--gpu", "h200", "--gpus-per-node", "1", *flags])
    return plan_input_from_args(args)


def test_an_untied_heads_gradient_is_reduced_with_a_float64_copy_after_the_loss():
    # zlayout's GPT with Llama-3-8B's head; checkpointing: only block inputs saved, none recomputed yet
    inp = plan("--layers", "32", "--hidden", "4096", "--heads", "32", "--vocab", "128256", "--seq", "2048",
               "--micro-batch", "1", "--checkpointing", "full", "--loop", "trainer")
    est = estimate_memory(inp, OFFLOAD)
    head = 128256 * 4096
    assert est.peak_phase == "backward (offload cast)"
    buckets = 2 * 500_000_000 * 2  # overlap_comm's two reduce buckets
    assert est.gpu_peak_allocated_bytes == (est.after_init_bytes + saved_activation_bytes(inp.model, inp.training)
                                            + buckets + head * (2 + 8) + MISC_GPU_BYTES)


def test_a_gradient_that_fits_the_bucket_keeps_the_fp32_cast_bound():
    inp = plan("--layers", "8", "--hidden", "4096", "--heads", "32", "--vocab", "32000", "--seq", "2048",
               "--micro-batch", "2")
    small, large = estimate_memory(inp, OFFLOAD), estimate_memory(
        inp.model_copy(update={"zero": inp.zero.model_copy(update={"reduce_bucket_size": 100_000_000})}), OFFLOAD)
    # the 131M-element head: 2 + 4 bytes an element in the bucket; 2 + 8 once it is above it
    # (held outside the bucket, float64 norm), but with the loss's and head's inputs freed
    assert small.peak_phase == "backward (offload cast)"
    assert large.gpu_peak_allocated_bytes != small.gpu_peak_allocated_bytes


def test_deepseek_v3s_peak_is_its_heads_reduction(monkeypatch):
    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(HELDOUT / "cards"))
    inp = plan("--hf-config", str(HELDOUT / "configs" / "deepseek-v3-L3-e16-m1536.json"), "--impl", "hf",
               "--seq", "2048", "--micro-batch", "1", "--loop", "deepspeed")
    assert inp.model.card is not None
    est = estimate_memory(inp, OFFLOAD)
    head = 129280 * 7168
    assert est.peak_phase == "backward (offload cast)"
    saved = inp.model.card.saved_bytes(1, 2048, False)
    assert est.gpu_peak_allocated_bytes == (est.after_init_bytes + saved + 2 * 500_000_000 * 2 + head * (2 + 8)
                                            + held_outputs_bytes(inp.model, inp.training) + MISC_GPU_BYTES)
    # measured on one H200 (h200-2026-12-02e, every step 25.71e9): within 1.5% (in-sample)
    assert est.gpu_peak_allocated_bytes == pytest.approx(25_708_003_328, rel=1.5e-2)


def test_a_tied_embeddings_gradient_is_reduced_by_the_epilogue_with_no_activation_alive():
    # zlayout's GPT, a 256000 x 4096 tied embedding (1.05B elements, over the bucket) and short
    # sequences: its float64 norm is the peak, with the weights, the buckets and nothing the
    # forward saved (the sum of the head's and the embedding's gradients is the last one made)
    inp = plan("--layers", "4", "--hidden", "4096", "--heads", "32", "--vocab", "256000", "--tie-embeddings",
               "--seq", "512", "--micro-batch", "1", "--loop", "trainer")
    est = estimate_memory(inp, OFFLOAD)
    embedding = 256000 * 4096
    assert est.peak_phase == "backward (offload cast)"
    assert est.gpu_peak_allocated_bytes == (est.after_init_bytes + 2 * 500_000_000 * 2 + embedding * (2 + 8)
                                            + MISC_GPU_BYTES)


def test_gemma2s_tied_embedding_leaves_the_peak_at_the_loss(monkeypatch):
    # held-out batch g (h200-2026-12-03b): eager attention, ZeRO-2 with the optimizer on the host
    folder = MEASUREMENTS / "h200-2026-12-03b" / "heldout"
    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(folder / "cards"))
    inp = plan("--hf-config", str(folder / "configs" / "gemma-2-9b-L8.json"), "--seq", "4096", "--micro-batch", "1",
               "--loop", "deepspeed")
    assert inp.model.card is not None and inp.model.tie_embeddings
    est = estimate_memory(inp, OFFLOAD)
    assert est.peak_phase == "backward (loss)"
    # measured on one H200, every step from the second 50.08e9 (planned 5.3% over before the
    # embedding's reduction was placed after the activations' release)
    assert est.gpu_peak_allocated_bytes == pytest.approx(50_077_082_624, rel=1e-2)

