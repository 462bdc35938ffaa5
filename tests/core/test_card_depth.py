"""A model card describes one config.json; the same config at another depth (`--layers`, the
app's Layers, break-even's depth scan) has the same blocks, so the card is resized with it
(`ModelCard.at_layers`), and a shape whose tensors the card does not hold (Hidden changed) is
planned without it. Before, the card kept its own blocks: Llama-3-8B at `--layers 64` was planned
with 32 blocks' activations (24.52 GiB where 64 blocks save 49.03), under by half."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from zlayout import hfconfig
from zlayout.cli import build_parser, main, plan_input_from_args
from zlayout.core.breakeven import model_with_layers
from zlayout.core.card import _extend_kinds, parameter_layers
from zlayout.core.memory import estimate_memory
from zlayout.spec import Layout

PUBLISHED = Path(__file__).resolve().parents[1] / "hf" / "configs" / "published"
GiB = 2**30


@pytest.fixture(autouse=True)
def shipped_cards_only(tmp_path, monkeypatch):
    """The shipped cards answer (an empty cache): importing benchmarks/measurements.py, as other
    tests of this worker do, points $ZLAYOUT_CARDS_DIR at a measurement folder's held-out cards."""
    monkeypatch.setenv("ZLAYOUT_CARDS_DIR", str(tmp_path / "empty-cache"))


def plan_input(config: str, *flags: str):
    args = build_parser().parse_args(["plan", "--hf-config", str(PUBLISHED / config), "--gpu", "h200",
                                      "--gpus-per-node", "1", "--seq", "2048", "--micro-batch", "2", *flags])
    return plan_input_from_args(args)


def activations(inp) -> int:
    return next(term.bytes for term in estimate_memory(inp, Layout(stage=2)).terms if term.name == "activations")


@pytest.mark.parametrize("config", ["Meta-Llama-3-8B.json", "falcon-7b.json", "gemma-3-1b-pt.json"])
def test_a_cards_activations_scale_with_the_layers_asked_for(config):
    whole = plan_input(config)
    assert whole.model.card is not None
    layers = whole.model.layers
    deeper, shallower = plan_input(config, "--layers", str(2 * layers)), plan_input(config, "--layers", "6")
    assert deeper.model.card is not None and shallower.model.card is not None
    assert len(deeper.model.card.layer_kinds) == 2 * layers and len(shallower.model.card.layer_kinds) == 6
    # the card's count is the shape's at every depth (the hand reader counts what transformers builds)
    assert deeper.model.card.params == deeper.model.params
    assert shallower.model.card.params == shallower.model.params
    if len(set(whole.model.card.layer_kinds)) == 1:  # every block alike: the saved tensors scale exactly
        assert activations(deeper) == 2 * activations(whole)
        assert activations(shallower) * layers == activations(whole) * 6
    else:
        assert activations(shallower) < activations(whole) < activations(deeper)


def test_gemma3s_sliding_and_global_blocks_keep_their_pattern_at_any_depth():
    whole = plan_input("gemma-3-1b-pt.json").model.card
    kinds = whole.layer_kinds  # 26 blocks: five sliding-window ones, then a global one
    assert kinds[:6] == (0, 0, 0, 0, 0, 1) and len(kinds) == 26
    deeper = whole.at_layers(40).layer_kinds
    assert deeper[:26] == kinds
    assert [i for i, kind in enumerate(deeper) if kind == 1] == [i for i in range(40) if i % 6 == 5]
    assert whole.at_layers(8).layer_kinds == kinds[:8]


def test_the_blocks_repeating_pattern_is_continued():
    assert _extend_kinds((0, 0, 1, 1), 6) == (0, 0, 1, 1, 1, 1)  # dense first blocks, then MoE
    assert _extend_kinds((0,) * 4, 6) == (0,) * 6
    assert _extend_kinds((0, 1, 0, 1, 0, 1), 9) == (0, 1, 0, 1, 0, 1, 0, 1, 0)
    assert _extend_kinds((0, 1, 2), 5) == (0, 1, 2, 2, 2)  # no pattern seen twice: the last kind
    assert _extend_kinds((0, 1, 2), 2) == (0, 1)


def test_a_vision_towers_numbered_layers_are_not_the_decoders():
    names = ["model.vision_tower.encoder.layers.0.w", "model.vision_tower.encoder.layers.1.w",
             "model.embed_tokens.weight", "model.language_model.layers.0.a", "model.language_model.layers.0.b",
             "model.language_model.layers.1.a", "model.language_model.layers.1.b", "model.language_model.layers.2.a",
             "model.language_model.layers.2.b", "model.norm.weight", "lm_head.weight"]
    assert parameter_layers(names, 3) == (-1, -1, -1, 0, 0, 1, 1, 2, 2, -2, -2)
    two_lists = [n.replace("layers.2", "layers.1") for n in names if "layers.2" not in n]
    assert parameter_layers(two_lists, 2) is None  # two lists of two blocks: which is the decoder's is unknown
    assert parameter_layers(names[3:] + ["model.language_model.layers.0.c"], 3) is None  # not one run


def test_break_even_scans_a_carded_model_with_its_card_resized():
    model = plan_input("Meta-Llama-3-8B.json").model
    scanned = model_with_layers(model, 48)
    assert scanned.card is not None and len(scanned.card.layer_kinds) == 48
    assert scanned.card.params == scanned.params
    asked = plan_input("Meta-Llama-3-8B.json", "--layers", "48").model
    assert (scanned.card, scanned.params, scanned.extra_params) == (asked.card, asked.params, asked.extra_params)


def test_a_shape_the_card_does_not_hold_is_planned_by_the_hand_model_and_says_so():
    model = plan_input("Meta-Llama-3-8B.json", "--hidden", "2048").model
    assert model.card is None and model.hidden == 2048
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        main(["plan", "--hf-config", str(PUBLISHED / "Meta-Llama-3-8B.json"), "--hidden", "2048", "--gpu", "h200"])
    assert "describes Meta-Llama-3-8B's own shape; with --hidden" in err.getvalue()


def test_a_profiles_model_read_back_keeps_the_resized_card():
    """A profile writes the card's key and the model's shape; read back, the card is resized again."""
    model = plan_input("Meta-Llama-3-8B.json", "--layers", "12").model
    again = type(model).model_validate(json.loads(model.model_dump_json()))
    assert again == model and again.card.layer_kinds == model.card.layer_kinds


def test_a_card_only_models_extra_parameters_follow_the_depth():
    """OLMoE has no hand reader: its shape comes from the common keys and the card counts the
    rest (extra_params); at another depth the card's count is still the model's."""
    whole = hfconfig.load(PUBLISHED / "OLMoE-1B-7B-0924.json")
    assert whole.card is not None and whole.extra_params != 0
    args = build_parser().parse_args(["plan", "--hf-config", str(PUBLISHED / "OLMoE-1B-7B-0924.json"),
                                      "--layers", "4", "--gpu", "h200"])
    model = plan_input_from_args(args).model
    assert model.card is not None and model.params == model.card.params
    assert model.params < whole.params


def sliced(tmp_path: Path, config: str, layers: int) -> Path:
    data = json.loads((PUBLISHED / config).read_text())
    data["num_hidden_layers"] = layers
    path = tmp_path / f"{Path(config).stem}-L{layers}.json"
    path.write_text(json.dumps(data))
    return path


def test_a_config_cut_to_fewer_layers_is_planned_from_its_models_card(tmp_path, monkeypatch):
    """No card was learned from Falcon-7B at 8 layers; the shipped one of its 32 is found through
    presets/cards/by-depth and resized. Without it the hand model planned 40.56 GiB where the H200
    measured 57.23 (h200-2026-12-02e batch b, ZeRO-2, 2 x 2048); with it, 56.65."""
    monkeypatch.setenv("ZLAYOUT_CARDS_DIR", str(tmp_path / "no-cache"))
    model = hfconfig.load(sliced(tmp_path, "falcon-7b.json", 8))
    assert model.card is not None and model.card.learned_layers == 32 and len(model.card.layer_kinds) == 8
    assert model.card.params == model.params
    assert "learned from the same model at 32 layers; its blocks are planned at 8" in model.card.depth_note()
    whole = hfconfig.load(PUBLISHED / "falcon-7b.json")
    assert whole.card.depth_note() is None


def test_a_by_depth_entry_that_is_not_zlayouts_is_read_as_none_and_never_written_over(tmp_path, monkeypatch):
    from zlayout import cards

    monkeypatch.setenv("ZLAYOUT_CARDS_DIR", str(tmp_path))
    config = json.loads(sliced(tmp_path, "Qwen3-8B.json", 4).read_text())
    key = cards.depth_key(config)
    mine = tmp_path / cards.BY_DEPTH / f"{key}.toml"
    mine.parent.mkdir()
    mine.write_text('card = "../../etc/passwd"\n')
    assert cards.write_depth_alias(tmp_path, config, "0123456789abcdef") is None
    assert mine.read_text() == 'card = "../../etc/passwd"\n'
    # the cache's entry does not parse: the shipped one (presets/cards/by-depth) answers
    assert cards.find_card(config).key == cards.config_key(json.loads((PUBLISHED / "Qwen3-8B.json").read_text()))
    assert cards.depth_key({"model_type": "llama", "hidden_size": 64}) is None  # no depth named


def test_a_by_depth_key_reads_per_block_kinds_as_their_repeating_pattern():
    # Qwen3.5's layer_types lists 32 kinds; cut to 4 or 6 blocks (or grown) it is the same model
    from zlayout import cards

    pattern = ["linear_attention"] * 3 + ["full_attention"]
    base = {"model_type": "qwen3_5_text", "hidden_size": 64}
    keys = {cards.depth_key({**base, "num_hidden_layers": n, "layer_types": (pattern * 9)[:n]}) for n in (4, 6, 8, 32)}
    assert len(keys) == 1 and None not in keys
    other = cards.depth_key({**base, "num_hidden_layers": 4, "layer_types": pattern[::-1]})
    assert other not in keys
    # no layer_types: the key is what it was (shipped by-depth entries stay valid)
    assert cards.depth_key({**base, "num_hidden_layers": 4}) == cards.config_key({**base, "zlayout_depth_free": True})


def test_the_shortest_period_is_the_brute_force_one_and_linear_on_long_lists():
    import random

    from zlayout.cards import _shortest_period

    def brute(items):
        return next(items[:d] for d in range(1, len(items) + 1)
                    if all(items[i] == items[i % d] for i in range(d, len(items))))

    rng = random.Random(7)
    for _ in range(2000):
        items = [rng.choice("ab") for _ in range(rng.randint(1, 14))]
        assert _shortest_period(items) == brute(items), items
    assert _shortest_period([]) == []
    # a hostile config.json's 200,000 distinct kinds: the whole list, without a quadratic scan
    assert len(_shortest_period([str(i) for i in range(200_000)])) == 200_000


def test_a_depth_without_moe_blocks_takes_no_bound_from_the_cards_moe_block():
    """DeepSeek-V2-Lite's first block is dense: cut to it, the card's MoE block (its experts'
    gradients) is no block of the model, and no bound a block sets (its backward's transient, its
    largest request or weight gradient) comes from it. The same mistake put DeepSeek-V3.2 at its 3
    dense blocks +39.6% over the run's peak allocated (h200-2026-12-31c)."""
    from zlayout.core.reductions import device_of

    full, cut = plan_input("DeepSeek-V2-Lite.json"), plan_input("DeepSeek-V2-Lite.json", "--layers", "1")
    device = device_of(full.hardware.gpu)
    card = cut.model.card
    assert set(card.layer_kinds) == {0} and {b.kind for b in full.model.card.regime(2048, 2).blocks} == {0, 1}
    assert [b.kind for b in card.blocks_at(2048, 2)] == [0]
    assert card.largest_block_transient(2, 2048, False, device) \
        < full.model.card.largest_block_transient(2, 2048, False, device)
    assert not cut.model.moe_layer_count
    assert "backward (experts)" != estimate_memory(cut, Layout(stage=2)).peak_phase


def test_a_moe_model_cut_into_its_dense_blocks_is_planned_not_refused():
    """DeepSeek-V3 keeps its first 3 blocks dense; --layers 2 is its first two, both dense (was
    refused: "dense_layers must name distinct blocks 0..1, got [0, 1, 2]"). The count is
    transformers' (DeepseekV3ForCausalLM at 2 layers on the meta device: 3,020,332,032)."""
    inp = plan_input("DeepSeek-V3.json", "--layers", "2")
    assert inp.model.dense_layers == (0, 1) and inp.model.moe_layer_count == 0
    assert inp.model.params == 3_020_332_032
