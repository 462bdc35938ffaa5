"""`zlayout learn`: what the meta-device trace records, the card it writes, and the planner
taking the card's activations (real transformers classes, real TOML files, the real CLI)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from zlayout import cards, hfconfig
from zlayout.core.card import CardError
from zlayout.learn.learner import (LearnError, block_list, build_model, evaluate, learn, measure, net_and_peak,
                                   regimes_to_trace, trace_step, weights_saved_as_views)
from zlayout.learn.trace import StorageLedger, cuda_sdpa_kernel, fused_attention

SMALL = Path(__file__).resolve().parent.parent / "hf" / "configs" / "small"
# types planned from their cards only (no hand reader: tests/hf's small fixtures are the hand readers')
CARD_ONLY = Path(__file__).resolve().parent / "configs"
PUBLISHED = Path(__file__).resolve().parent.parent / "hf" / "configs" / "published"


def zlayout(*argv: str, cards_dir: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, cards.CARDS_DIR_ENV: str(cards_dir)}
    return subprocess.run([sys.executable, "-m", "zlayout", *argv], capture_output=True, text=True,
                          timeout=300, env=env)


def small_config(name: str) -> dict:
    return json.loads((SMALL / f"{name}.json").read_text())


def built(config: dict, device: str, attention: str) -> torch.nn.Module:
    config = {k: v for k, v in config.items() if k not in ("architectures",)}
    hf_config = AutoConfig.for_model(config.pop("model_type"), **config)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf_config, attn_implementation=attention)
    return model.bfloat16()


def test_the_meta_trace_requests_what_a_real_run_allocates():
    """Eager attention and RMSNorm run the same ops on the CPU as on the meta device: each
    block's and the head's requests, byte for byte, equal those of real tensors."""
    config = small_config("llama-defaults")
    steps = {}
    for device in ("meta", "cpu"):
        model = built(config, device, "eager")
        steps[device] = measure(trace_step(model, block_list(model), 96, checkpointing=False), 2)
    for index in (0, 1):
        for phase in ("forward", "backward"):
            assert steps["meta"]["blocks"][index][phase] == steps["cpu"]["blocks"][index][phase]
            assert steps["meta"]["blocks"][index][phase]  # something was recorded
    assert steps["meta"]["head"]["forward"] == steps["cpu"]["head"]["forward"]
    assert steps["meta"]["head"]["backward"] == steps["cpu"]["head"]["backward"]


def test_the_fused_attention_stand_in_keeps_no_probabilities():
    """sdpa on meta would save tokens x tokens probabilities; the stand-in keeps q, k, v, the
    output and a float32 logsumexp per head and token, as the CUDA kernels do."""
    ledger = StorageLedger()
    sdpa = fused_attention(ledger)
    heads, tokens, dim = 4, 512, 32
    q, k, v = (torch.empty(1, heads, tokens, dim, dtype=torch.bfloat16, device="meta", requires_grad=True)
               for _ in range(3))
    ledger.exclude([q, k, v])
    with ledger:
        out = sdpa(q, k, v, is_causal=True)
    assert ledger.current == tokens * heads * dim * 2 + tokens * heads * 4  # out + logsumexp
    assert out.shape == (1, heads, tokens, dim)


@pytest.mark.parametrize("name", ["gpt_neox", "deepseek_v3", "llama-defaults"])
def test_the_fused_attention_output_keeps_querys_layout_as_cudnn_does(name, monkeypatch):
    """cuDNN attention (the H200's first choice) and flash allocate their output in q's memory
    order; partial rotary's `torch.cat` (gpt_neox) and MLA's (deepseek_v3) leave q in (batch,
    heads, seq, dim) memory, so transformers' transpose + contiguous after attention copies the
    output and the dense projection saves the copy. Each block's forward requests, with the
    stand-in, are those of torch's own cuDNN kernel on the meta device (its meta function is
    `alloc_with_matching_layout`, as cudnn/MHA.cpp), less cuDNN's two 8-byte philox scalars;
    an output always in (batch, seq, heads, dim) memory misses gpt_neox's copy."""
    import zlayout.learn.learner as learner

    def forward_requests() -> list[list[int]]:
        model = built(small_config(name), "meta", "sdpa")
        step = measure(trace_step(model, block_list(model), 256, checkpointing=False), 2)
        return [[n for n in step["blocks"][index]["forward"] if abs(n) != 8] for index in (0, 1)]

    stand_in = forward_requests()

    def cudnn_sdpa(ledger, math_sdpa=None):
        def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
            return torch.ops.aten._scaled_dot_product_cudnn_attention(
                query, key, value, attn_mask, True, dropout_p, is_causal, False, scale=scale)[0]
        return sdpa

    monkeypatch.setattr(learner, "fused_attention", cudnn_sdpa)
    assert stand_in == forward_requests()


def test_a_masked_fused_attention_output_keeps_the_querys_layout():
    """On sm90 torch 2.11 runs cuDNN's attention for masked calls too, whose output follows q's memory
    order: Phi-3's partial rotary makes q (batch, heads, seq, dim) memory and transformers'
    `.contiguous()` after attention copies the output (h200-2026-12-02c phi3 allocator trace), where
    the memory-efficient kernel's (batch, seq, heads, dim) output would copy nothing."""
    ledger = StorageLedger()
    q = torch.empty(2, 4, 64, 32, dtype=torch.bfloat16, device="meta")  # (batch, heads, seq, dim) memory
    mask = torch.empty(2, 1, 64, 64, dtype=torch.bfloat16, device="meta")
    with ledger:
        out = fused_attention(ledger)(q, q, q, attn_mask=mask)
    assert ledger.sdpa_kernels == {"efficient": 1}
    assert out.is_contiguous() and not out.transpose(1, 2).is_contiguous()
    bmhd = torch.empty(2, 64, 4, 32, dtype=torch.bfloat16, device="meta").transpose(1, 2)  # a projection's view
    with ledger:
        out = fused_attention(ledger)(bmhd, bmhd, bmhd, attn_mask=mask)
    assert out.transpose(1, 2).is_contiguous()


@pytest.mark.parametrize("masked, kv_heads", [(False, 4), (True, 4), (False, 2)])
def test_the_attention_backward_makes_one_workspace_after_the_gradients(masked, kv_heads):
    """dq, dk, dv, then one workspace of a float32 dq accumulator, float32 row sums and 256 bytes (and
    with grouped key/value heads dk and dv expanded to every query head), freed at once, masked or
    not: 50,856,192 bytes at 1 x 32 heads x 4096 x 96 (the phi3 allocator trace, h200-2026-12-02c),
    169,083,136 at 2 x 40 x 4096 x 128 (Phi-3-medium, h200-2026-12-24), 134,742,272 at 2 x 32 x 2048
    x 128 over 8 key/value heads (Mixtral-8x7B, h200-2026-12-25)."""
    batch, heads, seq, dim = 2, 4, 64, 32
    q, k, v = (torch.empty(batch, seq, n, dim, dtype=torch.bfloat16, device="meta").transpose(1, 2)
               .requires_grad_() for n in (heads, kv_heads, kv_heads))
    mask = torch.empty(batch, 1, seq, seq, dtype=torch.bfloat16, device="meta") if masked else None
    ledger = StorageLedger()
    ledger.exclude([q, k, v] + ([mask] if masked else []))
    with ledger:
        out = fused_attention(ledger)(q, k, v, attn_mask=mask, enable_gqa=kv_heads != heads)
        grad = torch.empty_like(out)
        window = ledger.open_window("backward", 0)
        out.backward(grad)
        ledger.close_window(window)
    rows = batch * heads * seq
    expanded = 2 * rows * dim * 2 if kv_heads != heads else 0
    workspace = 4 * rows * dim + 4 * rows + 256 + expanded
    grad_bytes = [rows * dim * 2, batch * kv_heads * seq * dim * 2, batch * kv_heads * seq * dim * 2]
    made = [e for e in window.events if e > 0]
    assert made[:4] == grad_bytes + [workspace]
    assert window.events[window.events.index(workspace) + 1] == -workspace


def test_a_boolean_mask_costs_one_bias_per_call_kept_until_backward():
    """torch converts a boolean attn_mask (transformers' sliding window) to an additive bias in q's
    dtype at every call (attention.cpp `convert_boolean_attn_mask`), and the kernel's autograd node
    saves it for backward: each masked block holds batch x queries x keys x 2 bytes more (gemma-3-1b,
    22 sliding blocks at 2 x 4096: the plan was 1.57e9 bytes under on the H200). A float mask is
    passed through, no new storage."""
    batch, heads, tokens, dim = 2, 4, 64, 32
    out_and_lse = batch * tokens * heads * dim * 2 + batch * heads * tokens * 4  # seq 64: lse not padded
    for dtype, extra in ((torch.bool, batch * tokens * tokens * 2), (torch.bfloat16, 0)):
        ledger = StorageLedger()
        q, k, v = (torch.empty(batch, heads, tokens, dim, dtype=torch.bfloat16, device="meta", requires_grad=True)
                   for _ in range(3))
        mask = torch.empty(batch, 1, tokens, tokens, dtype=dtype, device="meta")
        ledger.exclude([q, k, v, mask])
        with ledger:
            out = fused_attention(ledger)(q, k, v, attn_mask=mask)
            assert ledger.current == out_and_lse + extra  # kept while autograd holds the block
            out.sum().backward()
            del out
        assert ledger.current == 3 * q.numel() * 2  # the bias, output and lse freed; q, k, v's gradients kept


def test_the_cuda_kernel_choice_follows_pytorchs_dispatcher():
    """sdp_utils.cpp's filters: flash without a mask (grouped heads only with enable_gqa), the
    memory-efficient kernel with one (equal heads), math when neither takes the inputs."""
    def qkv(q_heads, k_heads, dim=64, v_dim=None, dtype=torch.bfloat16, tokens=256):
        return (torch.empty(2, q_heads, tokens, dim, dtype=dtype, device="meta"),
                torch.empty(2, k_heads, tokens, dim, dtype=dtype, device="meta"),
                torch.empty(2, k_heads, tokens, v_dim or dim, dtype=dtype, device="meta"))
    mask = torch.empty(2, 1, 256, 256, dtype=torch.bool, device="meta")
    assert cuda_sdpa_kernel(*qkv(32, 32), is_causal=True) == "flash"
    assert cuda_sdpa_kernel(*qkv(32, 8), is_causal=True, enable_gqa=True) == "flash"  # transformers' GQA
    assert cuda_sdpa_kernel(*qkv(32, 32), attn_mask=mask) == "efficient"  # a sliding window's mask
    assert cuda_sdpa_kernel(*qkv(128, 128, dim=192, v_dim=128), is_causal=True) == "efficient"  # MLA
    assert cuda_sdpa_kernel(*qkv(8, 8, dim=512), is_causal=True) == "efficient"  # past flash's 256
    assert cuda_sdpa_kernel(*qkv(71, 1), attn_mask=mask) == "math"  # Falcon's multi-query attention
    assert cuda_sdpa_kernel(*qkv(32, 8), attn_mask=mask, enable_gqa=True) == "math"
    assert cuda_sdpa_kernel(*qkv(8, 8, dim=100), attn_mask=mask) == "math"  # not a multiple of 8


def test_math_attention_on_meta_requests_what_it_allocates_on_a_real_device():
    """The math fallback on the meta device: the requests of forward and backward, byte for byte,
    are those of real CPU tensors (the ledger sees ATen's ops, not what a kernel allocates inside),
    float32 upcast and T x T probabilities included; its softmax as the H200 runs it, where the
    meta device's `_safe_softmax` kernel makes one tensor and its backward one."""
    events, forwards = {}, {}
    for device in ("meta", "cpu"):
        ledger = StorageLedger()
        q = torch.zeros(2, 6, 96, 16, dtype=torch.bfloat16, device=device, requires_grad=True)
        k, v = (torch.zeros(2, 1, 96, 16, dtype=torch.bfloat16, device=device, requires_grad=True) for _ in "kv")
        mask = torch.ones(96, 96, dtype=torch.bool, device=device).tril()
        ledger.exclude([q, k, v, mask])
        window = ledger.open_window("forward", 0)
        with ledger:
            out = torch.ops.aten._scaled_dot_product_attention_math(q, k, v, mask)[0]
            ledger.close_window(window)
            backward = ledger.open_window("backward", 0)
            out.sum().backward()
        ledger.close_window(backward)
        events[device], forwards[device] = window.events + backward.events, window.events
    assert events["meta"] == events["cpu"]
    probabilities = 2 * 6 * 96 * 96 * 4  # float32
    assert probabilities in events["meta"]
    # as the H200 ran it (h200-2026-12-03 probe_math_attention.py): the scores, softmax's output
    # and eq's bool mask alive at once in the forward; in the backward, beside the saved
    # probabilities, three gradients of their size
    assert max(_running_peaks(forwards["meta"])) >= 2 * probabilities + probabilities // 4
    assert max(_running_peaks(events["meta"])) >= 4 * probabilities


def _running_peaks(events: list[int]) -> list[int]:
    live, out = 0, []
    for event in events:
        live += event
        out.append(live)
    return out


def test_a_multimodal_card_names_the_tensors_a_text_step_leaves_without_gradients():
    """LLaVA trained on text: no gradient reaches the vision tower or the projector; the card
    names them, and the step prices hooks only for the tensors that get one."""
    config = json.loads((Path(__file__).resolve().parent.parent / "hf" / "configs" / "published"
                         / "llava-1.5-7b-hf.json").read_text())
    config["text_config"] = {**config.get("text_config", {}), "num_hidden_layers": 2}
    config["vision_config"] = {**config.get("vision_config", {}), "num_hidden_layers": 2}
    card = learn(config)
    untrained = card["parameters"]["untrained"]
    assert untrained and all(n.startswith(("model.vision_tower.", "model.multi_modal_projector.")) for n in untrained)
    language = [n for n in card["parameters"]["names"] if n not in untrained]
    assert any(n.startswith("model.language_model.") for n in language) and "lm_head.weight" in language


def test_a_card_predicts_a_token_count_it_was_not_fitted_on():
    config = small_config("llama-defaults")
    card = learn(config)
    regime = card["regimes"][-1]
    assert card["fit_error"] < 0.001
    model = built(config, "meta", "sdpa")
    fresh = measure(trace_step(model, block_list(model), 5000, checkpointing=False), 2)
    kinds = card["layers"]["kinds"]
    block = regime["blocks"][0]
    index = block["traced_block"]
    for phase in ("forward", "backward"):
        predicted = net_and_peak([evaluate(p, 5000) for p in block[phase]])
        assert predicted == pytest.approx(net_and_peak(fresh["blocks"][index][phase]), rel=1e-9)
    assert kinds == [0, 0] and card["parameters"]["count"] == sum(p.numel() for p in model.parameters())


def test_an_indexer_whose_top_k_stops_growing_is_learned_past_it_and_shorter_sequences_refused(tmp_path):
    """DeepSeek-V3.2's indexer keeps min(T, index_topk) tokens a query: at 1,536 the kink lies inside
    1,024-4,096 tokens, where a quadratic through the three counts bends away past them. The long
    check (16,384 tokens) sees it; the card is learned from 2,048 tokens on, holds a fresh trace at
    20,000 tokens, and plan refuses a shorter sequence (or a micro-batch its memory outgrows) in one
    line instead of extrapolating."""
    path = CARD_ONLY / "deepseek_v32-tiny.json"
    config = json.loads(path.read_text())
    card = learn(config)
    assert [r.get("min_tokens") for r in card["regimes"]] == [2048]
    regime = card["regimes"][0]
    assert regime["tokens_fitted"] == [2048, 4096, 8192] and card["layers"]["kinds"] == [0, 1, 1]
    # one sequence takes another path than two (learned from two); from two on the requests grow with
    # the micro-batch (_linear_in_sequences: no max_micro_batch)
    assert regime["sequences_traced"] == 2 and "max_micro_batch" not in regime
    model = built(config, "meta", card["attention"])
    model.bfloat16()
    fresh = measure(trace_step(model, block_list(model), 20000, checkpointing=False, sequences=2), 3)
    block = regime["blocks"][1]
    for phase in ("forward", "backward"):
        predicted = net_and_peak([2 * (q * 20000**2 + a * 20000) + c for q, a, c in block[phase]])
        measured = net_and_peak(fresh["blocks"][block["traced_block"]][phase])
        assert predicted == pytest.approx(measured, rel=0.01), phase
    # one sequence's own requests, held apart for a micro-batch of 1: exact at 20,000 tokens too,
    # where the per-sequence card of two is a quarter over at the forward's peak
    one = measure(trace_step(model, block_list(model), 20000, checkpointing=False, sequences=1), 3)
    single = regime["single_sequence"]["blocks"][1]
    for phase in ("forward", "backward"):
        predicted = net_and_peak([q * 20000**2 + a * 20000 + c for q, a, c in single[phase]])
        measured = net_and_peak(one["blocks"][single["traced_block"]][phase])
        assert predicted == pytest.approx(measured, rel=0.01), phase
    per_sequence = net_and_peak([q * 20000**2 + a * 20000 + c for q, a, c in block["forward"]])
    assert per_sequence[1] > 1.2 * net_and_peak(one["blocks"][block["traced_block"]]["forward"])[1]
    key = cards.config_key(config)
    written = cards.read_card(cards.write_card(tmp_path / "exact", key, cards.dumps_card(card, key, path.name),
                                               replace=False))
    assert written.regime(4096, 1) is written.regimes[0].single_sequence is not None
    assert written.regime(4096, 2) is written.regimes[0]
    regime["max_micro_batch"] = 2  # as a card whose memory outgrows the micro-batch records it
    cards.write_card(tmp_path / "cards", key, cards.dumps_card(card, key, path.name), replace=False)
    short = zlayout("plan", "--hf-config", str(path), "--gpu", "h200", "--seq", "1024", cards_dir=tmp_path / "cards")
    assert short.returncode == 2
    assert short.stderr.strip().splitlines()[-1].endswith(
        "model card holds sequences of 2,048 tokens or more (its memory steps with shorter ones: zlayout "
        "learn); use --seq 2048 or more")
    default = zlayout("plan", "--hf-config", str(path), "--gpu", "h200", cards_dir=tmp_path / "cards")
    assert default.returncode == 0, default.stderr
    assert ", seq 2048," in default.stdout  # the default, the shortest this card holds
    long = zlayout("plan", "--hf-config", str(path), "--gpu", "h200", "--seq", "32768", "--micro-batch", "2",
                   cards_dir=tmp_path / "cards")
    assert long.returncode == 0, long.stderr
    wide = zlayout("plan", "--hf-config", str(path), "--gpu", "h200", "--seq", "4096", "--micro-batch", "4",
                   cards_dir=tmp_path / "cards")
    assert wide.returncode == 2 and "grows faster than the micro-batch" in wide.stderr
    assert wide.stderr.strip().splitlines()[-1].endswith("use --micro-batch 2 or less and a larger --grad-accum")


def test_a_model_holding_fewer_positions_than_the_counts_traced_is_learned_within_them(tmp_path):
    """GPT-Neo's causal mask buffer holds max_position_embeddings rows: 1,024-4,096 tokens cannot run
    (nor train). Traced within its 512 positions, the card says so and plan refuses a longer --seq."""
    path = CARD_ONLY / "gpt_neo-tiny.json"
    done = zlayout("learn", "--hf-config", str(path), cards_dir=tmp_path / "cards")
    assert done.returncode == 0, done.stderr
    assert "fitted at 128, 256, 384 tokens" in done.stdout and "the model holds 512 positions" in done.stdout
    card = cards.read_card(next((tmp_path / "cards").glob("*.toml")))
    assert card.longest_sequence == 512 and card.regimes[-1].max_tokens is None
    fits = zlayout("plan", "--hf-config", str(path), "--gpu", "h200", "--seq", "512", cards_dir=tmp_path / "cards")
    assert fits.returncode == 0, fits.stderr
    default = zlayout("plan", "--hf-config", str(path), "--gpu", "h200", cards_dir=tmp_path / "cards")
    assert default.returncode == 0 and "--seq defaults to 512, the positions gpt_neo-tiny holds" in default.stderr
    past = zlayout("plan", "--hf-config", str(path), "--gpu", "h200", "--seq", "1024", cards_dir=tmp_path / "cards")
    assert past.returncode == 2
    assert past.stderr.strip().splitlines()[-1].endswith("a sequence of 1,024 tokens runs past them; use --seq 512 or less")


def test_a_padding_mask_a_model_makes_of_ones_is_all_ones_on_the_meta_device():
    """BART's decoder (its ForCausalLM) makes an all-ones padding mask when given none, and
    transformers asks whether it is all ones (`fast_all`, an `.item()`) to skip the causal mask for
    sdpa's is_causal: on a GPU it is, so flash runs. On meta the question had no answer and the
    learn was refused ("reads tensor values")."""
    config = {"model_type": "bart", "architectures": ["BartForCausalLM"], "d_model": 64, "decoder_layers": 2,
              "encoder_layers": 2, "decoder_attention_heads": 4, "encoder_attention_heads": 4,
              "decoder_ffn_dim": 128, "encoder_ffn_dim": 128, "vocab_size": 256, "max_position_embeddings": 1024,
              "dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0}
    card = learn(config)
    assert card["attention_kernels"] == ["flash"]
    assert card["regimes"][-1]["max_positions"] == 1024


@pytest.mark.parametrize("is_decoder", [False, True])
def test_a_bert_like_causal_lm_learns_without_reading_its_input(is_decoder):
    """RoFormer's ForCausalLM asks whether its first or last token is padding (a warning:
    `warn_if_padding_and_no_attention_mask`) and, as a bidirectional model (its config's default),
    whether its padding mask is all ones (`_ignore_bidirectional_mask_sdpa`): both read a value,
    and the learn was refused. Neither changes a tensor of the learner's unpadded input."""
    config = {"model_type": "roformer", "architectures": ["RoFormerForCausalLM"], "hidden_size": 64,
              "embedding_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
              "vocab_size": 256, "max_position_embeddings": 512, "pad_token_id": 0, "is_decoder": is_decoder,
              "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    card = learn(config)
    assert card["parameters"]["count"] == sum(p.numel() for p in build_model(config)[0].parameters())
    assert card["regimes"][-1]["max_positions"] == 512


def test_a_config_whose_class_builds_another_depth_than_its_keys_read_is_refused(tmp_path):
    """Dory's config class halves a layer_types list that names "mlp" entries (8 listed, 4 blocks
    built) and runs its middle blocks in loops: the card learned from the file holds 4 blocks, and
    resizing it to the 8 layers the keys read planned another model (its default config: 3.98B
    parameters planned as 7.28B). The plan refuses in one line."""
    path = CARD_ONLY / "dory-tiny.json"
    assert zlayout("learn", "--hf-config", str(path), cards_dir=tmp_path / "cards").returncode == 0
    planned = zlayout("plan", "--hf-config", str(path), "--gpu", "h200", "--seq", "1024", cards_dir=tmp_path / "cards")
    assert planned.returncode == 2 and planned.stdout == ""
    line = planned.stderr.strip().splitlines()[-1]
    assert "the config names 8 layers, but transformers builds 4 blocks from it" in line
    assert "cannot plan from its card" in line


def test_a_learned_position_table_no_config_key_names_limits_the_sequence(tmp_path):
    """Whisper's decoder (its ForCausalLM) holds max_target_positions rows of positions, a key the
    learner does not read: its traces run past them on the meta device, where an index does not
    stop, and the card still holds the table's rows from the model itself (learner.position_table)."""
    path = CARD_ONLY / "whisper-tiny.json"
    done = zlayout("learn", "--hf-config", str(path), cards_dir=tmp_path / "cards")
    assert done.returncode == 0, done.stderr
    assert "the model holds 448 positions" in done.stdout
    default = zlayout("plan", "--hf-config", str(path), "--gpu", "h200", cards_dir=tmp_path / "cards")
    assert default.returncode == 0 and "--seq defaults to 448" in default.stderr
    past = zlayout("plan", "--hf-config", str(path), "--gpu", "h200", "--seq", "512", cards_dir=tmp_path / "cards")
    assert past.returncode == 2
    assert past.stderr.strip().splitlines()[-1].endswith("a sequence of 512 tokens runs past them; use --seq 448 or less")


def test_a_decoder_only_causal_lm_of_an_encoder_decoder_family_is_planned_at_its_decoder_depth(tmp_path, monkeypatch):
    """ProphetNet's ForCausalLM is its decoder, whose depth is num_decoder_layers (no num_hidden_layers
    in its config): the plan reads that key, and `--layers` changes it in the config verify builds."""
    from zlayout import hfconfig

    path = CARD_ONLY / "prophetnet-tiny.json"
    assert zlayout("learn", "--hf-config", str(path), cards_dir=tmp_path / "cards").returncode == 0
    planned = zlayout("plan", "--hf-config", str(path), "--gpu", "h200", "--seq", "256", cards_dir=tmp_path / "cards")
    assert planned.returncode == 0, planned.stderr
    assert "(L2 h64 heads 4 " in planned.stdout
    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(tmp_path / "cards"))
    model = hfconfig.load(str(path)).with_layers(1)
    built = hfconfig.config_to_build(json.loads(path.read_text()), model)
    assert (built["num_decoder_layers"], built["num_encoder_layers"]) == (1, 3)


def test_parameters_the_device_context_does_not_reach_are_moved_to_the_meta_device():
    """DiffLlama makes its attention's lambdas with `torch.normal(0, std, size=...)`, which the
    meta device context does not reach: they were CPU tensors, and their gradients' copy back
    from the meta device stopped the backward ("Cannot copy out of meta tensor"). The learner
    moves them as the run's `model.to(device)` does: the model learns, every parameter counted."""
    config = json.loads((CARD_ONLY / "diffllama-tiny.json").read_text())
    model, _ = build_model(config)
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert any(name.endswith("lambda_q1") for name, _ in model.named_parameters())
    card = learn(config)
    assert card["parameters"]["count"] == sum(p.numel() for p in model.parameters())
    assert [tuple(shape) for shape in card["parameters"]["shapes"]] == [tuple(p.shape) for p in model.parameters()]


def test_lfm2s_short_convolution_is_learned_from_transformers_torch_code():
    """LFM2's conv blocks call `causal_conv1d_fn`, which transformers binds to causal-conv1d's kernel
    where it imports and to its own torch code (a depthwise conv1d, a slice) where not. No scan:
    the learner runs the torch code, what a node without causal-conv1d trains, as any other op.
    LFM2-1.2B: its two kinds of block (conv, attention), every parameter, the conv's padded output
    (T + 2 positions) in the conv block's forward."""
    path = PUBLISHED / "LFM2-1.2B.json"
    config = json.loads(path.read_text())
    card = learn(config)
    assert card["parameters"]["count"] == 1_170_340_608
    regime = card["regimes"][-1]
    assert sorted(block["kind"] for block in regime["blocks"]) == [0, 1]
    conv, attention = sorted(regime["blocks"], key=lambda b: b["kind"])  # layer 0 is a conv block
    hidden = config["hidden_size"]
    # the conv's output before the slice: T and a few padded positions x hidden in bf16, one sequence
    padded = [c for q, a, c in conv["forward"] if q == 0 and a == 2 * hidden and c > 0]
    assert padded and all(c <= 8 * hidden for c in padded)
    assert not any(q == 0 and a == 2 * hidden and c > 0 for q, a, c in attention["forward"])
    # LFM2 ties its head under a key of its own (`tie_embedding`): the card says what was built, and
    # the plan takes it with the card's parameter count (the host builds the head's fp32 weight
    # before tying it: h200-2026-12-21 measured 5.69 GiB, the plan said 5.44 untied)
    assert card["parameters"]["tied_embeddings"] is True
    from zlayout import hfconfig

    model = hfconfig.load(path)
    assert model.tie_embeddings and model.params == 1_170_340_608 and model.card.tied_embeddings


def test_a_position_table_with_a_padding_row_holds_the_rows_after_it():
    """RoBERTa's positions start at padding_idx + 1: of 514 rows (xlm-roberta-xl's), 512 hold
    positions; a sequence of 513 would index past the table on a GPU."""
    from zlayout.learn.learner import position_table

    config = {"model_type": "xlm-roberta-xl", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
              "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 514, "pad_token_id": 1,
              "is_decoder": True}
    model, _ = build_model(config)
    assert position_table(model) == 512
    assert learn(config)["regimes"][-1]["max_positions"] == 512


def test_bigbird_keeps_the_block_sparse_attention_it_trains_with_at_its_4096_positions():
    """BigBird turns its block-sparse attention into full attention, in the model and for good, on a
    sequence of 704 tokens or fewer. The learner's first short probe did that, and the next trace
    failed (gather() of None); and its 4,096-row table could not run the long check (16,384 tokens).
    It is now probed at the first count traced and learned within its positions: the card prices
    block-sparse attention (no FLOPs growing with T x T), where the same config in full attention
    has them."""
    def card(attention_type):
        config = AutoConfig.for_model("big_bird", num_hidden_layers=2, hidden_size=64, num_attention_heads=2,
                                      intermediate_size=128, vocab_size=128, attention_type=attention_type)
        return learn(config.to_dict())["regimes"][-1]

    def quadratic_flops(regime):
        return sum(entry[0][0] for entry in regime["blocks"][0]["work"]["forward"].values())

    sparse, full = card("block_sparse"), card("original_full")
    assert sparse["max_positions"] == full["max_positions"] == 4096
    assert quadratic_flops(sparse) == 0 and quadratic_flops(full) > 0


# XGLM at two blocks of width 64: its 2,048-row float32 sinusoidal table
XGLM_TINY = {"model_type": "xglm", "d_model": 64, "num_layers": 2, "attention_heads": 4, "ffn_dim": 128,
             "vocab_size": 256, "max_position_embeddings": 2048, "dropout": 0.0, "attention_dropout": 0.0,
             "activation_dropout": 0.0}


def test_a_buffer_the_first_step_grows_is_grown_before_the_traces():
    """XGLM's sinusoidal table holds 2,048 rows and is made again, longer, by a step past them, as a
    run's first step does once. The traces are of the steps after it (before: the 4,096-token trace
    made more requests than the 1,024-token one, and the card was refused as another path)."""
    card = learn(XGLM_TINY)
    regime, = card["regimes"]
    assert regime["tokens_fitted"] == [1024, 2048, 4096] and "min_tokens" not in regime


def test_a_class_transformers_cannot_checkpoint_is_learned_without_and_planned_without(tmp_path):
    """openai-gpt's class refuses gradient_checkpointing_enable (as its training run would): the
    learner traces it without checkpointing, and plan refuses --checkpointing full in one line. Its
    once-a-step (1, 1, T, T) mask is less than a card linear in the micro-batch prices: no limit."""
    path = CARD_ONLY / "openai-gpt-tiny.json"
    done = zlayout("learn", "--hf-config", str(path), cards_dir=tmp_path / "cards")
    assert done.returncode == 0, done.stderr
    card = cards.read_card(next((tmp_path / "cards").glob("*.toml")))
    assert card.checkpointing is False and card.largest_micro_batch is None and card.longest_sequence == 512
    plain = zlayout("plan", "--hf-config", str(path), "--gpu", "h200", "--micro-batch", "8",
                    cards_dir=tmp_path / "cards")
    assert plain.returncode == 0, plain.stderr
    refused = zlayout("plan", "--hf-config", str(path), "--gpu", "h200", "--checkpointing", "full",
                      cards_dir=tmp_path / "cards")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1].endswith(
        "transformers' openai-gpt class cannot checkpoint its blocks (gradient_checkpointing_enable refuses it); "
        "use --checkpointing none")


def test_a_package_kernel_with_no_stand_in_is_refused_at_its_first_call():
    """Kimi-Linear's delta attention calls fla's `chunk_kda`, which transformers runs as a torch loop
    over 64-token chunks where fla is not installed: a card of that loop would price neither. The
    learner stops at the first call, in one line (it traced for 300 s before)."""
    with pytest.raises(LearnError, match=r"its layers call `chunk_kda` \(flash-linear-attention's kernel; "
                                         r".*which zlayout has no stand-in for: this model type cannot be learned"):
        learn(json.loads((CARD_ONLY / "kimi_linear-tiny.json").read_text()))


def test_requests_that_grow_in_number_with_the_tokens_are_refused_from_the_first_two_traces():
    """MiniMax's lightning attention loops over 256-token blocks in Python: its requests grow in
    number with the tokens. Each regime stops at its second trace (1,024 and 2,048 tokens, then
    each longer start), and the error names the counts."""
    with pytest.raises(LearnError, match=r"requests differ in number between token counts \(2,629 at 8,192 "
                                         r"tokens, 4,485 at 16,384\): its code loops over the sequence in Python "
                                         r".*plan a transformer of its size with --layers --hidden --heads --vocab$"):
        learn(json.loads((CARD_ONLY / "minimax-tiny.json").read_text()))


def test_blocks_the_config_types_differently_are_kinds_apart_even_with_the_same_weights():
    """DeepSeek-V4's first blocks route tokens to experts by a hash of their ids (mlp_layer_types
    'hash_moe'), the rest by a learned gate, with the same parameter shapes."""
    from zlayout.learn.learner import block_kinds, per_block_types

    blocks = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(4))
    config = {"layer_types": ["full", "sliding", "full", "full"], "mlp_layer_types": ["hash", "moe", "moe", "moe"],
              "expert_types": ["a", "b"], "other": ["x", "x", "x", "x"]}
    assert per_block_types(config, 4) == [config["layer_types"], config["mlp_layer_types"]]
    assert block_kinds(blocks, per_block_types(config, 4)) == [0, 1, 2, 2]
    assert block_kinds(blocks) == [0, 0, 0, 0]


def test_a_sliding_window_model_gets_a_regime_up_to_the_window_and_one_past_it():
    config = small_config("gemma2")  # sliding_window 128, eager attention
    assert [r[0] for r in regimes_to_trace(config)] == [127, None]
    card = learn(config)
    assert card["attention"] == "eager"
    assert [r.get("max_tokens") for r in card["regimes"]] == [127, None]


def test_attention_past_a_sliding_window_is_recorded_as_masked_over_the_full_square():
    """Up to the window transformers calls SDPA with is_causal (the kernel skips the tiles above the
    diagonal: half the square); from the window on it passes the window as an explicit mask, which
    no kernel skips a tile of: the full square, recorded under the masked ops' names."""
    config = {**small_config("phi3"), "sliding_window": 64}  # hidden 96: 4 q . k / p . v FLOPs x hidden
    card = learn(config)
    below, past = (regime["blocks"][0]["work"] for regime in card["regimes"])
    assert [r.get("max_tokens") for r in card["regimes"]] == [63, None]
    for phase in ("forward", "backward"):
        assert f"masked_attention_{phase}" not in below[phase] and f"attention_{phase}" not in past[phase]
    assert below["forward"]["attention_forward"][0][0] == 4 * 96 / 2  # T^2 coefficient: causal, halved
    assert past["forward"]["masked_attention_forward"][0][0] == 4 * 96  # the full square
    assert past["backward"]["masked_attention_backward"][0][0] == 10 * 96


@pytest.mark.parametrize("dropout", [0.1, 0.0])
def test_attention_dropout_is_recorded_as_the_scores_it_draws_for(dropout):
    """GPT-2 passes its attn_pdrop to SDPA (dropout_p, is_causal): the fused kernel draws a random
    number per score it computes, forward and again in the backward, and launches nothing more.
    The card counts those scores (heads x T^2 / 2, causal) under their own names; without dropout
    there are none."""
    config = {**small_config("gpt2"), "attn_pdrop": dropout}  # 4 heads
    card = learn(config)
    assert card["attention"] == "sdpa"
    work = card["regimes"][0]["blocks"][0]["work"]
    for phase in ("forward", "backward"):
        if dropout:
            scores = work[phase][f"attention_dropout_{phase}"]
            assert scores[0] == [4 / 2, 0, 0]  # T^2 coefficient per sequence: 4 heads, the causal half
            assert all(v == 0 for row in scores[1:] for v in row)  # no kernel, no bytes, no op of its own
        else:
            assert f"attention_dropout_{phase}" not in work[phase]


def test_full_attention_layers_among_sliding_ones_are_their_own_kind_without_the_masks_bias():
    """Gemma-3's full-attention layers have the sliding layers' weights but run causal flash with no
    mask: a kind of their own (the config's layer_types), saving no batch x queries x keys bias."""
    config = {**small_config("gemma3_text"), "num_hidden_layers": 3, "sliding_window": 64,
              "layer_types": ["sliding_attention", "sliding_attention", "full_attention"]}
    card = learn(config)
    assert card["layers"]["kinds"] == [0, 0, 1]
    past = next(regime for regime in card["regimes"] if regime.get("max_tokens") is None)
    square = {block["kind"]: block["saved_by_dtype"]["bfloat16"][0] for block in past["blocks"]}
    assert square[0] > 0 and square[1] == 0  # the T^2 term: the sliding calls' bias only


@pytest.mark.slow  # zlayout learn in a subprocess: transformers' import each time
def test_learn_writes_the_card_plan_then_takes_its_activations(tmp_path):
    config = SMALL / "gpt2.json"  # dropout 0.1 and gelu_new: what the hand model under-counts
    plan = ["plan", "--hf-config", str(config), "--seq", "128", "--micro-batch", "64", "--stage", "0",
            "--gpu", "h200", "--json"]
    before = zlayout(*plan, cards_dir=tmp_path)
    assert before.returncode == 0, before.stderr
    assert "no model card" in before.stderr and len(before.stderr.strip().splitlines()) == 1
    learned = zlayout("learn", "--hf-config", str(config), cards_dir=tmp_path)
    assert learned.returncode == 0, learned.stderr
    written = list(tmp_path.glob("*.toml"))
    assert [p.stem for p in written] == [cards.config_key(json.loads(config.read_text()))]
    after = zlayout(*plan, cards_dir=tmp_path)
    assert after.returncode == 0 and "no model card" not in after.stderr
    hand = {t["name"]: t["bytes"] for t in json.loads(before.stdout)["terms"]}
    carded = {t["name"]: t["bytes"] for t in json.loads(after.stdout)["terms"]}
    # dropout masks and gelu_new's intermediates: more saved per block than the hand model
    assert carded["activations"] > 1.3 * hand["activations"]
    assert json.loads(after.stdout)["params"] == json.loads(before.stdout)["params"]
    # the same config cut to other depths finds this card through by-depth/, resized
    assert [p.parent.name for p in tmp_path.glob("*/*.toml")] == [cards.BY_DEPTH]
    for layers in (1, 4):
        deeper = tmp_path / f"gpt2-L{layers}.json"
        deeper.write_text(json.dumps({**json.loads(config.read_text()), "n_layer": layers}))
        other = zlayout(*plan[:2], str(deeper), *plan[3:], cards_dir=tmp_path)
        assert other.returncode == 0, other.stderr
        assert "learned from the same model at 2 layers; its blocks are planned at" in other.stderr
        terms = {t["name"]: t["bytes"] for t in json.loads(other.stdout)["terms"]}
        assert terms["activations"] * 2 == carded["activations"] * layers


@pytest.mark.slow  # zlayout learn in a subprocess: transformers' import each time
def test_learn_refuses_to_write_over_a_card_unless_forced_and_never_over_another_file(tmp_path):
    config = SMALL / "llama-defaults.json"
    key = cards.config_key(json.loads(config.read_text()))
    assert zlayout("learn", "--hf-config", str(config), cards_dir=tmp_path).returncode == 0
    again = zlayout("learn", "--hf-config", str(config), cards_dir=tmp_path)
    assert again.returncode == 2 and "--force" in again.stderr and len(again.stderr.strip().splitlines()) == 1
    assert zlayout("learn", "--hf-config", str(config), "--force", cards_dir=tmp_path).returncode == 0
    other = tmp_path / "other"
    other.mkdir()
    (other / f"{key}.toml").write_text("notes = 'mine'\n")
    refused = zlayout("learn", "--hf-config", str(config), "--out", str(other), "--force", cards_dir=tmp_path)
    assert refused.returncode == 2 and "only over its own cards" in refused.stderr
    assert (other / f"{key}.toml").read_text() == "notes = 'mine'\n"


@pytest.mark.slow  # zlayout learn in a subprocess: transformers' import each time
def test_a_remote_code_config_is_one_line(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "internlm2", "auto_map": {"AutoModelForCausalLM": "m.M"}}))
    with pytest.raises(LearnError, match="own remote code"):
        learn(json.loads(path.read_text()))
    result = zlayout("learn", "--hf-config", str(path), cards_dir=tmp_path)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1


def test_a_damaged_card_is_one_line_naming_it(tmp_path):
    config = json.loads((SMALL / "llama-defaults.json").read_text())
    key = cards.config_key(config)
    (tmp_path / f"{key}.toml").write_text(f"{cards.HEADER}\nformat = 1\n[parameters]\ncount = 5\nshapes = [[2]]\n")
    with pytest.raises(CardError) as raised:
        cards.read_card(tmp_path / f"{key}.toml")
    assert "\n" not in str(raised.value) and key in str(raised.value)


def plan_json(argv: list[str]) -> dict:
    import contextlib
    import io

    from zlayout.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(argv) == 0
    return json.loads(out.getvalue())


def test_the_shipped_card_turns_a_fits_the_hand_model_says_into_the_card_s_verdict(monkeypatch, tmp_path):
    """GPT-2 (dropout 0.1, gelu_new) at micro-batch 112 x 1024 on one H200, ZeRO-0: the hand
    model's activations put it at 109 GiB and say it fits; its card's (dropout masks, gelu_new's
    intermediates) put it past the card, and the verdict follows the larger figure."""
    published = Path(__file__).resolve().parent.parent / "hf" / "configs" / "published" / "gpt2.json"
    argv = ["plan", "--hf-config", str(published), "--seq", "1024", "--micro-batch", "112", "--stage", "0",
            "--gpu", "h200", "--json"]
    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(tmp_path))
    carded = plan_json(argv)
    monkeypatch.setattr(cards, "SHIPPED_CARDS_DIR", tmp_path)
    hand = plan_json(argv)
    assert carded["model"]["card"] == cards.config_key(json.loads(published.read_text()))
    assert "card" not in hand["model"]
    assert hand["fits"] and not carded["fits"]
    assert carded["gpu_peak_allocated_bytes"] > 1.2 * hand["gpu_peak_allocated_bytes"]


def test_a_card_records_each_ops_work_and_dropout_lengthens_the_step(tmp_path, monkeypatch):
    """The same GPT-2 shape with and without dropout: the hand model prices both alike; the cards
    record dropout's kernels (a mask per dropout, its backward) and bytes, and the step takes them.
    The card's matmuls are the model's: 2 FLOPs per block weight per token."""
    from zlayout.cli import build_parser, plan_input_from_args
    from zlayout.core.steptime import estimate_step_time, hand_work, micro_step_work
    from zlayout.spec import Layout

    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(tmp_path / "cards"))
    dropout = small_config("gpt2")  # transformers' GPT-2 defaults: dropout 0.1 in three places
    plain = {**dropout, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    runs = {}
    for name, config in (("dropout", dropout), ("plain", plain)):
        key = cards.config_key(config)
        cards.write_card(tmp_path / "cards", key, cards.dumps_card(learn(config), key, name), replace=False)
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(config))
        inp = plan_input_from_args(build_parser().parse_args(
            ["plan", "--hf-config", str(path), "--seq", "128", "--micro-batch", "64", "--gpu", "h200"]))
        assert inp.model.card is not None and inp.model.card.has_work()
        runs[name] = inp
    layout = Layout(stage=0)
    blocks_fwd = runs["plain"].model.card.pass_work(64, 128, checkpointing=False)[0]
    h, ffn = 64, 200
    assert blocks_fwd.gemm_flops == pytest.approx(2 * 64 * 128 * 2 * (4 * h * h + 2 * h * ffn))
    with_dropout, without = (micro_step_work(runs[n], layout) for n in ("dropout", "plain"))
    for a, b in zip(with_dropout, without):
        assert a.gemm_flops == pytest.approx(b.gemm_flops)
        assert a.hbm_bytes > b.hbm_bytes and a.kernels > b.kernels
    assert hand_work(runs["dropout"]) == hand_work(runs["plain"])
    assert estimate_step_time(runs["dropout"], layout).step_time_s > estimate_step_time(runs["plain"], layout).step_time_s


def test_a_card_counts_the_module_calls_zero3_hooks_run_on(tmp_path, monkeypatch):
    """DeepSpeed's ZeRO-3 hooks every module; a forward runs them on each module it calls. Llama's
    decoder layer calls 13 (itself, attention, q/k/v/o, MLP, gate/up/down, the activation, two
    norms), Qwen3's two more (q_norm, k_norm); outside the blocks the CausalLM, the model, the
    embedding, the rotary tables, the final norm and the head: 6. The step time reads them."""
    from zlayout.cli import build_parser, plan_input_from_args
    from zlayout.core.steptime import stage3_hooked_modules

    assert learn(small_config("llama-defaults"))["layers"]["module_calls"] == [13]
    config = small_config("qwen3-head-dim")
    card = learn(config)
    assert card["layers"]["module_calls"] == [15] and card["layers"]["module_calls_outside"] == 6
    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(tmp_path / "cards"))
    key = cards.config_key(config)
    cards.write_card(tmp_path / "cards", key, cards.dumps_card(card, key, "qwen3"), replace=False)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    for layers in (card["layers"]["count"], 7):  # at its own depth, and resized
        inp = plan_input_from_args(build_parser().parse_args(
            ["plan", "--hf-config", str(path), "--layers", str(layers), "--stage", "3"]))
        assert inp.model.card is not None
        assert stage3_hooked_modules(inp) == 15 * layers + 6


def test_dropout_keeps_a_one_byte_mask_as_on_cuda():
    """CUDA's dropout is the fused kernel, which keeps a boolean mask; on the meta device torch
    draws bf16 noise instead (two bytes an element: h200-2026-12-15's starcoderbase-1b card was
    3.1% over its run). GPT-2's two residual dropouts (hidden 64) keep 128 bytes a token, bool,
    and the bf16 it keeps is the dropout-free card's."""
    dropout = small_config("gpt2")
    plain = {**dropout, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    saved = {name: learn(config)["regimes"][0]["blocks"][0]["saved_by_dtype"]
             for name, config in (("dropout", dropout), ("plain", plain))}
    assert saved["dropout"]["bool"] == [0.0, 2 * 64, 0.0] and "bool" not in saved["plain"]
    assert saved["dropout"]["bfloat16"] == saved["plain"]["bfloat16"]


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    import contextlib
    import io

    from zlayout.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def test_a_type_without_a_hand_reader_plans_once_learned_with_the_exact_count(tmp_path, monkeypatch):
    """OLMoE (no hand reader) at a small size: before `zlayout learn` the plan is one line naming
    the command; after it, the plan reads the card: transformers' exact count, 8 experts top-2
    from the config's keys, the card's activations."""
    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(tmp_path / "cards"))
    config = {"model_type": "olmoe", "hidden_size": 64, "intermediate_size": 32, "num_hidden_layers": 3,
              "num_attention_heads": 4, "num_key_value_heads": 2, "num_experts": 8, "num_experts_per_tok": 2,
              "vocab_size": 256, "tie_word_embeddings": False, "eos_token_id": 1, "pad_token_id": 0}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    plan = ["plan", "--hf-config", str(path), "--seq", "256", "--gpus-per-node", "2", "--gpu", "h200",
            "--stage", "3", "--json"]
    code, _, err = run_cli(plan)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"zlayout learn --hf-config {path}" in err and "Traceback" not in err
    code, out, err = run_cli(["learn", "--hf-config", str(path)])
    assert code == 0, err
    code, out, err = run_cli(plan)
    assert code == 0, err
    planned = json.loads(out)
    hf_config = AutoConfig.for_model(**config)
    with torch.device("meta"):
        built = AutoModelForCausalLM.from_config(hf_config)
    assert planned["params"] == sum(p.numel() for p in built.parameters())
    assert planned["model"]["card"] == cards.config_key(config)
    assert (planned["model"]["experts"], planned["model"]["top_k"]) == (8, 2)
    activations = {t["name"]: t["bytes"] for t in planned["terms"]}["activations"]
    assert activations > 0 and planned["gpu_peak_allocated_bytes"] > 0 and planned["step_time_s"] > 0
    code, out, _ = run_cli(plan[:-1])  # the table: figures, no traceback
    assert code == 0 and "K params (L3 h64 heads 4/2 kv" in out.splitlines()[0] and "8 experts, top-2" in out
    assert "ZeRO-3" in out and "Traceback" not in out


def test_a_config_the_model_code_cannot_run_is_one_line_exit_2(tmp_path, monkeypatch):
    """DeepSeek-V3 with 8 expert groups over 12 routed experts: its router's topk fails ("k not
    in range for dimension"); learn says so in one line naming the model type, exit 2."""
    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(tmp_path / "cards"))
    config = {**small_config("deepseek_v3"), "n_routed_experts": 12, "n_group": 8, "topk_group": 4}
    with pytest.raises(LearnError, match="'deepseek_v3'.*RuntimeError: k not in range"):
        learn(config)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    code, out, err = run_cli(["learn", "--hf-config", str(path)])
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "'deepseek_v3'" in err and "k not in range" in err and "Traceback" not in err
    assert not (tmp_path / "cards").exists() or not list((tmp_path / "cards").iterdir())


def test_a_model_whose_code_reads_tensor_values_is_one_line_saying_so(tmp_path, monkeypatch):
    """Qwen4-Exp's indexer selects each query's tokens with torch.nonzero: on the meta device there
    are no values. learn says that (not that the config is wrong), in one line, exit 2."""
    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(tmp_path / "cards"))
    code, out, err = run_cli(["learn", "--hf-config", str(CARD_ONLY / "qwen4_exp_text-tiny.json")])
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "'qwen4_exp_text' code reads tensor values" in err and "meta device" in err
    assert "cannot run this config" not in err and "Traceback" not in err


def learned_and_planned(config: dict, tmp_path: Path, monkeypatch) -> str:
    """`zlayout learn` then `zlayout plan` on the config written to a file, the card cached under
    tmp_path: plan's output (one GPU, 512 tokens)."""
    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(tmp_path / "cards"))
    path = tmp_path / f"{config['model_type']}.json"
    path.write_text(json.dumps(config))
    assert run_cli(["learn", "--hf-config", str(path)])[0] == 0
    code, out, err = run_cli(["plan", "--hf-config", str(path), "--gpus-per-node", "1", "--seq", "512"])
    assert code == 0, err
    return out


def test_xlm_asserting_on_its_longest_length_is_learned_and_planned(tmp_path, monkeypatch):
    """XLM asserts `lengths.max().item() <= slen` (and again in get_masks): the learner answers the
    sequence's length, what an unpadded row's is, inside XLMModel.forward only; the card has
    transformers' parameter count and `Tensor.item` is torch's own again afterwards. The plan reads
    its width from `emb_dim` (no hidden_size key)."""
    original = torch.Tensor.item
    config = AutoConfig.for_model("xlm", n_layers=2, emb_dim=64, n_heads=2, vocab_size=128).to_dict()
    card = learn(config)
    assert torch.Tensor.item is original and torch.tensor(3).item() == 3
    assert card["parameters"]["count"] == sum(p.numel() for p in build_model(config)[0].parameters())
    assert card["layers"]["count"] == 2 and card["regimes"][-1]["max_positions"] == 512
    out = learned_and_planned(config, tmp_path, monkeypatch)
    assert out.startswith("xlm: 141K params (L2 h64 heads 2 ffn 256 vocab 128)")


def test_jetmoe_routing_read_as_python_ints_is_learned_as_an_even_split():
    """JetMoE's router turns its per-expert counts into Python ints (`.tolist()`) to cut the
    token-expert rows: the learner answers an even split within the router only, so the card is
    learned with transformers' parameter count, every expert's GEMMs together doing the whole
    rows' work, and `Tensor.tolist` is torch's own again afterwards (and for any other tensor)."""
    from zlayout.learn.trace import even_split

    assert even_split(10, 4) == [3, 3, 2, 2] and sum(even_split(4096 * 2, 8)) == 8192
    original = torch.Tensor.tolist
    config = AutoConfig.for_model("jetmoe", num_hidden_layers=2, hidden_size=64, kv_channels=16,
                                  num_key_value_heads=2, intermediate_size=64, vocab_size=128).to_dict()
    card = learn(config)
    assert torch.Tensor.tolist is original and torch.tensor([1, 2]).tolist() == [1, 2]
    assert card["parameters"]["count"] == sum(p.numel() for p in build_model(config)[0].parameters())
    assert len(card["regimes"][0]["blocks"]) >= 1
    # GEMM FLOPs per token: each of top-k rows through one expert of the MoE (h -> 2f, f -> h) and of the
    # MoA (h -> kv, kv -> h), two routers (h -> experts) and the shared k/v projection (h -> 2 kv)
    h, f, kv = config["hidden_size"], config["intermediate_size"], config["kv_channels"] * config["num_key_value_heads"]
    top_k, experts = config["num_experts_per_tok"], config["num_local_experts"]
    forward = card["regimes"][0]["blocks"][0]["work"]["forward"]
    assert forward["mm"][0][1] == 2 * (top_k * (h * 2 * f + f * h + h * kv + kv * h) + 2 * h * experts + h * 2 * kv)


def test_dbrx_looping_over_the_experts_it_hit_is_learned_as_an_even_split_and_planned(tmp_path, monkeypatch):
    """DBRX's experts loop in Python over `(mask.sum(...) > 0).nonzero()` and take each expert's
    tokens with `torch.where(mask[e])`: the learner answers every expert hit and an even share of
    the tokens x top-k rows each, inside DbrxExperts.forward only. The card has transformers'
    parameter count, the experts' GEMMs together do the whole rows' work, and `torch.where` and
    `Tensor.nonzero` are torch's own afterwards. The plan reads the shape DBRX nests (its KV heads
    in attn_config; width, experts, top-k in ffn_config; GLU experts, silu by default): the shape's
    count is the card's (no parameters unaccounted) and its active share is top-k of the experts."""
    original_where, original_nonzero = torch.where, torch.Tensor.nonzero
    config = AutoConfig.for_model("dbrx", n_layers=2, d_model=64, n_heads=4, vocab_size=128, max_seq_len=2048,
                                  attn_config={"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0},
                                  ffn_config={"ffn_hidden_size": 96, "moe_num_experts": 8, "moe_top_k": 2}).to_dict()
    card = learn(config)
    assert torch.where is original_where and torch.Tensor.nonzero is original_nonzero
    assert torch.tensor([0, 3]).nonzero().tolist() == [[1]]
    assert card["parameters"]["count"] == sum(p.numel() for p in build_model(config)[0].parameters())
    h, f = 64, 96
    forward = card["regimes"][0]["blocks"][0]["work"]["forward"]
    # per token: q, k, v (4 + 2 + 2 heads of 16), out; the router; top-k experts' w1, v1, w2
    assert forward["mm"][0][1] == 2 * (h * (h + 2 * 32) + h * h + h * 8 + 2 * 3 * h * f)
    out = learned_and_planned(config, tmp_path, monkeypatch)
    assert "heads 4/2 kv ffn 96 vocab 128; 8 experts, top-2" in out.splitlines()[0]
    model = hfconfig.model_from_config(config, card=cards.find_card(config))
    assert model.mlp == "swiglu" and model.extra_params == 0
    # a nested key's error names it where it is
    broken = {**config, "ffn_config": {**config["ffn_config"], "moe_top_k": "two"}}
    with pytest.raises(hfconfig.HfConfigError, match=r"'ffn_config\.moe_top_k' must be a whole number"):
        hfconfig.model_from_config(broken, card=cards.find_card(config))


def test_a_card_learned_before_attention_dropout_was_priced_is_named(tmp_path):
    """A cached card of a model with attention dropout, learned before its scores were counted, plans
    with one note saying its step time is under and how to learn it again; learned now, no note; a
    model without attention dropout gets none either way."""
    for dropout, noted in ((0.1, True), (0.0, False)):
        config = {**small_config("gpt2"), "attn_pdrop": dropout}
        path = tmp_path / f"gpt2-{dropout}.json"
        path.write_text(json.dumps(config))
        card = learn(config)
        assert card["attention_dropout_counted"] is True
        older = {k: v for k, v in card.items() if k != "attention_dropout_counted"}
        key = cards.config_key(config)
        cards.write_card(tmp_path, key, cards.dumps_card(older, key, path.name), replace=False)
        run = zlayout("plan", "--hf-config", str(path), "--gpus-per-node", "1", "--seq", "128", cards_dir=tmp_path)
        assert run.returncode == 0, run.stderr
        assert ("learned before zlayout priced attention dropout" in run.stderr) == noted, run.stderr
        (tmp_path / f"{key}.toml").unlink()
        cards.write_card(tmp_path, key, cards.dumps_card(card, key, path.name), replace=False)
        again = zlayout("plan", "--hf-config", str(path), "--gpus-per-node", "1", "--seq", "128", cards_dir=tmp_path)
        assert again.returncode == 0 and "attention dropout" not in again.stderr, again.stderr


def test_a_card_learned_before_attention_kernels_were_priced_is_named(tmp_path):
    """A cached card without `attention_kernels` (learned by an older zlayout, which priced every
    sdpa call as flash) still plans, with one note saying how to learn it again."""
    config = small_config("falcon-multi-query")
    path = tmp_path / "falcon.json"
    path.write_text(json.dumps(config))
    card = learn(config)
    assert card["attention_kernels"] == ["math"]  # 4 query heads against 1 kv head: no fused kernel
    card.pop("attention_kernels")
    key = cards.config_key(config)
    cards.write_card(tmp_path, key, cards.dumps_card(card, key, "falcon.json"), replace=False)
    run = zlayout("plan", "--hf-config", str(path), "--gpus-per-node", "1", "--seq", "512", cards_dir=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "learned before zlayout priced the attention kernel" in run.stderr
    assert f"zlayout learn --force --hf-config {path}" in run.stderr
    (tmp_path / f"{key}.toml").unlink()
    cards.write_card(tmp_path, key, cards.dumps_card(learn(config), key, "falcon.json"), replace=False)
    again = zlayout("plan", "--hf-config", str(path), "--gpus-per-node", "1", "--seq", "512", cards_dir=tmp_path)
    assert again.returncode == 0 and "learned before" not in again.stderr


def test_experts_in_one_bmm_are_recorded_as_gemms_not_attention():
    """Llama-4's experts are one bmm over every expert (`Llama4TextExperts`): recorded as `bmm_wide`,
    every token through all 4 experts; attention's own bmm (eager: two sides the sequence, one a
    head's width) keeps its name."""
    config = json.loads((CARD_ONLY / "llama4_text.json").read_text())
    regime = learn(config)["regimes"][0]
    forward = regime["blocks"][0]["work"]["forward"]
    assert "bmm" not in forward
    h, f, experts = config["hidden_size"], config["intermediate_size"], config["num_local_experts"]
    assert forward["bmm_wide"][0][1] == 2 * experts * 3 * h * f  # FLOPs per token (the linear term)
    eager = learn(small_config("gemma2"))["regimes"][-1]["blocks"][0]["work"]
    assert "bmm" in eager["forward"] and "bmm_wide" not in eager["forward"]


def test_misaligned_rows_are_recorded_apart_and_labels_one_element_off_are_not():
    """GPT-OSS's attention sinks make rows of T + 1 logits: the concatenation, softmax and the
    probabilities' `[..., :-1]` matmul are recorded as misaligned. A multiple-of-8 vocabulary's loss
    is not (its labels `[..., 1:]` are one element off, its log-probabilities aligned); GPT-2's
    50257 is (its log-softmax works row by row on rows off a 16-byte boundary)."""
    oss = learn(json.loads((CARD_ONLY / "gpt_oss.json").read_text()))["regimes"][-1]
    assert {"elementwise_unaligned", "bmm_unaligned"} <= set(oss["blocks"][0]["work"]["forward"])
    assert not any(op.endswith("_unaligned") for op in oss["head"]["work"]["forward"])  # vocabulary 1024
    gpt2 = learn(small_config("gpt2"))["regimes"][0]["head"]["work"]["forward"]  # vocabulary 300
    # its head's matmul reads bfloat16 rows of 600 bytes; the cast to float32 walks the logits as one
    # contiguous run from an aligned start (vectorized), and float32 rows of 1200 bytes are aligned
    assert "mm_unaligned" in gpt2 and "elementwise_unaligned" not in gpt2
    published = json.loads((SMALL.parent / "published" / "gpt2.json").read_text())  # vocabulary 50257
    head = learn(published)["regimes"][0]["head"]["work"]["forward"]
    # the head's matmul reads rows of 100514 bytes; the log-softmax's rows of 201028 bytes are too long
    # for shared memory, and SoftMax.cu's global-memory kernel realigns each row (`_row_softmax_bytes`)
    assert "mm_unaligned" in head and "elementwise_unaligned" not in head


def test_a_softmax_over_long_rows_moves_what_softmax_cu_reads_whatever_the_rows_alignment():
    """CTRL's loss (rows of 246,534 float32, 8 bytes off a 16-byte boundary from the second row on):
    the log-softmax reads each row three times and writes it once, its backward reads the gradient
    twice and the output once and writes one, and neither is misaligned (`cunn_SoftMaxForward`'s
    scalar prologue realigns a row). nll_loss reads one log-probability and one target a row, and its
    backward writes the whole gradient once. A short row (the warp-per-row kernels) keeps its
    one read and one write, and so does a softmax over rows other than the logits' (attention's, as
    long as the tokens: a card's polynomial in the tokens cannot hold SoftMax.cu's switch of kernels
    at a row length)."""
    rows, vocab = 16, 246534
    ledger = StorageLedger(logits_width=vocab)
    logits = torch.zeros(rows, vocab, device="meta", requires_grad=True)
    labels = torch.zeros(rows, dtype=torch.long, device="meta")
    short = torch.zeros(rows, 1000, device="meta")
    scores = torch.zeros(rows, 20000, device="meta")  # as long as attention's rows at 20,000 tokens
    ledger.exclude([logits, labels, short, scores])
    with ledger:
        loss = torch.nn.functional.cross_entropy(logits, labels)
        ledger.run_backward(loss)
        torch.softmax(short, -1)
        torch.softmax(scores, -1)
    row_bytes = rows * vocab * 4
    assert not any(name.endswith("_unaligned") for name in ledger.op_bytes)
    assert ledger.op_bytes["_log_softmax"] == 3 * row_bytes + row_bytes
    assert ledger.op_bytes["_log_softmax_backward_data"] == 2 * row_bytes + row_bytes + row_bytes
    assert ledger.op_bytes["nll_loss_forward"] == rows * (8 + 4) + 4 + 4  # the loss and its total weight
    assert ledger.op_bytes["nll_loss_backward"] == row_bytes + rows * (8 + 4)
    assert ledger.op_bytes["_softmax"] == 2 * rows * 1000 * 4 + 2 * rows * 20000 * 4


def test_pointwise_ops_over_broadcast_or_strided_operands_are_recorded_apart():
    """PyTorch vectorizes a pointwise kernel only when every operand is contiguous in the output's
    shape: the mask added over heads and a transposed operand run on the offset-computing kernel
    and are recorded as `_strided`; the same add over equal contiguous tensors, a reduction and a
    matmul are not."""
    ledger = StorageLedger()
    scores = torch.zeros(2, 4, 64, 64, dtype=torch.bfloat16, device="meta")
    mask = torch.zeros(2, 1, 64, 64, dtype=torch.bfloat16, device="meta")
    x = torch.zeros(64, 32, dtype=torch.bfloat16, device="meta")
    ledger.exclude([scores, mask, x])
    with ledger:
        scores + mask  # broadcast over heads
        scores + scores
        x.t() * 2.0  # a transposed input, its output laid out alike: one contiguous walk
        x.t().contiguous() + x.t()  # one operand transposed unlike the output; the copy is a copy
        x[:, :16].neg_()  # in place on a slice: its output is not one block
        scores.sum(-1)
        x @ x.t()
    assert ledger.op_calls == {"add_strided": 2, "add": 1, "mul": 1, "neg__strided": 1, "sum": 1, "mm": 1,
                               "clone": 1}


def test_the_backward_of_a_gather_by_index_is_recorded_as_a_scatter():
    """`x[perm]` (a MoE block's tokens sorted by expert) is a gather; its backward is an
    accumulating index_put, which CUDA runs sorted, row by row (`_scatter`, priced apart); an
    index_put that writes without accumulating (`inv[perm] = arange`) is an ordinary op."""
    ledger = StorageLedger()
    x = torch.zeros(64, 32, dtype=torch.bfloat16, device="meta", requires_grad=True)
    perm = torch.zeros(256, dtype=torch.long, device="meta")
    ledger.exclude([x, perm])
    with ledger:
        rows = x[perm]
        inverse = torch.empty_like(perm)
        inverse[perm] = torch.arange(256, device="meta")
        ledger.run_backward(rows.sum())
    # the scatter's kernels (zlayout.learn.launches): the index's remainder and stride multiply, the
    # sum's expanded gradient made contiguous, the divide, an arange, a one-tile radix sort of 256
    # indices, indexing_backward_kernel
    assert ledger.op_calls["index_put_scatter"] == 7 and ledger.op_calls["index_put_"] == 1
    assert "index_put" not in ledger.op_calls and ledger.op_calls["index"] == 1


def test_a_moe_blocks_routing_ops_count_the_kernels_cuda_launches_for_them():
    """A MoE block's routing ops at granite-3.0-1b-a400m's shapes (2 x 4096 tokens, 32 experts, top 8)
    through the ledger, each counted as the kernels PyTorch's CUDA code launches (zlayout.learn.
    launches), where the card counted one an op: the sort of 65,536 int64 expert ids is the values'
    copy, an index fill and cub's onesweep radix sort (a histogram, an exclusive sum, a pass per
    8 bits: the profile's 8 DeviceRadixSortOnesweepKernel a block, h200-2026-12-16 prof-1); a sort
    of 2,048 runs in shared memory; the backward of the gather by the sorted ids, an accumulating
    index_put over 8,192 rows, sorts its 65,536 indices over 13 bits (2 passes)."""
    tokens, experts, top_k, hidden = 8192, 32, 8, 1024
    ledger = StorageLedger()
    x = torch.zeros(tokens, hidden, dtype=torch.bfloat16, device="meta", requires_grad=True)
    logits = torch.zeros(tokens, experts, device="meta")
    weights = torch.zeros(experts, 2 * hidden, hidden, dtype=torch.bfloat16, device="meta")
    ledger.exclude([x, logits, weights])
    with ledger:
        _, chosen = logits.topk(top_k, dim=-1)
        ids, perm = torch.sort(chosen.reshape(-1))
        counts = torch.histc(ids.int(), bins=experts, min=0, max=experts - 1)
        offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
        rows = x[perm // top_k]
        out = torch._grouped_mm(rows, weights.transpose(-2, -1), offs=offsets)
        ledger.run_backward(out.float().sum())
        torch.sort(torch.zeros(2048, dtype=torch.long, device="meta"))
    assert ledger.op_calls["topk"] == 2  # gatherTopK, then the k results sorted in shared memory
    assert ledger.op_calls["sort"] == (1 + 1 + 2 + 8) + (1 + 2 + 1 + 1)
    assert ledger.op_calls["histc"] == 2 and ledger.op_calls["cumsum"] == 2
    assert ledger.op_calls["index"] == 1
    assert ledger.op_calls["index_put_scatter"] == 2 + 2 + (2 + 2) + 1
    assert ledger.op_calls["_grouped_mm"] == 2 * 2  # forward and the input's gradient, prepare + GEMM each
    # each op once beside its kernels: the host issues an op once (core.steptime `host_floor_s`)
    several = {"sort": 2, "_grouped_mm": 2, "topk": 1, "histc": 1, "cumsum": 1, "index_put_scatter": 1}
    assert {name: ledger.op_ops[name] for name in several} == several
    assert all(ledger.op_ops[name] == calls for name, calls in ledger.op_calls.items() if name not in several)


def test_safe_softmax_records_its_mask_reduction_and_fill_and_its_backward_the_scratch_kernel():
    """The math attention's softmax as CUDA runs it (ATen's `_safe_softmax`: softmax, eq(-inf), all,
    where over a broadcast condition): the `all` and the `where` are work without a request of their
    own; its backward, as every softmax backward on CUDA, first makes `grad * output`: a T x T tensor and a kernel reading two."""
    ledger = StorageLedger()
    q = torch.zeros(2, 6, 96, 16, dtype=torch.bfloat16, device="meta", requires_grad=True)
    k, v = (torch.zeros(2, 1, 96, 16, dtype=torch.bfloat16, device="meta", requires_grad=True) for _ in "kv")
    mask = torch.ones(96, 96, dtype=torch.bool, device="meta").tril()
    ledger.exclude([q, k, v, mask])
    with ledger:
        torch.ops.aten._scaled_dot_product_attention_math(q, k, v, mask)[0].sum().backward()
    probabilities = 2 * 6 * 96 * 96 * 4  # float32
    rows = 2 * 6 * 96
    assert ledger.op_bytes["all"] == probabilities // 4 + rows
    assert ledger.op_bytes["where_strided"] == 2 * probabilities + rows
    assert ledger.op_bytes["softmax_backward_product"] == 3 * probabilities
    assert ledger.op_calls["where_strided"] == ledger.op_calls["all"] == 1


def test_a_long_window_gets_its_regimes_and_one_as_long_as_the_positions_none():
    """A window past 8,192 tokens still changes the path there (the learner's long check would cross
    it); a window as long as the model's positions never applies (Phi-3.5-MoE: 131,072 of 131,072); a
    rotary model's nominal positions shorter than its window do not hide it (OLMo-3's defaults)."""
    assert regimes_to_trace({"sliding_window": 16384}) == [
        (16383, (1024, 2048, 4096), 3072), (None, (16384, 32768, 65536), 49152)]
    assert regimes_to_trace({"sliding_window": 131072, "max_position_embeddings": 131072}) == [
        (None, (1024, 2048, 4096), 3072)]
    assert [r[0] for r in regimes_to_trace({"sliding_window": 4096, "max_position_embeddings": 2048})] == [4095, None]


def test_a_window_regime_traces_sequences_of_multiples_of_8():
    """Below a window the learner traces sequences as trained, multiples of 8: a T x T tensor's
    rows are aligned as in the run (an odd count would record its ops as misaligned)."""
    for window in (128, 2047, 4096):
        for _, fitted, checked in regimes_to_trace({"sliding_window": window}):
            assert all(t % 8 == 0 for t in (*fitted, checked))


@pytest.mark.parametrize("name, batched", [("falcon-multi-query", True), ("llama-defaults", False)])
def test_a_card_holds_the_copies_a_micro_batch_of_several_sequences_makes(name, batched):
    """Falcon's multi-query attention on the math path expands k and v to every head: for one
    sequence the reshape that merges batch and heads is a view, for several it is a copy each
    block keeps for backward (falcon-7b-L8, 4 x 2048 at ZeRO-3 on an H200: 4.5 GiB the card learned
    from one sequence did not have). Such a card is learned from two sequences and stored per
    sequence, and predicts four sequences' requests; a model without such copies keeps its card
    learned from one."""
    config = small_config(name)
    card = learn(config)
    regime = card["regimes"][-1]
    assert ("sequences_traced" in regime) == batched
    assert regime.get("sequences_traced", 1) == (2 if batched else 1)
    model = built(config, "meta", "sdpa")
    tokens, sequences = 512, 4
    fresh = measure(trace_step(model, block_list(model), tokens, checkpointing=False, sequences=sequences), 2)
    one = measure(trace_step(model, block_list(model), tokens, checkpointing=False), 2)
    block = regime["blocks"][0]
    index = block["traced_block"]
    for phase in ("forward", "backward"):
        q_a = [[q, a, 0.0] for q, a, _ in block[phase]]
        constant = [c for _, _, c in block[phase]]
        predicted = net_and_peak([sequences * evaluate(p, tokens) + c for p, c in zip(q_a, constant)])
        measured = net_and_peak(fresh["blocks"][index][phase])
        # the forward whole; the backward's peak (its net also frees the norms' per-sequence
        # partial sums, a few KiB a card's per-token terms do not hold)
        assert predicted[1] == pytest.approx(measured[1], rel=1e-9)
        if phase == "forward":
            assert predicted[0] == pytest.approx(measured[0], rel=1e-9)
    # the copies: a block of four sequences keeps more than four blocks of one (falcon) or the same
    kept = net_and_peak(fresh["blocks"][index]["forward"])[0]
    assert (kept > sequences * net_and_peak(one["blocks"][index]["forward"])[0] + 1) == batched


@pytest.mark.parametrize("name, held", [("falcon-multi-query", 4), ("falcon-sequential", 4), ("gpt2", 0),
                                        ("llama-defaults", 0)])
def test_weights_saved_as_views_outside_linear_are_the_ones_zero3_cannot_free(name, held):
    """FalconLinear multiplies by `self.weight.T`: autograd saves that view, which keeps the
    gathered storage after ZeRO-3 swaps the parameter's data. nn.Linear goes through F.linear
    (DeepSpeed's wrapper saves the parameter itself) and GPT-2's Conv1D passes the parameter to
    addmm: nothing held."""
    config = small_config(name)
    card = learn(config)
    block = card["regimes"][-1]["blocks"][0]
    assert len(block.get("zero3_held", [])) == held
    model = built(config, "meta", "sdpa")
    blocks = block_list(model)
    matrices = {id(p): p.numel() for p in blocks[0].parameters() if p.dim() == 2}
    found = weights_saved_as_views(model, blocks, [0, 1])
    assert sorted(matrices[i] for i in found if i in matrices) == sorted(block.get("zero3_held", []))


def test_a_card_learned_from_another_transformers_release_is_named(tmp_path):
    """A release changes what a model's code asks for (5.25.0 expands Falcon's k/v head before
    sdpa): a card learned from another release's code still plans, with one note naming both
    releases and how to learn it again; the installed release's card plans without it."""
    import transformers

    config = small_config("llama-defaults")
    path = tmp_path / "llama.json"
    path.write_text(json.dumps(config))
    card = learn(config)
    assert card["transformers"] == transformers.__version__
    key = cards.config_key(config)
    cards.write_card(tmp_path, key, cards.dumps_card({**card, "transformers": "5.0.0"}, key, "llama.json"),
                     replace=False)
    run = zlayout("plan", "--hf-config", str(path), "--gpus-per-node", "1", "--seq", "512", cards_dir=tmp_path)
    assert run.returncode == 0, run.stderr
    assert f"learned from transformers 5.0.0's code; {transformers.__version__} is installed" in run.stderr
    assert f"zlayout learn --force --hf-config {path}" in run.stderr
    cards.write_card(tmp_path, key, cards.dumps_card(card, key, "llama.json"), replace=True)
    again = zlayout("plan", "--hf-config", str(path), "--gpus-per-node", "1", "--seq", "512", cards_dir=tmp_path)
    assert again.returncode == 0 and "is installed" not in again.stderr


@pytest.mark.parametrize("release", ["5.24.0\x1b[2J", "5.24.0\nnext line", 524])
def test_a_card_s_transformers_release_is_a_version_or_the_card_is_refused(tmp_path, release):
    """plan prints the release a card names: one that is not a version string (an escape
    sequence, a newline, a number) makes the card a damaged one, one line naming it."""
    config = small_config("llama-defaults")
    key = cards.config_key(config)
    cards.write_card(tmp_path, key, cards.dumps_card({**learn(config), "transformers": release}, key, "llama.json"),
                     replace=False)
    with pytest.raises(CardError) as raised:
        cards.read_card(tmp_path / f"{key}.toml")
    assert "\n" not in str(raised.value) and "transformers must be a release's version" in str(raised.value)


def test_a_saved_tensor_at_a_dead_storages_address_counts_as_its_own():
    """malloc hands a dead storage's address to a later one; what a window saves is told apart by
    storage, not by address, or a card differs between two processes (Phi-3.5-MoE's did)."""
    ledger = StorageLedger()
    window = ledger.open_window("forward", 0)
    addresses, saved_count = set(), 0
    with ledger:
        while saved_count < 1000 and (saved_count < 8 or len(addresses) == saved_count):
            saved = torch.ones(1024, dtype=torch.bfloat16, device="meta") * 2
            addresses.add(saved.untyped_storage()._cdata)
            ledger.saved(saved)
            saved_count += 1
            del saved
    assert len(addresses) < saved_count  # an address came back: the case under test happened
    assert window.saved_by_dtype["bfloat16"] == saved_count * 1024 * 2
    assert ledger.current == 0


def test_a_norms_weight_gradient_is_recorded_as_a_reduction_the_planner_sizes_for_its_gpu():
    """`x * weight` over (batch, seq, hidden): the weight's gradient sums batch x sequence of each
    column, the reduction CUDA splits over thread blocks with a global scratch buffer (Reduce.cuh).
    The window holds placeholders of 0 bytes where the kernel allocates and frees it, and the
    reduction's shape: 2304 columns of 4096 tokens, columns contiguous, four a thread."""
    from zlayout.core.reductions import REDUCTION_EVENTS, Device, Reduction, scratch_bytes

    ledger = StorageLedger()
    x = torch.zeros(2, 2048, 2304, device="meta", requires_grad=True)
    weight = torch.zeros(2304, device="meta", requires_grad=True)
    ledger.exclude([x, weight])
    with ledger:
        window = ledger.open_window("backward", 0)
        (x * weight).sum().backward()
        ledger.close_window(window)
    shapes = [(at, shape) for at, shape in window.reductions.items() if shape["outputs"] == 2304]
    assert len(shapes) == 1
    at, shape = shapes[0]
    assert window.events[at:at + REDUCTION_EVENTS] == [0] * REDUCTION_EVENTS
    assert shape == {"outputs": 2304, "inputs": 4096, "fastest": 0, "contiguous": 1, "reduce_dims": 1,
                     "ndim": 2, "output_vec": 4, "acc_bytes": 4, "max_threads": 512}
    reduction = Reduction((0, 0, 2304), (0, 0, 4096), False, True, 1, 2, 4, 4)
    assert scratch_bytes(reduction, 2304, 4096, Device(132, 2048))[0] == 72 * 2**20  # as the H200 measured


def test_a_config_asking_for_another_attention_is_told_which_the_card_and_verify_use(tmp_path):
    """A config.json saved with `_attn_implementation: flash_attention_2` (the flash-attn package):
    the card is learned, and verify trains, with what transformers picks for the class (sdpa), and
    learn says so in one note instead of printing "sdpa" as if the config had asked for it."""
    config = tmp_path / "llama-fa2.json"
    config.write_text(json.dumps({**small_config("llama-defaults"), "_attn_implementation": "flash_attention_2"}))
    learned = zlayout("learn", "--hf-config", str(config), "--out", str(tmp_path / "cards"), cards_dir=tmp_path)
    assert learned.returncode == 0, learned.stderr
    notes = [line for line in learned.stderr.splitlines() if line.startswith("zlayout: note:")]
    assert len(notes) == 1 and "'flash_attention_2'" in notes[0] and "with 'sdpa'" in notes[0]
    assert "(sdpa attention)" in learned.stdout


class _Tap(torch.autograd.Function):
    """Identity forward; backward notes the address of the gradient it passes on."""

    @staticmethod
    def forward(ctx, tensor, name, seen):
        ctx.name, ctx.seen = name, seen
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad):
        ctx.seen.append((ctx.name, grad.data_ptr()))
        return grad, None, None


@pytest.mark.parametrize("pattern", ["two products", "three uses", "residual", "transposed use", "gradient kept"])
def test_a_gradient_reaching_a_tensor_twice_is_summed_in_place_as_without_the_ledger(pattern):
    """Autograd sums the gradients reaching a tensor twice in place, into the one it holds alone
    (input_buffer.cpp); under any dispatch mode it sums them into a new tensor. The ledger's trace
    must make the requests a run makes: the sum lands in the same gradient with the ledger as
    without it (CPU tensors, whose addresses are real)."""
    kept = []

    def uses(x, seen):
        tap = lambda name: _Tap.apply(x, name, seen)  # noqa: E731
        if pattern == "two products":
            return tap("a") * 2 + tap("b") * 3
        if pattern == "three uses":
            return tap("a") * 2 + tap("b") * 3 + tap("c") * 4
        if pattern == "residual":  # the loss's expanded gradient reaches x unchanged: a view, not summed into
            return tap("a") + tap("b") * 3
        if pattern == "transposed use":
            return (tap("a").t() * 2).t() + tap("b") * 3
        held = tap("a") * 1.0
        held.register_hook(kept.append)
        return held * 2 + tap("b") * 3

    targets = []
    for ledger in (None, StorageLedger()):
        seen: list = []
        weight, base = torch.randn(64, 64, requires_grad=True), torch.randn(64, 64)
        x = base * weight
        x.register_hook(lambda grad: seen.append(("sum", grad.data_ptr())))
        if ledger is None:
            uses(x, seen).sum().backward()
        else:
            ledger.exclude([weight, base])
            with ledger:
                ledger.run_backward(uses(x, seen).sum())
        total = dict(seen)["sum"]
        targets.append([name for name, address in seen if address == total and name != "sum"])
    assert targets[0], "autograd summed into a new tensor without the ledger: the pattern tests nothing"
    assert targets[1] == targets[0]



@pytest.mark.parametrize("select", ["gather by index", "topk"])
def test_a_gather_or_topk_backward_fills_one_zero_tensor_in_place(select):
    """autograd's backward of `x[idx]` (a MoE's token gather) and of topk fill a fresh zero tensor of
    x's size in place (FunctionsManual.cpp `index_backward`: `_index_put_impl_`;
    `value_selecting_reduction_backward`: `scatter_`), unless a dispatch mode is on, where they
    fill a copy: one more tensor of x's size. The learner's backward makes the one."""
    weight = torch.randn(512, 64, device="meta", requires_grad=True)
    index = torch.zeros(1024, dtype=torch.long, device="meta")
    ledger = StorageLedger()
    ledger.exclude([weight, index])
    with ledger:
        x = weight * 2
        picked = x[index] if select == "gather by index" else x.topk(8, dim=-1).values
        loss = picked.sum()
        window = ledger.open_window("backward", 0)
        ledger.run_backward(loss)
        ledger.close_window(window)
    size = x.numel() * x.element_size()
    assert [e for e in window.events if e > 0].count(size) == 2  # the zeros filled, then weight * 2's gradient


def test_an_index_put_in_the_forward_is_differentiated_into_a_copy_as_on_cuda():
    """index_put_'s own backward, `grad.index_put(indices, zeros, false)`, copies the gradient on
    CUDA too (no subclass test in its formula): the ledger leaves it out of place."""
    events = []
    for formulas in (False, True):
        weight = torch.randn(1024, 256, device="meta", requires_grad=True)
        index = torch.zeros(64, dtype=torch.long, device="meta")
        ledger = StorageLedger()
        ledger.exclude([weight, index])
        with ledger:
            y = (weight * 2).clone()
            y[index] = 0.0
            loss = (y * 3).sum()
            window = ledger.open_window("backward", 0)
            ledger.run_backward(loss, formulas=formulas)
            ledger.close_window(window)
        events.append(window.events)
    assert events[0] == events[1]


def test_a_model_whose_blocks_cannot_run_alone_is_learned_from_every_block():
    """Gemma-4 takes each block's per-layer input from one table reshaped by the layer count, so
    the few blocks the learner runs cannot run without the others (a shape error). It runs every
    block instead, and takes each kind's entry from a block inside its kind's run."""
    config = json.loads((CARD_ONLY / "gemma4-tiny.json").read_text())
    card = learn(config)
    assert card["layers"]["kinds"] == [0, 0, 1, 0, 0, 1]  # sliding, sliding, full ...
    assert [kind["traced_block"] for kind in card["regimes"][0]["blocks"]] == [1, 2]
    model, _ = build_model(config)
    assert card["parameters"]["count"] == sum(p.numel() for p in model.parameters())
    # its per-layer embedding table and the projection into it grow with the depth (vocabulary x
    # 16 a block, 16 x 64 a block): the card resized to another depth counts what transformers builds
    # there (its per-layer head-size overrides follow the depth: hfconfig.config_at_depth)
    assert card["parameters"]["per_block"] == {"model.language_model.embed_tokens_per_layer.weight": 512 * 16,
                                               "model.language_model.per_layer_model_projection.weight": 16 * 64}
    assert card["layers"].get("resizable", True)
    from zlayout.core.card import card_from_dict
    from zlayout.hfconfig import config_at_depth

    resized = card_from_dict(card, "gemma4-tiny")
    for depth in (2, 3, 9):
        built = sum(p.numel() for p in build_model(config_at_depth(config, depth))[0].parameters())
        assert resized.at_layers(depth).params == built, depth


def test_gemma3n_blocks_are_kinds_by_sparsity_and_shared_keys_and_values(tmp_path, monkeypatch, capsys):
    """Gemma-3n's first layers keep only the top of each activation (`activation_sparsity_pattern`)
    and its last ones reuse an earlier layer's keys and values (`num_kv_shared_layers`): the same
    weights, other requests. Each is a kind of its own beside sliding and full attention, and every
    block of a kind asks for the same, but the shared kind's last two (autograd's sum of the shared
    keys' and values' gradient)."""
    config = json.loads((CARD_ONLY / "gemma3n-text-tiny.json").read_text())
    card = learn(config)
    # sliding / full x sparse (0-3), dense (4-7), dense with shared keys and values (8-11)
    assert card["layers"]["kinds"] == [0, 0, 0, 1, 2, 2, 2, 3, 4, 4, 4, 5]
    assert card["parameters"]["count"] == sum(p.numel() for p in build_model(config)[0].parameters())
    # which blocks share keys and values moves with the depth (the last num_kv_shared_layers), which
    # the card cannot follow: it says so, and planning it at another depth is refused in one line
    # rather than counted wrong (transformers builds 199,360 parameters at 3 blocks; resized, the card
    # had 203,488)
    assert card["layers"]["resizable"] is False
    from zlayout.core.card import CardError, card_from_dict

    one = card_from_dict(card, "gemma3n-tiny")
    assert one.at_layers(12) is one
    with pytest.raises(CardError, match=r"blocks change with its depth .* cannot be planned at 3: learn a copy"):
        one.at_layers(3)
    from zlayout import cards
    from zlayout.cli import main

    monkeypatch.setenv("ZLAYOUT_CARDS_DIR", str(tmp_path))
    key = cards.config_key(config)
    cards.write_card(tmp_path, key, cards.dumps_card(card, key, "gemma3n-text-tiny.json"), replace=False)
    path = str(CARD_ONLY / "gemma3n-text-tiny.json")
    assert main(["plan", "--hf-config", path, "--seq", "256", "--stage", "2"]) == 0
    capsys.readouterr()
    assert main(["plan", "--hf-config", path, "--layers", "3", "--seq", "256", "--stage", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--layers 3: " in err and "cannot be planned at 3" in err
    # a count outside --layers' bounds is refused as such first
    assert main(["plan", "--hf-config", path, "--layers", "0", "--seq", "256", "--stage", "2"]) == 2
    assert "--layers: must be from 1 to 1,000 (got 0)" in capsys.readouterr().err


def test_blocks_of_one_kind_that_ask_for_different_memory_are_refused_in_one_line(monkeypatch):
    """Blocks the config does not tell apart that ask for different memory on the same weights
    (Gemma-3n read without its per-block sparsity and sharing) cannot share one card entry: the
    learner says so rather than take one block for all."""
    import zlayout.learn.learner as learner

    read = learner.per_block_types
    monkeypatch.setattr(learner, "per_block_types", lambda config, blocks: [
        types for types in read(config, blocks) if not {"sparse", "shared_kv"} & set(types)])
    with pytest.raises(LearnError, match=r"blocks 1 and 4 have the same weights but ask for different memory"):
        learn(json.loads((CARD_ONLY / "gemma3n-text-tiny.json").read_text()))


@pytest.mark.parametrize(("config", "positions"), [
    ({"model_type": "bert", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
      "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 512, "is_decoder": True}, "512"),
    ({"model_type": "mpt", "d_model": 64, "n_layers": 2, "n_heads": 2, "vocab_size": 256, "max_seq_len": 2048,
      "expansion_ratio": 2}, "2,048"),
], ids=["bert", "mpt"])
def test_a_position_table_shorter_than_the_traced_sequences_is_learned_within_it(config, positions):
    """BERT's 512 positions (as a causal LM), MPT's 2,048-token ALiBi bias: 1,024-4,096 tokens fail
    on a shape; traced at a quarter, half and three quarters of the positions (not all of them,
    where a mask sliced from a buffer of that many rows stops being a strided view), the card
    records them."""
    held = int(positions.replace(",", ""))
    regime, = learn(config)["regimes"]
    assert regime["max_positions"] == held and regime["tokens_fitted"] == [held // 4, held // 2, held * 3 // 4]
    assert regime["tokens_checked"] == held * 7 // 8


def test_a_model_failing_within_its_positions_too_says_so_with_that_error(monkeypatch):
    """Where the model's code fails within its positions as well, the error is that run's, said to
    be within them (here BERT's own, run past its 512-row token-type buffer again)."""
    import zlayout.learn.learner as learner

    config = {"model_type": "bert", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
              "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 512, "is_decoder": True}
    monkeypatch.setattr(learner, "positions_regime", lambda positions: [(None, (600, 1200, 2400), 1800)])
    with pytest.raises(LearnError, match=r"\(traced within the 512 positions this config holds\)$"):
        learn(config)


def test_a_model_failing_alike_within_its_positions_says_the_error_alone():
    """A config whose code fails for another reason than its positions (DeepSeek-V3 with more expert
    groups than routed experts) fails alike when traced within its 2,048 positions: the error is
    said as it is, not as if the positions were the cause."""
    config = {**small_config("deepseek_v3"), "n_routed_experts": 12, "n_group": 8, "topk_group": 4,
              "max_position_embeddings": 2048}
    with pytest.raises(LearnError, match="k not in range") as caught:
        learn(config)
    assert "traced within" not in str(caught.value)


def test_the_language_model_only_types_are_transformers_own():
    # multimodal types whose AutoModelForCausalLM class (what learn and verify build) is another
    # class than the image-text-to-text one: the text model alone, no vision tower
    from transformers.models.auto.modeling_auto import (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as causal,
                                                        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES as vision)

    from zlayout.hfconfig import LANGUAGE_MODEL_ONLY

    assert LANGUAGE_MODEL_ONLY == {t: causal[t] for t in set(causal) & set(vision) if causal[t] != vision[t]}


def test_a_multimodal_config_planned_as_its_language_model_says_so(tmp_path, monkeypatch):
    # Qwen3.5's published config.json names Qwen3_5ForConditionalGeneration; AutoModelForCausalLM
    # builds Qwen3_5ForCausalLM from it, without the vision tower: the plan must not pass for both
    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(tmp_path / "cards"))
    text = json.loads((Path(__file__).parent / "configs" / "qwen3_5_text-tiny.json").read_text())
    config = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
              "text_config": {**text, "model_type": "qwen3_5_text"},
              "vision_config": {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
                                "out_hidden_size": 64}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    code, _, err = run_cli(["learn", "--hf-config", str(path)])
    assert code == 0, err
    code, _, err = run_cli(["plan", "--hf-config", str(path), "--seq", "256", "--gpu", "h200"])
    assert code == 0 and "names Qwen3_5ForConditionalGeneration, with its vision tower" in err, err
    assert "Qwen3_5ForCausalLM" in err
    # the text model's own config.json: nothing to say
    tiny = str(Path(__file__).parent / "configs" / "qwen3_5_text-tiny.json")
    assert run_cli(["learn", "--hf-config", tiny])[0] == 0
    code, _, err = run_cli(["plan", "--hf-config", tiny, "--seq", "256", "--gpu", "h200"])
    assert code == 0 and "vision tower" not in err, err


@pytest.mark.parametrize(("config", "kinds", "key", "cut"), [
    ({"model_type": "gpt_neo", "vocab_size": 256, "hidden_size": 64, "num_layers": 4, "num_heads": 4,
      "attention_types": [[["global", "local"], 2]], "window_size": 32, "max_position_embeddings": 512},
     [0, 1, 0, 1], "attention_layers", ["global", "local", "global"]),
    ({"model_type": "smollm3", "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
      "num_key_value_heads": 2, "intermediate_size": 128, "no_rope_layer_interval": 4, "pad_token_id": 0},
     [0, 0, 0, 1], "no_rope_layers", [1, 1, 1]),
    ({"model_type": "laguna", "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
      "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "moe_intermediate_size": 32,
      "shared_expert_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2, "sliding_window": 64,
      "num_attention_heads_per_layer": [4, 4, 2, 2], "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"],
      "layer_types": ["full_attention", "sliding_attention", "sliding_attention", "sliding_attention"]},
     [0, 1, 2, 2], "num_attention_heads_per_layer", [4, 4, 2]),
], ids=["gpt_neo-global-local", "smollm3-no-rope", "laguna-heads-per-layer"])
def test_blocks_a_config_list_tells_apart_are_kinds_apart_and_verify_cuts_the_list(config, kinds, key, cut,
                                                                                 tmp_path, monkeypatch):
    """GPT-Neo's local blocks among its global ones (`attention_layers`, which its config class
    expands from `attention_types`) and SmolLM3's blocks without rotary embeddings (`no_rope_layers`,
    0 every fourth) have the same weights: the learner read one kind and traced only the first blocks.
    Each is a kind apart now. Verify's `--layers` cuts those lists with the depth, and every other
    list of one entry a layer (Laguna's heads per layer, whose blocks differ in shape): transformers'
    config classes refused any depth but the file's ("len(config.attention_layers) = 24, num_layers =
    2", "num_attention_heads_per_layer length (40) must equal num_hidden_layers (2)")."""
    from zlayout import hfconfig

    card = learn(config)
    assert card["layers"]["kinds"] == kinds
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert zlayout("learn", "--hf-config", str(path), cards_dir=tmp_path / "cards").returncode == 0
    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(tmp_path / "cards"))
    model = hfconfig.load(str(path)).with_layers(3)
    built = hfconfig.config_to_build(config, model)
    rebuilt = AutoConfig.for_model(**built)  # transformers' own checks of the depth
    assert rebuilt.num_hidden_layers == 3 and getattr(rebuilt, key) == cut


def test_index_lists_are_not_per_block_flags():
    """Llama-4's `moe_layers` lists block indices, as many as blocks where every block is sparse."""
    from zlayout.hfconfig import per_block_flags

    assert per_block_flags([1, 1, 1, 0], 4) and per_block_flags(["global", "local"], 2)
    assert not per_block_flags([0, 1, 2, 3], 4)  # indices
    assert not per_block_flags([1, 1, 1, 1], 4)  # tells no block apart
    assert not per_block_flags([1, 0], 4) and not per_block_flags("gl", 2)


def test_every_stand_in_is_put_back_after_a_learn_even_one_that_fails():
    """The learner swaps torch's attention and dropout, transformers' mask checks, the GDN and Mamba
    kernels and JetMoE's router for stand-ins while it traces: after it, in the same process (the app
    learns beside everything else), every one is the original, whether the learn succeeded or not."""
    import sys

    import transformers.masking_utils as masking
    from transformers.modeling_utils import PreTrainedModel

    from zlayout.learn.trace import Swaps

    watched = [(torch.nn.functional, "scaled_dot_product_attention"), (torch.nn.functional, "dropout"),
               (masking, "fast_all"), (masking, "find_packed_sequence_indices"),
               (PreTrainedModel, "warn_if_padding_and_no_attention_mask")]
    before = [vars(owner)[name] for owner, name in watched]
    learn(json.loads((CARD_ONLY / "jamba-tiny.json").read_text()))  # Mamba-1 kernel stand-ins
    jamba = sys.modules["transformers.models.jamba.modeling_jamba"]
    kernels = {name: value for name, value in vars(jamba).items() if callable(value)}
    with pytest.raises(LearnError):
        learn(json.loads((CARD_ONLY / "minimax-tiny.json").read_text()))
    learn(json.loads((CARD_ONLY / "jamba-tiny.json").read_text()))
    assert [vars(owner)[name] for owner, name in watched] == before
    assert {name: value for name, value in vars(jamba).items() if callable(value)} == kernels

    swaps, owner = Swaps(), type("Owner", (), {"f": 1})
    swaps.swap(owner, "f", 2)
    swaps.swap(owner, "f", 3)  # swapped twice: back to the first original
    swaps.swap(owner, "g", 4)  # none of its own: deleted again
    swaps.restore()
    assert owner.f == 1 and not hasattr(owner, "g")


def test_verify_resizes_per_layer_lists_with_the_depth_and_keeps_every_index_and_the_token_ids():
    from zlayout.hfconfig import _layer_kinds_at_depth

    config = {"num_hidden_layers": 3, "moe_layers": [0, 1, 2], "eos_token_id": [1, 2, 3], "no_rope_layers": [1, 1, 0]}
    shallower, deeper = dict(config), dict(config)
    _layer_kinds_at_depth(shallower, 2, 3)
    _layer_kinds_at_depth(deeper, 5, 3)
    assert shallower == {**config, "moe_layers": [0, 1], "no_rope_layers": [1, 1]}
    assert deeper == {**config, "moe_layers": [0, 1, 2, 3, 4], "no_rope_layers": [1, 1, 0, 1, 1]}


def test_the_buffers_a_model_builds_are_host_memory_while_it_is_built(tmp_path, monkeypatch):
    """GPT-Neo's blocks each build a (1, 1, P, P) boolean causal mask: 96 MiB at 24 blocks of 2,048
    positions, on the host beside the fp32 weights while the training script builds the model
    (h200-2026-12-29: 6.30 GiB measured, 6.11 planned from the weights alone). The card records one
    block's of each kind and the rest; the plan's model construction adds them at its depth."""
    import dataclasses

    from zlayout.core.memory import estimate_memory
    from zlayout.spec import Layout

    path = CARD_ONLY / "gpt_neo-tiny.json"  # 2 blocks of 512 positions: global, local
    card = learn(json.loads(path.read_text()))
    assert card["parameters"]["block_buffer_bytes"] == [512 * 512, 512 * 512]
    assert zlayout("learn", "--hf-config", str(path), cards_dir=tmp_path / "cards").returncode == 0
    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(tmp_path / "cards"))
    from zlayout.cli import build_parser, plan_input_from_args

    args = build_parser().parse_args(["plan", "--hf-config", str(path), "--layers", "6", "--seq", "512",
                                      "--gpu", "h200", "--gpus-per-node", "1"])
    inp = plan_input_from_args(args)
    assert inp.model.card.built_buffer_bytes() == 6 * 512 * 512
    bare = inp.model_copy(update={"model": inp.model.model_copy(update={"card": dataclasses.replace(
        inp.model.card, block_buffer_bytes=())})})

    def construction(i):
        return next(t.bytes for t in estimate_memory(i, Layout(stage=0), replay=False).terms
                    if t.name == "model_construction")
    assert construction(inp) - construction(bare) == 6 * 512 * 512


def test_verify_leaves_a_gpt_neo_pattern_that_does_not_name_the_file_s_layers_unexpanded():
    """A hostile `attention_types` repeat count would build a list of that many names; one that does
    not name the file's layers is left for transformers' config class to refuse."""
    from zlayout.hfconfig import _layer_kinds_at_depth

    config = {"model_type": "gpt_neo", "num_layers": 4, "attention_types": [[["global", "local"], 10**12]]}
    _layer_kinds_at_depth(config, 2, 4)
    assert config["attention_types"] == [[["global", "local"], 10**12]]
    config = {"model_type": "gpt_neo", "num_layers": 4, "attention_types": [[["global", "local"], 2]]}
    _layer_kinds_at_depth(config, 3, 4)
    assert config["attention_types"] == [[["global", "local", "global"], 1]]


def test_an_error_whose_first_line_only_introduces_it_is_shown_with_the_next_cut_short():
    """transformers' config validation says "Validation error for field 'attn_pdrop':" on one line and
    what is wrong on the next (MPT's attn_pdrop of 0.0, typed int by transformers 5.24); a value it
    prints whole is cut."""
    from zlayout.learn.learner import GIST_CHARS, _gist

    error = ValueError("Validation error for field 'attn_pdrop':\n    TypeError: Field 'attn_pdrop' expected int, "
                       "got float (value: 0.0)")
    assert _gist(error) == ("Validation error for field 'attn_pdrop': TypeError: Field 'attn_pdrop' expected int, "
                            "got float (value: 0.0)")
    assert _gist(ValueError("k not in range\nmore")) == "k not in range"
    long = _gist(ValueError("bad value: " + "[1, " * 100_000))
    assert len(long) == GIST_CHARS + 3 and long.endswith("...")


def test_a_model_whose_float32_buffers_meet_its_bf16_weights_asks_for_its_buffers_cast():
    """DeepSpeed 0.19.8 casts the weights only (engine._cast_module_mixed_precision). openai-gpt's
    float32 causal mask, multiplied into its attention weights, and xglm's float32 sinusoidal table,
    added to its embeddings, make float32 activations that meet bf16 weights in a matmul: on the GPU
    and on verify's CPU run it raised at the first step (h200-2026-12-31's smoke runs). The card
    says so and the ds_config zlayout writes casts the buffers; a model whose buffers never meet a
    weight (Llama's rotary table in float32) keeps them as built."""
    from zlayout.core.card import card_from_dict

    llama = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256}
    gpt = json.loads((CARD_ONLY / "openai-gpt-tiny.json").read_text())
    assert learn(gpt).get("buffer_dtype") == "bfloat16"
    assert learn(XGLM_TINY).get("buffer_dtype") == "bfloat16"
    assert "buffer_dtype" not in learn(llama)
    with pytest.raises(CardError, match="buffer_dtype"):
        card_from_dict({**learn(llama), "buffer_dtype": "float8"}, key="k")


def test_the_dtype_check_refuses_mixed_products_and_convolutions_as_cuda_does():
    """The meta device runs a bf16 weight against a float32 input and returns float32; CUDA's kernels
    raise. The check raises on both products and convolutions, and leaves same-dtype ones alone."""
    from zlayout.learn.learner import SameDtypeProducts

    def meta(*shape, dtype=torch.bfloat16):
        return torch.empty(*shape, device="meta", dtype=dtype)

    with SameDtypeProducts():
        torch.nn.functional.linear(meta(4, 8), meta(16, 8))
        torch.nn.functional.conv1d(meta(1, 8, 32), meta(8, 1, 4), groups=8)
        with pytest.raises(RuntimeError, match="same dtype"):
            torch.nn.functional.linear(meta(4, 8, dtype=torch.float32), meta(16, 8))
        with pytest.raises(RuntimeError, match="same dtype"):
            torch.nn.functional.conv1d(meta(1, 8, 32, dtype=torch.float32), meta(8, 1, 4), groups=8)


def test_float32_buffers_deepspeed_keeps_are_traced_in_float32(monkeypatch):
    """DeepSpeed casts the parameters only; a buffer keeps its dtype, and an op that meets it runs in
    it. CodeGen's sin/cos table is a float32 buffer, so its rotary runs in float32 on the GPU: the
    card asks for those float32 tensors. Traced with every buffer cast (`model.bfloat16()`, the
    learner before), its forward asked for less per token than the run does."""
    from zlayout.learn import learner

    codegen = {"model_type": "codegen", "n_embd": 128, "n_layer": 2, "n_head": 4, "rotary_dim": 16,
               "vocab_size": 256, "bos_token_id": 0, "eos_token_id": 0, "n_positions": 2048, "n_ctx": 2048,
               "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}

    def forward_bytes_per_token(card: dict) -> float:
        return sum(request[1] for request in card["regimes"][0]["blocks"][0]["forward"] if request[1] > 0)

    as_deepspeed = learn(codegen)
    assert "buffer_dtype" not in as_deepspeed  # it runs with the table as built
    cast = learner.cast_as_deepspeed
    monkeypatch.setattr(learner, "cast_as_deepspeed", lambda model, buffers: cast(model, buffers=True))
    all_cast = learn(codegen)
    assert forward_bytes_per_token(as_deepspeed) > forward_bytes_per_token(all_cast)


def test_the_ds_config_casts_the_buffers_only_where_the_card_asks(tmp_path, monkeypatch):
    from zlayout.cli import build_parser, layout_from_args, plan_input_from_args
    from zlayout.profile.ds_config import ds_config

    path = CARD_ONLY / "openai-gpt-tiny.json"
    done = zlayout("learn", "--hf-config", str(path), cards_dir=tmp_path / "cards")
    assert done.returncode == 0, done.stderr
    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(tmp_path / "cards"))
    for precision, cast in (("bf16", {"buffer_dtype": "bf16"}), ("fp32", None)):
        args = build_parser().parse_args(["plan", "--hf-config", str(path), "--stage", "2", "--precision", precision])
        inp = plan_input_from_args(args)
        assert inp.model.card is not None and inp.model.card.buffer_dtype == "bfloat16"
        assert ds_config(inp, layout_from_args(args)).get("data_types") == cast


def test_a_model_that_meets_float32_with_bf16_weights_even_with_its_buffers_cast_is_refused():
    """Inkling-2's router casts its input to float32 for a weight it declares in float32, which
    DeepSpeed casts to bf16 with every other (its keep-in-fp32 lists keep buffers only): the
    product raises on a GPU whatever the buffers. Refused in one line, not planned."""
    from transformers import AutoConfig

    config = AutoConfig.for_model("inkling2_text").to_dict()
    with pytest.raises(LearnError, match=r"^transformers' 'inkling2_text': its code runs a product of float32 "
                                         r"and bf16 tensors \(aten\.mm.* it cannot train in bf16 under DeepSpeed"):
        learn(config)


def test_a_kind_only_the_last_block_has_stays_last_at_any_depth(tmp_path):
    """GPT-NeoX-Japanese gives its attention's output bias to the last block alone
    (`use_bias=layer_number == num_hidden_layers - 1`): cut or grown with --layers, the card keeps
    that block last, and the plan's count is the class's at every depth (cut to fewer blocks it was
    one bias short, and verify's worker refused the run: h200-2026-12-31c)."""
    path = CARD_ONLY / "gpt_neox_japanese-tiny.json"
    config = json.loads(path.read_text())
    key = cards.config_key(config)
    cards.write_card(tmp_path, key, cards.dumps_card(learn(config), key, path.name), replace=False)
    for layers in (3, 16, 20):
        plan = zlayout("plan", "--hf-config", str(path), "--layers", str(layers), "--seq", "256",
                       "--gpus-per-node", "1", "--json", cards_dir=tmp_path)
        assert plan.returncode == 0, plan.stderr
        model, _ = build_model({**config, "num_hidden_layers": layers})
        assert json.loads(plan.stdout)["params"] == sum(p.numel() for p in model.parameters()), layers
