"""The command palette's zlayout entries: the same actions as the key bindings."""

from __future__ import annotations

from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider

# (title, action, help); the action names are ZLayoutApp's.
PALETTE_ACTIONS: tuple[tuple[str, str, str], ...] = (
    ("Export profile", "export", "Write profile.toml, ds_config.json and launch scripts for the selected layout"),
    ("Load profile", "load", "Restore every input from a profile"),
    ("Verify on hardware", "verify", "Run the selected layout for a few real DeepSpeed steps"),
    ("Pin plan / what-if compare", "pin", "Pin the current plan; changes then show as deltas"),
    ("Show layout detail", "detail", "Memory terms with their reasons and the ds_config of the selected layout"),
    ("Toggle inputs panel", "toggle_inputs", "Show or hide the inputs"),
    ("Help: every key", "help", "List every key binding"),
    ("Quit", "quit", "Leave zlayout"),
)


class ZLayoutCommands(Provider):
    """Fuzzy-searchable entries for every app action."""

    async def discover(self) -> Hits:
        for title, action, help_text in PALETTE_ACTIONS:
            yield DiscoveryHit(title, partial(self.app.run_action, action), help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, action, help_text in PALETTE_ACTIONS:
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), partial(self.app.run_action, action),
                          help=help_text)
