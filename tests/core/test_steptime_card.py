"""The step time of a carded model from the work its card recorded (core.card.WorkPhase,
steptime.card_work): real learned cards (the held-out family configs', benchmarks/measurements/
h200-2026-12-02c/heldout: cards-v2 record each op's work, cards was learned before and does not)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from zlayout import cards
from zlayout.cli import build_parser, plan_input_from_args
from zlayout.core import steptime
from zlayout.spec import Layout

HELDOUT = Path(__file__).resolve().parents[2] / "benchmarks" / "measurements" / "h200-2026-12-02c" / "heldout"


def plan_input(monkeypatch, folder: str, config: str, *flags: str):
    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(HELDOUT / folder))
    args = build_parser().parse_args(["plan", "--hf-config", str(HELDOUT / "configs" / config), "--impl", "hf",
                                      "--gpu", "h200", "--gpus-per-node", "1", *flags])
    inp = plan_input_from_args(args)
    assert inp.model.card is not None
    return inp


def test_a_learned_cards_work_counts_the_models_matmuls_and_attention(monkeypatch):
    """gpt2-medium's card at 16 x 1024: its blocks' GEMM FLOPs are 2 per weight per token (24 layers
    of 12 h^2), the head's 2 x vocab x hidden per token, attention's causal-halved 4 T^2 h per layer."""
    inp = plan_input(monkeypatch, "cards-v2", "gpt2-medium.json", "--seq", "1024", "--micro-batch", "16")
    card = inp.model.card
    assert card.has_work()
    b, t, h, layers = 16, 1024, 1024, 24
    blocks_fwd, blocks_bwd, head_fwd, head_bwd = card.pass_work(b, t, checkpointing=False)
    assert blocks_fwd.gemm_flops == pytest.approx(2 * b * t * layers * 12 * h * h)
    assert blocks_bwd.gemm_flops == pytest.approx(2 * blocks_fwd.gemm_flops)
    assert head_fwd.gemm_flops == pytest.approx(2 * b * t * 50257 * h)
    assert blocks_fwd.attention_flops == pytest.approx(layers * 4 * b * t * t * h / 2)
    assert blocks_fwd.batched_gemm_flops == 0  # sdpa: no T^2 matmuls of its own
    # dropout (a mask a layer, its r/w), gelu_new's chain: more memory-bound bytes than GEMM FLOPs' inputs
    assert blocks_fwd.memory_bytes > 40 * b * t * h * layers
    assert blocks_fwd.kernels == int(blocks_fwd.kernels) and blocks_fwd.kernels > 20 * layers
    # checkpointing: the backward holds the recompute (a forward's GEMMs at most)
    _, ckpt_bwd, _, _ = card.pass_work(b, t, checkpointing=True)
    assert blocks_bwd.gemm_flops < ckpt_bwd.gemm_flops <= blocks_bwd.gemm_flops + blocks_fwd.gemm_flops


def test_eager_attention_is_priced_as_batched_matmuls_over_t_squared(monkeypatch):
    """gemma-2 (eager: softcapping): q @ k^T and probs @ v are bmm's over the full T^2 (no causal
    kernel skipping half), priced at a GEMM's efficiency at the head's width, not the hidden size's."""
    inp = plan_input(monkeypatch, "cards-v2", "gemma-2-2b-L8.json", "--seq", "4096", "--micro-batch", "1")
    fwd, _ = steptime.micro_step_work(inp, Layout(stage=2))
    layers, t, q = 8, 4096, 8 * 256
    assert fwd.attention_flops == 0
    assert fwd.batched_gemm_flops == pytest.approx(layers * 2 * 2 * t * t * q)
    per_flop = steptime.batched_gemm_seconds_per_flop(inp)
    assert per_flop > steptime.gemm_seconds_per_flop(inp)
    assert per_flop * steptime.peak_flops(inp) == pytest.approx(
        1 / (steptime.GEMM_EFFICIENCY * 256 / (256 + steptime.GEMM_HALF_WIDTH)))


def test_the_cards_work_lengthens_the_step_the_hand_model_under_counts(monkeypatch):
    """gpt2-medium's dropout and gelu_new, gemma-2's eager softmax over T^2: the card's work makes the
    step longer than the hand model's, which counts neither."""
    for config, stage, flags in (("gpt2-medium.json", 1, ("--seq", "1024", "--micro-batch", "16")),
                                 ("gemma-2-2b-L8.json", 2, ("--seq", "4096", "--micro-batch", "1",
                                                            "--checkpointing", "full"))):
        flags, layout = (*flags, "--stage", str(stage)), Layout(stage=stage)
        hand = steptime.estimate_step_time(plan_input(monkeypatch, "cards", config, *flags), layout)
        carded = steptime.estimate_step_time(plan_input(monkeypatch, "cards-v2", config, *flags), layout)
        assert carded.compute_s > 1.1 * hand.compute_s, config
        assert carded.step_time_s > hand.step_time_s, config


def test_a_card_learned_before_work_was_recorded_keeps_the_hand_model(monkeypatch):
    inp = plan_input(monkeypatch, "cards", "pythia-1b.json", "--seq", "2048", "--micro-batch", "4")
    assert not inp.model.card.has_work()
    assert steptime.card_with_work(inp) is None
    fwd, bwd = steptime.micro_step_work(inp, Layout(stage=0))
    hand_fwd, hand_bwd = steptime.hand_work(inp)
    assert fwd.gemm_flops == hand_fwd.gemm_flops and fwd.kernels == hand_fwd.kernels
    assert bwd.kernels == hand_bwd.kernels + steptime.parameter_tensors(inp)


def test_a_damaged_work_table_is_one_line_naming_it(tmp_path):
    text = (HELDOUT / "cards-v2" / "bcc7e70e1005c839.toml").read_text()
    broken = tmp_path / "bcc7e70e1005c839.toml"
    start = text.index("[regimes.blocks.work.forward]")
    line_end = text.index("\n", text.index("addmm = ", start))
    broken.write_text(text[:text.index("addmm = ", start)] + "addmm = '0 1 2, 3 4 5'" + text[line_end:])
    with pytest.raises(cards.CardError, match=r"work\.forward\.addmm: an op's work is"):
        cards.read_card(broken)


def test_a_moe_cards_work_counts_the_grouped_experts_and_prices_the_step(monkeypatch):
    """qwen3-30b-a3b cut to 4 layers (128 experts, top 8, width 768): torch's flop counter does not
    count `_grouped_mm`; the learner does, tokens x top-k x 3 matmuls of hidden x expert width a layer,
    their gradients twice that. A card learned so prices the step; one learned before (cards-v2,
    the experts recorded as bytes only) leaves the MoE model to the hand model."""
    import json

    from zlayout.core.card import card_from_dict
    from zlayout.learn.learner import learn

    older = plan_input(monkeypatch, "cards-v2", "qwen3-30b-a3b-L4.json", "--seq", "2048", "--micro-batch", "2")
    assert older.model.card.has_work() and not steptime.card_counts_experts(older, older.model.card)
    assert steptime.card_with_work(older) is None

    config = json.loads((HELDOUT / "configs" / "qwen3-30b-a3b-L4.json").read_text())
    card = card_from_dict(learn(config), older.model.card.key)
    b, t, layers = 2, 2048, 4
    experts = layers * 2 * b * t * config["num_experts_per_tok"] * 3 * config["hidden_size"] * config["moe_intermediate_size"]
    blocks_fwd, blocks_bwd, head_fwd, head_bwd = card.pass_work(b, t, checkpointing=False)
    assert blocks_fwd.grouped_gemm_flops == pytest.approx(experts)
    assert blocks_bwd.grouped_gemm_flops == pytest.approx(2 * experts)

    inp = older.model_copy(update={"model": older.model.model_copy(update={"card": card})})
    assert steptime.card_with_work(inp) is card
    fwd, bwd = steptime.micro_step_work(inp, Layout(stage=2))
    assert fwd.gemm_flops == pytest.approx(blocks_fwd.gemm_flops + head_fwd.gemm_flops + experts)
    # the experts' gradients: MOE_BACKWARD_GEMM_FACTOR slower than dense GEMMs (measured)
    assert bwd.gemm_flops == pytest.approx(blocks_bwd.gemm_flops + head_bwd.gemm_flops
                                           + steptime.MOE_BACKWARD_GEMM_FACTOR * 2 * experts)


def test_attention_past_a_sliding_window_is_priced_as_the_masked_kernels_full_square(monkeypatch):
    """Phi-3-mini (window 2047), its shipped card: at 1024 tokens transformers calls SDPA with
    is_causal, priced as flash (half the square at ATTENTION_EFFICIENCY); at 8192 it passes the
    window as a mask: the full square, at the masked kernels' MASKED_ATTENTION_EFFICIENCY (issue 27's
    batch g: priced as causal flash it came 30% short)."""
    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(Path("/nonexistent")))  # the shipped cards only
    published = Path(__file__).resolve().parents[1] / "hf" / "configs" / "published"
    layers, q, b = 32, 3072, 2

    def work(seq: int):
        args = build_parser().parse_args(["plan", "--hf-config", str(published / "Phi-3-mini-4k-instruct.json"),
                                          "--impl", "hf", "--gpu", "h200", "--gpus-per-node", "1",
                                          "--seq", str(seq), "--micro-batch", str(b)])
        inp = plan_input_from_args(args)
        assert inp.model.card is not None and inp.model.card.has_work()
        return inp, steptime.micro_step_work(inp, Layout(stage=0))

    _, (short_fwd, _) = work(1024)
    assert short_fwd.masked_attention_flops == 0
    assert short_fwd.attention_flops == pytest.approx(layers * 4 * b * 1024 ** 2 * q / 2)
    inp, (fwd, bwd) = work(8192)
    assert fwd.attention_flops == 0 and bwd.attention_flops == 0
    assert fwd.masked_attention_flops == pytest.approx(layers * 4 * b * 8192 ** 2 * q)
    assert bwd.masked_attention_flops == pytest.approx(fwd.masked_attention_flops * 10 / 4)
    causal = replace(fwd, attention_flops=fwd.masked_attention_flops / 2, masked_attention_flops=0.0)
    extra_s = steptime.phase_kernel_s(inp, fwd) - steptime.phase_kernel_s(inp, causal)
    peak = steptime.peak_flops(inp)
    assert extra_s == pytest.approx(fwd.masked_attention_flops / peak / steptime.MASKED_ATTENTION_EFFICIENCY
                                    - steptime.attention_kernel_s(inp, causal))
    assert extra_s > 0


BATCH_J = HELDOUT.parent.parent / "h200-2026-12-06" / "heldout"


def test_llama4s_experts_run_every_token_through_every_expert_and_are_priced_as_gemms(monkeypatch):
    """Llama-4 Scout cut to one layer (batch j): `Llama4TextExperts` multiplies every token by all 16
    experts in one bmm. Its card (cards-v2) records that bmm as a GEMM, 16 experts' worth, and the
    step takes the card; the card learned before (cards: recorded as attention's narrow bmm) left
    the model to the hand model's top-1 experts, 40% short of the run."""
    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(BATCH_J / "cards-v2"))
    args = build_parser().parse_args(["plan", "--hf-config", str(BATCH_J / "configs" / "llama4-scout-L1.json"),
                                      "--gpu", "h200", "--gpus-per-node", "1", "--seq", "8192"])
    inp = plan_input_from_args(args)
    m, seq = inp.model, 8192
    blocks_fwd = inp.model.card.pass_work(1, seq, checkpointing=False)[0]
    every_expert = 2 * seq * m.experts * 3 * m.hidden * m.expert_ffn_size  # gate, up and down, each expert
    assert blocks_fwd.batched_gemm_flops == 0
    assert blocks_fwd.gemm_flops >= every_expert
    assert steptime.card_with_work(inp) is inp.model.card
    assert steptime.card_counts_experts(inp, inp.model.card)
    carded = steptime.estimate_step_time(inp, Layout(stage=2))
    # the run (results-j.jsonl line 4): forward 0.091 s, backward 0.197 s
    assert carded.forward_s == pytest.approx(0.091, rel=0.15) and carded.backward_s == pytest.approx(0.197, rel=0.15)


def test_misaligned_memory_traffic_is_priced_at_its_lower_bandwidth():
    """A card's `elementwise_unaligned` bytes (GPT-OSS's sink rows of T + 1) take 1 / UNALIGNED_HBM_FRACTION
    times as long as the same bytes aligned."""
    from zlayout.core.card import OpWork, WorkPhase

    args = build_parser().parse_args(["plan", "--preset", "llama3-8b", "--gpu", "h200", "--gpus-per-node", "1"])
    inp = plan_input_from_args(args)
    ops = (OpWork("elementwise", (0, 0, 0), (0, 0, 1e9), (0, 0, 1)),
           OpWork("elementwise_unaligned", (0, 0, 0), (0, 0, 1e9), (0, 0, 1)))
    totals = WorkPhase(ops).totals(1, 1024)
    assert totals.memory_bytes == 1e9 and totals.unaligned_memory_bytes == 1e9
    aligned = steptime.phase_kernel_s(inp, steptime.PhaseWork(hbm_bytes=1e9))
    misaligned = steptime.phase_kernel_s(inp, steptime.PhaseWork(unaligned_hbm_bytes=1e9))
    assert misaligned == pytest.approx(aligned / steptime.UNALIGNED_HBM_FRACTION)


def test_strided_memory_traffic_is_priced_at_the_non_vectorized_kernels_bandwidth():
    """A card's `elementwise_strided` bytes (pointwise ops over a broadcast or strided operand)
    take 1 / STRIDED_HBM_FRACTION times as long as the same bytes vectorized; a misaligned op is
    priced as misaligned whatever else it is."""
    from zlayout.core.card import OpWork, WorkPhase

    args = build_parser().parse_args(["plan", "--preset", "llama3-8b", "--gpu", "h200", "--gpus-per-node", "1"])
    inp = plan_input_from_args(args)
    ops = (OpWork("elementwise", (0, 0, 0), (0, 0, 1e9), (0, 0, 1)),
           OpWork("elementwise_strided", (0, 0, 0), (0, 0, 2e9), (0, 0, 1)),
           OpWork("elementwise_unaligned", (0, 0, 0), (0, 0, 3e9), (0, 0, 1)),
           OpWork("elementwise_scatter", (0, 0, 0), (0, 0, 4e9), (0, 0, 1)))
    totals = WorkPhase(ops).totals(1, 1024)
    assert (totals.memory_bytes, totals.strided_memory_bytes, totals.unaligned_memory_bytes,
            totals.scatter_memory_bytes) == (1e9, 2e9, 3e9, 4e9)
    vectorized = steptime.phase_kernel_s(inp, steptime.PhaseWork(hbm_bytes=1e9))
    strided = steptime.phase_kernel_s(inp, steptime.PhaseWork(strided_hbm_bytes=1e9))
    assert strided == pytest.approx(vectorized / steptime.STRIDED_HBM_FRACTION)
    # an accumulating index_put (a MoE block's backward of its gathers by expert): sorted, row by row
    scatter = steptime.phase_kernel_s(inp, steptime.PhaseWork(scatter_hbm_bytes=1e9))
    assert scatter == pytest.approx(vectorized / steptime.SCATTER_HBM_FRACTION)


def test_falcon_s_math_attention_step_is_priced_from_its_strided_and_softmax_work():
    """Falcon-7B's shipped card (math attention: the mask added over batch and heads, `_safe_softmax`'s
    fill) at batch r's held-out 1 x 4096, 4 layers, checkpointed, ZeRO-1 on one H200: the run took
    0.378 s a step (h200-2026-12-12 results/batch-heldout-r-results.jsonl); priced without the
    strided and softmax work the plan said 0.292 (-22.8%)."""
    config = Path(__file__).resolve().parents[1] / "hf" / "configs" / "published" / "falcon-7b.json"
    args = build_parser().parse_args(["plan", "--hf-config", str(config), "--layers", "4", "--seq", "4096",
                                      "--micro-batch", "1", "--checkpointing", "full", "--gpu", "h200",
                                      "--gpus-per-node", "1", "--host-cores", "16", "--stage", "1"])
    inp = plan_input_from_args(args)
    assert inp.model.card is not None and inp.model.card.key == "81faf173b690f922"
    t = steptime.estimate_step_time(inp, Layout(stage=1))
    assert t.step_time_s == pytest.approx(0.378, rel=0.10)


@pytest.mark.parametrize("calls,outside", [("[13, 2]", "6"), ("[-1]", "6"), ("[true]", "6"), ("[13]", "'6'"),
                                           ("[13]", "1e9"), ("'13'", "6")])
def test_damaged_module_calls_are_one_line_naming_the_card(tmp_path, calls, outside):
    """The shipped Llama-3.2-1B card counts 13 module calls a block and 6 outside; any other shape
    of those two keys is refused in one line, and a card without them reads as before."""
    from zlayout.core.card import card_from_dict  # noqa: F401 (the parser under test, via read_card)

    shipped = next(p for p in cards.SHIPPED_CARDS_DIR.glob("*.toml") if "Llama-3.2-1B" in p.read_text()[:400])
    text = shipped.read_text()
    assert "module_calls = [\n    13,\n]" in text and "module_calls_outside = 6" in text
    assert cards.read_card(shipped).stage3_modules() == 16 * 13 + 6
    broken = tmp_path / shipped.name
    broken.write_text(text.replace("module_calls = [\n    13,\n]", f"module_calls = {calls}")
                      .replace("module_calls_outside = 6", f"module_calls_outside = {outside}"))
    with pytest.raises(cards.CardError, match="module_calls") as raised:
        cards.read_card(broken)
    assert "\n" not in str(raised.value) and shipped.stem in str(raised.value)
    older = tmp_path / "older" / shipped.name
    older.parent.mkdir()
    older.write_text(text.replace("module_calls = [\n    13,\n]\n", "").replace("module_calls_outside = 6\n", ""))
    assert cards.read_card(older).stage3_modules() is None


def test_an_op_of_several_kernels_costs_the_host_one_op_and_a_launch_for_each_further_one(tmp_path, monkeypatch):
    """A tiny Mixtral (4 experts, top 2) learned by the real learner: its router sorts 2 x 4,096
    expert ids a block (a copy, an index fill and cub's radix sort: 12 kernels, zlayout.learn.
    launches) in one op. The card records the ops beside the launches; the host's side of a pass is
    HOST_S_PER_KERNEL an op and HOST_S_PER_EXTRA_KERNEL a further kernel, the GPU's side every kernel.
    The same card without its op counts (as cards learned before them) prices each launch an op."""
    import json

    from zlayout.learn.learner import learn

    config_path = Path(__file__).resolve().parents[1] / "hf" / "configs" / "small" / "mixtral.json"
    config = json.loads(config_path.read_text())
    learned = learn(config)
    key = cards.config_key(config)
    older = json.loads(json.dumps(learned))  # the op counts dropped: "flops, bytes, calls"
    for regime in older["regimes"]:
        for table in [block["work"] for block in regime["blocks"]] + [regime["head"]["work"]]:
            for ops in table.values():
                for name in ops:
                    ops[name] = ops[name][:3]
    for folder, card in (("cards", learned), ("older", older)):
        cards.write_card(tmp_path / folder, key, cards.dumps_card(card, key, "mixtral.json"), replace=False)
    flags = ["--hf-config", str(config_path), "--seq", "4096", "--micro-batch", "1", "--gpu", "h200",
             "--gpus-per-node", "1", "--stage", "1"]
    runs = {}
    for folder in ("cards", "older"):
        monkeypatch.setenv(cards.CARDS_DIR_ENV, str(tmp_path / folder))
        inp = plan_input_from_args(build_parser().parse_args(["plan", *flags]))
        assert inp.model.card is not None and steptime.card_with_work(inp) is inp.model.card
        runs[folder] = inp
    layout = Layout(stage=1)
    layers = config["num_hidden_layers"]
    blocks_fwd, _, head_fwd, _ = runs["cards"].model.card.pass_work(1, 4096, checkpointing=False)
    whole = blocks_fwd + head_fwd
    # the sort's 11 kernels past its first, in every block, and more (topk, the backward's scatters)
    assert whole.kernels - whole.ops >= 11 * layers
    assert whole.ops == int(whole.ops) and whole.kernels == int(whole.kernels)

    for new, old in zip(*(steptime.micro_step_work(runs[folder], layout) for folder in ("cards", "older"))):
        assert new.kernels == old.kernels and new.host_kernels == old.host_kernels  # the GPU's side: every kernel
        assert old.host_extra_kernels == 0 and new.host_extra_kernels >= 11 * layers
        ops = new.host_kernels - new.host_extra_kernels
        assert steptime.host_floor_s(new) == pytest.approx(
            new.host_fixed_s + ops * steptime.HOST_S_PER_KERNEL
            + new.host_extra_kernels * steptime.HOST_S_PER_EXTRA_KERNEL + new.grad_hooks * steptime.HOST_GRAD_HOOK_S)
        assert steptime.host_floor_s(old) - steptime.host_floor_s(new) == pytest.approx(
            new.host_extra_kernels * (steptime.HOST_S_PER_KERNEL - steptime.HOST_S_PER_EXTRA_KERNEL))
        assert steptime.phase_kernel_s(runs["cards"], new) == pytest.approx(steptime.phase_kernel_s(runs["older"], old))
    # a tiny model's step is its host's: the card that knows its ops is the shorter
    assert steptime.estimate_step_time(runs["cards"], layout).step_time_s \
        < steptime.estimate_step_time(runs["older"], layout).step_time_s


BATCH_31 = Path(__file__).resolve().parents[2] / "benchmarks" / "measurements" / "h200-2026-12-31"


@pytest.mark.parametrize(("vocab", "align"), [(50257, 1), (246534, 2), (40478, 2), (50358, 2), (32004, 4),
                                              (50304, 8), (256000, 8)])
def test_the_heads_gemm_alignment_is_the_vocabularys_largest_power_of_two_up_to_8(vocab, align):
    assert steptime.head_gemm_alignment(vocab) == align


def test_an_even_misaligned_vocabularys_head_runs_on_the_faster_half_aligned_kernels(monkeypatch):
    """CTRL's 246,534-word head (h200-2026-12-31 profiles/prof-12: 5.17 TFLOP a GEMM on cuBLAS's
    sm80 align2 kernels, 0.268 of the peak): its card records the head's GEMMs as misaligned; the
    plan prices them at HALF_ALIGNED_HEAD_EFFICIENCY, where an odd vocabulary's run at
    UNALIGNED_HEAD_EFFICIENCY, and the blocks' GEMMs keep the aligned rate."""
    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(BATCH_31 / "heldout" / "cards"))
    args = build_parser().parse_args(["plan", "--hf-config", str(BATCH_31 / "configs" / "ctrl-default.json"),
                                      "--layers", "16", "--seq", "256", "--micro-batch", "32", "--gpu", "h100",
                                      "--gpus-per-node", "1"])
    inp = plan_input_from_args(args)
    assert inp.model.card is not None and inp.model.vocab == 246534
    fwd, bwd = steptime.micro_step_work(inp, Layout(stage=1))
    head = 2 * 256 * 32 * 1280 * 246534  # tokens x hidden x vocab, two FLOPs each
    assert fwd.half_aligned_gemm_flops == pytest.approx(head, rel=1e-6)
    assert bwd.half_aligned_gemm_flops == pytest.approx(2 * head, rel=1e-6)
    assert fwd.unaligned_gemm_flops == bwd.unaligned_gemm_flops == 0
    odd = replace(fwd, half_aligned_gemm_flops=0.0, unaligned_gemm_flops=head)
    ratio = steptime.HALF_ALIGNED_HEAD_EFFICIENCY / steptime.UNALIGNED_HEAD_EFFICIENCY
    saved = steptime.phase_kernel_s(inp, odd) - steptime.phase_kernel_s(inp, fwd)
    assert saved == pytest.approx(head / (inp.hardware.gpu.peak_bf16_flops * steptime.UNALIGNED_HEAD_EFFICIENCY)
                                  * (1 - 1 / ratio), rel=1e-6)
    # the run (5 steps, one H100): 0.210 s a step; priced as an odd vocabulary's head it was 0.314
    step = steptime.estimate_step_time(inp, Layout(stage=1)).step_time_s
    assert 0.210 < step < 0.26


def test_an_odd_vocabularys_head_stays_on_the_one_element_kernels():
    args = build_parser().parse_args(["plan", "--layers", "4", "--hidden", "1024", "--heads", "16",
                                      "--vocab", "50257", "--gpu", "h200", "--gpus-per-node", "1"])
    fwd, _ = steptime.micro_step_work(plan_input_from_args(args), Layout(stage=1))
    assert fwd.unaligned_gemm_flops > 0 and fwd.half_aligned_gemm_flops == 0
    even = build_parser().parse_args(["plan", "--layers", "4", "--hidden", "1024", "--heads", "16",
                                      "--vocab", "50258", "--gpu", "h200", "--gpus-per-node", "1"])
    fwd2, _ = steptime.micro_step_work(plan_input_from_args(even), Layout(stage=1))
    assert fwd2.unaligned_gemm_flops == 0 and fwd2.half_aligned_gemm_flops > 0


def test_attention_dropout_runs_at_the_dropout_kernels_measured_efficiency(monkeypatch):
    """gpt2-medium (attn_pdrop 0.1) at 8 x 1024: its shipped card counts the scores the fused
    attention draws dropout for; the same config's card learned before they were recorded
    (h200-2026-12-31e's held-out one) prices each pass's GPU side lower by exactly its attention
    FLOPs at the dropout kernels' efficiency less at the plain kernels' (head size 64, 1,024
    tokens, 8 x 16 x 1024 / 128 query tiles; the backward draws them again)."""
    root = HELDOUT.parents[1] / "h200-2026-12-31e"
    flags = ["plan", "--hf-config", str(root / "configs" / "gpt2-medium.json"), "--gpu", "h200",
             "--gpus-per-node", "1", "--seq", "1024", "--micro-batch", "8"]
    monkeypatch.delenv(cards.CARDS_DIR_ENV, raising=False)
    shipped = plan_input_from_args(build_parser().parse_args(flags))
    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(root / "heldout" / "cards"))
    before = plan_input_from_args(build_parser().parse_args(flags))
    assert shipped.model.card.key == before.model.card.key
    scores = 24 * 16 * 1024 * 1024 / 2 * 8
    layout = Layout(stage=2)
    (fwd, bwd), (old_fwd, old_bwd) = (steptime.micro_step_work(inp, layout) for inp in (shipped, before))
    assert fwd.dropout_scores == pytest.approx((scores, 0.0))
    assert bwd.dropout_scores == pytest.approx((0.0, scores))
    assert old_fwd.dropout_scores == old_bwd.dropout_scores == (0.0, 0.0)
    assert fwd.attention_flops == pytest.approx(4 * 64 * scores) and fwd.attention_backward_flops == 0
    assert bwd.attention_flops == bwd.attention_backward_flops == pytest.approx(10 * 64 * scores)
    peak = steptime.peak_flops(shipped)

    def slower(flops: float, backward: bool) -> float:  # the dropout kernels' time less the plain ones'
        eff = steptime.attention_kernel_efficiency
        return flops / peak * (1 / eff(64, 1024, 1024, backward, True) - 1 / eff(64, 1024, 1024, backward, False))

    assert steptime.phase_kernel_s(shipped, fwd) - steptime.phase_kernel_s(before, old_fwd) == pytest.approx(
        slower(fwd.attention_flops, False))
    assert steptime.phase_kernel_s(shipped, bwd) - steptime.phase_kernel_s(before, old_bwd) == pytest.approx(
        slower(bwd.attention_flops, True))
    monkeypatch.delenv(cards.CARDS_DIR_ENV)
    with_checkpointing = plan_input_from_args(build_parser().parse_args([*flags, "--checkpointing", "full"]))
    _, ckpt_bwd = steptime.micro_step_work(with_checkpointing, layout)
    assert ckpt_bwd.dropout_scores == pytest.approx((scores, scores))  # the recompute draws them again
    # the recompute runs the forward kernels: its FLOPs are not the backward's
    assert ckpt_bwd.attention_flops - ckpt_bwd.attention_backward_flops == pytest.approx(4 * 64 * scores)


def test_attention_kernel_efficiency_is_the_sweep_between_and_at_its_shapes():
    """The table's own points come back at the sweep's call size (16,384 tokens, 2,048 / d heads);
    between them it is linear in log2(seq) and in the head size; past the edges it holds; a call
    with fewer query tiles fills the GPU less (h200-2026-12-31f's GPT-2-XL shape, 4 x 25 x 1,024 x
    64: measured 0.288 forward and 0.214 backward)."""
    eff = steptime.attention_kernel_efficiency
    tiles = 16384 * 16 / 128
    assert eff(128, 4096, tiles, False, False) == pytest.approx(0.600)
    assert eff(128, 4096, tiles, True, True) == pytest.approx(0.390)
    between = eff(128, 2896, tiles, False, False)  # 2^11.5
    assert between == pytest.approx((0.548 + 0.600) / 2, rel=1e-3)
    assert eff(112, 4096, 16384 * 18 / 128, False, False) == pytest.approx((0.471 + 0.600) / 2, rel=0.01)
    assert eff(128, 65536, tiles, False, False) == pytest.approx(0.633)
    assert eff(128, 128, tiles, False, False) == pytest.approx(0.349)
    assert eff(64, 1024, 4 * 25 * 1024 / 128, False, False) == pytest.approx(0.288, rel=0.03)
    assert eff(64, 1024, 4 * 25 * 1024 / 128, True, False) == pytest.approx(0.214, rel=0.03)
    assert eff(64, 1024, 100, False, False) < eff(64, 1024, 1000, False, False) < eff(64, 1024, 4096, False, False)
