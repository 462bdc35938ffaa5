"""The input widgets the panel and the dialogs type into, and the names users read.

`FieldInput` exists because of how Textual routes keys: a printable key is handled by the
focused Input at once, while an editing key (backspace, arrows, home/end) is an Input
*binding* that only runs after the key has bubbled through the widget tree, several
message hops later. When keys arrive together (SSH delivers a burst in one read) a
character overtakes the backspace typed before it: `End BSpace 8` on "1" gives "1"
instead of "8". `FieldInput` runs its own editing bindings as the key arrives, so every
key takes effect in the order it was typed.
"""

from __future__ import annotations

import re

from textual import events
from textual.widgets import Checkbox, Input

# Labels of the panel's fields: what every message shows instead of the internal name.
FIELD_LABELS: dict[str, str] = {
    "preset": "Preset", "size": "Size", "layers": "Layers", "hidden": "Hidden",
    "heads": "Heads", "kv_heads": "KV heads", "ffn": "FFN", "vocab": "Vocab", "mlp": "MLP",
    "norm": "Norm", "bias": "Biases", "tie_embeddings": "Tied embeddings", "gpu": "GPU",
    "gpus_per_node": "GPUs/node", "nodes": "Nodes", "intra_link": "Intra link",
    "inter_link": "Inter link", "host_ram_gib": "Host RAM GiB", "nvme_gib": "NVMe GiB",
    "seq": "Sequence", "micro_batch": "Micro-batch", "grad_accum": "Grad accum",
    "precision": "Precision", "checkpointing": "Checkpoint",
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


def _editing_keys() -> dict[str, str]:
    keys: dict[str, str] = {}
    for binding in Input.BINDINGS:
        key, action = (binding.key, binding.action) if hasattr(binding, "key") else binding[:2]
        for one in key.split(","):
            keys[one.strip()] = action
    return keys


class FieldInput(Input):
    """An Input whose editing keys take effect in the order they were typed (see above)."""

    EDITING_KEYS = _editing_keys()

    async def _on_key(self, event: events.Key) -> None:
        action = self.EDITING_KEYS.get(event.key)
        if action is None:
            await super()._on_key(event)
            return
        event.stop()
        event.prevent_default()
        self._restart_blink()
        await self.run_action(action)


class TickBox(Checkbox):
    """A checkbox that shows its state without colour: X when on, blank when off."""

    @property
    def _button(self):  # Textual draws the same X in both states, told apart by colour only
        self.BUTTON_INNER = "X" if self.value else " "
        return super()._button
