"""QA's cuts, each through the real app: select labels, the what-if line, the detail screen's
term names, GiB figures past 10000 GiB, the layouts title at 80 columns with the inputs open."""

from __future__ import annotations

import pytest
from rich.text import Text
from textual.widgets import Input
from textual.widgets._select import SelectCurrent

from test_app import screen_text
from tui_fakes import settle
from zlayout import catalog
from zlayout.spec import HardwareSpec, PlanInput, TrainingSpec
from zlayout.tui.app import ZLayoutApp
from zlayout.tui.fields import PanelSelect
from zlayout.tui.screens import DetailScreen
from zlayout.tui.widgets import LayoutTable

SIZES = [(80, 24), (100, 30), (160, 48)]


def qa_input(preset: str = "llama3-70b", gpu: str = "h100", nodes: int = 8) -> PlanInput:
    hw = HardwareSpec(gpu=catalog.load_gpu(gpu), gpus_per_node=8, nodes=nodes,
                      intra_link=catalog.load_link(catalog.default_intra_link(gpu)),
                      inter_link=catalog.load_link("ib-ndr") if nodes > 1 else None)
    return PlanInput(model=catalog.load_model(preset), hardware=hw,
                     training=TrainingSpec(seq=2048, micro_batch=1))


async def open_inputs(pilot) -> None:
    app = pilot.app
    await settle(pilot)
    if not app.show_inputs:
        await pilot.press("ctrl+b")
    for _ in range(100):
        if getattr(app.query_one("#inputs"), "fields_mounted", False):
            break
        await pilot.pause(0.05)
    await pilot.pause()


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
async def test_every_option_of_every_select_fits_the_select(size):
    """'full (every layer)' showed as 'full (every' at 160x48; at 80x24 two preset names
    (deepseek-v2-lite, qwen1.5-moe-a2.7b) were wider than the preset select."""
    app = ZLayoutApp(initial=qa_input(), cursor_blink=False)
    async with app.run_test(size=size) as pilot:
        await open_inputs(pilot)
        tabs = app.query_one("#input-tabs")
        seen = set()
        for pane in ("tab-model", "tab-hardware", "tab-training"):
            tabs.active = pane
            await pilot.pause(0.1)
            for select in app.query(PanelSelect):
                if not select.region.width:
                    continue
                seen.add(select.id)
                room = select.query_one(SelectCurrent).query_one("#label").content_region.width
                for prompt, _ in select._options:
                    assert Text.from_markup(str(prompt)).cell_len <= room, (size, select.id, prompt, room)
        assert {"preset", "gpu", "checkpointing", "impl", "allocator"} <= seen


async def test_the_what_if_line_names_the_panels_labels_and_wraps_instead_of_cutting():
    app = ZLayoutApp(initial=qa_input(), cursor_blink=False)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot)
        await pilot.press("ctrl+t")
        app.query_one("#seq", Input).value = "8192"
        app.query_one("#micro_batch", Input).value = "2"
        app.query_one("#grad_accum", Input).value = "4"
        await settle(pilot)
        app.clear_notifications()
        await pilot.pause()
        panel = app.query_one("#compare")
        lines = screen_text(app).splitlines()
        shown = " ".join(lines[y][panel.region.x:panel.region.right].strip("│ ")
                         for y in range(panel.region.y, panel.region.y + 4))
        assert "Changed: Sequence: 2048 → 8192, Micro-batch: 1 → 2, Grad accum: 1 → 4" \
            in " ".join(shown.split())
        assert "micro_batch" not in shown and "grad_accum" not in shown and "…" not in shown


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
async def test_the_detail_screen_shows_every_term_name_whole(size):
    app = ZLayoutApp(initial=qa_input(), cursor_blink=False)
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        table = app.query_one(LayoutTable)
        index = next(i for i, row in enumerate(table._rows) if row.stage == "3" and row.params_on == "cpu")
        table.move_cursor(row=index, animate=False)
        await pilot.press("enter")
        await pilot.pause(0.3)
        assert isinstance(app.screen, DetailScreen)
        body = app.screen.query_one("#detail-body")
        text = ""
        for y in range(0, body.virtual_size.height, max(1, body.size.height)):
            body.scroll_to(y=y, animate=False)
            await pilot.pause()
            lines = screen_text(app).splitlines()
            text += "\n".join(lines[y][body.region.x:body.region.right]
                              for y in range(body.region.y, body.region.bottom)) + "\n"
        assert "…" not in text, text
        joined = "".join(text.split())  # a folded name reads whole once the line breaks go
        for name in ("stage3_persistent_parameters", "stage3_max_reuse_distance",
                     "stage3_param_persistence_threshold"):
            assert name in joined, name


async def test_gib_past_ten_thousand_stays_in_gib_in_the_table():
    """405B on 8 A100-40GB: Free showed '✗ +10.2T GiB', Used '10.2T' under a GiB title."""
    app = ZLayoutApp(initial=qa_input("llama3-405b", "a100-40gb", 1), cursor_blink=False)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot)
        cells = app.query_one(LayoutTable).cell_texts()
        used = [row["used"] for row in cells.values()]
        assert not any("T" in value for row in cells.values() for value in row.values())
        assert any(len(value) == 5 and value.isdigit() and int(value) >= 10000 for value in used)
        assert any(row["free"].startswith("✗ +1") and row["free"].endswith(" GiB")
                   and row["free"][3:-4].isdigit() for row in cells.values())


async def test_at_80_columns_with_the_inputs_open_the_title_is_whole_and_names_the_columns_past_the_edge():
    """44 columns are left for the table; even without the per-term columns it needs ~75, so
    the columns that do not fit whole (Free, Host, Comm, Step, tok/s here) are left out (→
    scrolls, by whole columns): the title names them, uncut."""
    app = ZLayoutApp(initial=qa_input(), cursor_blink=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_inputs(pilot)
        table = app.query_one(LayoutTable)
        await pilot.pause()
        title = str(table.border_title)
        hidden = sum(table.left_out_titles(), [])
        assert hidden and hidden[-1] == "tok/s"
        assert title.endswith(" ".join(hidden)) and "→" in title
        line = screen_text(app).splitlines()[table.region.y]
        assert title in line and "…" not in line
        # with the panel hidden every column fits and the title says the units
        await pilot.press("ctrl+b")
        await pilot.pause(0.2)
        assert not sum(table.left_out_titles(), [])
        title = str(table.border_title)
        assert "→" not in title and "GiB" in title
        assert title in screen_text(app).splitlines()[table.region.y]


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
async def test_the_status_line_shows_the_whole_recommendation_with_the_inputs_open(size):
    """70B on 4 nodes of H100s, seq 4096, micro-batch 3: at 80x24 with the inputs open the
    sentence takes 8 lines of 43 columns; the status showed 6 and cut it after '(14.80
    s/step),' (its offload and what it costs were gone)."""
    initial = qa_input(nodes=4).model_copy(update={"training": TrainingSpec(
        seq=4096, micro_batch=3, checkpointing="full")})
    app = ZLayoutApp(initial=initial, cursor_blink=False)
    async with app.run_test(size=size) as pilot:
        await open_inputs(pilot)
        status = app.query_one("#recommendation")
        assert "spending" in status.text and status.text.endswith(".")
        lines = screen_text(app).splitlines()
        shown = " ".join(lines[y][status.content_region.x:status.content_region.right].strip()
                         for y in range(status.region.y, status.region.bottom))
        assert " ".join(shown.split()) == " ".join(status.text.split())


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
async def test_a_notification_sits_over_the_inputs_panel_off_the_table(size):
    """The export toast covered the table's Peak (80x24, the inputs open) or Step and tok/s
    columns for 5 s (each toast's holder aligned right); then, 38 columns wide, the ★ column
    at 80x24: a toast is no wider than the inputs panel it sits over."""
    from textual.widgets._toast import Toast

    app = ZLayoutApp(initial=qa_input(), cursor_blink=False)
    async with app.run_test(size=size, notifications=True) as pilot:
        await open_inputs(pilot)
        app.notify("ZeRO-1\nprofiles/llama3-70b-z1", title="Exported")
        await pilot.pause(0.3)
        toast = app.screen.query_one(Toast)
        table = app.query_one(LayoutTable)
        assert toast.region.x == 0 and toast.region.bottom >= size[1] - 2
        assert toast.region.right <= table.region.x, (toast.region, table.region)
        assert app._notifications and list(app._notifications)[0].timeout == 5  # Textual's own


async def test_the_detail_names_what_the_step_needs_once_and_the_tables_figures():
    """At the card's edge (70B ZeRO-3, 4x8 H100, seq 3584, micro-batch 3: the cache fills the
    card; found with ZeRO-3 param→cpu at seq 4096) the detail read '(needs 75.3 of 79.6 GiB per
    GPU); needs 75.3 GiB, peak 67.6 GiB allocated'. Its figures are the table row's: Need, Peak
    and, with room, Used."""
    from zlayout.spec import Layout
    from zlayout.tui import view

    initial = qa_input(nodes=4).model_copy(update={"training": TrainingSpec(
        seq=3584, micro_batch=3, checkpointing="full")})
    app = ZLayoutApp(initial=initial, cursor_blink=False)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot)
        table = app.query_one(LayoutTable)
        for layout, state in ((Layout(stage=3), "fits-flushing"),
                              (Layout(stage=3, offload_optimizer="cpu"), "fits")):
            memory = app.plan.for_layout(layout).memory
            assert memory.gpu_fit.state == state
            row = table.cell_texts()[layout.key]
            table.move_cursor(row=[lp.layout for lp in app.plan.layouts].index(layout), animate=False)
            await pilot.press("enter")
            await pilot.pause(0.3)
            title = " ".join(str(app.screen.query_one(".dialog-title").render()).split())
            assert title.count("needs") == 1 and f"needs {row['need']}" in title, title
            assert f"peak {row['peak']} GiB allocated" in title
            if state == "fits":
                assert f"device used {row['used']} of" in title
            await pilot.press("escape")
            await pilot.pause()
