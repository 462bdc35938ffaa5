"""From what the user types to the plan on screen, off the input path.

Every edit is validated at once (cheap: the field is marked while the user types), and the
planning itself runs in a thread worker once the keys have paused for `PLAN_DEBOUNCE_S`: first
every layout's figures (tens of milliseconds), shown at once with the break-even panel saying
it is computing, then break-even's searches (seconds for a large model), which wait for that
frame and stop as soon as another edit comes (breakeven.cancellable). A result is shown only
if no edit came after the one it was started for, so the plan on screen is always the plan of
the fields as they stand, and a half-typed value is never planned. The app never writes into the field the
user is in (see `InputsPanel.set_values`); the edits it makes (a preset or a size fills the
architecture) are undoable with ctrl+z, like the user's own.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from textual.message import Message

from zlayout.messages import exception_text
from zlayout.spec import ModelSpec, PlanInput
from zlayout.tui.form import FormInvalid, form_values, plan_input_from_form
from zlayout.tui.widgets import InputsPanel

if TYPE_CHECKING:  # the planner is imported by the first planning worker, after the first frame
    from zlayout.core.plan import Plan

# keys closer than this are one edit: only the last state is planned. A burst's keys arrive in
# one read and are queued before the timer's event; a typist's are 100 ms or more apart
PLAN_DEBOUNCE_S = 0.02
# break-even's searches wait this long at most for the quick figures' frame (sharing the
# interpreter with them would delay that frame)
QUICK_FRAME_WAIT_S = 0.5
UNDO_DEPTH = 100
ARCHITECTURE_FIELDS = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "mlp", "norm",
                       "bias", "tie_embeddings")
FILLING_FIELDS = ("preset", "size", "gpu")  # an edit of these fills others (field_changed)


@dataclass(frozen=True, slots=True)
class InputState:
    """What undo restores: the panel's values and the model they are edits of."""

    values: Mapping[str, Any]
    model_base: ModelSpec


class PlanReady(Message):
    """A worker finished planning edit `generation` (plan None: the planner raised `error`)."""

    def __init__(self, generation: int, inp: PlanInput, plan: Plan | None,
                 crossovers: tuple[Any, ...], error: str | None, elapsed_s: float,
                 quick: bool = False, drawn: threading.Event | None = None) -> None:
        super().__init__()
        self.generation, self.inp, self.plan = generation, inp, plan
        self.crossovers, self.error, self.elapsed_s = crossovers, error, elapsed_s
        self.quick = quick  # the plan without break-even; the full one follows
        self.drawn = drawn  # a quick plan's: set once its frame is drawn (or it is dropped)


class EditingMixin:
    """The ZLayoutApp half that turns edits into plans (mixed into the App class)."""

    _planner: Callable[[PlanInput], Plan]
    _crossover_finder: Callable[[PlanInput], Sequence[Any]] | None
    _quick_planner: Callable[[PlanInput], Plan] | None
    _add_breakeven: Callable[[Plan], Plan]

    def _init_editing(self) -> None:
        self.input_errors: dict[str, str] = {}
        self._extra_errors: dict[str, str] = {}  # preset/size fields: not part of the input
        self._shown_values: dict[str, Any] = {}  # the panel's values last validated
        # the edit order (InputsPanel.edit_order) of the edit field_changed applies: its fills
        # leave the fields the user changed after it
        self._editing_order: int | None = None
        self._valid_input: PlanInput | None = None  # the fields' input, when they are valid
        self._generation = 0  # bumped by every edit; a plan for an older one is dropped
        self._planning_generation = -1  # the edit a worker is planning now (-1: none)
        self._plan_timer = None
        self._plan_is_quick = False  # the plan on screen lacks break-even (still being computed)
        self._first_frame_pending = False  # planning waits for the first frame (see plan_after_first_frame)
        self._history: list[InputState] = []
        self.recompute_s = 0.0  # the last planning time, for benchmarks/tui_startup.py

    # -- edits ------------------------------------------------------------------------------

    @property
    def plan_pending(self) -> bool:
        """True while the fields' plan is not on screen yet: edits not yet seen (their
        Changed messages are queued), the pause not yet over, or the worker still planning."""
        if self._plan_timer is not None or self._planning_generation >= 0 or self._first_frame_pending:
            return True
        panel = self.query_one(InputsPanel)
        return not panel.fields_mounted or panel.values() != self._shown_values

    def inputs_edited(self) -> None:
        """Validate the fields now; plan them once the keys pause."""
        self._fields_changed()
        self._plan_timer = self.set_timer(PLAN_DEBOUNCE_S, self._start_planning)

    def plan_now(self) -> None:
        """Plan the fields without waiting for a pause (load, undo)."""
        self._fields_changed()
        self._start_planning()

    def _fields_changed(self) -> None:
        """A new generation of the fields: validated now, any pending plan of the last one dropped."""
        self._first_frame_pending = False
        self._generation += 1
        self._validate()
        if self._plan_timer is not None:
            self._plan_timer.stop()
            self._plan_timer = None

    def plan_after_first_frame(self) -> None:
        """At start-up: validate the fields now (the first frame marks a bad one) and plan them
        once the first frame is on screen (`first_frame_shown`). The planning thread (and the
        planner's import) would otherwise share the interpreter with building that frame."""
        self._generation += 1
        self._validate()
        self._first_frame_pending = True

    def first_frame_shown(self) -> None:
        if self._first_frame_pending:
            self._first_frame_pending = False
            self._start_planning()
            if self._planning_generation < 0:  # nothing to plan: the hidden tabs right away
                self.query_one(InputsPanel).mount_deferred_soon()

    def current_errors(self) -> dict[str, str]:
        """The fields' errors as they stand now, also when their news is still queued (a field
        fixed earlier in the same burst as ctrl+s was still "marked" for export). Reads only."""
        values = self.query_one(InputsPanel).values()
        if values == self._shown_values:
            return dict(self.input_errors)
        try:
            plan_input_from_form(values, self._model_base, self._base_input, self._presets)
        except FormInvalid as exc:
            return dict(exc.errors)
        return {}

    def _validate(self) -> None:
        panel = self.query_one(InputsPanel)
        values = panel.values()
        try:
            inp = plan_input_from_form(values, self._model_base, self._base_input, self._presets)
            errors: dict[str, str] = {}
        except FormInvalid as exc:
            inp, errors = None, exc.errors
        if inp is not None and inp.model.name == "custom" and (values["preset"] is not None or values["size"]):
            panel.set_values({"preset": None, "size": ""})  # an edited architecture is no preset
            values = panel.values()
        self._shown_values = values
        self._valid_input = inp
        self.input_errors = errors
        panel.mark_errors({**errors, **self._extra_errors})
        self.show_status()

    def _start_planning(self) -> None:
        self._plan_timer = None
        inp = self._valid_input
        if inp is None or self._extra_errors:
            return  # the status says which fields to fix; the last plan stays, marked stale
        if (self.plan is not None and inp == self.plan.input and self.planner_error is None
                and not self._plan_is_quick):
            self._commit_state()
            self.show_status()
            return
        self._planning_generation = self._generation
        self._plan_in_thread(self._generation, inp)

    def _plan_in_thread(self, generation: int, inp: PlanInput) -> None:
        planner, finder, quick = self._planner, self._crossover_finder, self._quick_planner
        add_breakeven = self._add_breakeven

        def stale() -> bool:  # an edit came since: nobody will see this plan
            return self._generation != generation

        def work() -> None:
            from zlayout.core.breakeven import Cancelled, cancellable

            started = time.perf_counter()
            try:
                with cancellable(stale):
                    if quick is not None:  # the table's figures first, break-even after
                        drawn = threading.Event()
                        plan = quick(inp)
                        self.post_message(PlanReady(generation, inp, plan, (), None,
                                                    time.perf_counter() - started, quick=True, drawn=drawn))
                        drawn.wait(QUICK_FRAME_WAIT_S)
                        plan = add_breakeven(plan)
                    else:
                        plan = planner(inp)
                    crossovers = tuple(finder(inp)) if finder is not None else ()
                error = None
            except Cancelled:  # dropped by plan_ready as any stale plan is
                plan, crossovers, error = None, (), "cancelled: the inputs were edited"
            except Exception as exc:  # a planner bug must not take the app down
                plan, crossovers, error = None, (), f"{type(exc).__name__}: {exc}"
            self.post_message(PlanReady(generation, inp, plan, crossovers, error,
                                        time.perf_counter() - started))

        self.run_worker(work, thread=True, group="plan", exit_on_error=False)

    def plan_ready(self, message: PlanReady) -> None:
        self.query_one(InputsPanel).mount_deferred_soon()  # after the first plan (see there)
        if message.quick:
            # the figures of the fields' plan, shown at once; the plan stays pending (export
            # and verify wait) until break-even's full plan replaces it
            if message.generation == self._generation and message.plan is not None:
                self.planner_error = None
                self.recompute_s = message.elapsed_s
                self._plan_is_quick = True
                self.plan = message.plan
                self.call_after_refresh(message.drawn.set)
            else:
                message.drawn.set()  # stale: its worker stops at break-even's first evaluation
            return
        if message.generation != self._generation:
            if message.generation == self._planning_generation:
                self._planning_generation = -1
                if self._plan_timer is None and self._valid_input is not None:
                    self._start_planning()  # the edits since were no-ops for planning
            return
        self._planning_generation = -1
        self.recompute_s = message.elapsed_s
        if message.plan is None:
            self.planner_error = message.error
            self.show_status()
            return
        self.planner_error = None
        self._crossovers = message.crossovers
        self._plan_is_quick = False
        self.plan = message.plan
        self._commit_state()

    # -- presets, size, GPU ---------------------------------------------------------------------

    def field_changed(self, field: str) -> None:
        panel = self.query_one(InputsPanel)
        values = panel.values()
        if values.get(field) == self._shown_values.get(field):
            return  # a select announcing the value it was built with, not an edit
        # the other fields that fill fields, edited since the last validation: their news is queued
        unheard = {f: (values[f], self._shown_values.get(f)) for f in FILLING_FIELDS
                   if f != field and values[f] != self._shown_values.get(f)}
        # the fields that fill fields changed after this one, in the order typed (their news may
        # still be queued): applied again after it, so the last one typed wins even where its
        # text is the one shown (in one burst, a preset then Size's 13B typed again: the preset
        # cleared Size); each edit's fills leave the fields changed after it
        order = panel.edit_order()
        mine = order.get(field, 0)
        later = sorted((o, f) for f, o in order.items() if f in FILLING_FIELDS and o > mine)
        try:
            for stamp, edited in [(mine, field), *later]:
                self._editing_order = stamp
                self._apply_filling(edited, panel.values())
        finally:
            self._editing_order = None
        self.inputs_edited()  # once: validating between them would read a half-applied burst
        # ...so they stay unshown (unless filled just now), or that news would read as "not an
        # edit": in one burst, Size's 13B typed before Preset's news came was never applied
        now = panel.values()
        self._shown_values.update({f: shown for f, (typed, shown) in unheard.items() if now[f] == typed})

    def _apply_filling(self, field: str, values: Mapping[str, Any]) -> None:
        """What an edit of a field that fills others does (preset, size, GPU)."""
        if field == "preset":
            self._extra_errors.pop("preset", None)
            if values["preset"] is not None:
                self._use_model(self._load_model(values["preset"]), from_size=False)
        elif field == "size":
            self._extra_errors.pop("size", None)
            if values["size"].strip():
                self._use_model(self._model_of_size(values["size"]), from_size=True)
        elif field == "gpu" and values["gpu"]:
            self._follow_gpu_link(values["gpu"])

    def _load_model(self, name: str) -> ModelSpec | None:
        try:
            return self._presets.load_model(name)
        except Exception as exc:  # the catalog's message names what exists
            self._extra_errors["preset"] = exception_text(exc)
            return None

    def _model_of_size(self, text: str) -> ModelSpec | None:
        try:
            return self._presets.model_of_size(text.strip())
        except Exception as exc:  # the catalog's message says what to type
            message = exception_text(exc)
            if not any(example in message for example in ("70B", "13B", "350M")):
                message += " (type a size with a unit: 70B, 350M, 1.5T or 13e9)"
            self._extra_errors["size"] = message
            return None

    def _use_model(self, model: ModelSpec | None, from_size: bool) -> None:
        if model is None:
            return
        shown = self._valid_input or (self.plan.input if self.plan is not None else None)
        if from_size and shown is not None and shown.model.name == "custom":
            self.notify("Size replaced the architecture you entered: ctrl+z brings it back.",
                        title="Size")
        self._model_base = model
        values = {k: v for k, v in form_values(self._base_input.model_copy(
            update={"model": model})).items() if k in ARCHITECTURE_FIELDS}
        if from_size:
            values["preset"] = model.name if model.name in self._presets.models else None
        else:
            values["size"] = ""
        self._fill_unedited(values)

    def _fill_unedited(self, values: dict[str, Any]) -> None:
        """Fill fields for the user (a preset's architecture, a GPU's link), leaving out those
        the user changed after the edit being applied (`_editing_order`; the panel counts each
        change as its key is handled, whatever order the news arrives in): in one burst,
        `enter qwen2.5 enter tab ... g enter` changed MLP before the preset's news arrived, and
        the preset then wrote its swiglu over the user's gelu (a GPU's link over the intra link
        typed after it, too). The field the cursor is in is filled too when nothing was typed
        into it after: in one burst `1 3 B tab ... tab` on Size, the focus had reached Hidden
        before the size's news did, and Hidden kept 8192 beside the 13B shape's heads (36)."""
        panel = self.query_one(InputsPanel)
        order = panel.edit_order()
        panel.set_values({field: value for field, value in values.items()
                          if order.get(field, 0) <= (self._editing_order or 0)}, into_focused=True)

    def _follow_gpu_link(self, gpu_name: str) -> None:
        """A new GPU brings its own intra-node link (NVLink generation), as the CLI does."""
        if self._presets.default_intra_link is None:
            return
        try:
            link = self._presets.default_intra_link(gpu_name)
        except Exception:
            return
        self._fill_unedited({"intra_link": link})

    # -- undo -----------------------------------------------------------------------------------

    def _commit_state(self) -> None:
        """Remember the fields whose plan is on screen: a step ctrl+z returns to."""
        values = dict(self.query_one(InputsPanel).values())
        if self._history and self._history[-1].values == values:
            return
        self._history.append(InputState(values, self._model_base))
        del self._history[:-UNDO_DEPTH]

    def action_undo(self) -> None:
        """Back to the previous planned inputs (the fields as they were, every one)."""
        current = self.query_one(InputsPanel).values()
        if self._history and self._history[-1].values != current:
            target = self._history[-1]  # unplanned edits since the last plan: drop them first
        elif len(self._history) >= 2:
            self._history.pop()
            target = self._history[-1]
        else:
            self.notify("Nothing to undo.", title="Undo")
            return
        self._model_base = target.model_base
        self._extra_errors.clear()
        self.query_one(InputsPanel).set_values(target.values, into_focused=True)
        self.plan_now()

    def load_input(self, inp: PlanInput) -> None:
        """Show `inp` in every field and plan it (what loading a profile does)."""
        self._base_input = inp
        self._model_base = inp.model
        self._extra_errors.clear()
        values = self._panel_values(inp)
        values["size"] = ""
        self.query_one(InputsPanel).set_values(values, into_focused=True)
        self.plan_now()

    def _panel_values(self, inp: PlanInput) -> dict[str, Any]:
        values = form_values(inp)
        values["preset"] = inp.model.name if inp.model.name in self._presets.models else None
        return values
