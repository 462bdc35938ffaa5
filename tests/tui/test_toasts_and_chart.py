"""Issue 31's last cuts, through the real app at the sizes where they showed: the export
toast's path, toasts over the table with the inputs hidden, the chart's legend below 120
columns, and the export/verify question for a row that is not ★."""

from __future__ import annotations

import pytest

from test_app import screen_text
from test_nothing_cut import SIZES, open_inputs, qa_input
from tui_fakes import settle
from zlayout.spec import Layout
from zlayout.tui import view
from zlayout.tui.actions import TOAST_TEXT_WIDTH
from zlayout.tui.app import TOAST_OVER_TABLE_S, ZLayoutApp
from zlayout.tui.screens import ConfirmScreen, PathScreen
from zlayout.tui.widgets import LayoutTable, MemoryBars


def test_a_long_path_keeps_its_file_name_whole_and_shortens_the_directory():
    assert view.short_path("profiles/llama3-8b-z3", 33) == "profiles/llama3-8b-z3"
    long = "/tmp/home/exports/team-llama/llama3-70b-z3-opt_cpu-param_cpu"
    assert view.short_path(long, 33) == "…/llama3-70b-z3-opt_cpu-param_cpu"
    assert view.short_path("/tmp/home/exports/team-llama/x", 26) == "…/exports/team-llama/x"
    # a name longer than the line: the name alone, never a cut directory or name
    assert view.short_path("/a/" + "n" * 40, 33) == "n" * 40
    for width in range(10, 60):
        shown = view.short_path(long, width)
        assert shown.endswith("llama3-70b-z3-opt_cpu-param_cpu") and long.endswith(shown.lstrip("…"))


class Files:
    def __init__(self):
        self.saved = []

    def save(self, plan, layout, path):
        self.saved.append(path)

    def load(self, path):
        raise ValueError("unused")

    def exists(self, path):
        return False


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
async def test_the_export_toast_shows_the_path_on_a_line_of_its_own_broken_nowhere(size, tmp_path):
    from textual.widgets._toast import Toast

    app = ZLayoutApp(initial=qa_input(), cursor_blink=False)
    app._profile_io = Files()
    path = tmp_path / "exports" / "team-llama" / "llama3-70b-z3-opt_cpu-param_cpu"
    async with app.run_test(size=size, notifications=True) as pilot:
        await open_inputs(pilot)
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert isinstance(app.screen, PathScreen)
        field = app.screen.query_one("#path-input")
        field.value = str(path)
        await pilot.press("enter")
        await pilot.pause(0.3)
        assert app._profile_io.saved == [str(path)]
        toast = app.screen.query_one(Toast)
        lines = [screen_text(app).splitlines()[y][toast.region.x:toast.region.right].strip(" ▌")
                 for y in range(toast.region.y, toast.region.bottom)]
        star = app.plan.recommendation.layout
        assert lines == ["Exported", star.label, "…/llama3-70b-z3-opt_cpu-param_cpu"], lines
        assert all(len(line) <= TOAST_TEXT_WIDTH for line in lines)


async def test_with_the_inputs_hidden_a_toast_that_reaches_the_table_is_short_lived():
    """80x24, inputs hidden: the chart has 3 lines under the table. A 3-line toast fits there
    and keeps Textual's 5 s; a taller one would cover the last rows' figures: 2 s."""
    from textual.widgets._toast import Toast

    app = ZLayoutApp(initial=qa_input(), cursor_blink=False)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await settle(pilot)
        assert not app.show_inputs
        table = app.query_one(LayoutTable)
        app.notify("ZeRO-1\nprofiles/llama3-70b-z1", title="Exported")
        await pilot.pause(0.3)
        toast = app.screen.query_one(Toast)
        assert toast.region.y >= table.region.bottom
        assert [n.timeout for n in app._notifications if n.title == "Exported"] == [5]
        app.notify("a warning long enough to fold onto a third line of the toast's width, "
                   "and a fourth", title="Warning", severity="warning", timeout=15)
        await pilot.pause()
        assert [n.timeout for n in app._notifications if n.title == "Warning"] == [TOAST_OVER_TABLE_S]


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
async def test_the_charts_legend_names_every_colour_at_every_size(size):
    """Below 120 columns the legend's names were dropped from the bottom border, leaving six
    coloured squares ('■ ■ ■ ■ ■ ■ │ cap 79.6 GiB'); they now go under the bars."""
    for inputs in (False, True):
        app = ZLayoutApp(initial=qa_input(), cursor_blink=False)
        async with app.run_test(size=size) as pilot:
            if inputs:
                await open_inputs(pilot)
            else:
                await settle(pilot)
                if app.show_inputs:
                    await pilot.press("ctrl+b")
            app.query_one("#views").focus()  # they take the table's place below 120 columns
            bars = app.query_one(MemoryBars)

            def chart_rows() -> tuple[list[str], str]:
                rows = screen_text(app).splitlines()[bars.region.y:bars.region.bottom]
                return rows, "\n".join(row[bars.region.x:bars.region.right] for row in rows)

            # the chart is laid out on a later refresh: on a loaded machine 0.3 s was not always enough
            for _ in range(50):
                await pilot.pause(0.1)
                rows, chart = chart_rows()
                if all(f"■ {name}" in chart for _, name in view.MEMORY_COLUMNS):
                    break
            for _, name in view.MEMORY_COLUMNS:
                assert chart.count(f"■ {name}") == 1, (size, inputs, chart)
            assert "79.6 GiB" in rows[-1]  # the capacity stays in the border


async def test_the_question_for_a_picked_row_that_does_not_fit_names_its_cost_against_the_star():
    """Export and verify on a row that is not ★ and does not fit: the question's first line
    is the dialog's (the layout, step time against ★) with the fit of both."""
    app = ZLayoutApp(initial=qa_input(nodes=4), cursor_blink=False)
    app._profile_io = Files()
    async with app.run_test(size=(80, 24)) as pilot:
        await open_inputs(pilot)
        plan = app.plan
        star = plan.for_layout(plan.recommendation.layout)
        picked = plan.for_layout(Layout(stage=3))
        assert not picked.memory.fits and star.memory.fits
        table = app.query_one(LayoutTable)
        table.focus()
        table.select_key(picked.layout.key)
        await pilot.pause()
        await pilot.press("enter", "escape")
        await pilot.pause()
        for key in ("ctrl+s", "ctrl+r"):
            await pilot.press(key)
            await pilot.pause()
            assert isinstance(app.screen, ConfirmScreen)
            question = " ".join(str(app.screen.query_one("#confirm-question").render()).split())
            verb = "Export" if key == "ctrl+s" else "Verify"
            assert question.startswith(
                f"{verb} {picked.layout.label}, not ★: {view.fmt_seconds(picked.time.step_time_s)}/step, ")
            assert f"against ★ {star.layout.label} ({view.fmt_seconds(star.time.step_time_s)}/step)" in question
            assert f"does not fit: {picked.memory.shortfall}" in question
            assert f"(★ fits, {view.gpu_figures(star.memory).free} free)" in question
            assert question.endswith(f"{verb} it anyway?")
            await pilot.press("n")
            await pilot.pause()


def test_every_branch_of_the_dialogs_first_line_names_the_fit():
    from zlayout.core.plan import make_plan

    plan = make_plan(qa_input(nodes=4), with_breakeven=False)
    star = plan.recommendation.layout
    fits_not_star = next(lp.layout for lp in plan.layouts if lp.memory.fits and lp.layout != star)
    title = view.action_title(plan, star, "Export")
    assert title.startswith(f"Export ★ {star.label} (") and "% free, the recommended layout)" in title
    title = view.action_title(plan, fits_not_star, "Verify")
    assert ", not ★: " in title and "against ★" in title and title.count("free") == 2
    nothing_fits = make_plan(qa_input(nodes=1).model_copy(update={"hardware": qa_input(nodes=1).hardware.model_copy(
        update={"host_ram_bytes": 1 << 30, "nvme_bytes": 0})}), with_breakeven=False)
    if nothing_fits.recommendation.layout is None:
        layout = nothing_fits.layouts[0].layout
        title = view.action_title(nothing_fits, layout, "Export")
        assert "does not fit: " in title and title.endswith("no layout fits)")


def test_a_gib_figure_reads_the_same_in_the_table_the_status_and_the_question():
    """One layout's need read '1816.3' in the does-not-fit question and '1816' in the table;
    a small one '9.9' in the status and '9.87' in the table: one rule (spec.gib_figure)."""
    from zlayout.core.plan import make_plan
    from zlayout.spec import gib_figure

    assert [gib_figure(x * 2**30) for x in (0.4213, 9.871, 75.34, 999.94, 1181.3, 10434.4)] == \
        ["0.42", "9.87", "75.3", "999.9", "1181", "10434"]
    plan = make_plan(qa_input(nodes=4), with_breakeven=False)
    rows = {row.key: row for row in view.layout_rows(plan)}
    for lp in plan.layouts:
        row = rows[lp.layout.key]
        if not lp.memory.fits_gpu:
            assert f"needs {row.needed} GiB per GPU" in lp.memory.shortfall
        elif lp.memory.gpu_fit.state == "fits":
            assert f"device used {row.device_used} of " in lp.memory.gpu_fit.summary()
    assert any(len(rows[lp.layout.key].needed) == 4 and not lp.memory.fits for lp in plan.layouts)  # 1816
    small = make_plan(qa_input("llama3-8b", nodes=1), with_breakeven=False)
    star = small.for_layout(small.recommendation.layout)
    assert f"device used {view.gpu_figures(star.memory).used} of" in view.recommendation_text(small)


def test_a_path_in_a_message_breaks_only_after_a_slash():
    text = ("break-even cannot scale the llama3 family: /tmp/pytest-of-root/pytest-1/"
            "test_a_broken0/models/llama3-bad.toml: invalid TOML")
    lines = view.fold_at_slashes(text, 33).split("\n")
    assert all(len(line) <= 33 for line in lines), lines
    assert "".join(lines).replace(" ", "") == text.replace(" ", "")
    path_lines = [line for line in lines if "/" in line]
    for line, after in zip(lines, lines[1:]):  # every break inside the path follows a slash
        if line in path_lines and after in path_lines:
            assert line.endswith("/"), lines
    assert view.fold_at_slashes("short\nlines stay", 33) == "short\nlines stay"
