"""The app's widgets. Each one displays a `Plan` (or the inputs); none of them computes."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.widget import MountError, Widget
from textual.widgets import (Checkbox, DataTable, Header, Input, Label, Select, Static,
                             TabPane)
from textual.widgets._header import HeaderTitle

from zlayout.tui import view
from zlayout.tui.fields import FieldInput, KeysInTypedOrder, PanelSelect, PanelTabs, TickBox, readable
from zlayout.tui.form import NO_LINK, Presets

if TYPE_CHECKING:  # the planner is imported after the first frame
    from zlayout.core.plan import Plan

CATEGORY_STYLES = {
    "params": "#5f87ff",
    "grads": "#d75fd7",
    "optimizer": "#ffaf00",
    "activations": "#5fd75f",
    "buffers": "#00d7d7",
    "overhead": "#8a8a8a",
}
HEADROOM_STYLES = {"ok": "bold green", "tight": "bold yellow", "over": "bold red"}
_EDIT_ORDER = itertools.count(1)  # InputsPanel.edit_order: one count for every field


class LayoutTable(KeysInTypedOrder, DataTable):
    """Every layout, one row each; the recommended one starred and bold.

    No figure is ever cut: each column is as wide as its widest cell, and the table holds
    only the columns that fit its width whole. When the table with the per-term columns
    (Param … Other) would be wider than the space it has, those columns are left out (the bar
    chart and the detail screen show them). When even the rest does not fit (80 columns with
    the inputs panel open), the columns that do not fit whole are left out too, and the title
    names exactly those (`← Peak Used · → Step tok/s`).

    Sideways scrolling is by whole columns, never by cells: a demanding user reads figures,
    and half a figure (`✗ +1740 Gi`, `Fre`) is a wrong figure, so no key, wheel or scrollbar
    may show part of a column. `→` brings in the next column on the right, whole, leaving out
    as few columns on the left as that takes; `←` brings back the previous one; `home`/`end`
    go to either end, and so does a sideways wheel (or shift+wheel), a column a notch. ZeRO,
    Opt, Par and Free always stay (which row is which, and whether it fits). The DataTable underneath never
    scrolls sideways itself (no horizontal overflow): what it holds fits, all but the blank
    padding right of its last column, which may fall past the edge (a blank is not a figure;
    counting it left the default plan's Free column out at 80x24 with the inputs open)."""

    DEFAULT_CSS = """
    LayoutTable {
        overflow-x: hidden;
    }
    """

    plan: reactive[Plan | None] = reactive(None, init=False, always_update=True)

    # Free (fits, and by how much) sits beside the layout and is never scrolled away: at 80
    # columns with the inputs open a row that does not fit looked like one that does.
    # Need is the figure the verdict and the status line's "needs X of Y GiB" use.
    COLUMNS: tuple[tuple[str, str], ...] = (
        ("stage", "ZeRO"), ("opt", "Opt"), ("param", "Par"), ("free", "Free"), *view.MEMORY_COLUMNS,
        ("need", "Need"), ("peak", "Peak"), ("used", "Used"), ("host", "Host"),
        ("comm", "Comm"), ("step", "Step"), ("tps", "tok/s"))
    COLUMN_KEYS = tuple(key for key, _ in COLUMNS)
    FIXED_KEYS = ("stage", "opt", "param", "free")  # never scrolled away
    BREAKDOWN_KEYS = frozenset(key for key, _ in view.MEMORY_COLUMNS)
    TITLE = "Layouts · GiB per GPU · Host: GiB per node · Comm: GB per GPU per step"
    # Shorter titles for narrower tables, longest first: the title is never cut mid-word.
    SHORT_TITLES = ("Layouts · GiB per GPU · Host: GiB/node · Comm: GB/GPU/step",
                    "Layouts · GiB/GPU · Host GiB/node · Comm GB/GPU", "Layouts · GiB per GPU",
                    "Layouts")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, fixed_columns=len(self.FIXED_KEYS),
                         **kwargs)
        self.border_title = self.TITLE
        self.show_breakdown = True
        self._rows: list[view.LayoutRow] = []
        self._row_cells: list[list[Text]] = []  # each row's cells (_cells), made once per plan
        self._widths: dict[str, int] = {}  # each column's content width for those cells
        self._first = 0  # the first scrollable column shown: an index into _scrollable_keys()
        self._held: tuple[str, ...] = ()  # the columns the DataTable holds now
        self._wanted: tuple[str, ...] = self.COLUMN_KEYS  # the columns that fit (see _fit)
        self._left_out: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())  # left, right of them

    def on_mount(self) -> None:
        self._add_columns()

    def _candidate_keys(self) -> tuple[str, ...]:
        """The columns the table would show if it were wide enough (all but the per-term ones
        when those do not fit)."""
        return tuple(key for key in self.COLUMN_KEYS if self.show_breakdown or key not in self.BREAKDOWN_KEYS)

    def _scrollable_keys(self) -> tuple[str, ...]:
        return tuple(key for key in self._candidate_keys() if key not in self.FIXED_KEYS)

    def _add_columns(self) -> None:
        titles = dict(self.COLUMNS)
        for key in self._wanted:
            self.add_column(Text(titles[key], justify="left" if key in ("stage", "opt", "param") else "right"),
                            key=key)
        self._held = self._wanted
        self.fixed_columns = sum(key in self.FIXED_KEYS for key in self._held)

    def _content_widths(self, cells: list[list[Text]]) -> dict[str, int]:
        """Each column's width without padding: its widest cell or title (what DataTable
        sizes an auto-width column to)."""
        titles = dict(self.COLUMNS)
        return {key: max([len(titles[key])] + [row[index].cell_len for row in cells])
                for index, key in enumerate(self.COLUMN_KEYS)}

    def _width_needed(self, with_breakdown: bool) -> int:
        """Columns wide enough for every cell and title, with the cell padding on both sides
        (but the blank right of the last column)."""
        return sum(width + 2 * self.cell_padding for key, width in self._widths.items()
                   if with_breakdown or key not in self.BREAKDOWN_KEYS) - self.cell_padding

    def _room(self) -> int:
        """The width the columns have: the table's less its border and a vertical scrollbar,
        from the size Textual gives the table (its region on screen can lag behind it)."""
        return self.outer_size.width - self.gutter.width

    def _window(self, first: int) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
        """With the scrollable columns starting at `first`: the columns that fit whole (the
        fixed ones, then scrollable ones in order up to the first that does not fit), those
        left out on the left, and those left out on the right. A column fits when its text
        does: the blank padding right of the last one may fall past the edge."""
        scrollable = self._scrollable_keys()
        fixed = tuple(key for key in self._candidate_keys() if key in self.FIXED_KEYS)
        room, used, shown, padding = self._room(), 0, [], self.cell_padding
        for key in fixed + scrollable[first:]:
            used += self._widths[key] + 2 * padding
            if used - padding > room:
                break
            shown.append(key)
        left = scrollable[:first]
        right = tuple(key for key in fixed + scrollable[first:] if key not in shown)
        return tuple(shown), left, right

    def _last_first(self) -> int:
        """The largest useful `first`: the smallest one that leaves nothing out on the right
        (as a scroll offset stops at the end)."""
        scrollable = self._scrollable_keys()
        for first in range(len(scrollable)):
            if not self._window(first)[2]:
                return first
        return max(0, len(scrollable) - 1)

    def _fit(self) -> bool:
        """Choose the columns shown (see the class docstring); True if they are not the ones
        the table holds (a rebuild is due)."""
        if not self._rows or self._room() <= 0:
            return False
        room = self._fitted_room = self._room()
        breakdown = self._width_needed(True) <= room
        if breakdown != self.show_breakdown:
            self.show_breakdown = breakdown
            self._first = 0
        self._first = max(0, min(self._first, self._last_first()))
        shown, left, right = self._window(self._first)
        self._wanted, self._left_out = shown, (left, right)
        return self._wanted != self._held

    def _refit(self) -> None:
        if self._fit():
            self._rebuild()
        self._retitle()

    _fitted_room = -1  # the room of the last _fit

    def _size_updated(self, size: Size, virtual_size: Size, container_size: Size,
                      layout: bool = True) -> bool:
        # Fit the columns to a new width here, before the frame is drawn, and not only on
        # Resize: Textual does not always send one (opening the inputs panel at 80x24 resized
        # the table from 80 to 44 columns without a Resize in about half of the runs).
        changed = super()._size_updated(size, virtual_size, container_size, layout)
        if self._room() != self._fitted_room:
            self._refit()
        return changed

    def on_resize(self) -> None:
        self._refit()

    def watch_show_vertical_scrollbar(self) -> None:
        # a vertical scrollbar (a table taller than its space) takes room from the columns
        self.call_after_refresh(self._refit)

    # -- sideways, by whole columns ---------------------------------------------------------

    def scroll_columns(self, step: int) -> bool:
        """Scroll by whole columns: step > 0 brings in the next column(s) on the right, step
        < 0 the previous one(s) on the left. True if the columns shown changed."""
        if not self._rows:
            return False
        first = self._first
        for _ in range(abs(step)):
            if step > 0:
                right = self._window(first)[2]
                scrollable = self._scrollable_keys()
                if not right or right[0] not in scrollable:
                    break  # nothing past the right edge (or not even the fixed columns fit)
                # the smallest move left that makes the next column on the right fit whole
                target = scrollable.index(right[0])
                first = next((f for f in range(first + 1, target + 1) if right[0] in self._window(f)[0]),
                             target)
            elif first > 0:
                first -= 1
        return self._scroll_columns_to(first)

    def _scroll_columns_to(self, first: int) -> bool:
        before = self._first
        self._first = max(0, min(first, self._last_first()))
        if self._first == before:
            return False
        self._refit()
        return True

    def action_cursor_right(self) -> None:
        self.scroll_columns(1)

    def action_cursor_left(self) -> None:
        self.scroll_columns(-1)

    def action_scroll_home(self) -> None:
        self._scroll_columns_to(0)

    def action_scroll_end(self) -> None:
        self._scroll_columns_to(self._last_first())

    # The sideways wheel (and shift/ctrl+wheel, as Textual reads it): whole columns too. The
    # DataTable's own handlers would scroll by cells; they never run for these.
    def _on_mouse_scroll_right(self, event: events.MouseScrollRight) -> None:
        self._wheel_columns(event, 1)

    def _on_mouse_scroll_left(self, event: events.MouseScrollLeft) -> None:
        self._wheel_columns(event, -1)

    def _on_mouse_scroll_down(self, event: events.MouseScrollDown) -> None:
        if event.ctrl or event.shift:
            self._wheel_columns(event, 1)

    def _on_mouse_scroll_up(self, event: events.MouseScrollUp) -> None:
        if event.ctrl or event.shift:
            self._wheel_columns(event, -1)

    def _wheel_columns(self, event: events.MouseEvent, step: int) -> None:
        event.prevent_default()
        if self.scroll_columns(step):
            event.stop()

    def left_out_titles(self) -> tuple[list[str], list[str]]:
        """The titles of the columns left out, besides the per-term ones: those left of the
        columns shown (scrolled past: ← brings them back) and those right of them (→)."""
        if not self._rows or self._fitted_room <= 0:
            return [], []
        titles = dict(self.COLUMNS)
        left, right = self._left_out
        return [titles[key] for key in left], [titles[key] for key in right]

    def _retitle(self) -> None:
        """The longest title that fits the top border whole; when columns are left out, it
        names exactly those, and which way (← →) brings them in."""
        room = self.outer_size.width - 2
        if room <= 0:
            return
        left, right = (" ".join(titles) for titles in self.left_out_titles())
        if left and right:
            forms = (f"Layouts · GiB/GPU · ← {left} · → {right}", f"Layouts · ← {left} · → {right}",
                     f"← {left} · → {right}", "Layouts")
        elif right:
            forms = (f"Layouts · GiB per GPU · → scrolls to {right}", f"Layouts · GiB/GPU · → {right}",
                     f"Layouts · → {right}", f"→ {right}", "Layouts")
        elif left:
            forms = (f"Layouts · GiB per GPU · ← scrolls back to {left}", f"Layouts · GiB/GPU · ← {left}",
                     f"Layouts · ← {left}", f"← {left}", "Layouts")
        else:
            forms = (self.TITLE, *self.SHORT_TITLES)
        title = next((form for form in forms if len(form) <= room), forms[-1])
        if self.border_title != title:
            self.border_title = title

    def watch_plan(self, plan: Plan | None) -> None:
        if plan is None:
            return
        rows = view.layout_rows(plan)
        same_layouts = [row.key.value for row in self.ordered_rows] == [row.key for row in rows]
        self._rows = rows
        self._row_cells = [self._cells(row) for row in rows]
        self._widths = self._content_widths(self._row_cells)
        refit = self._fit()
        self._retitle()
        if refit or not same_layouts:
            self._rebuild()
            return
        # Same layouts: update the cells in place (no relayout, so typing stays smooth). When a
        # column's widest cell changed width, rebuild instead: DataTable's own update_width
        # re-measures the whole column for every narrower cell (thousands of measurements per
        # plan, ~100 ms on the next idle, in front of the next keystroke).
        shown = self._held
        if any(self.columns[key].content_width != self._widths[key] for key in shown if key in self.columns):
            self._rebuild()
            return
        for row, row_cells in zip(rows, self._row_cells):
            for column, cell in zip(self.COLUMN_KEYS, row_cells):
                if column in shown:
                    self.update_cell(row.key, column, cell)

    def _rebuild(self) -> None:
        cursor_key = self.selected_key
        self.clear(columns=True)
        self._add_columns()
        shown = self._held
        for row, row_cells in zip(self._rows, self._row_cells):
            self.add_row(*(cell for column, cell in zip(self.COLUMN_KEYS, row_cells) if column in shown),
                         key=row.key)
        # DataTable measures new rows on its next idle and does not invalidate its render cache
        # when that widens a column: a header drawn in between (a repaint before the idle) kept
        # the titles' widths, misaligned over the rows. Set the widths the rows need now.
        for key, width in self._widths.items():
            if key in shown:
                self.columns[key].content_width = width
        if cursor_key is not None:
            self.select_key(cursor_key)

    @staticmethod
    def _cells(row: view.LayoutRow) -> list[Text]:
        """One Text per COLUMNS entry."""
        style = "bold" if row.recommended else ""
        return [
            Text.assemble(("★ " if row.recommended else "  ", "bold yellow"), (row.stage, style)),
            Text(row.optimizer_on, style=style),
            Text(row.params_on, style=style),
            Text(row.headroom, justify="right", style=HEADROOM_STYLES[row.headroom_level]),
            *(Text(cell, justify="right") for cell in row.columns),
            Text(row.needed, justify="right", style=style),
            Text(row.peak_allocated, justify="right"),
            Text(row.device_used, justify="right"),
            Text(row.host, justify="right", style="" if row.host_fits else "bold red"),
            Text(row.comm, justify="right"),
            Text(row.step_time, justify="right"),
            Text(row.tokens_per_s, justify="right"),
        ]

    def cell_texts(self) -> dict[str, dict[str, str]]:
        """The cells the table holds, as plain text: layout key -> column key -> text."""
        keys = [column.key.value for column in self.ordered_columns]
        return {row.key.value: dict(zip(keys, (str(cell) for cell in self.get_row(row.key))))
                for row in self.ordered_rows}

    @property
    def selected_key(self) -> str | None:
        """The layout key under the cursor (None before the first plan)."""
        if not self.row_count:
            return None
        return self.ordered_rows[self.cursor_row].key.value

    def select_key(self, key: str) -> None:
        keys = [row.key.value for row in self.ordered_rows]
        if key in keys and keys.index(key) != self.cursor_row:
            self.move_cursor(row=keys.index(key), animate=False)


class PlanPanel(Widget):
    """A panel drawn from the plan. A new plan repaints it; only a change in its number of
    lines asks for a relayout of the screen (which is what costs time on each keystroke)."""

    plan: reactive[Plan | None] = reactive(None, init=False)
    _line_count = -1
    _cache: tuple[tuple[Any, ...], Text] | None = None

    def watch_plan(self) -> None:
        self._relayout_if_taller_or_shorter()

    def _relayout_if_taller_or_shorter(self) -> None:
        lines = len(self.render().plain.splitlines())
        if lines != self._line_count:
            self._line_count = lines
            self.refresh(layout=True)

    def render(self) -> Text:
        """The panel's text, drawn once per (plan, width): the line count check and the
        frame share it."""
        key = (self.plan, getattr(self, "pinned", None), getattr(self, "crossovers", None), self.size.width)
        if self._cache is None or any(a is not b for a, b in zip(self._cache[0][:3], key[:3])) \
                or self._cache[0][3] != key[3]:
            self._cache = (key, self.draw())
        return self._cache[1]

    def draw(self) -> Text:
        raise NotImplementedError


class MemoryBars(PlanPanel):
    """Each layout's per-GPU memory as a stacked bar on the card's scale (the red │ at the
    right end is the capacity; a bar past it ends in a red ▶); the legend sits in the
    bottom border, or, where its names do not fit there (below ~120 columns), under the bars,
    wrapped between its entries: a colour is never left without its name. Every figure is
    drawn whole: the bars get what the labels and the widest figure leave."""

    LABEL_WIDTH = 21
    _names_in_border = True

    def on_resize(self) -> None:
        self._relayout_if_taller_or_shorter()

    def _border_room(self) -> int:
        # the border is the content, its padding (1 a side) and 2 corners; a space each side of the title
        return self.size.width + 2 * 1 - 4

    def _legend_names(self, sep: str) -> list[Text]:
        return [Text.assemble(("■ ", CATEGORY_STYLES[key]), title + sep) for key, title in view.MEMORY_COLUMNS]

    def _relegend(self) -> None:
        """The longest legend that fits the bottom border (Textual cuts a border title); the
        names go under the bars (`draw`) when only the capacity fits there."""
        plan = self.plan
        capacity = plan.layouts[0].memory.gpu_capacity_bytes if plan and plan.layouts else 0
        room = self._border_room()
        forms = [(sep, cap) for sep, cap in (("  ", " capacity "), (" ", " cap "))]
        forms += [(None, " capacity "), (None, " cap "), (None, " ")]
        for sep, cap in forms:
            legend = Text.assemble(*self._legend_names(sep)) if sep is not None else Text()
            legend.append("│", style="bold red")
            legend.append(f"{cap}{view.fmt_gib(capacity)} GiB")
            if legend.cell_len <= room:
                break
        self._names_in_border = sep is not None
        self.border_subtitle = legend.markup

    def _legend_lines(self, width: int) -> Text | None:
        """The legend's names wrapped into `width` cells, between entries; None when they
        are in the border (`_relegend`)."""
        if self._names_in_border:
            return None
        out, line_len = Text(), 0
        for name in self._legend_names(" "):
            if line_len and line_len + name.cell_len > width:
                out.append("\n")
                line_len = 0
            out.append_text(name)
            line_len += name.cell_len
        return out

    def draw(self) -> Text:
        # drawn once per plan and width (PlanPanel.render): the legend follows both here (a
        # Resize alone did not always reach the panel when the inputs were shown)
        self._relegend()
        plan = self.plan
        if plan is None:
            return Text("")
        rows = view.bar_segments(plan, 2)
        figure_width = max((len(bar.used_gib) for bar in rows), default=5)
        label_width = min(self.LABEL_WIDTH, max(len(bar.label) for bar in rows) + 1) if rows else 1
        room = self.content_region.width or self.size.width
        width = max(2, room - label_width - 1 - figure_width)
        out = Text(no_wrap=True, overflow="crop")
        rec = plan.recommendation.layout
        for bar in view.bar_segments(plan, width):
            out.append(f"{bar.label[:label_width - 1]:<{label_width - 1}} ",
                       style="bold" if rec is not None and rec.key == bar.key else "")
            line = []
            for key, cells in bar.cells:
                line += [("█", CATEGORY_STYLES[key])] * cells
            line += [(" ", "")] * (width - len(line))
            line[bar.capacity_cell] = ("▶" if bar.overflow else "│", "bold red")
            for char, style in line[:width]:
                out.append(char, style=style)
            out.append(f" {bar.used_gib:>{figure_width}}", style="" if bar.fits_gpu else "bold red")
            out.append("\n")
        legend = self._legend_lines(room)
        if legend is not None:
            out.append_text(legend)
        out.rstrip()
        return out


class BreakEvenPanel(PlanPanel):
    """The largest model (and micro-batch) each layout fits, and where the choice changes."""
    crossovers: tuple[Any, ...] = ()  # set with the plan: the core's Crossover list
    computing = False  # the plan on screen is the quick one: its break-even is being computed

    def draw(self) -> Text:
        plan = self.plan
        if plan is None:
            return Text("")
        if self.computing:
            return Text("Computing the largest model each layout fits, for these inputs…",
                        style="dim italic")
        out = Text()
        error = getattr(plan, "breakeven_error", "")
        if error:  # a broken model preset: say which file and why, never other sizes
            out.append("Not computed: ", style="bold red")
            out.append(error)
            out.append("\nThe layouts table and the memory bars do not depend on it.", style="dim italic")
            return out
        scaling = view.scaling_text(plan)
        if scaling:
            out.append(f"Largest model that fits: {scaling}\n", style="dim")
        out.append(f"{'ZeRO Opt  Par':<14} {'max model':>9} {'max mb':>6}  {'limit':<5}  beyond →\n",
                   style="bold")
        rows = view.breakeven_rows(plan, self.crossovers)
        sized = [row for row in rows if row.max_params not in ("—", view.WILL_NOT_RUN_CELL)]
        for row in sized:
            out.append(f"{row.label:<14} {row.max_params:>9} {row.max_micro_batch:>6}  "
                       f"{row.limited_by:<5}  {row.then}\n")
        unfit = [row for row in rows if row.max_params == "—"]
        if sized and unfit:  # one line for the layouts no size fits
            out.append("no fit: ", style="bold")
            out.append(", ".join(view.list_label(row) for row in unfit) + "\n")
        wont = view.will_not_run_line(rows)
        if wont:  # the layouts table's ✗ run: no size, whatever fits (wrapped at the panel's width)
            out.append(f"{view.WILL_NOT_RUN_CELL}: ", style="bold red")
            out.append(wont + "\n")
        line = view.first_crossover_line(plan, self.crossovers)
        if line:
            out.append(line, style="italic")
        elif not sized:
            out.append("No break-even sizes: no size of this model fits any layout, "
                       "or the core reports none.", style="dim italic")
        out.rstrip()
        return out


class ComparePanel(PlanPanel):
    """Peak memory and step time now vs a pinned plan, side by side with the deltas."""

    pinned: reactive[Plan | None] = reactive(None, init=False)

    def watch_pinned(self) -> None:
        self._relayout_if_taller_or_shorter()

    def draw(self) -> Text:
        plan, pinned = self.plan, self.pinned
        if pinned is None or plan is None:
            # wrapped here: the panel draws its table one line per row (nowrap), which cut
            # this sentence at 160x48 ("then chan…")
            width = self.content_region.width or self.size.width or 80
            return Text("\n".join(view.wrap_keeping_figures(
                "Nothing pinned: ctrl+t pins this plan, then change any input.", width)), style="dim italic")
        out = Text(no_wrap=True, overflow="ellipsis")
        changes = view.input_changes(pinned, plan)
        # the changed inputs are wrapped at the panel's width, never cut (the table below is
        # drawn one line per row)
        changed = Text.assemble(("Changed: ", "bold"), (", ".join(changes), "") if changes
                                else ("nothing yet", "dim"))
        width = self.content_region.width or self.size.width or 80
        for line in changed.wrap(self.app.console, width, overflow="fold"):
            out.append_text(line)
            out.append("\n")
        out.append(f"{'':14} {'peak GiB':^17}  {'step time':^19}\n", style="bold")
        out.append(f"{'ZeRO Opt  Par':<14} {'was':>5} {'now':>5} {'Δ':>5}  "
                   f"{'was':>6} {'now':>6} {'Δ':>5}\n", style="bold")
        sign_style = {1: "red", -1: "green", 0: "dim"}
        for row in view.compare_rows(pinned, plan):
            out.append(f"{row.label:<14} {row.pinned_peak:>5} {row.peak:>5} ")
            out.append(f"{row.peak_delta:>5}", style=sign_style[row.peak_delta_sign])
            out.append(f"  {row.pinned_step:>6} {row.step:>6} ")
            out.append(f"{row.step_delta:>5}", style=sign_style[row.step_delta_sign])
            out.append("\n")
        out.rstrip()
        return out


# --- the inputs panel -------------------------------------------------------------------

MODEL_INT_LABELS = (("layers", "Layers"), ("hidden", "Hidden"), ("heads", "Heads"),
                    ("kv_heads", "KV heads"), ("ffn", "FFN"), ("vocab", "Vocab"))
HARDWARE_INT_LABELS = (("gpus_per_node", "GPUs/node"), ("nodes", "Nodes"),
                       ("host_ram_gib", "Host RAM GiB"), ("nvme_gib", "NVMe GiB"))
TRAINING_INT_LABELS = (("seq", "Sequence"), ("micro_batch", "Micro-batch"),
                       ("grad_accum", "Grad accum"))
# The fields of the tabs built after the first frame.
HARDWARE_FIELDS = ("gpu", "gpus_per_node", "nodes", "intra_link", "inter_link", "host_ram_gib",
                   "nvme_gib", "host_cores")
TRAINING_FIELDS = ("seq", "micro_batch", "grad_accum", "precision", "checkpointing", "impl", "allocator",
                   "loop")


class InputsPanel(Widget):
    """Model, hardware and training inputs in three tabs. Posts `InputsPanel.Changed(field)`
    when the user edits a field; the app turns the values into a plan input.

    Only the Model tab is built before the first frame: the Hardware and Training tabs (two
    thirds of the widgets, seven of the ten selects) are built and mounted once the first
    plan is on screen (`mount_deferred_soon`), since mounting them was most of the time to the
    first frame. Until then their values
    are the initial ones, or those `set_values` gave them (`values()` reads those), and
    `fields_mounted` is False (the app counts its plan as pending)."""

    class Changed(Message):
        def __init__(self, field: str) -> None:
            super().__init__()
            self.field = field

    def __init__(self, presets: Presets, values: Mapping[str, Any], *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._presets = presets
        self._initial = dict(values)
        self._marked: dict[str, str] = {}
        self._rows: dict[str, Widget] = {}  # field -> its row, its error line, its input
        self._errors: dict[str, Static] = {}
        self._inputs: dict[str, Widget] = {}
        self._unmounted: dict[str, Any] = {}  # the values of the fields not mounted yet
        self.fields_mounted = False
        # per field, the order of the user's last change to it (`edit_order`; 0: none since the
        # app last wrote it): counted as each key changes a widget, in the order typed, whatever
        # order the fields' Changed news reaches the app in
        self._edited: dict[str, int] = {}
        self._writing = False

    def compose(self) -> ComposeResult:
        v = self._initial
        with PanelTabs(id="input-tabs"):
            with TabPane("Model", id="tab-model"):
                with VerticalScroll(can_focus=False):
                    yield from self._row("Preset", PanelSelect(
                        _options(self._presets.models, v.get("preset")), value=_or_null(v.get("preset")),
                        prompt="custom", allow_blank=True, compact=True, id="preset"), "preset")
                    yield from self._row("Size", FieldInput(value="", placeholder="e.g. 70B",
                                                       compact=True, id="size"), "size")
                    for field, label in MODEL_INT_LABELS:
                        yield from self._row(label, FieldInput(value=v[field], compact=True, id=field,
                                                          placeholder="default" if field in ("kv_heads", "ffn") else ""),
                                             field)
                    yield from self._row("MLP", PanelSelect([(k, k) for k in ("gelu", "swiglu")],
                                                       value=v["mlp"], allow_blank=False,
                                                       compact=True, id="mlp"), "mlp")
                    yield from self._row("Norm", PanelSelect([(k, k) for k in ("layernorm", "rmsnorm")],
                                                        value=v["norm"], allow_blank=False,
                                                        compact=True, id="norm"), "norm")
                    yield self._input("bias", TickBox("Biases", v["bias"], compact=True, id="bias"))
                    yield self._input("tie_embeddings", TickBox("Tied embeddings", v["tie_embeddings"],
                                                                compact=True, id="tie_embeddings"))
            yield TabPane("Hardware", id="tab-hardware")
            yield TabPane("Training", id="tab-training")
        self._unmounted = {field: v[field] for field in HARDWARE_FIELDS + TRAINING_FIELDS}

    def _hardware_rows(self, v: Mapping[str, Any]) -> Iterable[Widget]:
        yield from self._row("GPU", PanelSelect(_options(self._presets.gpus, v["gpu"]),
                                           value=v["gpu"], allow_blank=False,
                                           compact=True, id="gpu"), "gpu")
        for field, label in HARDWARE_INT_LABELS[:2]:
            yield from self._row(label, FieldInput(value=v[field], compact=True, id=field), field)
        yield from self._row("Intra link", PanelSelect(
            _options(self._presets.links, v["intra_link"]), value=v["intra_link"],
            allow_blank=False, compact=True, id="intra_link"), "intra_link")
        yield from self._row("Inter link", PanelSelect(
            _options((NO_LINK, *self._presets.links), v["inter_link"]),
            value=v["inter_link"], allow_blank=False, compact=True, id="inter_link"),
            "inter_link")
        for field, label in HARDWARE_INT_LABELS[2:]:
            yield from self._row(label, FieldInput(value=v[field], compact=True, id=field), field)
        yield from self._row("Host cores", FieldInput(value=v["host_cores"], compact=True,
                                                      id="host_cores"), "host_cores")

    def _training_rows(self, v: Mapping[str, Any]) -> Iterable[Widget]:
        for field, label in TRAINING_INT_LABELS:
            yield from self._row(label, FieldInput(value=v[field], compact=True, id=field), field)
        yield from self._row("Precision", PanelSelect(
            [(k, k) for k in ("bf16", "fp16", "fp32")], value=v["precision"],
            allow_blank=False, compact=True, id="precision"), "precision")
        yield from self._row("Checkpoint", PanelSelect(
            [("none", "none"), ("full", "full")], value=v["checkpointing"],
            allow_blank=False, compact=True, id="checkpointing"), "checkpointing")
        yield from self._row("Model code", PanelSelect(
            [("zlayout GPT", "zlayout"), ("transformers", "hf")], value=v["impl"],
            allow_blank=False, compact=True, id="impl"), "impl")
        yield from self._row("Allocator", PanelSelect(
            [("default", "default"), ("expandable", "expandable")], value=v["allocator"],
            allow_blank=False, compact=True, id="allocator"), "allocator")
        # the loop around the engine: DeepSpeed's examples keep the outputs (the bf16 logits)
        # until the next forward; HF Trainer drops them once the loss is taken
        yield from self._row("Loop", PanelSelect(
            [("deepspeed", "deepspeed"), ("trainer", "trainer")], value=v["loop"],
            allow_blank=False, compact=True, id="loop"), "loop")

    _mount_scheduled = False

    def on_mount(self) -> None:
        self.set_timer(2.0, self.mount_deferred_soon)  # in case the first plan never comes
        self._watch_edits(self._inputs)

    def _watch_edits(self, fields: Iterable[str]) -> None:
        for field in fields:
            self.watch(self._inputs[field], "value", self._watcher(field), init=False)

    def _watcher(self, field: str):
        # one parameter: Textual passes a watcher as many values as it takes (old, new)
        return lambda _value: self._changed(field)

    def _changed(self, field: str) -> None:
        self._edited[field] = 0 if self._writing else next(_EDIT_ORDER)

    def edit_order(self) -> dict[str, int]:
        """Per field, when the user last changed it, as an order (higher: later; 0 or absent:
        not since the app last wrote it)."""
        return dict(self._edited)

    def mount_deferred_soon(self) -> None:
        """Mount the Hardware and Training tabs after the next refresh (the app calls this
        once the first plan is on screen: mounting them while the first plan is computed made
        both slower, the planning thread and the mounting sharing the interpreter)."""
        if not self._mount_scheduled:
            self._mount_scheduled = True
            self.call_after_refresh(self._mount_deferred)

    async def _mount_deferred(self) -> None:
        v = self._initial  # the values they are built with; set_values since: applied below
        for pane_id, rows, fields in (("tab-hardware", self._hardware_rows(v), HARDWARE_FIELDS),
                                      ("tab-training", self._training_rows(v), TRAINING_FIELDS)):
            try:
                await self.query_one(f"#{pane_id}", TabPane).mount(VerticalScroll(*rows, can_focus=False))
            except MountError:
                return  # the app quit before its first frame was followed by this
            # from here on values() reads these widgets (a key typed into them counts)
            pending = {field: self._unmounted.pop(field) for field in fields}
            self._watch_edits(fields)
            self.set_values({field: value for field, value in pending.items() if value != v[field]},
                            into_focused=True)
            marked, self._marked = self._marked, {}
            self.mark_errors(marked)
        assert not self._unmounted, "HARDWARE_FIELDS/TRAINING_FIELDS are out of date"
        self.fields_mounted = True

    def _input(self, field: str, widget: Widget) -> Widget:
        self._inputs[field] = widget
        return widget

    def _row(self, label: str, widget: Widget, field: str) -> Iterable[Widget]:
        self._inputs[field] = widget
        row = self._rows[field] = Horizontal(Label(label, classes="field-label"), widget,
                                             classes="field-row", id=f"row-{field}")
        yield row  # its error line is mounted below it the first time it has an error

    # The fields whose values make the plan input (not preset/size: those fill the others).
    FIELDS = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "mlp", "norm", "bias",
              "tie_embeddings", "gpu", "gpus_per_node", "nodes", "intra_link", "inter_link",
              "host_ram_gib", "nvme_gib", "host_cores", "seq", "micro_batch", "grad_accum", "precision",
              "checkpointing", "impl", "allocator", "loop")

    def values(self) -> dict[str, Any]:
        out = {}
        unmounted = self._unmounted
        for field in self.FIELDS + ("preset", "size"):
            if field in unmounted:
                out[field] = unmounted[field]
                continue
            value = self._inputs[field].value
            out[field] = None if value is Select.NULL else value
        return out

    def set_values(self, values: Mapping[str, Any], into_focused: bool = False) -> None:
        """Show `values` without posting Changed (the app already knows them). The field the
        user is in is left alone (never write under someone typing) unless `into_focused`
        (undo and load replace everything on purpose)."""
        focused = self.app.focused
        self._writing = True
        try:
            self._write(values, focused, into_focused)
        finally:
            self._writing = False

    def _write(self, values: Mapping[str, Any], focused: Widget | None, into_focused: bool) -> None:
        with self.prevent(Input.Changed, Select.Changed, Checkbox.Changed):
            for field, value in values.items():
                if field in self._unmounted:
                    self._unmounted[field] = value  # shown once its tab is mounted
                    continue
                widget = self._inputs[field]
                if not into_focused and focused is not None and (
                        focused is widget or widget in focused.ancestors):
                    continue
                if isinstance(widget, Select):
                    if value is None:
                        widget.clear()
                        continue
                    if value not in {v for _, v in widget._options}:
                        widget.set_options(_options(_option_values(widget), value))
                    widget.value = value
                else:
                    widget.value = value

    def mark_errors(self, errors: Mapping[str, str]) -> None:
        """Mark each invalid field with its reason; clear the marks of the others."""
        if errors == self._marked:
            return
        for field in set(errors) | set(self._marked):
            reason = errors.get(field, "")
            if reason == self._marked.get(field, "") or field in self._unmounted:
                continue  # unmounted: marked once its tab is mounted
            row = self._rows[field]
            row.set_class(bool(reason), "invalid")
            error = self._errors.get(field)
            if error is None:
                if not reason:
                    continue
                # built on the first error only: 25 hidden lines were a tenth of the widgets
                # mounted before the first frame
                error = self._errors[field] = Static("", classes="field-error", id=f"error-{field}")
                row.parent.mount(error, after=row)
            error.update(Text(f"↳ {readable(reason)}") if reason else "")
            error.display = bool(reason)
        self._marked = dict(errors)

    @on(Input.Changed)
    @on(Select.Changed)
    @on(Checkbox.Changed)
    def _field_changed(self, event: Input.Changed | Select.Changed | Checkbox.Changed) -> None:
        event.stop()
        widget = event.control if hasattr(event, "control") else None
        if widget is not None and widget.id:
            self.post_message(self.Changed(widget.id))


def _or_null(value: Any) -> Any:
    return Select.NULL if value is None else value


def _options(names: Iterable[str], current: Any = None) -> list[tuple[str, str]]:
    names = list(dict.fromkeys(names))
    if current not in (None, "") and current not in names:
        names.insert(0, current)
    return [(name, name) for name in names]


def _option_values(select: Select) -> list[str]:
    return [value for _, value in select._options if value is not Select.NULL]


class _OneLineTitle(HeaderTitle):
    """The header's title: one line whatever its text (the header sizes it), so a new subtitle
    (the figures in it change with nearly every plan) repaints it without a relayout of the
    whole screen, which Static.update asks for by default."""

    def update(self, content: Any = "", *, layout: bool = False) -> None:
        super().update(content, layout=False)


class AppHeader(Header):
    """Textual's Header with the title above."""

    def compose(self) -> ComposeResult:
        for widget in super().compose():
            yield _OneLineTitle() if type(widget) is HeaderTitle else widget


class StatusLine(Widget):
    """The recommendation with its whole reason (wrapped, never cut), or why the plan on
    screen is not the inputs' plan."""

    text: reactive[str] = reactive("")
    _lines = -1

    def watch_text(self, text: str) -> None:
        # A relayout of the whole screen only when the wrapped text changes height: the text
        # changes with nearly every plan (its figures), its line count rarely.
        width = self.content_region.width
        lines = len(view.wrap_keeping_figures(text, width)) if width else -1
        if lines != self._lines or lines < 0:
            self._lines = lines
            self.refresh(layout=True)

    def on_resize(self) -> None:
        self._lines = -1
        self.watch_text(self.text)

    def render(self) -> Text:
        width = self.content_region.width
        return Text("\n".join(view.wrap_keeping_figures(self.text, width)) if width else self.text)
