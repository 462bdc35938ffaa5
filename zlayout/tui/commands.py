"""The command palette's zlayout entries: the same actions as the key bindings."""

from __future__ import annotations

from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider

# (title, action, help); the action names are ZLayoutApp's.
PALETTE_ACTIONS: tuple[tuple[str, str, str], ...] = (
    ("Export profile", "export", "Write profile.toml, ds_config.json and launch scripts for the selected layout"),
    ("Load profile or config.json", "load", "Restore every input from a profile, or read a model's config.json"),
    ("Verify on hardware", "verify", "Run the selected layout for a few real DeepSpeed steps"),
    ("Pin plan / what-if compare", "pin", "Pin the current plan; changes then show as deltas"),
    ("Show layout detail", "detail", "Memory terms with their reasons and the ds_config of the selected layout"),
    ("Toggle inputs panel", "toggle_inputs", "Show or hide the inputs"),
    ("Undo input change", "undo", "Back to the inputs of the previous plan"),
    ("Help: every key", "help", "List every key binding"),
)  # Quit is Textual's own system command (listing it here showed it twice)


class ZLayoutCommands(Provider):
    """Fuzzy-searchable entries for every app action."""

    def _entries(self) -> list[tuple[str, object, str]]:
        entries: list[tuple[str, object, str]] = [
            (title, partial(self.app.run_action, action), help_text)
            for title, action, help_text in PALETTE_ACTIONS]
        plan = getattr(self.app, "plan", None)
        if plan is not None:  # the core's suggestions when nothing fits, one entry each
            for index, fix in enumerate(getattr(plan.recommendation, "fixes", ())):
                entries.append((f"Apply suggestion: {fix.text}",
                                partial(self.app.apply_fix, index), f"then {fix.layout.label} fits"))
        return entries

    async def discover(self) -> Hits:
        for title, callback, help_text in self._entries():
            yield DiscoveryHit(title, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, callback, help_text in self._entries():
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), callback, help=help_text)
