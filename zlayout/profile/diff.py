"""What changed between two profiles, and what it did to memory and step time."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zlayout.profile.schema import Profile


@dataclass(frozen=True, slots=True)
class Change:
    field: str  # dotted path, e.g. "inputs.training.seq"
    before: Any  # None: absent in A
    after: Any  # None: absent in B


@dataclass(frozen=True, slots=True)
class Effect:
    figure: str  # e.g. "gpu_peak_allocated_bytes"
    basis: str  # "predicted" or "measured"
    before: int | float | bool | None
    after: int | float | bool | None

    @property
    def delta(self) -> float | None:
        if isinstance(self.before, bool) or isinstance(self.after, bool):
            return None
        if self.before is None or self.after is None:
            return None
        return self.after - self.before

    @property
    def delta_fraction(self) -> float | None:
        d = self.delta
        return None if d is None or not self.before else d / self.before


@dataclass(frozen=True, slots=True)
class ProfileDiff:
    changes: tuple[Change, ...]  # inputs, layout and run settings
    effects: tuple[Effect, ...]  # headline figures that differ
    term_changes: tuple[Effect, ...]  # memory terms ("gpu:activations") whose bytes differ
    status_before: str
    status_after: str

    @property
    def same_configuration(self) -> bool:
        return not self.changes


def _flatten(value: Any, prefix: str) -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


_FIGURES = ("gpu_peak_allocated_bytes", "gpu_peak_reserved_bytes", "gpu_device_used_bytes",
            "host_peak_bytes", "nvme_bytes", "step_time_s", "tokens_per_s", "fits")


def diff_profiles(a: Profile, b: Profile) -> ProfileDiff:
    """A -> B: configuration changes, then their effect on the predicted (and measured) figures."""
    from zlayout.profile.team_config import split

    def settings(p: Profile) -> dict[str, Any]:
        # ds_config: the team's keys (optimizer, scheduler): a change there moves no figure, but it is a change
        return {"inputs": p.inputs.model_dump(mode="json"), "layout": p.layout.model_dump(mode="json"),
                "run": p.run.model_dump(mode="json"), "ds_config": split(p.ds_config())[1]}

    flat_a, flat_b = _flatten(settings(a), ""), _flatten(settings(b), "")
    changes = tuple(Change(key, flat_a.get(key), flat_b.get(key))
                    for key in sorted(set(flat_a) | set(flat_b), key=lambda k: (k.split(".")[0] != "layout", k))
                    if flat_a.get(key) != flat_b.get(key))

    effects: list[Effect] = []
    for key in _FIGURES:
        before, after = getattr(a.prediction, key), getattr(b.prediction, key)
        if before != after:
            effects.append(Effect(key, "predicted", before, after))
    if a.verification.measured and b.verification.measured:
        for key in sorted(set(a.verification.measured) | set(b.verification.measured)):
            before, after = a.verification.measured.get(key), b.verification.measured.get(key)
            if before != after:
                effects.append(Effect(key, "measured", before, after))

    def terms(p: Profile) -> dict[str, int]:
        out: dict[str, int] = {}
        for term in p.prediction.terms:
            key = f"{term.where}:{term.name}"
            out[key] = out.get(key, 0) + term.bytes
        return out

    terms_a, terms_b = terms(a), terms(b)
    term_changes = [Effect(key, "predicted", terms_a.get(key), terms_b.get(key))
                    for key in list(terms_a) + [k for k in terms_b if k not in terms_a]
                    if terms_a.get(key) != terms_b.get(key)]
    term_changes.sort(key=lambda e: -abs((e.after or 0) - (e.before or 0)))
    return ProfileDiff(tuple(changes), tuple(effects), tuple(term_changes),
                       a.verification.status, b.verification.status)
