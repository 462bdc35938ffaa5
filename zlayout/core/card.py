"""A model card as the planner reads it: data in, bytes out, no torch and no I/O.

A card (written by `zlayout learn`, read from TOML by `zlayout.cards`) records, for each kind
of block and for the head and loss, the requests each phase makes of the allocator in order:
+bytes for an allocation, -bytes for a free, each a function of one sequence's token count
`q*T^2 + a*T + c` (q is not 0 only where something grows with T^2: eager attention's
probabilities, attention's FLOPs). At micro-batch `b` a request is `b*(q*T^2 + a*T) + c`: what
grows with tokens grows with the batch, a weight's gradient does not.

From the requests: what a phase leaves allocated (their sum) and the most it holds at once
above what it started with (the largest running sum).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

Poly = tuple[float, float, float]


class CardError(ValueError):
    """A card that is not one this planner reads: one line naming what is wrong."""


def bytes_at(poly: Poly, micro_batch: int, seq: int) -> float:
    q, a, c = poly
    return micro_batch * (q * seq * seq + a * seq) + c


@dataclass(frozen=True, slots=True)
class Phase:
    """One phase's requests, in order."""

    requests: tuple[Poly, ...]

    def net_and_peak(self, micro_batch: int, seq: int) -> tuple[int, int]:
        live = peak = 0.0
        for poly in self.requests:
            live += bytes_at(poly, micro_batch, seq)
            peak = max(peak, live)
        return int(round(live)), int(round(peak))

    def sizes(self, micro_batch: int, seq: int) -> list[int]:
        """The requests' sizes (positive: allocate, negative: free), for an allocator replay."""
        return [int(round(bytes_at(poly, micro_batch, seq))) for poly in self.requests]


@dataclass(frozen=True, slots=True)
class BlockCard:
    kind: int
    forward: Phase
    backward: Phase
    checkpointed_forward: Phase
    checkpointed_backward: Phase


@dataclass(frozen=True, slots=True)
class ModelCard:
    key: str
    model_type: str
    attention: str
    params: int
    parameter_numels: tuple[int, ...]  # in parameters() order: what DeepSpeed flattens
    layer_kinds: tuple[int, ...]
    blocks: tuple[BlockCard, ...]
    head_forward: Phase
    head_backward: Phase
    head_checkpointed_forward: Phase
    head_checkpointed_backward: Phase
    source: str = ""

    def block(self, kind: int) -> BlockCard:
        return next(b for b in self.blocks if b.kind == kind)

    # ---------------------------------------------------------- the planner's terms

    def saved_bytes(self, micro_batch: int, seq: int, checkpointing: bool) -> int:
        """Every block's saved activations at the end of the forward pass."""
        total = 0
        for kind in self.layer_kinds:
            block = self.block(kind)
            phase = block.checkpointed_forward if checkpointing else block.forward
            total += phase.net_and_peak(micro_batch, seq)[0]
        return total

    def largest_block_transient(self, micro_batch: int, seq: int, checkpointing: bool) -> int:
        """The most a block's backward holds above what it started with (with checkpointing:
        its recompute and backward), over the kinds of block."""
        return max((b.checkpointed_backward if checkpointing else b.backward).net_and_peak(micro_batch, seq)[1]
                   for b in self.blocks)

    def largest_forward_transient(self, micro_batch: int, seq: int, checkpointing: bool) -> int:
        """The most a block's forward holds above what it keeps."""
        worst = 0
        for b in self.blocks:
            net, peak = (b.checkpointed_forward if checkpointing else b.forward).net_and_peak(micro_batch, seq)
            worst = max(worst, peak - net)
        return worst

    def head_saved_bytes(self, micro_batch: int, seq: int, checkpointing: bool) -> int:
        """What the final norm, the head and the loss keep at the end of the forward pass
        (the model's outputs dropped, the loss kept)."""
        phase = self.head_checkpointed_forward if checkpointing else self.head_forward
        return phase.net_and_peak(micro_batch, seq)[0]

    def head_backward_peak_bytes(self, micro_batch: int, seq: int, checkpointing: bool) -> int:
        """The most the loss's and head's backward hold above what the forward left."""
        phase = self.head_checkpointed_backward if checkpointing else self.head_backward
        return phase.net_and_peak(micro_batch, seq)[1]


# --------------------------------------------------------------------------- parsing


def _phase(data: Any, where: str) -> Phase:
    if not isinstance(data, list) or not all(
            isinstance(r, list) and len(r) == 3 and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                        for x in r) for r in data):
        raise CardError(f"{where}: a phase is a list of [q, a, c] requests")
    return Phase(tuple(tuple(float(x) for x in r) for r in data))


def _get(data: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    value = data.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise CardError(f"{where}: {key!r} is missing or not a {kind.__name__}")
    return value


def card_from_dict(data: Mapping[str, Any], key: str, source: str = "") -> ModelCard:
    """The card a parsed TOML holds (`zlayout learn`'s format 1); CardError names what is wrong."""
    where = source or key
    if data.get("format") != 1:
        raise CardError(f"{where}: card format {data.get('format')!r}, this zlayout reads format 1")
    params = _get(data, "parameters", dict, where)
    shapes = _get(params, "shapes", list, where)
    numels = []
    for shape in shapes:
        n = 1
        for dim in shape:
            n *= int(dim)
        numels.append(n)
    count = _get(params, "count", int, where)
    if sum(numels) != count:
        raise CardError(f"{where}: the parameter shapes add up to {sum(numels):,}, not the count {count:,}")
    layers = _get(data, "layers", dict, where)
    kinds = tuple(int(k) for k in _get(layers, "kinds", list, where))
    blocks = []
    for i, block in enumerate(_get(data, "blocks", list, where)):
        at = f"{where} blocks[{i}]"
        blocks.append(BlockCard(kind=_get(block, "kind", int, at),
                                **{name: _phase(block.get(name), f"{at}.{name}") for name in (
                                    "forward", "backward", "checkpointed_forward", "checkpointed_backward")}))
    if set(kinds) - {b.kind for b in blocks}:
        raise CardError(f"{where}: layer kinds {sorted(set(kinds) - {b.kind for b in blocks})} have no block entry")
    head = _get(data, "head", dict, where)
    return ModelCard(
        key=key, model_type=str(data.get("model_type")), attention=str(data.get("attention")),
        params=count, parameter_numels=tuple(numels), layer_kinds=kinds, blocks=tuple(blocks),
        head_forward=_phase(head.get("forward"), f"{where} head.forward"),
        head_backward=_phase(head.get("backward"), f"{where} head.backward"),
        head_checkpointed_forward=_phase(head.get("checkpointed_forward"), f"{where} head.checkpointed_forward"),
        head_checkpointed_backward=_phase(head.get("checkpointed_backward"), f"{where} head.checkpointed_backward"),
        source=source)
