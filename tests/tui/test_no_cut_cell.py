"""No cell is ever cut: extreme plans (0.1B on 1 GPU to 405B on 1024 GPUs, nothing fitting,
everything fitting) rendered by the real app at 80x24, 100x30, 120x40 and 160x48. Every
table cell on screen must read exactly its full formatted value, the header its whole
summary, and the ★ reason its whole sentence."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from tui_fakes import settle
from zlayout import catalog
from zlayout.core.plan import make_plan
from zlayout.spec import GiB, HardwareSpec, PlanInput, TrainingSpec
from zlayout.tui import view
from zlayout.tui.app import ZLayoutApp
from zlayout.tui.widgets import LayoutTable, StatusLine

SIZES = [(80, 24), (100, 30), (120, 40), (160, 48)]


def extreme_input(name: str) -> PlanInput:
    def hardware(gpu, per_node, nodes, host_gib=2048):
        return HardwareSpec(gpu=catalog.load_gpu(gpu), gpus_per_node=per_node, nodes=nodes,
                            intra_link=catalog.load_link(catalog.default_intra_link(gpu)),
                            inter_link=catalog.load_link("ib-ndr"), host_ram_bytes=host_gib * GiB)
    cases = {
        # 0.1B on one GPU: everything fits, tiny figures
        "tiny-on-1": (catalog.model_for_size(catalog.parse_size("100M")), hardware("h200", 1, 1), 512, 1),
        # 405B on 1024 GPUs: huge communication, small per-GPU shards
        "405b-on-1024": (catalog.load_model("llama3-405b"), hardware("h100", 8, 128), 8192, 1),
        # 70B on 8x8 H100 at a long sequence: nothing fits, overshoots of thousands of GiB
        "nothing-fits": (catalog.load_model("llama3-70b"), hardware("h100", 8, 8, 64), 32768, 8),
        # 405B on one GPU: the largest overshoots
        "405b-on-1": (catalog.load_model("llama3-405b"), hardware("l40s", 1, 1, 256), 8192, 4),
    }
    model, hw, seq, micro = cases[name]
    return PlanInput(model=model, hardware=hw, training=TrainingSpec(seq=seq, micro_batch=micro))


def screen_lines(app) -> list[str]:
    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), record=True,
                      force_terminal=True, legacy_windows=False, safe_box=False)
    console.print(app.screen._compositor.render_update(full=True))
    return console.export_text().splitlines()


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
@pytest.mark.parametrize("case", ["tiny-on-1", "405b-on-1024", "nothing-fits", "405b-on-1"])
async def test_every_cell_shows_its_full_value(case, size):
    inp = extreme_input(case)
    app = ZLayoutApp(initial=inp, cursor_blink=False, crossovers=None)
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        await pilot.pause(0.1)
        plan = app.plan
        assert plan.input == inp
        table = app.query_one(LayoutTable)
        expected = {row.key: dict(zip(LayoutTable.COLUMN_KEYS, (str(c) for c in LayoutTable._cells(row))))
                    for row in view.layout_rows(make_plan(inp))}
        shown_columns = [column.key.value for column in table.ordered_columns]
        assert {"stage", "opt", "param", "peak", "used", "free", "host", "step", "tps"} <= set(shown_columns)
        # the table is never wider than its space: nothing scrolled off to the right
        assert table.virtual_size.width <= table.scrollable_content_region.width
        lines = screen_lines(app)
        region = table.content_region
        for index, row in enumerate(table.ordered_rows):
            table.move_cursor(row=index, animate=False)
            await pilot.pause()
            lines = screen_lines(app)
            y = region.y + 1 + index - table.scroll_offset.y  # +1: the header row
            assert region.y < y < region.bottom, (case, size, row.key.value)
            line = lines[y]
            x = region.x
            for column in table.ordered_columns:
                width = column.get_render_width(table)
                cell = line[x:x + width].strip()
                want = expected[row.key.value][column.key.value].strip()
                assert cell == want, (case, size, row.key.value, column.key.value)
                x += width
        # the header's summary and the whole ★ reason (wrapped) are on screen
        assert view.plan_summary(plan, size[0]) in lines[0]
        status = app.query_one(StatusLine)
        shown_status = " ".join(" ".join(lines[y][status.region.x:status.region.right].split())
                                for y in range(status.region.y, status.region.bottom))
        assert shown_status == " ".join(view.recommendation_text(plan).split())


async def test_the_header_lines_up_with_the_rows_when_drawn_before_the_table_measures_them():
    """A new set of layouts rebuilds the table; DataTable measures the new rows on its next
    idle. A header drawn before that idle (a repaint in between) must already have the rows'
    column widths: DataTable keeps that drawing in a cache the measurement does not clear,
    which left the titles misaligned over the figures (the flaky 160x48 snapshot)."""
    from tui_fakes import snapshot_app
    app = snapshot_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot)
        table = app.query_one(LayoutTable)
        table._rebuild()
        drawn_before_idle = table.render_line(0).text
        await pilot.pause()
        await pilot.pause()
        header = table.render_line(0).text
        first_row = table.render_line(1).text
        assert header == drawn_before_idle
        # every title ends where its column's figures end (all but the first three are right-aligned)
        for title in ("Peak", "Used", "Free", "Host", "Comm", "Step", "tok/s"):
            end = header.index(title) + len(title)
            assert first_row[end - 1] != " " and first_row[end] == " ", (title, header, first_row)
