"""Modal screens: layout detail, export/load path, overwrite confirmation, help, verification.

Modals query their own widgets through `self.query_one` (they are the active screen); the
verification worker lives on its screen, posts lines as messages and never touches a widget.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any, Callable, Iterable

from rich.syntax import Syntax
from rich.table import Table
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Log, ProgressBar, Static
from textual.worker import Worker, WorkerState, get_current_worker

from zlayout.core.plan import LayoutPlan
from zlayout.spec import Layout, PlanInput
from zlayout.tui import view

# A verifier runs the layout for real and yields progress lines; it must stop (and kill its
# processes) soon after `cancel` is set, and when its generator is closed.
Verifier = Callable[[PlanInput, Layout, threading.Event], Iterable[str]]


class DetailScreen(ModalScreen[None]):
    """One layout: every memory term with its reason, and the ds_config it implies."""

    BINDINGS = [Binding("escape,enter,q", "dismiss", "Close", id="detail-close")]

    def __init__(self, layout_plan: LayoutPlan, ds_config: dict[str, Any]) -> None:
        super().__init__()
        self._layout_plan = layout_plan
        self.ds_config_json = json.dumps(ds_config, indent=2)

    def compose(self) -> ComposeResult:
        lp = self._layout_plan
        mem = lp.memory
        with Vertical(id="detail", classes="dialog"):
            yield Label(f"[b]{lp.layout.label}[/b]  peak {view.fmt_gib(mem.gpu_peak_allocated_bytes)} GiB "
                        f"allocated, {view.fmt_gib(mem.gpu_device_used_bytes)} GiB on the device "
                        f"({view.headroom_text(mem)} free), peak during {mem.peak_phase}",
                        classes="dialog-title")
            with VerticalScroll(id="detail-body"):
                yield Static(self._terms_table(), id="detail-terms")
                yield Label("[b]ds_config.json[/b]")
                yield Static(Syntax(self.ds_config_json, "json",
                                    theme="ansi_dark", background_color="default"),
                             id="detail-ds-config")
            yield Label("[dim]escape: close · ↑↓ scroll[/dim]", classes="dialog-hint")

    def _terms_table(self) -> Table:
        """Every term: where it lives, its size, and why it is there (wrapped to fit)."""
        table = Table(box=None, expand=True, pad_edge=False, header_style="bold")
        table.add_column("Term", no_wrap=True)
        table.add_column("Where", no_wrap=True)
        table.add_column("GiB", justify="right", no_wrap=True)
        table.add_column("Why", ratio=1)
        for term in self._layout_plan.memory.terms:
            table.add_row(term.name, term.where, view.fmt_gib(term.bytes), term.explanation)
        return table

    def on_mount(self) -> None:
        self.query_one("#detail-body").focus()


class PathScreen(ModalScreen[str | None]):
    """Ask for a file path. `check(path)` returns a reason the path will not do, or None."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="path-cancel")]

    def __init__(self, title: str, initial: str, hint: str,
                 check: Callable[[str], str | None]) -> None:
        super().__init__()
        self._title, self._initial, self._hint, self._check = title, initial, hint, check

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog small-dialog"):
            yield Label(f"[b]{self._title}[/b]", classes="dialog-title")
            yield Input(value=self._initial, id="path-input")
            yield Static("", id="path-error", classes="field-error")
            yield Label(f"[dim]{self._hint} · enter: OK · escape: cancel[/dim]", classes="dialog-hint")

    def on_mount(self) -> None:
        self.query_one("#path-error").display = False
        self.query_one("#path-input", Input).focus()

    @on(Input.Submitted, "#path-input")
    def _submitted(self, event: Input.Submitted) -> None:
        path = event.value.strip()
        reason = self._check(path)
        error = self.query_one("#path-error", Static)
        if reason:
            error.update(f"↳ {reason}")
            error.display = True
            self.query_one("#path-input", Input).add_class("invalid")
            return
        self.dismiss(path)

    def action_cancel(self) -> None:
        self.dismiss(None)


class ConfirmScreen(ModalScreen[bool]):
    """A yes/no question; 'no' is the default (escape and n say no)."""

    BINDINGS = [Binding("y", "answer(True)", "Yes", id="confirm-yes"),
                Binding("n,escape", "answer(False)", "No", id="confirm-no")]

    def __init__(self, question: str) -> None:
        super().__init__()
        self._question = question

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog small-dialog"):
            yield Label(self._question, classes="dialog-title")
            with Horizontal(classes="buttons"):
                yield Button("Overwrite (y)", variant="error", id="yes")
                yield Button("Cancel (n)", variant="primary", id="no")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class HelpScreen(ModalScreen[None]):
    """Every key of the app, from its bindings (so the list cannot go stale)."""

    BINDINGS = [Binding("escape,q,f1", "dismiss", "Close", id="help-close")]

    def __init__(self, keys: list[tuple[str, str]]) -> None:
        super().__init__()
        self.keys = keys

    def compose(self) -> ComposeResult:
        table = Table(box=None, expand=True, show_header=False, pad_edge=False)
        table.add_column("Key", style="bold", no_wrap=True)
        table.add_column("Does", ratio=1)
        for key, description in self.keys:
            table.add_row(key, description)
        with Vertical(id="help", classes="dialog"):
            yield Label("[b]zlayout keys[/b]", classes="dialog-title")
            with VerticalScroll(id="help-keys"):
                yield Static(table)
            yield Label("[dim]escape: close · ↑↓ scroll[/dim]", classes="dialog-hint")

    def on_mount(self) -> None:
        self.query_one("#help-keys").focus()


class VerifyScreen(ModalScreen[None]):
    """Runs the verification of one layout in a thread worker and streams its output."""

    BINDINGS = [Binding("escape", "cancel_or_close", "Cancel / close", id="verify-cancel")]

    class Line(Message):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    def __init__(self, inp: PlanInput, layout: Layout, verifier: Verifier) -> None:
        super().__init__()
        self._inp, self._layout, self._verifier = inp, layout, verifier
        self._cancel = threading.Event()
        self.lines: list[str] = []
        self.state = "running"  # running, cancelling, finished, failed, cancelled
        self.result: dict[str, Any] | None = None  # the last JSON line with a "status"

    def compose(self) -> ComposeResult:
        with Vertical(id="verify", classes="dialog"):
            yield Label(f"[b]Verify {self._layout.label}[/b] on "
                        f"{self._inp.hardware.world}× {self._inp.hardware.gpu.name}",
                        classes="dialog-title")
            yield ProgressBar(total=None, show_eta=False, id="verify-progress")
            yield Log(id="verify-log", highlight=False)
            yield Label("running · escape: cancel", id="verify-status", classes="dialog-hint")

    def on_mount(self) -> None:
        self.run_verification()

    def on_unmount(self) -> None:
        self._cancel.set()  # the app is quitting: stop the run (the verifier kills its ranks)

    @work(thread=True, exclusive=True, exit_on_error=False, group="verify")
    def run_verification(self) -> None:
        worker = get_current_worker()
        lines = self._verifier(self._inp, self._layout, self._cancel)
        try:
            for line in lines:
                if worker.is_cancelled or self._cancel.is_set():
                    break
                self.post_message(self.Line(str(line).rstrip("\n")))
        finally:
            close = getattr(lines, "close", None)
            if close is not None:
                close()  # runs the verifier's cleanup (it kills its processes)

    @on(Line)
    def _line(self, message: Line) -> None:
        self.lines.append(message.text)
        self.query_one("#verify-log", Log).write_line(message.text)
        step = STEP_LINE.search(message.text)
        if step is not None:  # "[rank 0] step 2/5: loss ..." (zlayout verify's live log)
            self.query_one("#verify-progress", ProgressBar).update(total=int(step[2]),
                                                                   progress=int(step[1]))
        record = _json_of(message.text)
        if record is None:
            return
        if isinstance(record.get("step"), int) and isinstance(record.get("steps"), int):
            self.query_one("#verify-progress", ProgressBar).update(total=record["steps"],
                                                                   progress=record["step"])
        if "status" in record:
            self.result = record
            for line in _comparison_lines(record):
                self.query_one("#verify-log", Log).write_line(line)

    @on(Worker.StateChanged)
    def _worker_state(self, event: Worker.StateChanged) -> None:
        if event.worker.group != "verify":
            return
        status = self.query_one("#verify-status", Label)
        bar = self.query_one("#verify-progress", ProgressBar)
        if event.state == WorkerState.SUCCESS:
            if self._cancel.is_set():
                self.state = "cancelled"
                status.update("cancelled (its processes were stopped) · escape: close")
            else:
                self.state = "finished"
                bar.update(total=1, progress=1)
                outcome = f": {self.result['status']}" if self.result else ""
                cause = f" ({self.result['cause']})" if self.result and self.result.get("cause") else ""
                status.update(f"finished{outcome}{cause} · escape: close")
        elif event.state == WorkerState.ERROR:
            self.state = "failed"
            self.query_one("#verify-log", Log).write_line(f"error: {event.worker.error}")
            status.update(f"failed: {event.worker.error} · escape: close")
        elif event.state == WorkerState.CANCELLED:
            self.state = "cancelled"
            status.update("cancelled (its processes were stopped) · escape: close")

    def action_cancel_or_close(self) -> None:
        if self.state == "running":
            self._cancel.set()
            self.workers.cancel_group(self, "verify")
            self.state = "cancelling"
            self.query_one("#verify-status", Label).update("cancelling…")
        elif self.state != "cancelling":
            self.dismiss(None)


STEP_LINE = re.compile(r"\bstep (\d+)/(\d+)\b")


def _json_of(line: str) -> dict[str, Any] | None:
    """The JSON object a line holds (progress or the result), else None."""
    if not line.startswith("{"):
        return None
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def _comparison_lines(result: dict[str, Any]) -> list[str]:
    """Measured against predicted, one line per figure both sides have."""
    measured, predicted = result.get("measured") or {}, result.get("predicted") or {}
    errors = result.get("errors_pct") or {}
    if not isinstance(measured, dict) or not isinstance(predicted, dict):
        return []
    lines = [f"── result: {result.get('status')} ──"]
    if result.get("cause"):
        lines.append(str(result["cause"]))
    for key, want in predicted.items():
        got = measured.get(key)
        if isinstance(want, (int, float)) and isinstance(got, (int, float)) and got:
            error = errors.get(key) if isinstance(errors, dict) and errors.get(key) is not None \
                else (want - got) / got * 100
            lines.append(f"{key:<28} predicted {_figure(key, want):>12}  measured "
                         f"{_figure(key, got):>12}  error {error:+.1f}%")
    return lines


def _figure(key: str, value: float) -> str:
    if key.endswith("_bytes"):
        return f"{view.fmt_gib(value)} GiB"
    if key.endswith("_s"):
        return f"{value:.3f} s"
    return f"{value:,.6g}"
