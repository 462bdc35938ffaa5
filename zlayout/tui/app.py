"""The zlayout app: inputs on the left, every layout live on the right.

One immutable `Plan` lives in the `plan` reactive; watchers hand it to the widgets, which
only display. How edits become plans (validation at once, planning in a worker after a
pause, undo) is `editing.py`; export, load and verify are `actions.py`; this module lays
the screen out and holds the keys. The planner, the verifier, the profile files and the
presets come in through the constructor, so tests run the real app on fakes.
"""

from __future__ import annotations

import json
import os
import sys
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from textual import events, on
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.reactive import reactive
from textual.widgets import DataTable, Footer, Input, TabbedContent

from zlayout.spec import Layout, ModelSpec, PlanInput
from zlayout.tui import view
from zlayout.tui.actions import LayoutActionsMixin
from zlayout.tui.backends import ProfileIO, catalog_presets, default_plan_input
from zlayout.tui.commands import ZLayoutCommands
from zlayout.tui.editing import EditingMixin, PlanReady
from zlayout.tui.fields import KeyScroll, KeysInTypedOrder, field_label
from zlayout.tui.form import Presets
from zlayout.tui.screens import DetailScreen, HelpScreen, Verifier
from zlayout.tui.widgets import (AppHeader, BreakEvenPanel, ComparePanel, InputsPanel, LayoutTable,
                                 MemoryBars, StatusLine)

if TYPE_CHECKING:
    from zlayout.core.plan import Plan

Planner = Callable[[PlanInput], "Plan"]
CrossoverFinder = Callable[[PlanInput], Sequence[Any]]
STATE_DUMP_ENV = "ZLAYOUT_STATE_DUMP"  # a file path: f12 writes the app's state there (tests)


# The planner is imported by the first planning worker, after the first frame: importing it
# (catalog tables, every estimator) is not on the way to the first screen.
# `presets_dirs`: `zlayout app --presets-dir`'s folders, where break-even looks for the family.
def _core_plan(inp: PlanInput, presets_dirs: tuple[str, ...] = ()) -> Plan:
    from dataclasses import replace

    from zlayout.catalog import PresetFileError
    from zlayout.core.plan import make_plan

    try:
        return make_plan(inp, presets_dirs=presets_dirs)
    except PresetFileError as exc:
        # a broken model preset stops break-even only: plan the rest, the panel says why
        return replace(make_plan(inp, with_breakeven=False), breakeven_error=str(exc))


def _core_plan_quick(inp: PlanInput, presets_dirs: tuple[str, ...] = ()) -> Plan:
    """Every layout's memory, time and the recommendation, without break-even's searches (a
    few allocator replays: tens of milliseconds, against seconds for break-even): shown first,
    `_core_add_breakeven` completes it."""
    from zlayout.core.plan import make_plan

    return make_plan(inp, with_breakeven=False, presets_dirs=presets_dirs)


def _core_add_breakeven(quick: Plan, presets_dirs: tuple[str, ...] = ()) -> Plan:
    """`quick` with every layout's break-even: make_plan's full plan without planning the
    layouts again. Run inside breakeven.cancellable, it stops when the inputs are edited."""
    from dataclasses import replace

    from zlayout.catalog import PresetFileError
    from zlayout.core.breakeven import break_even

    try:
        layouts = tuple(replace(lp, breakeven=break_even(quick.input, lp.layout, presets_dirs))
                        for lp in quick.layouts)
    except PresetFileError as exc:
        # a broken model preset stops break-even only: the panel says why
        return replace(quick, breakeven_error=str(exc))
    return replace(quick, layouts=layouts)


def _core_crossovers(inp: PlanInput, presets_dirs: tuple[str, ...] = ()) -> Sequence[Any]:
    from zlayout.catalog import PresetFileError
    from zlayout.core import breakeven

    finder = getattr(breakeven, "crossovers", None)
    try:
        return finder(inp, presets_dirs=presets_dirs) if finder is not None else ()
    except PresetFileError:  # _core_plan's plan carries the message
        return ()


# An edit's figures usually follow within ~0.15 s: the last inputs' are dimmed only after this
# (a dim frame shown briefly is a flicker, and costs the keystroke two redraws).
UPDATING_DIM_AFTER_S = 0.25

# With the inputs panel hidden a toast sits over the chart below the table; one too tall for
# the lines there would cover the table's last rows: it lives this long instead of 5-15 s.
TOAST_OVER_TABLE_S = 2.0

COMPACT_WIDTH = 120  # below this the inputs panel starts hidden (ctrl+b shows it)

# Keys that are not app bindings but that the help screen lists too.
OTHER_KEYS = (
    ("enter", "on the table: the layout's memory terms and ds_config"),
    ("↑ ↓ pgup pgdn", "move in the table (the cursor follows ★ until you move it)"),
    ("← → home end", "on a narrow table: bring in the columns left out, whole (the title names them)"),
    ("tab / shift+tab", "next / previous field or panel"),
    ("← →", "on the tab bar: Model, Hardware, Training"),
    ("enter / space", "on a select: open it (or type a letter); type to search, enter takes it"),
    ("ctrl+p", "command palette: every action (and, when nothing fits, the fixes)"),
    ("y / n", "in a question: yes / no (escape: no)"),
    ("escape", "in a dialog: close it (a running verification: cancel it)"),
)


class Body(Horizontal):
    """Inputs beside the plan; as wide as the terminal, so its resize is the terminal's
    (the App's own on_resize is not called on later resizes)."""

    def on_resize(self) -> None:
        self.app.terminal_resized()


class LowerViews(KeysInTypedOrder, KeyScroll):
    """The chart, break-even and what-if. Below 120 columns they had the 3-9 lines the table
    leaves (break-even took ~30 presses of ↓ in a 4-line window, what-if rows scrolled
    away from their header): while they have the focus there, the table and the status line
    make way, and escape or shift+tab brings the table back. Keys in typed order (fields.py):
    a burst that tabbed through here on its way to the inputs lost every character typed
    after it (`tab tab ... tab 1 3 B tab end backspace 8` from the table left Size empty)."""

    BINDINGS = [Binding("shift+tab", "back_to_table", "Back to the table", show=False)]

    def on_focus(self) -> None:
        self.screen.set_class(self.app.size.width < COMPACT_WIDTH, "views-focused")

    def on_blur(self) -> None:
        self.screen.remove_class("views-focused")

    def action_back_to_table(self) -> None:
        self.app.action_focus_table()


class ZLayoutApp(EditingMixin, LayoutActionsMixin, App[None]):
    """Design a DeepSpeed ZeRO layout interactively."""

    CSS_PATH = Path(__file__).with_name("app.tcss")
    TITLE = "zlayout"
    COMMANDS = App.COMMANDS | {ZLayoutCommands}
    BINDINGS = [
        Binding("f1,question_mark", "help", "Help", id="help", key_display="f1 ?",
                tooltip="this list of keys (? works outside text fields)"),
        Binding("ctrl+s", "export", "Export", id="export",
                tooltip="export the selected layout as a profile (asks before replacing one, "
                        "or if the layout does not fit)"),
        Binding("ctrl+o", "load", "Load", id="load", show=False,
                tooltip="load a profile, or a model's config.json"),
        Binding("ctrl+r", "verify", "Verify", id="verify",
                tooltip="run the selected layout for real: GPUs, CPU check or SLURM script"),
        Binding("ctrl+z", "undo", "Undo", id="undo",
                tooltip="undo the last change of inputs (repeat for earlier ones)"),
        Binding("ctrl+t", "pin", "What-if", id="compare",
                tooltip="what-if: pin this plan, change inputs, read the deltas; again: unpin"),
        Binding("ctrl+b", "toggle_inputs", "Inputs", id="toggle-inputs",
                tooltip="show or hide the inputs (hidden at first below 120 columns)"),
        Binding("escape", "focus_table", "Back to table", show=False, id="focus-table",
                tooltip="back to the layouts table"),
        Binding("ctrl+q", "quit", "Quit", id="quit", priority=True, tooltip="quit zlayout"),
    ]

    plan: reactive[Plan | None] = reactive(None, init=False)
    pinned: reactive[Plan | None] = reactive(None, init=False)
    show_inputs: reactive[bool] = reactive(True, init=False)

    def __init__(self, initial: PlanInput | None = None, planner: Planner = _core_plan,
                 verifier: Verifier | None = None, profile_io: ProfileIO | None = None,
                 presets: Presets | None = None, crossovers: CrossoverFinder | None = _core_crossovers,
                 cursor_blink: bool = True, presets_dirs: Sequence[str] = (),
                 team_config: dict | None = None, notes: Sequence[str] = ()) -> None:
        super().__init__()
        # what the command line says about the inputs it opened on (`zlayout: note:` lines: the
        # model card learned at another depth or by another transformers, no card, a vision tower
        # not planned), shown once the app is up: printed on exit they came after every decision
        self._notes = tuple(notes)
        # `zlayout app --ds-config`: the team's DeepSpeed config, whose optimizer and scheduler
        # every export keeps (zlayout sets the ZeRO, batch and precision keys)
        self._team_config = team_config
        # `zlayout app --presets-dir`'s folders: the preset lists, break-even and export read
        # them as the CLI's commands do (the defaults below; collaborators passed in are kept)
        self._presets_dirs = dirs = tuple(str(d) for d in presets_dirs)
        self._presets = presets if presets is not None else catalog_presets(dirs)
        self._base_input = initial if initial is not None else default_plan_input()
        self._model_base: ModelSpec = self._base_input.model
        self._planner = partial(_core_plan, presets_dirs=dirs) if planner is _core_plan else planner
        # the real planner's plan without break-even, on screen first (a planner passed in: none)
        self._quick_planner = partial(_core_plan_quick, presets_dirs=dirs) if planner is _core_plan else None
        self._add_breakeven = partial(_core_add_breakeven, presets_dirs=dirs)
        self._verifier = verifier
        self._profile_io = profile_io
        self._crossover_finder = (partial(_core_crossovers, presets_dirs=dirs)
                                  if crossovers is _core_crossovers else crossovers)
        self.planner_error: str | None = None
        self._breakeven_error_shown = ""  # notified once per distinct message
        self.cursor_blink = cursor_blink
        self._compact: bool | None = None
        self._inputs_toggled = False  # the user chose: resizing no longer shows/hides the panel
        self._crossovers: tuple[Any, ...] = ()
        self._follow_star = True  # the table cursor follows ★ until the user moves it
        # the layout export and verify act on: ★, unless the user picked another on purpose
        # (enter on its row, or a suggestion applied); moving the cursor to read a row is no pick
        self._picked_key: str | None = None
        self._fix_layout: Layout | None = None
        self._init_editing()
        self._dim_timer = None  # dims figures that are still the last inputs' (`_mark_updating`)
        if os.environ.get(STATE_DUMP_ENV):
            self.bind("f12", "dump_state", show=False)

    # -- layout -------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield AppHeader()
        with Body(id="body"):
            yield InputsPanel(self._presets, self._panel_values(self._base_input), id="inputs")
            with Vertical(id="main"):
                yield StatusLine(id="recommendation")
                yield LayoutTable(id="layouts")
                with LowerViews(id="views"):
                    yield MemoryBars(id="bars")
                    with Horizontal(id="lower"):
                        yield BreakEvenPanel(id="breakeven")
                        yield ComparePanel(id="compare")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one("#bars").border_title = "Per-GPU memory"
        self.query_one("#breakeven").border_title = "Break-even"
        self.query_one("#compare").border_title = "What-if (ctrl+t pins)"
        if not self.cursor_blink:
            for field in self.query(Input):
                field.cursor_blink = False
        self.plan_after_first_frame()
        self.query_one(LayoutTable).focus()
        for note in self._notes:
            self.notify(note, title="Note on the inputs", severity="warning", timeout=30, markup=False)

    @on(events.Ready)
    def _first_frame(self) -> None:
        self.first_frame_shown()

    def on_resize(self) -> None:
        self.terminal_resized()

    def terminal_resized(self) -> None:
        compact = self.size.width < COMPACT_WIDTH
        if compact != self._compact:
            self._compact = compact
            self.screen.set_class(compact, "compact")
            if not self._inputs_toggled:
                self.show_inputs = not compact
        if self.plan is not None:
            self.sub_title = view.plan_summary(self.plan, self.size.width)

    def watch_show_inputs(self, show: bool) -> None:
        panel = self.query_one(InputsPanel)
        panel.display = show
        if show:
            # Textual may skip the Resize of the tabs when the panel reappears (its screen map was
            # refreshed while the panel was hidden), leaving their underline under no tab;
            # re-showing the active tab redraws it.
            tabs = self.query_one("#input-tabs", TabbedContent)
            if tabs.active:
                tabs.show_tab(tabs.active)
            # set_focus, not focus(): focus() lands after the keys already queued, so a quick
            # ctrl+b ctrl+b hid the panel first and then focused its tab bar, hidden: the keys
            # after it were lost (3 of 6 bursts at 80x24)
            if self.focused is self.query_one(LayoutTable) and self._compact:
                self.screen.set_focus(self.query_one("#input-tabs").query("Tabs").first())
        elif self.focused is not None and panel in self.focused.ancestors:
            self.screen.set_focus(self.query_one(LayoutTable))

    def notify(self, message: str, *, title: str = "", severity: str = "information",
               timeout: float | None = None, markup: bool = True) -> None:
        """Textual's notify; a path in a plain message breaks only after a slash, and a toast
        that would reach the table's figures is short-lived."""
        if not markup:  # plain text, as every message quoting a path is sent
            from zlayout.tui.actions import TOAST_TEXT_WIDTH

            message = view.fold_at_slashes(message, TOAST_TEXT_WIDTH)
        if self._toast_reaches_table(message, title):
            timeout = min(timeout if timeout is not None else TOAST_OVER_TABLE_S, TOAST_OVER_TABLE_S)
        super().notify(message, title=title, severity=severity, timeout=timeout, markup=markup)

    def _toast_reaches_table(self, message: str, title: str) -> bool:
        """Whether a toast of this text, stacked at the bottom left on those still shown, rises
        into the table: only with the inputs panel hidden (open, a toast is no wider than the
        panel) and fewer lines below the table than the stack's (each text folded into
        TOAST_TEXT_WIDTH, a title line, and one line between toasts)."""
        from rich.cells import cell_len

        from zlayout.tui.actions import TOAST_TEXT_WIDTH

        if self.show_inputs or not self.is_running:
            return False
        table = self.query_one(LayoutTable)
        if not table.display or self.screen is not table.screen:
            return False

        def lines(text: str, heading: str) -> int:
            return bool(heading) + sum(max(1, -(-cell_len(line) // TOAST_TEXT_WIDTH))
                                       for line in text.split("\n"))

        stack = lines(message, title) + sum(lines(n.message, n.title) + 1 for n in self._notifications)
        # the table as it stands or as its rows will lay it out (a plan's first toast comes
        # before the table has grown to its rows)
        laid_out = table.row_count + 2  # its rows, the header and the top border
        if table.styles.max_height is not None:
            laid_out = min(laid_out, int(table.styles.max_height.value))
        bottom = max(table.region.bottom, table.region.y + laid_out)
        below_table = self.size.height - 1 - bottom  # the footer's line is not free
        return stack > below_table

    # -- the plan -------------------------------------------------------------------------

    def watch_plan(self, plan: Plan | None) -> None:
        if plan is None:
            return
        self.sub_title = view.plan_summary(plan, self.size.width)
        table = self.query_one(LayoutTable)
        table.plan = plan
        if self._fix_layout is not None:  # a suggestion was applied: select its layout
            table.select_key(self._fix_layout.key)
            self._fix_layout = None
        elif self._follow_star and plan.recommendation.layout is not None:
            table.select_key(plan.recommendation.layout.key)
        self.query_one(MemoryBars).plan = plan
        panel = self.query_one(BreakEvenPanel)
        panel.crossovers = self._crossovers
        panel.computing = self._plan_is_quick  # break-even follows
        panel.plan = plan
        self.query_one(ComparePanel).plan = plan
        self.show_status()
        error = getattr(plan, "breakeven_error", "")
        if error and error != self._breakeven_error_shown:  # the panel may be scrolled away
            self.notify(error, title="Break-even not computed", severity="warning", timeout=15,
                        markup=False)  # a TOML error quotes [brackets]
        self._breakeven_error_shown = error

    def watch_pinned(self, pinned: Plan | None) -> None:
        self.query_one(ComparePanel).pinned = pinned

    def show_status(self) -> None:
        status = self.query_one("#recommendation", StatusLine)
        errors = {**self.input_errors, **self._extra_errors}
        stale = bool(errors) or self.planner_error is not None
        status.set_class(stale, "has-errors")
        self.query_one(LayoutTable).set_class(stale, "stale")
        self._mark_updating()
        if self.planner_error is not None:
            status.text = (f"⚠ the planner failed on these inputs ({self.planner_error}): "
                           "showing the last plan")
        elif errors:
            names = ", ".join(field_label(field) for field in errors)
            status.text = (f"⚠ {len(errors)} field{'s' if len(errors) > 1 else ''} invalid "
                           f"({names}): showing the plan of the last valid inputs (dimmed)")
        elif self.plan is not None:
            status.text = view.recommendation_text(self.plan)
        else:
            status.text = "planning…"  # the first plan is computed after the first frame

    def _figures_outdated(self) -> bool:
        """The figures on screen are the last valid inputs' while the fields' are planned."""
        return (not self.input_errors and not self._extra_errors and self.planner_error is None
                and self.plan is not None and self._valid_input is not None
                and self._valid_input != self.plan.input)

    def _mark_updating(self) -> None:
        """Between an edit and its figures the last inputs' are dimmed a little (#main.updating),
        never shown as current for longer than a glance: only once they are UPDATING_DIM_AFTER_S
        old. Most edits' figures come sooner, and dimming then undimming restyles the table
        and redraws the screen twice (~20 ms each at 80x24) on the keystroke's way to its plan."""
        main = self.query_one("#main")
        if not self._figures_outdated():
            main.remove_class("updating")
            if self._dim_timer is not None:
                self._dim_timer.stop()
                self._dim_timer = None
        elif self._dim_timer is None and not main.has_class("updating"):
            self._dim_timer = self.set_timer(UPDATING_DIM_AFTER_S, self._dim_outdated)

    def _dim_outdated(self) -> None:
        self._dim_timer = None
        self.query_one("#main").set_class(self._figures_outdated(), "updating")

    @on(PlanReady)
    def _plan_ready(self, message: PlanReady) -> None:
        self.plan_ready(message)

    @on(InputsPanel.Changed)
    def _input_changed(self, event: InputsPanel.Changed) -> None:
        self.field_changed(event.field)

    @on(DataTable.RowHighlighted, "#layouts")
    def _row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        rec = self.plan.recommendation.layout if self.plan is not None else None
        self._follow_star = rec is not None and event.row_key.value == rec.key

    # -- actions --------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """While a dialog is open, only quit (and the dialog's own keys) work."""
        if len(self.screen_stack) > 1 and action in {"export", "load", "verify", "pin", "help", "undo",
                                                     "toggle_inputs", "detail", "focus_table"}:
            return False
        return True

    def selected_layout(self) -> Layout | None:
        """The layout export and verify act on: the one picked on purpose (enter on its row,
        or a suggestion applied) while the plan still has it, else ★; with no ★ (nothing
        fits), the row under the cursor (the does-not-fit question follows)."""
        if self.plan is None:
            return None
        layouts = {lp.layout.key: lp.layout for lp in self.plan.layouts}
        if self._picked_key in layouts:
            return layouts[self._picked_key]
        if self.plan.recommendation.layout is not None:
            return self.plan.recommendation.layout
        return layouts.get(self.query_one(LayoutTable).selected_key or "")

    @on(DataTable.RowSelected, "#layouts")
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        rec = self.plan.recommendation.layout if self.plan is not None else None
        key = event.row_key.value
        # enter on ★ drops an earlier pick: ★ again
        self._picked_key = None if rec is not None and key == rec.key else key
        self.action_detail()

    def action_detail(self) -> None:
        if self.plan is None:
            return
        key = self.query_one(LayoutTable).selected_key
        layout = next((lp.layout for lp in self.plan.layouts if lp.layout.key == key), None)
        if layout is None:
            return
        from zlayout.profile.ds_config import ds_config

        self.push_screen(DetailScreen(self.plan.for_layout(layout), ds_config(self.plan.input, layout)))

    def action_focus_table(self) -> None:
        # now, not on the views' blur: a hidden table cannot take the focus
        self.screen.remove_class("views-focused")
        self.screen.set_focus(self.query_one(LayoutTable))

    def action_toggle_inputs(self) -> None:
        self._inputs_toggled = True
        self.show_inputs = not self.show_inputs

    def action_pin(self) -> None:
        if self.pinned is None:
            if self.plan is None:
                return
            self.pinned = self.plan
            self.notify("Plan pinned: change any input to see the deltas. ctrl+t again unpins.",
                        title="What-if")
            self.query_one("#views", VerticalScroll).scroll_to_widget(self.query_one(ComparePanel),
                                                                      animate=False)
        else:
            self.pinned = None
            self.notify("Unpinned.", title="What-if")

    def action_help(self) -> None:
        keys = [(self.get_key_display(b).replace("^", "ctrl+"), b.tooltip or b.description or b.action)
                for b in self.BINDINGS if isinstance(b, Binding)]
        self.push_screen(HelpScreen(keys + list(OTHER_KEYS)))

    def apply_fix(self, index: int) -> None:
        """Take one of the core's suggestions (when nothing fits): its inputs, its layout."""
        if self.plan is None or index >= len(self.plan.recommendation.fixes):
            return
        fix = self.plan.recommendation.fixes[index]
        self._follow_star = False
        self._fix_layout = fix.layout
        self._picked_key = fix.layout.key  # chosen from the palette: what export then writes
        self.load_input(fix.input)
        self.notify(f"Applied: {fix.text}", title="Suggestion", markup=False)

    def action_dump_state(self) -> None:
        """Write what the app shows to $ZLAYOUT_STATE_DUMP as JSON: the fields, whether their
        plan is on screen yet, the plan input and every table cell (the pty tests read it)."""
        path = os.environ.get(STATE_DUMP_ENV)
        if not path:
            return
        state = {
            "values": self.query_one(InputsPanel).values(),
            "focused": self.focused.id if self.focused is not None else None,
            "tab": self.query_one("#input-tabs", TabbedContent).active,
            "pending": self.plan_pending,
            "errors": {**self.input_errors, **self._extra_errors},
            "plan_input": self.plan.input.model_dump(mode="json") if self.plan else None,
            "table": self.query_one(LayoutTable).cell_texts(),
            "subtitle": self.sub_title,
            "status": self.query_one(StatusLine).text,
            "screen": type(self.screen).__name__,
            "scrolled": {w.id: w.scroll_target_y for w in self.screen.query(KeyScroll) if w.id},
            "notifications": [notification.message for notification in self._notifications],
        }
        tmp = f"{path}.tmp"
        with open(tmp, "w") as out:
            json.dump(state, out)
        os.replace(tmp, path)


def run_app(initial: PlanInput | None = None, presets_dirs: Sequence[str] = (),
            script_command: str = "zlayout plan --preset llama3-8b --json",
            team_config: dict | None = None, notes: Sequence[str] = ()) -> int:
    """The full-screen app; without a terminal on stdin and stdout, one line and exit 2 that
    names `script_command`, the command printing these same inputs' plan for a script.
    `presets_dirs`: `--presets-dir`'s folders (preset lists, break-even, export)."""
    # textual-serve (`zlayout serve`) runs the app on pipes with its web driver: that is a screen
    served = bool(os.environ.get("TEXTUAL_DRIVER"))
    if not served and not (sys.stdin.isatty() and sys.stdout.isatty()):
        print("zlayout: error: the app needs a terminal (stdin and stdout are not one); "
              f"for output a script can read, run: {script_command}",
              file=sys.stderr)
        return 2
    ZLayoutApp(initial=initial, presets_dirs=presets_dirs, team_config=team_config, notes=notes).run()
    return 0
