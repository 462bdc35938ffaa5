"""What the app does with the selected layout: export it, load a profile, verify it.

A layout that does not fit is exported or verified only after the user has read why it
does not fit and said yes; a plan that is not the fields' plan (a field invalid, planning
pending) is refused with the fields to fix.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from zlayout.install import zlayout_argv
from zlayout.messages import exception_text
from zlayout.spec import Layout
from zlayout.tui.backends import (ProfileIO, cli_verifier, default_profile_io, verification_missing,
                                  verify_flags)
from zlayout.tui.fields import field_label
from zlayout.tui.screens import ConfirmScreen, PathScreen, VerifyOptions, VerifyOptionsScreen, VerifyScreen

# A toast is as wide as the inputs panel (app.tcss: it sits over the panel, off the table),
# less its border and padding.
TOAST_WIDTH = 36
TOAST_TEXT_WIDTH = TOAST_WIDTH - 3

if TYPE_CHECKING:  # the planner is imported after the app's first frame
    from zlayout.core.plan import Plan


class LayoutActionsMixin:
    """The ZLayoutApp half that exports, loads and verifies (mixed into the App class)."""

    def _refuse_when_invalid(self, what: str) -> bool:
        errors = {**self.current_errors(), **self._extra_errors}
        if errors:
            names = ", ".join(field_label(field) for field in errors)
            self.notify(f"Fix the marked fields first ({names}): {what} uses the inputs "
                        "as they stand.", severity="warning", title=what.capitalize())
            return True
        if self.plan_pending:
            self.notify(f"The plan of these inputs is still being computed: {what} again in a moment.",
                        severity="warning", title=what.capitalize())
            return True
        return False

    def _ask_if_it_does_not_fit(self, plan: Plan, layout: Layout, what: str,
                                then: Callable[[], None]) -> None:
        """A layout that does not fit is acted on only after a yes to a question whose first
        line is the dialog's own: the layout, why it does not fit and, when it is not ★, what
        it costs against ★."""
        if plan.for_layout(layout).memory.fits:
            then()
            return
        from zlayout.tui.view import action_title

        self.push_screen(
            ConfirmScreen(f"{action_title(plan, layout, what)}. {what} it anyway?",
                          yes=f"{what} anyway (y)", no="Cancel (n)"),
            lambda yes: then() if yes else self.notify(f"Not {what.lower()}ed: pick a layout that fits "
                                                       "(★ is the recommended one).", title=what))

    def _resolve_profile_io(self) -> ProfileIO | None:
        if self._profile_io is None:
            resolved = default_profile_io(self._presets_dirs, self._team_config)
            if isinstance(resolved, str):
                self.notify(resolved, severity="error", title="Profiles")
                return None
            self._profile_io = resolved
        return self._profile_io

    # -- export and load --------------------------------------------------------------------

    def action_export(self) -> None:
        layout = self.selected_layout()
        plan = self.plan
        if plan is None or layout is None or self._refuse_when_invalid("export"):
            return
        self._ask_if_it_does_not_fit(plan, layout, "Export", lambda: self._ask_export_path(plan, layout))

    def _ask_export_path(self, plan: Plan, layout: Layout) -> None:
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

        from zlayout.tui.view import action_title

        self.push_screen(PathScreen(action_title(plan, layout, "Export"), initial,
                                    "a directory (profile.toml + ds_config.json + launch scripts) or a .toml file",
                                    check), chosen)

    def _save(self, io: ProfileIO, plan: Plan, layout: Layout, path: str) -> None:
        try:
            io.save(plan, layout, path)
        except Exception as exc:
            self.notify(f"Not exported: {exc}", severity="error", title="Export", markup=False)
            return
        from zlayout.tui.view import short_path

        # the layout and the path each on a line of their own: the toast breaks neither
        self.notify(f"{layout.label}\n{short_path(path, TOAST_TEXT_WIDTH)}", title="Exported", markup=False)

    def action_load(self) -> None:
        io = self._resolve_profile_io()
        if io is None:
            return
        loaded: dict[str, Any] = {}

        def check(path: str) -> str | None:
            if not path:
                return "type the path of a profile.toml, a model's config.json or their directory"
            if _names_an_hf_config(Path(path).expanduser()):
                return load_hf_config(path)
            try:
                loaded["input"] = io.load(path)
            except Exception as exc:
                return exception_text(exc)
            return None

        def load_hf_config(path: str) -> str | None:
            """A Hugging Face config.json replaces the model (read without transformers) and
            plans it as the transformers class; the hardware and training stay."""
            from zlayout.hfconfig import load as load_config

            try:
                model = load_config(Path(path).expanduser())
            except ValueError as exc:
                return str(exc)
            base = self.plan.input
            loaded["input"] = base.model_copy(update={
                "model": model, "training": base.training.model_copy(update={"impl": "hf"})})
            return None

        def chosen(path: str | None) -> None:
            if path and "input" in loaded:
                self.load_input(loaded["input"])
                self.notify(f"Loaded {path}", title="Load", markup=False)

        self.push_screen(PathScreen("Load a profile or a config.json", "profiles/",
                                    "a profile.toml, a model's config.json, or their directory",
                                    check), chosen)

    # -- verify -------------------------------------------------------------------------------

    def action_verify(self) -> None:
        layout = self.selected_layout()
        plan = self.plan
        if plan is None or layout is None or self._refuse_when_invalid("verify"):
            return
        verifier = self._verifier
        if verifier is None:
            missing = verification_missing()
            if missing:
                self.notify(f"Cannot verify: {missing}.", severity="warning", title="Verify", markup=False)
                return
            verifier = cli_verifier
        self._ask_if_it_does_not_fit(plan, layout, "Verify",
                                     lambda: self._ask_how_to_verify(plan, layout, verifier))

    def _ask_how_to_verify(self, plan: Plan, layout: Layout, verifier: Any) -> None:
        def chosen(options: VerifyOptions | None) -> None:
            if options is None:
                return
            if options.slurm_script:
                self._write_slurm_script(plan, layout, options.slurm_script)
                return
            self.push_screen(VerifyScreen(plan.input, layout, verifier, cpu_processes=options.cpu_processes,
                                          emulate=options.emulate))

        from zlayout.tui.view import action_title

        self.push_screen(VerifyOptionsScreen(plan.input, layout, action_title(plan, layout, "Verify")),
                         chosen)

    def _write_slurm_script(self, plan: Plan, layout: Layout, path: str) -> None:
        """`zlayout verify --slurm PATH` for this plan, in a worker (it takes a second)."""
        command = [*zlayout_argv(), "verify", *verify_flags(plan.input, layout),
                   "--slurm", path]

        def work() -> None:
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=120)
            except (OSError, subprocess.TimeoutExpired) as exc:
                self.call_from_thread(self.notify, f"No SLURM script: {exc}", severity="error",
                                      title="Verify", markup=False)
                return
            text = (done.stdout or done.stderr).strip().splitlines()
            line = text[-1] if text else f"zlayout verify exited with {done.returncode}"
            self.call_from_thread(self.notify, line.removeprefix("zlayout: "),
                                  severity="information" if done.returncode == 0 else "error",
                                  title="SLURM script", markup=False, timeout=15)

        self.run_worker(work, thread=True, group="slurm", exit_on_error=False)


def _names_an_hf_config(path: Path) -> bool:
    """A config.json, or a directory holding one and no profile (a downloaded model)."""
    if path.is_dir():
        return (path / "config.json").is_file() and not (path / "profile.toml").exists()
    return path.name == "config.json"
