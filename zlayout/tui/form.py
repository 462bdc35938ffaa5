"""The inputs panel's values <-> a `PlanInput`, without Textual.

The panel holds strings (what the user typed) and choices; this module turns them into a
validated `PlanInput`, or into a reason per field that the panel shows next to that field.
Anything the panel does not show (DeepSpeed knobs, link and GPU details, headroom) comes from
the `base` input, so a loaded profile keeps every value it carried.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from pydantic import ValidationError

from zlayout.messages import exception_text, parse_count_with_unit, parse_gib_amount, parse_whole_number
from zlayout.spec import BOUNDS, GiB, HardwareSpec, ModelSpec, PlanInput, TrainingSpec, training_limits

# Architecture fields the panel shows, in order; the rest of ModelSpec comes from the base model.
MODEL_INT_FIELDS = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab")
MODEL_CHOICE_FIELDS = ("mlp", "norm")
MODEL_BOOL_FIELDS = ("bias", "tie_embeddings")
HARDWARE_INT_FIELDS = ("gpus_per_node", "nodes")
HARDWARE_GIB_FIELDS = {"host_ram_gib": "host_ram_bytes", "nvme_gib": "nvme_bytes"}
TRAINING_INT_FIELDS = ("seq", "micro_batch", "grad_accum")
TRAINING_CHOICE_FIELDS = ("precision", "checkpointing", "impl", "allocator", "loop")
OPTIONAL_INT_FIELDS = ("kv_heads", "ffn")  # empty means "the default" (heads, 4*hidden)
COUNT_FIELDS = ("seq", "hidden", "ffn", "vocab")  # token counts and widths: 4k is 4,096, as cli.UNIT_FLAGS
NO_LINK = "none"

FIELD_EXAMPLES = {
    "layers": "32", "hidden": "4096", "heads": "32", "kv_heads": "8 (or empty)",
    "ffn": "14336 (or empty)", "vocab": "128256", "gpus_per_node": "8", "nodes": "1",
    "seq": "4096", "micro_batch": "1", "grad_accum": "1", "host_ram_gib": "2048", "nvme_gib": "0",
    "host_cores": "112 (or empty: the GPU preset's)",
}


class FormInvalid(Exception):
    """Some fields do not make a valid plan input: `errors` maps field id -> reason."""

    def __init__(self, errors: Mapping[str, str]):
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))
        self.errors = dict(errors)


@dataclass(frozen=True, slots=True)
class Presets:
    """Preset names the selects offer, and how to load one (the catalog, or a fake in tests)."""

    models: tuple[str, ...]
    gpus: tuple[str, ...]
    links: tuple[str, ...]
    load_gpu: Callable[[str], Any]
    load_link: Callable[[str], Any]
    load_model: Callable[[str], ModelSpec] = lambda name: _no_catalog(name)
    model_of_size: Callable[[str], ModelSpec] = lambda text: _no_catalog(text)  # "70B" -> a model
    default_intra_link: Callable[[str], str] | None = None  # GPU name -> its link preset


def _no_catalog(name: str) -> Any:
    raise LookupError(f"no preset catalog: cannot look up {name!r}")


def form_values(inp: PlanInput) -> dict[str, Any]:
    """The panel's values that show `inp` (the inverse of `plan_input_from_form`)."""
    m, hw, t = inp.model, inp.hardware, inp.training
    return {
        "layers": str(m.layers), "hidden": str(m.hidden), "heads": str(m.heads),
        "kv_heads": "" if m.kv_heads is None else str(m.kv_heads),
        "ffn": "" if m.ffn is None else str(m.ffn),
        "vocab": str(m.vocab), "mlp": m.mlp, "norm": m.norm, "bias": m.bias,
        "tie_embeddings": m.tie_embeddings,
        "gpu": hw.gpu.name, "gpus_per_node": str(hw.gpus_per_node), "nodes": str(hw.nodes),
        "intra_link": hw.intra_link.name,
        "inter_link": hw.inter_link.name if hw.inter_link is not None else NO_LINK,
        "host_ram_gib": _format_gib(hw.host_ram_bytes), "nvme_gib": _format_gib(hw.nvme_bytes),
        "seq": str(t.seq), "micro_batch": str(t.micro_batch), "grad_accum": str(t.grad_accum),
        "precision": t.precision, "checkpointing": t.checkpointing,
        "impl": t.impl, "allocator": t.allocator, "loop": t.loop,
        "host_cores": "" if hw.host_cores is None else str(hw.host_cores),
    }


def _format_gib(n_bytes: int) -> str:
    gib = n_bytes / GiB
    return str(int(gib)) if gib == int(gib) else f"{gib:g}"


def model_from_form(values: Mapping[str, Any], model_base: ModelSpec) -> ModelSpec:
    """The model the architecture fields describe, on top of `model_base` (keeps its name
    when nothing differs, so a preset stays a preset)."""
    errors: dict[str, str] = {}
    arch: dict[str, Any] = {}
    for field in MODEL_INT_FIELDS:
        _parse_int(values, field, arch, errors, optional=field in OPTIONAL_INT_FIELDS)
    for field in MODEL_CHOICE_FIELDS + MODEL_BOOL_FIELDS:
        arch[field] = values[field]
    data = model_base.model_dump()
    changed = any(data.get(k) != v for k, v in arch.items())
    data.update(arch)  # a field that did not parse keeps the base's value: the others are checked too
    if changed:  # a custom model, of no preset's family (break-even scales it in depth)
        data.update(name="custom", family=None)
    try:
        model = ModelSpec(**data)
    except ValidationError as exc:
        # every bad field is named, not only the first kind found: a Vocab typed as 0 hid
        # Hidden 4097's "must be divisible by Heads" ("1 field invalid" for two)
        raise FormInvalid({**_errors_by_field(exc, _model_field_of), **errors}) from None
    card = model_base.card
    if card is not None and card.depth_refusal(model.layers) is not None:
        # within the layer count's bounds, a depth this card cannot plan: the hand model would plan
        # another model, so the field says why rather than show its figures (`plan --layers` refuses
        # with the card's longer line)
        errors.setdefault("layers", f"{model_base.hf_model_type or 'this model'}'s blocks change with its depth: "
                                    f"learn a copy of its config.json at {model.layers} layers to plan that depth")
    if errors:
        raise FormInvalid(errors)
    return model


def plan_input_from_form(values: Mapping[str, Any], model_base: ModelSpec, base: PlanInput,
                         presets: Presets) -> PlanInput:
    """Build and validate the plan input; raises FormInvalid naming every bad field (a field
    that does not parse is checked no further, and the others are checked with the base's
    value in its place, so two bad fields are two marks)."""
    errors: dict[str, str] = {}
    model = None
    try:
        model = model_from_form(values, model_base)
    except FormInvalid as exc:
        errors.update(exc.errors)

    hw_kwargs: dict[str, Any] = {}
    for field in HARDWARE_INT_FIELDS:
        _parse_int(values, field, hw_kwargs, errors)
    _parse_int(values, "host_cores", hw_kwargs, errors, optional=True)  # empty: the preset's
    for field, spec_field in HARDWARE_GIB_FIELDS.items():
        gib = _parse_float(values, field, errors)
        if gib is not None:
            hw_kwargs[spec_field] = int(gib * GiB)
    for field, base_spec, load in (("gpu", base.hardware.gpu, presets.load_gpu),
                                   ("intra_link", base.hardware.intra_link, presets.load_link)):
        resolved = _resolve(values[field], base_spec, load, field, errors)
        if resolved is not None:
            hw_kwargs[field] = resolved
    inter = values["inter_link"]
    if inter in (None, NO_LINK):
        hw_kwargs["inter_link"] = None
    else:
        resolved = _resolve(inter, base.hardware.inter_link, presets.load_link, "inter_link", errors)
        if resolved is not None:
            hw_kwargs["inter_link"] = resolved

    train_kwargs: dict[str, Any] = {}
    for field in TRAINING_INT_FIELDS:
        _parse_int(values, field, train_kwargs, errors)
    for field in TRAINING_CHOICE_FIELDS:
        train_kwargs[field] = values[field]

    hardware = training = None
    try:
        hardware = HardwareSpec(**{**base.hardware.model_dump(exclude={"gpu", "intra_link", "inter_link"}),
                                   "gpu": base.hardware.gpu, "intra_link": base.hardware.intra_link,
                                   "inter_link": base.hardware.inter_link, **hw_kwargs})
    except ValidationError as exc:
        for field, message in _errors_by_field(exc, _hardware_field_of).items():
            errors.setdefault(field, message)
    try:
        training = TrainingSpec(**{**base.training.model_dump(), **train_kwargs})
    except ValidationError as exc:
        for field, message in _errors_by_field(exc, lambda loc: loc).items():
            errors.setdefault(field, message)
    if model is not None and training is not None:
        # PlanInput's own check (GPT-2's learned positions, a model card's limits), which model_copy
        # does not run; the flag that mends it is the CLI's
        for field, what, _hint in training_limits(model, training):
            errors.setdefault(field, what)
    if errors or model is None or hardware is None or training is None:
        raise FormInvalid(errors or {"layers": "invalid model"})
    return base.model_copy(update={"model": model, "hardware": hardware, "training": training})


def _out_of_range(field: str, shown: str) -> str:
    """A number below a field's range, in the words the range check uses (host RAM -100
    said "0 or more" where 0 said "from 1 GiB")."""
    bound = BOUNDS.get(HARDWARE_GIB_FIELDS.get(field, field))
    return f"must be {bound.describe()} (got {shown})" if bound is not None else "must be greater than 0"


def _parse_int(values: Mapping[str, Any], field: str, out: dict[str, Any],
               errors: dict[str, str], optional: bool = False) -> None:
    text = str(values[field]).strip().replace("_", "").replace(",", "")
    if optional and not text:
        out[field] = None
        return
    # as the command line reads it ('١٢' is not one; a token count or width also with k: 32k)
    number = parse_count_with_unit(text) if field in COUNT_FIELDS else parse_whole_number(text)
    if number is None:
        with_unit = " or 4k" if field in COUNT_FIELDS else ""  # k = 1,024, as --seq 4k
        errors[field] = f"type a whole number, e.g. {FIELD_EXAMPLES.get(field, '8')}{with_unit}"
        return
    if number <= 0:
        errors[field] = _out_of_range(field, f"{number:,}")
        return
    out[field] = number


def _parse_float(values: Mapping[str, Any], field: str, errors: dict[str, str]) -> float | None:
    # finite, as the command line's --host-ram-gib reads it ('inf' or '1e400' GiB crashed the plan:
    # no integer of bytes), also with a unit: 2T is 2,048 GiB, 3.84TB decimal
    number = parse_gib_amount(values[field])
    if number is None:
        errors[field] = f"type a number of GiB, e.g. {FIELD_EXAMPLES.get(field, '0')} or 2T"
        return None
    if number < 0:
        errors[field] = _out_of_range(field, f"{number:g} GiB")
        return None
    return number


def _resolve(name: Any, base_spec: Any, load: Callable[[str], Any], field: str,
             errors: dict[str, str]) -> Any:
    if not name:
        errors[field] = "pick a preset"
        return None
    if base_spec is not None and base_spec.name == name:
        return base_spec
    try:
        return load(str(name))
    except Exception as exc:  # the catalog says what is wrong (unknown name, bad file)
        errors[field] = exception_text(exc)
        return None


def _model_field_of(loc: str) -> str:
    return loc


def _hardware_field_of(loc: str) -> str:
    return {"host_ram_bytes": "host_ram_gib", "nvme_bytes": "nvme_gib"}.get(loc, loc)


def _errors_by_field(exc: ValidationError, field_of: Callable[[str], str]) -> dict[str, str]:
    """pydantic's errors keyed by the panel field they belong to. A model-level error
    (empty loc) goes to the field its message names."""
    errors: dict[str, str] = {}
    for err in exc.errors():
        message = err["msg"].removeprefix("Value error, ")
        loc = str(err["loc"][0]) if err["loc"] else _field_named_in(message)
        errors.setdefault(field_of(loc), _in_panel_words(message))
    return errors


_TRY_FLAG = re.compile(r"[;,]? try --([a-z-]+) (\S+)$")


def _in_panel_words(message: str) -> str:
    """The spec's "…; try --hidden 4096" (a command-line flag) as the panel says it: "…;
    type 4096" under the field it names (see _field_named_in)."""
    from zlayout.tui.fields import field_label

    message = _TRY_FLAG.sub(lambda m: f"; type {m.group(2)}", message)
    # "hidden (4097) must be divisible by heads (32)": the fields by their labels
    return _NAMED_VALUE.sub(lambda m: field_label(m.group(1).replace("-", "_")), message)


_NAMED_VALUE = re.compile(r"\b(layers|hidden|heads|kv-heads|kv_heads|ffn|vocab)(?= \()")


def _field_named_in(message: str) -> str:
    """The field a model-level message is about: the one its "try --FLAG N" says to change
    (Hidden 4097 was marked under Heads), else the first field it names."""
    suggested = _TRY_FLAG.search(message)
    if suggested is not None:
        field = suggested.group(1).replace("-", "_")
        if field in MODEL_INT_FIELDS or field in HARDWARE_INT_FIELDS:
            return field
    lowered = message.lower()
    for needle, field in (("kv-heads", "kv_heads"), ("heads", "heads"), ("inter-node", "inter_link"),
                          ("nodes", "nodes")):
        if needle in lowered:
            return field
    return "layers"
