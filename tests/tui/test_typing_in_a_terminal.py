"""No keystroke is lost: the real app in a pseudo-terminal, keys written in bursts.

Each burst is one write of 30+ key bytes with edits in it (end, backspaces, tabs to the
next field), the way keys arrive over SSH. The test then reads the app's state back
(f12 dump) and checks the exact field values, and that the plan on screen is the plan of
those fields: its input is what the fields make, and every table cell is that plan's.
"""

from __future__ import annotations

import pytest

from pty_app import PtyApp, keys
from zlayout import catalog
from zlayout.core.plan import make_plan
from zlayout.spec import PlanInput
from zlayout.tui import view
from zlayout.tui.form import plan_input_from_form
from zlayout.tui.backends import catalog_presets
from zlayout.tui.widgets import LayoutTable


@pytest.fixture
def terminal_app(tmp_path):
    apps = []

    def start(args, size):
        app = PtyApp(args, size, tmp_path / "state.json")
        apps.append(app)
        app.settled()
        return app

    yield start
    for app in apps:
        app.close()


def assert_plan_is_the_fields_plan(state):
    """The plan on screen is the plan of the fields as they stand, cell for cell."""
    shown = PlanInput.model_validate(state["plan_input"])
    rebuilt = plan_input_from_form(state["values"], shown.model, shown, catalog_presets())
    assert rebuilt == shown
    plan = make_plan(shown)
    titles = dict(LayoutTable.COLUMNS)
    for row in view.layout_rows(plan):
        cells = dict(zip(LayoutTable.COLUMN_KEYS, (str(c) for c in LayoutTable._cells(row))))
        table_row = state["table"][row.key]
        assert table_row == {key: cells[key] for key in table_row}, (row.key, titles)


@pytest.mark.parametrize("size", [(160, 48), (80, 24)], ids=["160x48", "80x24"])
def test_bursts_of_keys_into_several_fields_are_all_applied(terminal_app, size):
    app = terminal_app(["app", "--preset", "llama3-8b", "--gpu", "h200", "--gpus-per-node", "8"], size)
    if size[0] < 120:
        app.write(keys("\x02"))  # ctrl+b: the inputs panel (hidden at first below 120 columns)
    app.focus("layers")
    # layers 32 -> 48, hidden 4096 -> 6144, heads 32 -> 48, kv heads 8 -> 6: one write
    burst = keys("end", "backspace", "backspace", "48", "tab",
                 "end", *["backspace"] * 4, "6144", "tab",
                 "end", "backspace", "backspace", "48", "tab",
                 "end", "backspace", "6")
    assert len(burst) >= 30
    app.write(burst)
    # and straight after, a second burst with a typo fixed in it: ffn 14336 -> 16384
    app.write(keys("tab", "end", *["backspace"] * 5, "1638x", "backspace", "4"))
    state = app.settled(until=lambda s: s["values"]["ffn"] == "16384")
    values = state["values"]
    assert (values["layers"], values["hidden"], values["heads"], values["kv_heads"], values["ffn"]) == \
        ("48", "6144", "48", "6", "16384")
    assert state["errors"] == {}
    model = PlanInput.model_validate(state["plan_input"]).model
    assert (model.layers, model.hidden, model.heads, model.kv_heads, model.ffn) == (48, 6144, 48, 6, 16384)
    assert model.name == "custom" and values["preset"] is None
    assert_plan_is_the_fields_plan(state)


def test_size_typed_in_a_burst_then_undone(terminal_app):
    app = terminal_app(["app", "--layers", "48", "--hidden", "6144", "--heads", "48", "--vocab", "32000"],
                       (160, 48))
    app.focus("size")
    # 70B typed and erased, 13B typed, its "13" deleted from the left, 7 typed, B retyped
    app.write(keys("70B", "backspace", "backspace", "backspace", "13B", "left", "left", "left",
                   "delete", "delete", "backspace", "7", "end", "backspace", "B"))
    sized = catalog.model_for_size(catalog.parse_size("7B"))
    state = app.settled(until=lambda s: s["values"]["size"] == "7B")
    assert state["values"]["layers"] == str(sized.layers)
    assert state["values"]["hidden"] == str(sized.hidden)
    assert PlanInput.model_validate(state["plan_input"]).model.params == sized.params
    assert_plan_is_the_fields_plan(state)
    # ctrl+z, as often as it takes, brings the architecture typed on the command line back
    for _ in range(10):
        app.write(keys("ctrl+z"))
        state = app.settled()
        if state["values"]["hidden"] == "6144":
            break
    values = state["values"]
    assert (values["layers"], values["hidden"], values["heads"], values["size"]) == ("48", "6144", "48", "")
    assert_plan_is_the_fields_plan(state)


def test_a_burst_through_the_tab_bar_and_a_select_lands_in_the_fields_it_names(terminal_app):
    """Keys that walk through the Preset select and the tab bar in one write: each lands where
    the focus is when its turn comes (the select and the tab bar used to run keys meant for
    the next field, and a tab run there sent the focus back to Preset)."""
    app = terminal_app(["app", "--preset", "llama3-8b", "--gpu", "h200", "--gpus-per-node", "8"], (160, 48))
    app.focus("layers")
    # Layers -> Size -> Preset -> tab bar, two tabs right (Training), into Sequence: 3072;
    # back to the tab bar, two tabs left (Model), three tabs in (Layers): 40
    app.write(keys("shift+tab", "shift+tab", "shift+tab", "right", "right", "tab",
                   "end", *["backspace"] * 4, "3072",
                   "shift+tab", "left", "left", "tab", "tab", "tab", "end", "backspace", "backspace", "40"))
    state = app.settled(until=lambda s: s["values"]["layers"] == "40")
    assert state["focused"] == "layers"
    assert (state["values"]["seq"], state["values"]["layers"]) == ("3072", "40")
    inp = PlanInput.model_validate(state["plan_input"])
    assert (inp.training.seq, inp.model.layers) == (3072, 40)
    assert_plan_is_the_fields_plan(state)


def test_a_burst_that_ends_on_the_tab_bar_keeps_the_tab_it_chose(terminal_app):
    """From Size, one write of shift+tab shift+tab right: the tab bar shows Hardware, and a
    tab typed later goes to Hardware's first field (the Model pane's late 'I have the focus'
    news used to switch the tabs back, and the tab then landed on Preset)."""
    app = terminal_app(["app", "--preset", "llama3-70b", "--gpu", "h100", "--gpus-per-node", "8"], (160, 48))
    app.focus("size")
    app.write(keys("shift+tab", "shift+tab", "right"))
    app.settled()
    app.write(keys("tab"))
    state = app.settled(until=lambda s: s["focused"] != "size")
    assert state["focused"] == "gpu"


def test_showing_and_hiding_the_inputs_in_one_burst_leaves_the_focus_on_the_table(terminal_app):
    # At 80x24 the inputs start hidden and the table has the focus. ctrl+b ctrl+b written at
    # once: the first showed the panel and asked for its tab bar to be focused later, the
    # second hid the panel before that focus landed, so the focus ended on a hidden tab bar and
    # the keys typed next were lost (3 of 6 runs). Four runs, each must end on the table.
    for _ in range(4):
        app = terminal_app(["app", "--preset", "llama3-8b", "--gpu", "h200", "--gpus-per-node", "8"], (80, 24))
        assert app.state()["focused"] == "layouts"
        app.write(keys("\x02\x02"))
        assert app.settled()["focused"] == "layouts"
        app.close()


# -- bursts through the selects: opening, searching, choosing and leaving in one write ------

def to_hardware_gpu(app) -> None:
    """From Layers: back to the tab bar, right to Hardware, into its first field (GPU)."""
    app.focus("layers")
    app.write(keys("shift+tab", "shift+tab", "shift+tab", "right", "tab"))
    assert app.settled()["focused"] == "gpu"


@pytest.mark.parametrize("size", [(160, 48), (100, 30), (80, 24)], ids=["160x48", "100x30", "80x24"])
def test_a_burst_that_opens_searches_and_leaves_the_gpu_select(terminal_app, size):
    """The issue's burst, one write at 0 ms: `enter h 1 0 0 enter tab 4` on GPU left the list
    open on h200 and GPUs/node at 8 (the list took the focus only after the burst's keys)."""
    app = terminal_app(["app", "--preset", "llama3-70b", "--gpu", "h200", "--gpus-per-node", "8"], size)
    if size[0] < 120:
        app.write(keys("\x02"))  # ctrl+b: the inputs (hidden at first below 120 columns)
    to_hardware_gpu(app)
    app.write(keys("\r", "h100", "\r", "tab", "4"))
    state = app.settled(until=lambda s: s["values"]["gpus_per_node"] == "4")
    assert state["focused"] == "gpus_per_node"
    assert (state["values"]["gpu"], state["values"]["intra_link"]) == ("h100", "nvlink4")
    hardware = PlanInput.model_validate(state["plan_input"]).hardware
    assert (hardware.gpu.name, hardware.gpus_per_node) == ("h100", 4)
    assert_plan_is_the_fields_plan(state)


def test_one_burst_through_every_select_of_hardware_and_training(terminal_app):
    """Each select opened (enter, or a letter on a closed one), searched (a typo taken back
    with backspace; a search taken back whole keeps the value), chosen, and left with tab, all
    in one write; then the focus walks on into a number field and types. (No escape inside a
    burst: a terminal's ESC followed at once by another byte is that key with alt.)"""
    app = terminal_app(["app", "--preset", "llama3-8b", "--gpu", "h200", "--gpus-per-node", "8"], (160, 48))
    to_hardware_gpu(app)
    app.write(keys(
        "\r", "a", "1", "0", "0", "-", "8", "\r",        # GPU: a100-80gb (its link: nvlink3)
        "tab", "tab",                                     # GPUs/node, Nodes
        "tab", "\r", "p", "c", "x", "backspace", "i", "e", "5", "\r",  # Intra link: pcie5
        "tab", "r", "o", "backspace", "backspace", "\r",  # Inter link: opened by a letter, search undone
        "tab", "end", "backspace", "backspace", "backspace", "backspace", "1024",  # Host RAM GiB
    ))
    state = app.settled(until=lambda s: s["values"]["host_ram_gib"] == "1024")
    values = state["values"]
    assert (values["gpu"], values["intra_link"], values["inter_link"]) == ("a100-80gb", "pcie5", "ib-ndr")
    assert state["focused"] == "host_ram_gib"
    assert_plan_is_the_fields_plan(state)
    # Training: from the tab bar, every select in one write, then the sequence length
    app.write(keys(*["shift+tab"] * 6, "right", "tab",       # the tab bar, Training, Sequence
                   "tab", "tab", "tab",                         # Precision
                   "\r", "f", "p", "1", "\r",                   # fp16
                   "tab", "f", "u", "\r",                       # Checkpoint: full (a letter opens it)
                   "tab", "\r", "t", "r", "a", "\r",            # Model code: transformers
                   "tab", "\r", "e", "x", "\r",                 # Allocator: expandable
                   "tab", "t", "r", "\r",                       # Loop: trainer (a letter opens it)
                   *["shift+tab"] * 7,                          # back to Sequence
                   "end", "backspace", "backspace", "backspace", "backspace", "8192"))
    state = app.settled(until=lambda s: s["values"]["seq"] == "8192")
    values = state["values"]
    assert (values["precision"], values["checkpointing"], values["impl"], values["allocator"], values["loop"]) == \
        ("fp16", "full", "hf", "expandable", "trainer")
    assert state["focused"] == "seq"
    training = PlanInput.model_validate(state["plan_input"]).training
    assert (training.seq, training.precision, training.checkpointing, training.impl, training.allocator,
            training.loop) == (8192, "fp16", "full", "hf", "expandable", "trainer")
    assert_plan_is_the_fields_plan(state)


@pytest.mark.parametrize("size", [(160, 48), (80, 24)], ids=["160x48", "80x24"])
def test_a_size_typed_in_the_burst_that_chose_a_preset_is_applied(terminal_app, size):
    """QA (tmux 160x48, one burst on Preset): `enter down down enter tab 1 3 B tab` left Size
    showing 13B beside Mixtral's plan (46.7B). The preset's news came after Size read 13B: the
    form was validated with 13B in it, and Size's own news then read as "not an edit"."""
    app = terminal_app(["app", "--preset", "llama3-8b", "--gpu", "h200", "--gpus-per-node", "8"], size)
    if size[0] < 120:
        app.write(keys("\x02"))  # ctrl+b: the inputs (hidden at first below 120 columns)
    app.focus("preset")
    app.write(keys("\r", "down", "down", "\r", "tab", "13B", "tab"))  # llama3-8b, mistral-7b, mixtral-8x7b
    state = app.settled(until=lambda s: s["values"]["size"] == "13B" and s["focused"] == "layers")
    sized = catalog.model_for_size(catalog.parse_size("13B"))
    values = state["values"]
    assert (values["layers"], values["hidden"], values["preset"]) == (str(sized.layers), str(sized.hidden), None)
    assert PlanInput.model_validate(state["plan_input"]).model.params == sized.params
    assert state["errors"] == {}
    assert_plan_is_the_fields_plan(state)


@pytest.mark.parametrize("size", [(160, 48), (80, 24)], ids=["160x48", "80x24"])
def test_the_size_shown_typed_again_after_a_preset_in_one_burst_is_applied(terminal_app, size):
    """Size showing 13B, one burst from it: `shift+tab enter down enter tab ctrl+a ctrl+k 1 3 B tab`.
    Size's keys were handled before the preset's news came, the preset then cleared Size (its
    13B was the text shown, so "unedited"), and Size's own news read as "not an edit": Mistral's
    plan stayed with Size empty. The last field typed wins."""
    app = terminal_app(["app", "--params", "13e9", "--gpu", "h200", "--gpus-per-node", "8"], size)
    if size[0] < 120:
        app.write(keys("\x02"))  # ctrl+b: the inputs (hidden at first below 120 columns)
    app.focus("size")
    app.write(keys("\x01", "\x0b", "13B"))  # ctrl+a ctrl+k: the field emptied
    app.settled(until=lambda s: s["values"]["size"] == "13B" and s["values"]["preset"] is None)
    app.write(keys("shift+tab", "\r", "down", "\r", "tab", "\x01", "\x0b", "13B", "tab"))
    state = app.settled(until=lambda s: s["focused"] == "layers")
    sized = catalog.model_for_size(catalog.parse_size("13B"))
    values = state["values"]
    assert (values["size"], values["preset"], values["layers"]) == ("13B", None, str(sized.layers))
    assert PlanInput.model_validate(state["plan_input"]).model.params == sized.params
    assert_plan_is_the_fields_plan(state)


def test_one_burst_through_the_model_selects(terminal_app):
    """Preset searched and chosen, then MLP and Norm changed by letters on the closed selects,
    in one write, and the focus goes on to Biases (a space ticks it)."""
    app = terminal_app(["app", "--preset", "llama3-8b", "--gpu", "h200", "--gpus-per-node", "8"], (160, 48))
    app.focus("size")
    app.write(keys("shift+tab", "\r", *"qwen2.5-7b", "\r",  # Preset: qwen2.5-7b (qwen2.5-7 is 72b first)
                   "tab", "tab", "tab", "tab", "tab", "tab", "tab", "tab",  # Size .. Vocab, MLP
                   "g", "\r",                                              # MLP: gelu
                   "tab", "l", "a", "\r",                                  # Norm: layernorm
                   "tab", " "))                                            # Biases ticked
    state = app.settled(until=lambda s: s["focused"] == "bias")
    values = state["values"]
    assert (values["mlp"], values["norm"], values["bias"]) == ("gelu", "layernorm", True)
    # editing the architecture made the model custom: the preset's own fields stay
    from zlayout import catalog

    qwen = catalog.load_model("qwen2.5-7b")
    assert (values["layers"], values["hidden"], values["vocab"]) == (str(qwen.layers), str(qwen.hidden),
                                                                     str(qwen.vocab))
    model = PlanInput.model_validate(state["plan_input"]).model
    assert (model.mlp, model.norm, model.bias, model.hidden) == ("gelu", "layernorm", True, qwen.hidden)
    assert_plan_is_the_fields_plan(state)


def test_a_field_fixed_in_the_same_burst_as_ctrl_s_is_not_reported_marked(terminal_app):
    """Layers marked invalid; then fixed and ctrl+s in one write: export said "Fix the marked
    fields first (Layers)" about a field fixed before the key was typed."""
    app = terminal_app(["app", "--preset", "llama3-8b", "--gpu", "h200", "--gpus-per-node", "8"], (160, 48))
    app.focus("layers")
    app.write(keys("end", "x"))
    assert "layers" in app.settled(until=lambda s: bool(s["errors"]))["errors"]  # marked
    app.write(keys("end", "backspace", "backspace", "backspace", "40", "\x13"))  # fixed, ctrl+s
    # the export asks for its path, or says the plan is still being computed: never a stale
    # mark (read while its notification shows: they go after 5 s)
    state = app.state(until=lambda s: s["values"]["layers"] == "40" and (
        s["screen"] == "PathScreen" or any("still being computed" in n or "Fix the marked" in n
                                           for n in s["notifications"])))
    assert not any("Fix the marked fields" in n for n in state["notifications"]), state["notifications"]


def test_a_size_burst_that_tabs_on_fills_the_field_the_cursor_reached(terminal_app):
    """QA: on Size, `13B tab` then Layers edited and `tab` in one write: the size's news arrived with
    the cursor in Hidden, which kept llama3-70b's 8192 beside the 13B shape's heads and FFN
    ('Hidden (8192) must be divisible by Heads (36)')."""
    app = terminal_app(["app", "--preset", "llama3-70b", "--gpu", "h100", "--nodes", "4"], (160, 48))
    app.focus("size")
    app.write(keys("end", *["backspace"] * 4, "13B", "tab", "end", "backspace", "backspace", "40", "tab"))
    sized = catalog.model_for_size(catalog.parse_size("13B"))
    # Layers typed after the size makes the model custom (Size cleared); every field not typed
    # into, the one the cursor reached included, holds the 13B shape's figure
    state = app.settled(until=lambda s: s["values"]["layers"] == "40" and not s["pending"])
    values = state["values"]
    assert values["hidden"] == str(sized.hidden) and values["heads"] == str(sized.heads)
    assert values["ffn"] == str(sized.ffn)
    assert state["errors"] == {}
    assert_plan_is_the_fields_plan(state)


def test_a_burst_from_the_table_through_the_lower_views_to_the_size_field(terminal_app):
    """QA (tmux, one send-keys): from the table, `tab tab enter m i x t enter tab 1 3 B tab end
    backspace 8 tab` changed nothing, while the same keys 0.4 s apart set Size to 8. The first
    tab reached the chart/break-even views, which left the burst's later keys to bubble up to
    the app: its bindings (the tabs) ran, every character was lost."""
    app = terminal_app(["app", "--preset", "llama3-70b", "--gpu", "h100", "--nodes", "4"], (160, 48))
    before = app.settled()
    assert before["focused"] == "layouts"
    app.write(keys("tab", "tab", "\r", *"mixt", "\r",  # views, the tab bar: enter and letters do nothing
                   "tab", *"13B",                      # Preset: its list opens, searches "13B"
                   "tab", "end", "backspace", "8",     # the list closed unchanged; Size: "8"
                   "tab"))                             # on to Layers
    state = app.settled(until=lambda s: s["focused"] == "layers" and bool(s["errors"]))
    values = state["values"]
    assert (values["preset"], values["size"], values["layers"]) == ("llama3-70b", "8", "80")
    assert state["tab"] == "tab-model"
    assert list(state["errors"]) == ["size"] and "no unit" in state["errors"]["size"]
    # a size without a unit plans nothing: the plan on screen stays llama3-70b's, marked stale
    assert state["plan_input"] == before["plan_input"] and state["table"] == before["table"]
    assert "field invalid (Size)" in state["status"]


@pytest.mark.parametrize("size", [(160, 48), (80, 24)], ids=["160x48", "80x24"])
def test_a_burst_of_arrows_scrolls_a_layouts_details_a_line_a_key(terminal_app, size):
    """Ten ↓ in one write scroll the memory terms ten lines (Textual's own scroll reckoned each
    key from where the view was at the last refresh: the burst moved them two); page and end
    keys after them count from there too."""
    import time

    app = terminal_app(["app", "--preset", "llama3-8b", "--gpu", "h200", "--gpus-per-node", "8"], size)
    app.write(keys("enter"))  # the table has the focus: the starred layout's details
    app.state(until=lambda s: s["screen"] == "DetailScreen")
    app.write(keys(*["down"] * 10))
    time.sleep(1.0)  # a deferred scroll would have landed by now
    assert app.state()["scrolled"] == {"detail-body": 10}
    app.write(keys("up", "up", "up", "end", "up", "home", "down", "down"))
    time.sleep(1.0)
    assert app.state()["scrolled"] == {"detail-body": 2}
