"""The zlayout app: inputs on the left, every layout live on the right.

One immutable `Plan` lives in the `plan` reactive. An edit builds a new `PlanInput` (pydantic
validates it; a bad field is marked with the reason and the last good plan stays), the planner
turns it into a new plan, and the watcher hands that plan to the widgets, which only display.
The planner, the verifier, the profile files and the presets come in through the constructor,
so tests run the real app on fakes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Sequence

from textual import on
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.reactive import reactive
from textual.widgets import DataTable, Footer, Header, Input

from zlayout.core.plan import Plan, make_plan
from zlayout.spec import Layout, ModelSpec, PlanInput
from zlayout.tui import view
from zlayout.tui.backends import (ProfileIO, catalog_presets, cli_verifier, default_plan_input,
                                  default_profile_io, verification_missing)
from zlayout.tui.commands import ZLayoutCommands
from zlayout.tui.form import FormInvalid, Presets, form_values, plan_input_from_form
from zlayout.tui.screens import (ConfirmScreen, DetailScreen, HelpScreen, PathScreen, Verifier,
                                 VerifyScreen)
from zlayout.tui.widgets import (BreakEvenPanel, ComparePanel, InputsPanel, LayoutTable, MemoryBars,
                                 StatusLine)

Planner = Callable[[PlanInput], Plan]
CrossoverFinder = Callable[[PlanInput], Sequence[Any]]


def _core_crossovers(inp: PlanInput) -> Sequence[Any]:
    from zlayout.core import breakeven

    finder = getattr(breakeven, "crossovers", None)
    return finder(inp) if finder is not None else ()

COMPACT_WIDTH = 120  # below this the inputs panel starts hidden (ctrl+b shows it)

# Keys that are not app bindings but that the help screen lists too.
OTHER_KEYS = (
    ("enter", "on the table: the selected layout's memory terms and ds_config"),
    ("↑ ↓ pgup pgdn", "move in the table, scroll a panel"),
    ("tab / shift+tab", "next / previous field or panel"),
    ("← →", "on a tab bar: switch tabs (Model, Hardware, Training)"),
    ("enter / space", "on a select: open it; type to search its options"),
    ("ctrl+p", "command palette: every action by name (and, when nothing fits, the core's suggestions)"),
    ("y / n", "in the overwrite question: replace the profile / keep it (escape: keep)"),
    ("escape", "in a dialog: close it (in a running verification: cancel it, which stops every rank)"),
)


class ZLayoutApp(App[None]):
    """Design a DeepSpeed ZeRO layout interactively."""

    CSS_PATH = Path(__file__).with_name("app.tcss")
    TITLE = "zlayout"
    COMMANDS = App.COMMANDS | {ZLayoutCommands}
    BINDINGS = [
        Binding("ctrl+s", "export", "Export", id="export",
                tooltip="export the selected layout as a profile (asks for the path; asks before replacing one)"),
        Binding("ctrl+o", "load", "Load", id="load",
                tooltip="load a profile: every input is restored from it"),
        Binding("ctrl+r", "verify", "Verify", id="verify",
                tooltip="run the selected layout for real (zlayout verify) with streamed output; escape cancels"),
        Binding("ctrl+t", "pin", "Pin/compare", id="compare",
                tooltip="what-if: pin the current plan, change inputs, read the deltas; again to unpin"),
        Binding("ctrl+b", "toggle_inputs", "Inputs", id="toggle-inputs",
                tooltip="show or hide the inputs panel (hidden at first below 120 columns)"),
        Binding("f1,question_mark", "help", "Help", id="help", key_display="f1 ?",
                tooltip="this list of keys (? works outside text fields)"),
        Binding("escape", "focus_table", "Back to table", show=False, id="focus-table",
                tooltip="back to the layouts table (from a field or a panel)"),
        Binding("ctrl+q", "quit", "Quit", id="quit", priority=True, tooltip="quit zlayout"),
    ]

    plan: reactive[Plan | None] = reactive(None, init=False)
    pinned: reactive[Plan | None] = reactive(None, init=False)
    show_inputs: reactive[bool] = reactive(True, init=False)

    def __init__(self, initial: PlanInput | None = None, planner: Planner = make_plan,
                 verifier: Verifier | None = None, profile_io: ProfileIO | None = None,
                 presets: Presets | None = None, crossovers: CrossoverFinder | None = _core_crossovers,
                 cursor_blink: bool = True) -> None:
        super().__init__()
        self._presets = presets if presets is not None else catalog_presets()
        self._base_input = initial if initial is not None else default_plan_input()
        self._model_base: ModelSpec = self._base_input.model
        self._planner = planner
        self._verifier = verifier
        self._profile_io = profile_io
        self._crossover_finder = crossovers
        self.planner_error: str | None = None
        self.cursor_blink = cursor_blink
        self.input_errors: dict[str, str] = {}
        self._extra_errors: dict[str, str] = {}  # preset/size fields: not part of the input
        self.recompute_s = 0.0  # the last input-to-plan time, for benchmarks/tui_startup.py
        self._compact: bool | None = None
        self._crossovers: tuple[Any, ...] = ()
        self._shown_values: dict[str, Any] = {}  # the panel's values the plan was last built from

    # -- layout -------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="body"):
            yield InputsPanel(self._presets, self._panel_values(self._base_input), id="inputs")
            with Vertical(id="main"):
                yield StatusLine(id="recommendation")
                yield LayoutTable(id="layouts")
                with VerticalScroll(id="views"):
                    yield MemoryBars(id="bars")
                    with Horizontal(id="lower"):
                        yield BreakEvenPanel(id="breakeven")
                        yield ComparePanel(id="compare")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#bars").border_title = "Per-GPU memory"
        self.query_one("#breakeven").border_title = "Break-even"
        self.query_one("#compare").border_title = "What-if (ctrl+t pins)"
        if not self.cursor_blink:
            for field in self.query(Input):
                field.cursor_blink = False
        self._recompute()
        self.query_one(LayoutTable).focus()

    def on_resize(self) -> None:
        compact = self.size.width < COMPACT_WIDTH
        if compact != self._compact:
            self._compact = compact
            self.screen.set_class(compact, "compact")
            self.show_inputs = not compact

    def watch_show_inputs(self, show: bool) -> None:
        panel = self.query_one(InputsPanel)
        panel.display = show
        if show:
            if self.focused is self.query_one(LayoutTable) and self._compact:
                self.query_one("#input-tabs").query("Tabs").first().focus()
        elif self.focused is not None and panel in self.focused.ancestors:
            self.query_one(LayoutTable).focus()

    # -- the plan -------------------------------------------------------------------------

    def watch_plan(self, plan: Plan | None) -> None:
        if plan is None:
            return
        self.sub_title = view.plan_summary(plan)
        self.query_one(LayoutTable).plan = plan
        self.query_one(MemoryBars).plan = plan
        panel = self.query_one(BreakEvenPanel)
        panel.crossovers = self._crossovers
        panel.plan = plan
        self.query_one(ComparePanel).plan = plan
        self._show_status()

    def watch_pinned(self, pinned: Plan | None) -> None:
        self.query_one(ComparePanel).pinned = pinned

    def _show_status(self) -> None:
        status = self.query_one("#recommendation", StatusLine)
        errors = {**self.input_errors, **self._extra_errors}
        status.set_class(bool(errors) or self.planner_error is not None, "has-errors")
        if self.planner_error is not None:
            status.text = (f"⚠ the planner failed on these inputs ({self.planner_error}): "
                           "showing the last plan")
        elif errors:
            status.text = (f"⚠ {len(errors)} field{'s' if len(errors) > 1 else ''} invalid "
                           f"({', '.join(errors)}): showing the last valid plan")
        elif self.plan is not None:
            status.text = view.recommendation_text(self.plan)

    def _panel_values(self, inp: PlanInput) -> dict[str, Any]:
        values = form_values(inp)
        values["preset"] = inp.model.name if inp.model.name in self._presets.models else None
        return values

    def _recompute(self) -> None:
        """Inputs -> PlanInput -> Plan; on bad input, mark the fields and keep the plan."""
        started = time.perf_counter()
        panel = self.query_one(InputsPanel)
        values = panel.values()
        self._shown_values = values
        try:
            inp = plan_input_from_form(values, self._model_base, self._base_input, self._presets)
            errors: dict[str, str] = {}
        except FormInvalid as exc:
            inp, errors = None, exc.errors
        self.input_errors = errors
        panel.mark_errors({**errors, **self._extra_errors})
        self.planner_error = None
        if inp is not None:
            try:
                plan = self._planner(inp)
                crossovers = tuple(self._crossover_finder(inp)) if self._crossover_finder else ()
            except Exception as exc:  # a planner bug must not take the app down
                self.planner_error = f"{type(exc).__name__}: {exc}"
            else:
                if inp.model.name == "custom" and (values["preset"] is not None or values["size"]):
                    panel.set_values({"preset": None, "size": ""})
                self._crossovers = crossovers
                self.plan = plan
        self._shown_values = panel.values()
        self.recompute_s = time.perf_counter() - started
        self._show_status()

    @on(InputsPanel.Changed)
    def _input_changed(self, event: InputsPanel.Changed) -> None:
        panel = self.query_one(InputsPanel)
        values = panel.values()
        if values.get(event.field) == self._shown_values.get(event.field):
            return  # a select announcing the value it was built with, not an edit
        if event.field == "preset":
            self._extra_errors.pop("preset", None)
            if values["preset"] is not None:
                self._use_model(self._load_model(values["preset"], "preset"), clear_size=True)
        elif event.field == "size":
            self._extra_errors.pop("size", None)
            if values["size"].strip():
                self._use_model(self._model_of_size(values["size"]), clear_size=False)
        elif event.field == "gpu" and values["gpu"]:
            self._follow_gpu_link(values["gpu"])
        self._recompute()

    def _load_model(self, name: str, field: str) -> ModelSpec | None:
        try:
            return self._presets.load_model(name)
        except Exception as exc:  # the catalog's message names what exists
            self._extra_errors[field] = str(exc).strip("'\"")
            return None

    def _model_of_size(self, text: str) -> ModelSpec | None:
        try:
            return self._presets.model_of_size(text.strip())
        except Exception as exc:
            self._extra_errors["size"] = (f"{str(exc).strip(chr(39) + chr(34))} "
                                          "(type a size such as 70B, 13e9 or 350M)")
            return None

    def _use_model(self, model: ModelSpec | None, clear_size: bool) -> None:
        if model is None:
            return
        self._model_base = model
        panel = self.query_one(InputsPanel)
        values = {k: v for k, v in form_values(self._base_input.model_copy(
            update={"model": model})).items()
            if k in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "mlp", "norm",
                     "bias", "tie_embeddings")}
        if clear_size:
            values["size"] = ""
        else:
            values["preset"] = model.name if model.name in self._presets.models else None
        panel.set_values(values)

    def _follow_gpu_link(self, gpu_name: str) -> None:
        """A new GPU brings its own intra-node link (NVLink generation), as the CLI does."""
        if self._presets.default_intra_link is None:
            return
        try:
            link = self._presets.default_intra_link(gpu_name)
        except Exception:
            return
        self.query_one(InputsPanel).set_values({"intra_link": link})

    # -- actions --------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """While a dialog is open, only quit (and the dialog's own keys) work."""
        if len(self.screen_stack) > 1 and action in {"export", "load", "verify", "pin", "help",
                                                     "toggle_inputs", "detail", "focus_table"}:
            return False
        return True

    def selected_layout(self) -> Layout | None:
        """The layout under the table cursor (else the recommended one)."""
        if self.plan is None:
            return None
        key = self.query_one(LayoutTable).selected_key
        for lp in self.plan.layouts:
            if lp.layout.key == key:
                return lp.layout
        return self.plan.recommendation.layout

    @on(DataTable.RowSelected, "#layouts")
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_detail()

    def action_detail(self) -> None:
        layout = self.selected_layout()
        if layout is None or self.plan is None:
            return
        from zlayout.profile.ds_config import ds_config

        self.push_screen(DetailScreen(self.plan.for_layout(layout), ds_config(self.plan.input, layout)))

    def action_focus_table(self) -> None:
        self.query_one(LayoutTable).focus()

    def action_toggle_inputs(self) -> None:
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
                for b in self._app_bindings()]
        self.push_screen(HelpScreen(keys + list(OTHER_KEYS)))

    def _app_bindings(self) -> list[Binding]:
        out = []
        for binding in self.BINDINGS:
            assert isinstance(binding, Binding)
            out.append(binding)
        return out

    def _refuse_when_invalid(self, what: str) -> bool:
        errors = {**self.input_errors, **self._extra_errors}
        if errors:
            self.notify(f"Fix the marked fields first ({', '.join(errors)}): {what} uses the inputs "
                        "as they stand.", severity="warning", title=what.capitalize())
            return True
        return False

    def _resolve_profile_io(self) -> ProfileIO | None:
        if self._profile_io is None:
            resolved = default_profile_io()
            if isinstance(resolved, str):
                self.notify(resolved, severity="error", title="Profiles")
                return None
            self._profile_io = resolved
        return self._profile_io

    def action_export(self) -> None:
        layout = self.selected_layout()
        plan = self.plan
        if plan is None or layout is None or self._refuse_when_invalid("export"):
            return
        io = self._resolve_profile_io()
        if io is None:
            return
        initial = f"profiles/{plan.input.model.name}-{layout.key}"

        def check(path: str) -> str | None:
            if not path:
                return "type a directory (profile.toml, ds_config.json and launch scripts go in it) or a .toml file"
            parent = Path(path).expanduser().parent
            if Path(path).suffix == ".toml" and not parent.is_dir():
                return f"{parent} does not exist: create it first or pick another path"
            return None

        def chosen(path: str | None) -> None:
            if not path:
                return
            exists = getattr(io, "exists", None) or (lambda p: Path(p).exists())
            if exists(path):
                self.push_screen(ConfirmScreen(f"{path} already holds a profile. Overwrite it?"),
                                 lambda yes: self._save(io, plan, layout, path) if yes else
                                 self.notify("Not exported: nothing was overwritten.", title="Export"))
            else:
                self._save(io, plan, layout, path)

        self.push_screen(PathScreen(f"Export {layout.label} as a profile", initial,
                                    "a directory (profile.toml + ds_config.json + launch scripts) or a .toml file",
                                    check), chosen)

    def _save(self, io: ProfileIO, plan: Plan, layout: Layout, path: str) -> None:
        try:
            io.save(plan, layout, path)
        except Exception as exc:
            self.notify(f"Not exported: {exc}", severity="error", title="Export")
            return
        self.notify(f"Exported {layout.label} to {path}", title="Export")

    def action_load(self) -> None:
        io = self._resolve_profile_io()
        if io is None:
            return
        loaded: dict[str, PlanInput] = {}

        def check(path: str) -> str | None:
            if not path:
                return "type the path of a profile.toml or of the directory that holds it"
            try:
                loaded["input"] = io.load(path)
            except Exception as exc:
                return str(exc).strip("'\"") or type(exc).__name__
            return None

        def chosen(path: str | None) -> None:
            if path and "input" in loaded:
                self.load_input(loaded["input"])
                self.notify(f"Loaded {path}", title="Load")

        self.push_screen(PathScreen("Load a profile", "profiles/", "a profile.toml or its directory",
                                    check), chosen)

    def load_input(self, inp: PlanInput) -> None:
        """Show `inp` in every field and plan it (what loading a profile does)."""
        self._base_input = inp
        self._model_base = inp.model
        self._extra_errors.clear()
        values = self._panel_values(inp)
        values["size"] = ""
        self.query_one(InputsPanel).set_values(values)
        self._recompute()

    def apply_fix(self, index: int) -> None:
        """Take one of the core's suggestions (when nothing fits): its inputs, its layout."""
        if self.plan is None or index >= len(self.plan.recommendation.fixes):
            return
        fix = self.plan.recommendation.fixes[index]
        self.load_input(fix.input)
        table = self.query_one(LayoutTable)
        keys = [row.key.value for row in table.ordered_rows]
        if fix.layout.key in keys:
            table.move_cursor(row=keys.index(fix.layout.key), animate=False)
        self.notify(f"Applied: {fix.text}", title="Suggestion")

    def action_verify(self) -> None:
        layout = self.selected_layout()
        plan = self.plan
        if plan is None or layout is None or self._refuse_when_invalid("verify"):
            return
        verifier = self._verifier
        if verifier is None:
            missing = verification_missing()
            if missing:
                self.notify(f"Cannot verify: {missing}.", severity="warning", title="Verify")
                return
            verifier = cli_verifier
        self.push_screen(VerifyScreen(plan.input, layout, verifier))


def run_app() -> int:
    """`zlayout` with no subcommand."""
    ZLayoutApp().run()
    return 0
