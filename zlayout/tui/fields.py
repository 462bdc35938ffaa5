"""The input widgets the panel and the dialogs type into, and the names users read.

`FieldInput` exists because of how Textual routes keys. The app hands every key to the
widget focused when it reads the key; the Input inserts a printable key at once, but an
editing key (backspace, arrows, home/end) or a focus key (tab) is a *binding* that runs
only after the key has bubbled up the widget tree, several message hops later. When keys
arrive together (SSH delivers a burst in one read) a character overtakes the backspace
typed before it (`End BSpace 8` on "1" gave "1"), and the keys typed after a tab land in
the field the tab was leaving. `FieldInput` runs the bindings of a key as it handles the
key, and passes on the keys that reach it after an earlier one moved the focus, so every
key takes effect in the order it was typed, in the field it was typed into. The panel's
other focusable widgets (selects, tick boxes, the tab bar, the layouts table) do the same
through `KeysInTypedOrder`: a burst that walks through a select or the tab bar
(`shift+tab shift+tab right tab ...`) otherwise left its later keys to a widget the focus
had already left, which then ran them (a tab there moved the focus back).
"""

from __future__ import annotations

import re
import time

from textual import events
from textual.actions import SkipAction
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widget import Widget
from textual.widgets import Checkbox, Input, Select, TabbedContent, TabPane
from textual.widgets._select import SelectCurrent, SelectOverlay
from textual.widgets._tabbed_content import ContentTab, ContentTabs

# Labels of the panel's fields: what every message shows instead of the internal name.
FIELD_LABELS: dict[str, str] = {
    "preset": "Preset", "size": "Size", "layers": "Layers", "hidden": "Hidden",
    "heads": "Heads", "kv_heads": "KV heads", "ffn": "FFN", "vocab": "Vocab", "mlp": "MLP",
    "norm": "Norm", "bias": "Biases", "tie_embeddings": "Tied embeddings", "gpu": "GPU",
    "gpus_per_node": "GPUs/node", "nodes": "Nodes", "intra_link": "Intra link",
    "inter_link": "Inter link", "host_ram_gib": "Host RAM GiB", "nvme_gib": "NVMe GiB",
    "seq": "Sequence", "micro_batch": "Micro-batch", "grad_accum": "Grad accum",
    "precision": "Precision", "checkpointing": "Checkpoint", "host_cores": "Host cores",
    "impl": "Model code", "allocator": "Allocator", "loop": "Loop",
}
# Internal spellings that reach messages (spec field names, CLI flags) -> the label.
_INTERNAL_NAMES = {
    **{name: label for name, label in FIELD_LABELS.items() if "_" in name},
    "host_ram_bytes": "Host RAM", "nvme_bytes": "NVMe", "kv-heads": "KV heads",
    "gpus-per-node": "GPUs/node", "micro-batch": "Micro-batch", "grad-accum": "Grad accum",
    "intra-link": "Intra link", "inter-link": "Inter link", "host-ram-gib": "Host RAM GiB",
    "nvme-gib": "NVMe GiB", "tie-embeddings": "Tied embeddings",
}
_INTERNAL_RE = re.compile(r"(?<![\w-])-{0,2}(" + "|".join(
    re.escape(name) for name in sorted(_INTERNAL_NAMES, key=len, reverse=True)) + r")(?![\w-])")


def field_label(field: str) -> str:
    return FIELD_LABELS.get(field, field)


def readable(message: str) -> str:
    """A spec or catalog message with internal names replaced by the panel's labels."""
    return _INTERNAL_RE.sub(lambda m: _INTERNAL_NAMES[m.group(1)], message)


def passed_on_if_focus_moved(widget: Widget, event: events.Key) -> bool:
    """Pass `event` to the focused widget if an earlier key of its burst moved the focus away
    from `widget` (the key belongs to the new field); True if it did."""
    focused = widget.app.focused
    if focused is widget:
        return False
    event.stop()
    event.prevent_default()
    passed_on = events.Key(event.key, event.character)
    passed_on._set_forwarded()
    (focused or widget.screen).post_message(passed_on)
    return True


async def ran_binding_now(widget: Widget, event: events.Key) -> bool:
    """Run the key's binding (the widget's, the screen's or the app's) now rather than after
    the key has bubbled up; True if one ran."""
    if await widget.app._check_bindings(event.key):
        event.stop()
        event.prevent_default()
        return True
    return False


class KeysInTypedOrder:
    """For a focusable widget that takes no text: every key is a binding, run as the key is
    handled, and keys arriving after the focus moved on go to the focused widget. Keys
    bubbling up from a focused child (a select's open list) are left to Textual."""

    async def _on_key(self, event: events.Key) -> None:
        focused = self.app.focused
        if focused is not None and focused is not self and self in focused.ancestors:
            return
        if not passed_on_if_focus_moved(self, event):
            await ran_binding_now(self, event)


class KeyScroll(VerticalScroll):
    """A VerticalScroll that moves for every ↑ ↓ pgup pgdn home end, however fast they come.
    Textual defers a key's scroll to the next refresh and reckons it from where the view was
    then: keys arriving faster than the screen refreshes were lost (ten ↓ in one burst moved a
    layout's memory terms two lines). Here each key scrolls now, from where the last one left it."""

    def _scroll_now(self, y: float) -> None:
        if not self.allow_vertical_scroll:
            raise SkipAction()
        self.scroll_to(y=y, animate=False, immediate=True)

    def action_scroll_down(self) -> None:
        self._scroll_now(self.scroll_target_y + 1)

    def action_scroll_up(self) -> None:
        self._scroll_now(self.scroll_target_y - 1)

    def action_page_down(self) -> None:
        self._scroll_now(self.scroll_target_y + self.scrollable_content_region.height)

    def action_page_up(self) -> None:
        self._scroll_now(self.scroll_target_y - self.scrollable_content_region.height)

    def action_scroll_home(self) -> None:
        self._scroll_now(0)

    def action_scroll_end(self) -> None:
        self._scroll_now(self.max_scroll_y)


class FieldInput(Input):
    """An Input whose keys take effect in the order they were typed (see above)."""

    async def _on_key(self, event: events.Key) -> None:
        if passed_on_if_focus_moved(self, event):
            return
        if not event.is_printable and await ran_binding_now(self, event):
            self._restart_blink()
            return
        await super()._on_key(event)


class PanelSelect(KeysInTypedOrder, Select):
    """A Select that keeps a burst's keys in order, its open list included.

    Textual's Select opens its list by moving the focus to it, later (`focus()` is queued
    behind the keys already read): in one burst, `enter h 1 0 0 enter tab 4` reached the closed
    select, not the list (the list stayed open on h200 and GPUs/node kept 8). Here the focus
    never moves: the select keeps it and drives its open list itself, as each key is handled.
    Open, letters and digits search (as Textual's list does, each key narrowing the match),
    `↑ ↓ pgup pgdn home end` move, `enter` takes the highlighted option, `escape` closes
    unchanged, `backspace` takes back a searched character; `tab`, `shift+tab` and other keys
    close the list unchanged and then do what they do. Closed, a letter or digit opens the list
    and searches, like `enter` then the letter."""

    SEARCH_RESET_S = 0.7  # Textual's list: a pause this long starts a new search
    LIST_KEYS = {"up": "cursor_up", "down": "cursor_down", "pageup": "page_up", "pagedown": "page_down",
                 "home": "first", "end": "last"}
    _search = ""
    _searched_at = 0.0

    async def _on_key(self, event: events.Key) -> None:
        if passed_on_if_focus_moved(self, event):
            return
        searchable = event.character is not None and event.is_printable and event.character.isalnum()
        if not self.expanded and not searchable:
            await ran_binding_now(self, event)
            return
        event.stop()
        event.prevent_default()
        if not self.expanded:
            self.action_show_overlay()
        overlay = self.query_one(SelectOverlay)
        if event.key in self.LIST_KEYS:
            getattr(overlay, f"action_{self.LIST_KEYS[event.key]}")()
        elif event.key == "enter":
            if overlay.highlighted is not None:
                self.value = self._options[overlay.highlighted][1]
            self.expanded = False
        elif event.key == "escape":
            self.expanded = False
        elif event.key == "backspace":
            self._search_for(overlay, self._search[:-1])
        elif event.character is not None and event.is_printable:
            now = time.monotonic()
            query = self._search if now - self._searched_at < self.SEARCH_RESET_S else ""
            self._searched_at = now
            self._search_for(overlay, query + event.character)
        else:  # tab, shift+tab, ctrl+...: close the list, then the key's own binding
            self.expanded = False
            await self.app._check_bindings(event.key)

    def _search_for(self, overlay: SelectOverlay, query: str) -> None:
        """Highlight the first match of `query`; with nothing searched, the current value."""
        self._search = query
        index = overlay._find_search_match(query) if query else self._index_of_value()
        if index is not None:
            overlay.select(index)

    def _index_of_value(self) -> int | None:
        return next((i for i, (_, value) in enumerate(self._options) if value == self.value), None)

    def on_mount(self) -> None:
        # the list never takes the focus: a click on an option selects it (Textual's
        # UpdateSelection) with the focus staying on the select
        self.query_one(SelectOverlay).can_focus = False

    def action_show_overlay(self) -> None:
        self._search = ""
        super().action_show_overlay()

    def _watch_expanded(self, expanded: bool) -> None:
        """Textual's, but the list is shown without taking the focus (see the class docstring)."""
        overlay = self.query_one(SelectOverlay)
        self.set_class(expanded, "-expanded")
        if not expanded:
            return
        overlay.select(None if self.value is self.NULL else self._index_of_value())
        self.query_one(SelectCurrent).has_value = self.value is not self.NULL

    def _on_blur(self, event: events.Blur) -> None:
        self.expanded = False  # the focus went elsewhere (a click, ctrl+b): the list goes too


class PanelTabs(TabbedContent):
    """A TabbedContent whose tab bar keeps a burst's keys in order, and switches the pane as
    the key that changes the tab is handled: the tab key after `right` must find the new
    pane's fields in the focus chain, not the old one's."""

    def compose(self) -> ComposeResult:
        for widget in super().compose():
            if type(widget) is ContentTabs:
                widget.__class__ = _InOrderContentTabs  # the same widget, these key rules
            yield widget

    def _on_tab_pane_focused(self, event: TabPane.Focused) -> None:
        # A pane says it gained the focus; in a burst that news can arrive after a later key
        # switched to another pane: only a pane that still holds the focus is shown.
        focused = self.app.focused
        if focused is None or event.tab_pane not in focused.ancestors:
            event.stop()
            event.prevent_default()

    def get_child_by_type(self, expect_type):
        # TabbedContent finds its tab bar by exact type
        return super().get_child_by_type(_InOrderContentTabs if expect_type is ContentTabs else expect_type)


class _InOrderContentTabs(KeysInTypedOrder, ContentTabs):
    async def _on_key(self, event: events.Key) -> None:
        before = self.active
        await super()._on_key(event)
        if self.active != before and self.active:
            self.tabbed_content.active = ContentTab.sans_prefix(self.active)


class TickBox(KeysInTypedOrder, Checkbox):
    """A checkbox that shows its state without colour: X when on, blank when off."""

    @property
    def _button(self):  # Textual draws the same X in both states, told apart by colour only
        self.BUTTON_INNER = "X" if self.value else " "
        return super()._button
