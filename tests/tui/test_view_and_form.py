"""The app's pure parts: form values <-> PlanInput, and what the widgets are given to show."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tui_fakes import fixed_input, fixed_presets, stub_planner
from zlayout.core.plan import make_plan
from zlayout.spec import GiB, PlanInput
from zlayout.tui import view
from zlayout.tui.form import FormInvalid, form_values, plan_input_from_form


def values_with(**changes):
    values = form_values(fixed_input())
    values.update(changes)
    return values


def build(values):
    inp = fixed_input()
    return plan_input_from_form(values, inp.model, inp, fixed_presets())


def test_form_values_round_trip_to_the_same_input():
    assert build(form_values(fixed_input())) == fixed_input()


@settings(max_examples=40, deadline=None)
@given(layers=st.integers(1, 200), seq=st.integers(1, 1 << 20), gpus=st.integers(1, 16),
       nodes=st.integers(1, 64), host_gib=st.integers(1, 8192), nvme_gib=st.integers(0, 65536),
       checkpointing=st.sampled_from(["none", "full"]), precision=st.sampled_from(["bf16", "fp16", "fp32"]))
def test_any_valid_input_round_trips_through_the_form(layers, seq, gpus, nodes, host_gib, nvme_gib,
                                                      checkpointing, precision):
    base = fixed_input()
    # the preset's own depth is the preset itself (the form names it back); any other is custom
    name = base.model.name if layers == base.model.layers else "custom"
    inp = base.model_copy(update={
        "model": base.model.model_copy(update={"layers": layers, "name": name}),
        "hardware": base.hardware.model_copy(update={"gpus_per_node": gpus, "nodes": nodes,
                                                     "host_ram_bytes": host_gib * GiB,
                                                     "nvme_bytes": nvme_gib * GiB}),
        "training": base.training.model_copy(update={"seq": seq, "checkpointing": checkpointing,
                                                     "precision": precision}),
    })
    assert plan_input_from_form(form_values(inp), base.model, base, fixed_presets()) == inp


@pytest.mark.parametrize("field, text, reason", [
    ("layers", "eight", "whole number"),
    ("layers", "0", "must be from 1 to 1,000 (got 0)"),
    ("hidden", "4096.5", "whole number"),
    ("kv_heads", "5", "multiple of KV heads (5); type 4"),
    ("heads", "33", "divisible by Heads (33); type 32"),
    ("hidden", "4097", "Hidden (4097) must be divisible by Heads (32); type 4096"),  # was under Heads
    ("seq", "", "whole number"),
    ("host_ram_gib", "lots", "number of GiB"),
    ("nvme_gib", "-1", "must be from 0 GiB to 1,048,576 GiB (got -1 GiB)"),
    # below the range in the range's words: -100 said "0 or more" where 0 said "from 1 GiB"
    ("host_ram_gib", "-100", "must be from 1 GiB to 1,048,576 GiB (got -100 GiB)"),
    ("host_ram_gib", "0", "must be from 1 GiB to 1,048,576 GiB (got 0 GiB)"),
    ("gpus_per_node", "-8", "must be from 1 to 128 (got -8)"),
    # what the command line refuses the app refuses too: other scripts' digits, infinities
    # ('inf' GiB crashed the plan: no integer of bytes)
    ("layers", "١٢", "whole number"),
    ("host_ram_gib", "inf", "number of GiB"),
    ("nvme_gib", "1e400", "number of GiB"),
    ("host_ram_gib", "nan", "number of GiB"),
])
def test_each_bad_value_is_reported_on_its_own_field(field, text, reason):
    with pytest.raises(FormInvalid) as caught:
        build(values_with(**{field: text}))
    assert set(caught.value.errors) == {field}
    assert reason in caught.value.errors[field]


def test_every_bad_field_is_reported_at_once():
    with pytest.raises(FormInvalid) as caught:
        build(values_with(layers="x", seq="y", nodes="0"))
    assert set(caught.value.errors) == {"layers", "seq", "nodes"}


@pytest.mark.parametrize("bad", [dict(hidden="4097", vocab="0"), dict(hidden="4097", layers="x"),
                                 dict(gpus_per_node="x", nodes="100000"), dict(seq="x", micro_batch="99999")],
                         ids=["model-check-and-range", "model-check-and-typo", "hardware", "training"])
def test_a_field_that_does_not_parse_hides_no_other_error(bad):
    """Two invalid fields were counted as one: a field that did not parse skipped the checks of
    the spec (Hidden's divisibility, Nodes' range) for its whole section."""
    with pytest.raises(FormInvalid) as caught:
        build(values_with(**bad))
    assert set(caught.value.errors) == set(bad)
    assert not any("--" in reason for reason in caught.value.errors.values())  # no CLI flag in the panel


def test_an_unknown_gpu_is_reported_on_the_gpu_field():
    with pytest.raises(FormInvalid) as caught:
        build(values_with(gpu="tpu-v9"))
    assert set(caught.value.errors) == {"gpu"}


def test_a_gpu_error_that_ends_by_quoting_a_value_keeps_its_closing_quote():
    """The form stripped quotes off both ends of the catalog's message ("got 'x'" read "got 'x")."""
    import dataclasses

    def broken(name):
        raise ValueError(f"gpus/{name}.toml: memory_bytes must be a whole number, got '80GB'")

    inp = fixed_input()
    presets = dataclasses.replace(fixed_presets(), load_gpu=broken)
    with pytest.raises(FormInvalid) as caught:
        plan_input_from_form(values_with(gpu="lab-gpu"), inp.model, inp, presets)
    assert caught.value.errors["gpu"] == "gpus/lab-gpu.toml: memory_bytes must be a whole number, got '80GB'"


@pytest.mark.parametrize("count", [653_056, 17_700_000, 950_000, 8_030_261_248, 176_729_321_472, 999_960_000])
def test_the_app_shows_parameter_counts_as_the_command_line_does(count):
    from zlayout.catalog import format_params

    assert view.fmt_params(count) == format_params(count)
    assert view.fmt_params(0) == "—"


def test_changing_the_architecture_makes_the_model_custom_and_keeps_the_rest():
    inp = build(values_with(layers="16", ffn="11008"))
    assert inp.model.name == "custom" and inp.model.ffn == 11008
    assert inp.zero == fixed_input().zero and inp.hardware == fixed_input().hardware


def test_headroom_colours_follow_the_thresholds():
    plan = stub_planner(fixed_input())
    memory = plan.layouts[0].memory
    # red is "does not fit" only: a layout that fits with the card full (its cache flushed,
    # core/fit.py's fits-flushing) is yellow, 'full'
    for free_fraction, level in ((0.5, "ok"), (0.21, "ok"), (0.199, "tight"), (0.06, "tight"),
                                 (0.051, "tight"), (0.049, "tight"), (0.0, "tight")):
        capacity = memory.gpu_capacity_bytes
        used = int(capacity * (1 - free_fraction))
        moved = type(memory)(**{**{f: getattr(memory, f) for f in memory.__dataclass_fields__},
                                # a full card fits where the step needs well less (core/fit.py's edge margin)
                                "gpu_device_used_bytes": used, "gpu_needed_bytes": min(used, int(capacity * 0.8)),
                                "gpu_usable_bytes": capacity})
        assert view.headroom_level(moved) == level, free_fraction
        assert view.headroom_text(moved) == ("full" if free_fraction == 0 else f"{free_fraction * 100:.0f}%")


def test_a_layout_that_does_not_fit_is_red_and_says_so():
    inp = fixed_input()
    huge = inp.model_copy(update={"model": inp.model.model_copy(update={"layers": 400})})
    plan = stub_planner(huge)
    z0 = plan.layouts[0].memory
    assert not z0.fits
    assert view.headroom_level(z0) == "over"
    assert view.headroom_text(z0).startswith("✗")


def test_the_columns_add_up_to_what_the_device_uses():
    plan = make_plan(fixed_input())
    for lp in plan.layouts:
        by_column = view.gpu_bytes_by_column(lp.memory)
        assert sum(by_column.values()) >= lp.memory.gpu_device_used_bytes
        assert by_column["activations"] == sum(t.bytes for t in lp.memory.gpu_terms()
                                               if t.category == "activations")


def test_bars_are_on_the_cards_scale_and_mark_what_overflows():
    """A ZeRO-0 layout many times the card no longer shrinks the layouts that fit to a cell:
    the card's capacity is the last cell, a bar past it stops there, marked overflowing."""
    plan = make_plan(fixed_input().model_copy(update={"model": fixed_input().model.model_copy(
        update={"layers": 96})}))
    capacity = plan.layouts[0].memory.gpu_capacity_bytes
    assert any(lp.memory.gpu_device_used_bytes > 3 * capacity for lp in plan.layouts)
    for width in (10, 40, 97):
        for bar, lp in zip(view.bar_segments(plan, width), plan.layouts):
            length = sum(cells for _, cells in bar.cells)
            assert length < width and bar.capacity_cell == width - 1
            assert bar.overflow == (lp.memory.gpu_device_used_bytes > capacity)
            if not bar.overflow:  # its share of the card, to a cell
                assert abs(length - lp.memory.gpu_device_used_bytes / capacity * (width - 1)) <= 1


def test_compare_rows_give_signed_percent_changes():
    pinned = stub_planner(fixed_input())
    inp = fixed_input()
    longer = inp.model_copy(update={"training": inp.training.model_copy(update={"seq": 8192})})
    rows = view.compare_rows(pinned, stub_planner(longer))
    assert len(rows) == len(pinned.layouts)
    assert all(row.peak_delta.startswith("+") and row.peak_delta_sign == 1 for row in rows)
    assert all(row.step_delta == "=" for row in rows)
    assert view.input_changes(pinned, stub_planner(longer)) == ["Sequence: 4096 → 8192"]  # the panel's label


def test_breakeven_rows_handle_missing_and_zero_sizes():
    plan = stub_planner(fixed_input())
    rows = view.breakeven_rows(plan, None)
    assert all(row.then == "—" for row in rows)
    bare = type(plan)(input=plan.input, recommendation=plan.recommendation,
                      layouts=tuple(type(lp)(lp.layout, lp.memory, lp.comm, lp.time, None)
                                    for lp in plan.layouts))
    assert all(row.max_params == "—" for row in view.breakeven_rows(bare))
    assert view.first_crossover_line(bare, ()) == ""


@pytest.mark.parametrize("n_bytes, text", [(0, "·"), (GiB // 2, "0.50"), (12.34 * GiB, "12.3"),
                                           (1234 * GiB, "1234"), (10434 * GiB, "10434"),
                                           (20000 * GiB, "20000")])
def test_gib_formatting_stays_within_five_characters_and_in_gib(n_bytes, text):
    """Always GiB: a '10.2T' under a GiB title read as tera-GiB (QA: 405B on 8 A100-40GB)."""
    assert view.fmt_gib(n_bytes) == text
    assert len(text) <= 5 and "T" not in text


def test_the_app_starts_without_torch_or_deepspeed():
    code = ("import sys; import zlayout.tui.app, zlayout.commands.serve; "
            "bad = [m for m in ('torch', 'deepspeed') if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_an_edited_preset_architecture_is_custom_and_of_no_family():
    """The app's break-even then scales the custom shape, not the preset's family."""
    from zlayout import catalog
    from zlayout.tui.form import model_from_form

    base = catalog.load_model("llama3-70b")
    values = form_values(PlanInput(model=base, hardware=fixed_input().hardware, training=fixed_input().training))
    assert model_from_form(values, base) == base
    edited = model_from_form({**values, "layers": "48"}, base)
    assert (edited.name, edited.family, edited.layers) == ("custom", None, 48)


@pytest.mark.parametrize("width", range(24, 90))
def test_the_status_line_never_wraps_between_a_figure_and_its_unit(width):
    """Rich's wrap left "at 0.43" at a line's end and "s/step" on the next; the status line's
    lines are also never wider than the line (a zero-width glue made them one cell too wide)."""
    from rich.cells import cell_len

    text = ("★ ZeRO-1: fits; 60% of the card free at the peak (device used 55.5 of 140.4 GiB per GPU) "
            "at 0.27 s/step (38% MFU); runner-up ZeRO-2 is as fast (0.27 s/step), a tie within 3%, "
            "so a lower stage wins.")
    lines = view.wrap_keeping_figures(text, width)
    assert " ".join(lines) == text
    assert all(cell_len(line) <= width for line in lines)
    for line, following in zip(lines, lines[1:]):
        assert not (line.split(" ")[-1].replace(".", "").isdigit()
                    and following.split(" ")[0] in ("s/step", "GiB")), (line, following)


def test_a_sequence_past_a_models_learned_positions_is_reported_on_the_seq_field():
    """GPT-2's 1,024 learned positions: a longer sequence indexes past the table (a GPU run stops
    on it). PlanInput refuses it; the panel builds its input with model_copy, which validates
    nothing, so the form says it itself, under Seq."""
    inp = fixed_input()
    model = inp.model.model_copy(update={"position_embeddings": 1024, "name": "gpt2"})
    with pytest.raises(FormInvalid) as caught:
        plan_input_from_form(values_with(seq="2048"), model, inp, fixed_presets())
    assert set(caught.value.errors) == {"seq"}
    assert "1,024" in caught.value.errors["seq"] and "gpt2" in caught.value.errors["seq"]
    assert plan_input_from_form(values_with(seq="1024"), model, inp, fixed_presets()).training.seq == 1024


def test_a_sequence_or_micro_batch_past_the_model_cards_limits_is_reported_on_its_field(tmp_path, monkeypatch):
    """A card learned from 2,048 tokens on (a top-k indexer's kink below: zlayout learn), exact at
    micro-batches of up to two, of a class that cannot checkpoint its blocks (openai-gpt's): PlanInput
    refuses past them, and so does the form, field by field."""
    from pathlib import Path

    from zlayout import cards, hfconfig

    published = Path(__file__).resolve().parent.parent / "hf" / "configs" / "published" / "Qwen3-0.6B.json"
    key = hfconfig.load(published).card.key
    text = (cards.SHIPPED_CARDS_DIR / f"{key}.toml").read_text()
    assert text.count("[[regimes]]\n") == 1
    (tmp_path / "cards").mkdir()
    (tmp_path / "cards" / f"{key}.toml").write_text(text.replace(
        "[[regimes]]\n", "[[regimes]]\nmin_tokens = 2048\nmax_micro_batch = 2\n", 1).replace(
        "\nformat = 1\n", "\nformat = 1\ncheckpointing = false\n", 1))
    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(tmp_path / "cards"))
    model = hfconfig.load(published)
    assert model.card.shortest_sequence == 2048
    inp = fixed_input().model_copy(update={"model": model})
    values = {**form_values(inp), "seq": "1024", "micro_batch": "4", "checkpointing": "full"}
    with pytest.raises(FormInvalid) as caught:
        plan_input_from_form(values, model, inp, fixed_presets())
    assert set(caught.value.errors) == {"seq", "micro_batch", "checkpointing"}
    assert "sequences of 2,048 tokens or more" in caught.value.errors["seq"]
    assert "exact at 2 sequences a step" in caught.value.errors["micro_batch"]
    assert "cannot checkpoint its blocks" in caught.value.errors["checkpointing"]
    assert "--" not in caught.value.errors["seq"] + caught.value.errors["micro_batch"]
    done = plan_input_from_form({**values, "seq": "2048", "micro_batch": "2", "checkpointing": "none"}, model, inp,
                                fixed_presets())
    assert (done.training.seq, done.training.micro_batch) == (2048, 2)


def test_a_sequence_a_mamba2_scan_would_pad_is_reported_on_the_seq_field(tmp_path, monkeypatch):
    """Mamba-2's torch reference pads the sequence to its chunk (64 tokens in the tiny config):
    its card prices multiples only, and the form says so under Seq, as the CLI does."""
    from pathlib import Path

    from zlayout import cards, hfconfig
    from zlayout.cli import main

    config = Path(__file__).resolve().parent.parent / "learn" / "configs" / "mamba2-tiny.json"
    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(tmp_path / "cards"))
    assert main(["learn", "--hf-config", str(config)]) == 0
    model = hfconfig.load(config)
    inp = fixed_input().model_copy(update={"model": model})
    with pytest.raises(FormInvalid) as caught:
        plan_input_from_form({**form_values(inp), "seq": "1000"}, model, inp, fixed_presets())
    assert set(caught.value.errors) == {"seq"}
    assert "chunk (64 tokens: 1,000 runs as 1,024)" in caught.value.errors["seq"]
    assert plan_input_from_form({**form_values(inp), "seq": "1024"}, model, inp, fixed_presets()).training.seq == 1024


def test_a_model_whose_card_does_not_resize_refuses_another_depth_on_the_layers_field():
    """A card the learner found does not count what transformers builds at fewer blocks (Gemma-3n's
    kv-shared blocks move with the depth: `layers.resizable = false`) cannot plan another depth, and
    the hand model would plan another model: Layers says why, as `plan --layers` refuses."""
    from dataclasses import replace

    from pathlib import Path

    from zlayout import hfconfig
    from zlayout.tui.form import model_from_form

    base = hfconfig.load(Path(__file__).resolve().parents[1] / "hf" / "configs" / "published" / "Qwen2.5-0.5B.json")
    assert base.card is not None  # shipped in presets/cards
    fixed = base.model_copy(update={"card": replace(base.card, resizable=False)})
    values = form_values(PlanInput(model=fixed, hardware=fixed_input().hardware, training=fixed_input().training))
    assert model_from_form(values, fixed) == fixed
    with pytest.raises(FormInvalid) as refused:
        model_from_form({**values, "layers": "48"}, fixed)
    assert "blocks change with its depth: learn a copy of its config.json at 48 layers" in refused.value.errors["layers"]
    # a count outside the field's bounds says so first (the card's line would name a depth no model has)
    with pytest.raises(FormInvalid) as out_of_range:
        model_from_form({**values, "layers": "0"}, fixed)
    assert out_of_range.value.errors["layers"] == "must be from 1 to 1,000 (got 0)"
    assert model_from_form({**values, "layers": "48"}, base).layers == 48  # a card that resizes does
