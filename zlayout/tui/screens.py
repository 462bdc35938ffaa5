"""Modal screens: layout detail, export/load path, overwrite confirmation, help, verification.

Modals query their own widgets through `self.query_one` (they are the active screen); the
verification worker lives on its screen, posts lines as messages and never touches a widget.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable

from rich.table import Table
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Log, ProgressBar, Static
from textual.worker import Worker, WorkerState, get_current_worker

from zlayout.spec import Layout, PlanInput
from zlayout.tui import view
from zlayout.tui.fields import FieldInput, KeyScroll

if TYPE_CHECKING:  # the planner is imported after the app's first frame
    from zlayout.core.plan import LayoutPlan

OK_STATUSES = ("validated", "cpu-ok")  # zlayout verify's statuses of a run that passed

# A verifier runs the layout for real and yields progress lines; it must stop (and kill its
# processes) soon after `cancel` is set, and when its generator is closed. With
# `cpu_processes`, it runs a CPU check (gloo) with that many processes instead of the GPUs.
Verifier = Callable[..., Iterable[str]]


class DetailScreen(ModalScreen[None]):
    """One layout: every memory term with its reason, and the ds_config it implies."""

    # f12: the app's state dump (the pty tests; nothing without $ZLAYOUT_STATE_DUMP), which a
    # dialog's screen would otherwise stop
    BINDINGS = [Binding("escape,enter,q", "dismiss", "Close", id="detail-close"),
                Binding("f12", "app.dump_state", show=False)]

    def __init__(self, layout_plan: LayoutPlan, ds_config: dict[str, Any]) -> None:
        super().__init__()
        self._layout_plan = layout_plan
        self.ds_config_json = json.dumps(ds_config, indent=2)

    def compose(self) -> ComposeResult:
        from rich.syntax import Syntax  # pygments: ~30 ms, only when a detail is opened

        lp = self._layout_plan
        mem = lp.memory
        with Vertical(id="detail", classes="dialog"):
            gpu = view.gpu_figures(mem)  # the table's figures; the sentence is the core's (fit.py)
            # the sentence names what the step needs unless it fits with room (then device used)
            needs = f"needs {gpu.needed} GiB, " if mem.gpu_fit.state == "fits" else ""
            yield Label(Text.assemble((lp.layout.label, "bold"), f"  {mem.gpu_fit.summary()}; "
                                      f"{needs}peak {gpu.peak} GiB allocated during {mem.peak_phase}"),
                        classes="dialog-title")
            with KeyScroll(id="detail-body"):
                yield Static(self._terms_table(), id="detail-terms")
                yield Static(self._step_time_table(), id="detail-step-time")
                yield Label("[b]ds_config.json[/b]")
                yield Static(Syntax(self.ds_config_json, "json",
                                    theme="ansi_dark", background_color="default",
                                    word_wrap=True),
                             id="detail-ds-config")
            yield Label("[dim]escape: close · ↑↓ scroll[/dim]", classes="dialog-hint")

    # Below this width the reasons go under their term, at the dialog's full width: in a
    # "Why" column 25 wide, "(stage3_max_reuse_distance)" was split "…_dista / nce)".
    STACKED_BELOW = 120

    def _stacked(self) -> bool:
        return self.app.size.width < self.STACKED_BELOW

    def _terms_table(self) -> Any:
        """Every term: where it lives, its size, and why it is there (wrapped to fit)."""
        rows = [(term.name, term.where, view.fmt_gib(term.bytes), term.explanation)
                for term in self._layout_plan.memory.terms]
        if self._stacked():
            return _stacked_rows(("Term", "Where", "GiB"), rows)
        table = Table(box=None, expand=True, pad_edge=False, header_style="bold")
        # long names (stage3_param_persistence_threshold in a reason) fold onto the next line
        # rather than being cut with an ellipsis when the dialog is narrow
        table.add_column("Term", overflow="fold", min_width=12)
        table.add_column("Where", no_wrap=True)
        table.add_column("GiB", justify="right", no_wrap=True)
        table.add_column("Why", ratio=1, overflow="fold")
        for row in rows:
            table.add_row(*row)
        return table

    def _step_time_table(self) -> Any:
        """The step time part by part (`zlayout plan --stage N` prints the same), and the
        host-bound or offload-bound note where the host's side or the offload sets it."""
        from rich.console import Group

        from zlayout.core.steptime import step_time_notes, step_time_parts

        t = self._layout_plan.time
        title = Text.assemble((f"Step time {view.fmt_seconds(t.step_time_s)}", "bold"),
                              f" (forward {view.fmt_seconds(t.forward_s)}, backward "
                              f"{view.fmt_seconds(t.backward_s)}, optimizer {view.fmt_seconds(t.optimizer_s)})")
        rows = [(name, f"{seconds:.3f}", why) for name, seconds, why in step_time_parts(t)]
        rows += [(label, "", note) for label, note in step_time_notes(t)]
        if self._stacked():
            return Group(title, _stacked_rows(("Part", "s"), rows))
        table = Table(box=None, expand=True, pad_edge=False, header_style="bold", title=title,
                      title_justify="left")
        table.add_column("Part", overflow="fold", min_width=12)
        table.add_column("s", justify="right", no_wrap=True)
        table.add_column("Why", ratio=1, overflow="fold")
        for name, seconds, why in rows:
            table.add_row(Text(name, style="yellow" if name == "host-bound" else ""), seconds, why)
        return table

    def on_resize(self) -> None:
        # the layout (columns or stacked) follows the terminal's width
        self.query_one("#detail-terms", Static).update(self._terms_table())
        self.query_one("#detail-step-time", Static).update(self._step_time_table())

    def on_mount(self) -> None:
        self.query_one("#detail-body").focus()


def _stacked_rows(headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> Any:
    """Rows whose last cell (the reason) goes on its own lines under the others, indented
    and wrapped at the whole width (words are never split)."""
    from rich.console import Group
    from rich.padding import Padding

    count = len(headers)
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(count)]

    def line(cells: tuple[str, ...], style: str = "") -> Text:
        padded = [cell.rjust(w) if i == count - 1 else cell.ljust(w)
                  for i, (cell, w) in enumerate(zip(cells, widths))]
        return Text("  ".join(padded), style=style, no_wrap=True, overflow="fold")

    parts: list[Any] = [line(headers, "bold")]
    for row in rows:
        parts += [line(row[:count], "yellow" if row[0] == "host-bound" else ""),
                  Padding(Text(row[-1], style="dim"), (0, 0, 0, 4))]
    return Group(*parts)


class PathScreen(ModalScreen[str | None]):
    """Ask for a file path. `check(path)` returns a reason the path will not do, or None."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="path-cancel")]

    def __init__(self, title: str, initial: str, hint: str,
                 check: Callable[[str], str | None]) -> None:
        super().__init__()
        self._title, self._initial, self._hint, self._check = title, initial, hint, check

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog small-dialog"):
            yield Label(Text(self._title, style="bold"), classes="dialog-title")
            yield FieldInput(value=self._initial, id="path-input")
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

    def __init__(self, question: str, yes: str = "Overwrite (y)", no: str = "Cancel (n)") -> None:
        super().__init__()
        self._question, self._yes, self._no = question, yes, no

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog small-dialog"):
            yield Label(Text(self._question), classes="dialog-title", id="confirm-question")
            with Horizontal(classes="buttons"):
                yield Button(self._yes, variant="error", id="yes")
                yield Button(self._no, variant="primary", id="no")

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
            with KeyScroll(id="help-keys"):
                yield Static(table)
            yield Label("[dim]escape: close · ↑↓ scroll[/dim]", classes="dialog-hint")

    def on_mount(self) -> None:
        self.query_one("#help-keys").focus()


@dataclass(frozen=True, slots=True)
class VerifyOptions:
    """How to verify: on this node's GPUs (both None), a CPU check, or a SLURM script."""

    cpu_processes: int | None = None
    slurm_script: str | None = None
    emulate: bool = False  # rank 0 of the plan's GPUs on this node's one GPU (verify --emulate)


class VerifyOptionsScreen(ModalScreen["VerifyOptions | None"]):
    """Where to run the verification: this node's GPUs, a CPU check with N processes (gloo,
    runs anywhere), or, for a multi-node plan, a SLURM batch script to submit."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="verify-options-cancel"),
                Binding("g", "choose('gpus')", "GPUs", show=False),
                Binding("c", "choose('cpu')", "CPU check", show=False),
                Binding("s", "choose('slurm')", "SLURM script", show=False),
                Binding("e", "choose('emulate')", "One GPU as rank 0", show=False)]

    def __init__(self, inp: PlanInput, layout: Layout, title: str | None = None) -> None:
        super().__init__()
        self._inp, self._layout = inp, layout
        self._title = title or f"Verify {layout.label}"  # view.action_title: the layout, its cost against ★
        self.multi_node = inp.hardware.nodes > 1

    def compose(self) -> ComposeResult:
        from zlayout.verify import options as verify_options  # after the first frame (planner)

        hw = self._inp.hardware
        where = f"{hw.world}× {hw.gpu.name}" + (f" ({hw.nodes} nodes)" if self.multi_node else "")
        with Vertical(classes="dialog small-dialog", id="verify-options"):
            yield Label(Text.assemble((self._title, "bold"), f" on {where}"), classes="dialog-title")
            if self.multi_node:
                yield Static(Text("A multi-node run starts from a scheduler: write the SLURM script "
                                  "(then sbatch it), or check the layout on CPU here."), classes="dialog-text")
                with Horizontal(classes="field-row"):
                    yield Label("SLURM script", classes="field-label")
                    yield FieldInput(value=f"verify-{self._inp.model.name}-{self._layout.key}.sbatch",
                                     compact=True, id="slurm-path")
            with Horizontal(classes="field-row"):
                yield Label("CPU processes", classes="field-label")
                yield FieldInput(value=str(verify_options.default_cpu_processes(self._inp)),
                                 compact=True, id="cpu-processes")
            yield Static("", id="verify-options-error", classes="field-error")
            with Horizontal(classes="buttons"):
                if self.multi_node:
                    yield Button("SLURM script (s)", variant="primary", id="slurm")
                else:
                    yield Button("GPUs of this node (g)", variant="primary", id="gpus")
                yield Button("CPU check (c)", id="cpu")
                yield Button("Cancel (esc)", id="cancel")
            yield Static(Text("CPU check: the layout's real DeepSpeed steps on CPU with gloo, "
                              "N processes (zlayout verify --cpu --processes N)", style="dim"),
                         classes="dialog-hint")
            if hw.world > 1:
                yield Static(Text(f"e: one GPU here as rank 0 of {hw.world}: the per-GPU memory of the "
                                  "whole run, measured (zlayout verify --emulate)", style="dim"),
                             classes="dialog-hint")

    def on_mount(self) -> None:
        self.query_one("#verify-options-error").display = False
        self.query_one(Button).focus()

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "cancel":
            self.dismiss(None)
        else:
            self.action_choose(event.button.id or "")

    def action_choose(self, how: str) -> None:
        if how == "gpus" and not self.multi_node:
            self.dismiss(VerifyOptions())
        elif how == "emulate" and self._inp.hardware.world > 1:
            self.dismiss(VerifyOptions(emulate=True))
        elif how == "slurm" and self.multi_node:
            path = self.query_one("#slurm-path", Input).value.strip()
            if not path:
                self._error("type where the SLURM script goes, e.g. verify.sbatch")
                return
            self.dismiss(VerifyOptions(slurm_script=path))
        elif how == "cpu":
            text = self.query_one("#cpu-processes", Input).value.strip()
            from zlayout.verify import options as verify_options

            # The CLI's rule (zlayout verify --cpu refuses more processes than usable cores).
            limit = verify_options.cpu_processes_limit()
            if not text.isdigit() or not 1 <= int(text) <= limit:
                self._error(f"CPU processes: type a whole number from 1 to {limit} (this machine "
                            f"has {limit} usable cores; a CPU check runs one process per core)")
                return
            self.dismiss(VerifyOptions(cpu_processes=int(text)))

    def _error(self, text: str) -> None:
        error = self.query_one("#verify-options-error", Static)
        error.update(Text(f"↳ {text}"))
        error.display = True

    def action_cancel(self) -> None:
        self.dismiss(None)


class VerifyScreen(ModalScreen[None]):
    """Runs the verification of one layout in a thread worker and streams its output."""

    BINDINGS = [Binding("escape", "cancel_or_close", "Cancel / close", id="verify-cancel")]

    class Line(Message):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    def __init__(self, inp: PlanInput, layout: Layout, verifier: Verifier,
                 cpu_processes: int | None = None, emulate: bool = False) -> None:
        super().__init__()
        self._inp, self._layout, self._verifier = inp, layout, verifier
        self._cpu_processes = cpu_processes
        self._emulate = emulate
        self._cancel = threading.Event()
        self.lines: list[str] = []
        self.state = "running"  # running, cancelling, finished, failed, cancelled
        self.result: dict[str, Any] | None = None  # the last JSON line with a "status"
        self._exit_line: str | None = None  # "zlayout verify exited with code N"

    def compose(self) -> ComposeResult:
        hw = self._inp.hardware
        where = (f"CPU check, {self._cpu_processes} processes (gloo)" if self._cpu_processes
                 else f"one GPU as rank 0 of {hw.world} (emulated)" if self._emulate
                 else f"{hw.world}× {hw.gpu.name}")
        with Vertical(id="verify", classes="dialog"):
            yield Label(Text.assemble(("Verify ", "bold"), (self._layout.label, "bold"), f" on {where}"),
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
        if self._cpu_processes:
            lines = self._verifier(self._inp, self._layout, self._cancel, cpu_processes=self._cpu_processes)
        elif self._emulate:
            lines = self._verifier(self._inp, self._layout, self._cancel, emulate=True)
        else:
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
        if EXIT_LINE.match(message.text):
            self._exit_line = message.text
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

    def _finish(self, text: str, failed: bool) -> None:
        status = self.query_one("#verify-status", Label)
        status.update(Text(f"{text} · escape: close", style="bold red" if failed else "bold green"))
        status.set_class(failed, "failed")
        if failed:
            self.query_one("#verify-progress", ProgressBar).add_class("failed")

    @on(Worker.StateChanged)
    def _worker_state(self, event: Worker.StateChanged) -> None:
        if event.worker.group != "verify":
            return
        if event.state == WorkerState.SUCCESS:
            if self._cancel.is_set():
                self.state = "cancelled"
                self.query_one("#verify-status", Label).update(
                    "cancelled (its processes were stopped) · escape: close")
                return
            outcome = str(self.result["status"]) if self.result else None
            cause = f" ({self.result['cause']})" if self.result and self.result.get("cause") else ""
            if outcome in OK_STATUSES and self._exit_line is None:
                self.state = "finished"
                self.query_one("#verify-progress", ProgressBar).update(total=1, progress=1)
                self._finish(f"finished: {outcome}{cause}", failed=False)
            else:
                # a failed run keeps its progress where it stopped: never a full bar
                self.state = "failed"
                what = outcome or (self._exit_line or "no result")
                self._finish(f"failed: {what}{cause}", failed=True)
        elif event.state == WorkerState.ERROR:
            self.state = "failed"
            self.query_one("#verify-log", Log).write_line(f"error: {event.worker.error}")
            self._finish(f"failed: {event.worker.error}", failed=True)
        elif event.state == WorkerState.CANCELLED:
            self.state = "cancelled"
            self.query_one("#verify-status", Label).update("cancelled (its processes were stopped) · escape: close")

    def action_cancel_or_close(self) -> None:
        if self.state == "running":
            self._cancel.set()
            self.workers.cancel_group(self, "verify")
            self.state = "cancelling"
            self.query_one("#verify-status", Label).update("cancelling…")
        elif self.state != "cancelling":
            self.dismiss(None)


EXIT_LINE = re.compile(r"^zlayout verify exited with code \d+")
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
    if result.get("emulated_world"):
        lines.append(f"emulated: rank 0 of {result['emulated_world']} on one GPU: GPU memory as on the "
                     "full run (NCCL's buffers left out); step time and host memory not compared")
    for key, want in predicted.items():
        got = measured.get(key)
        if isinstance(want, (int, float)) and isinstance(got, (int, float)) and got:
            error = errors.get(key) if isinstance(errors, dict) and errors.get(key) is not None \
                else (want - got) / got * 100
            lines.append(f"{key:<28} predicted {_figure(key, want):>12}  measured "
                         f"{_figure(key, got):>12}  error {error:+.1f}%")
    from zlayout.verify.result import step_time_spread_line

    spread = step_time_spread_line(result)
    if spread:
        lines.append(spread)
    return lines


def _figure(key: str, value: float) -> str:
    if key.endswith("_bytes"):
        return f"{view.fmt_gib(value)} GiB"
    if key.endswith("_s"):
        return f"{value:.3f} s"
    return f"{value:,.6g}"
