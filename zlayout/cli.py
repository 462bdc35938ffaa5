"""The command line: `zlayout` (the app) and `zlayout plan|breakeven|export|show|check|diff|verify|calibrate|serve`.

Each subcommand lives in `zlayout/commands/<name>.py` and exposes `register(subparsers)`;
this module owns only the shared plan flags and turning them into a `PlanInput`. Bad input
is a one-line message on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import gc

# The start imports pydantic and builds zlayout's models: some 30 000 objects that live as long
# as the process, and next to no garbage. The collector's 60-odd passes over them while they are
# made cost a plan about 5 ms; it runs again once they are made (and main freezes them).
_collecting = gc.isenabled()
gc.disable()

import argparse  # noqa: E402
import errno  # noqa: E402
import importlib  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import shlex  # noqa: E402
import sys  # noqa: E402
from typing import NoReturn, Sequence  # noqa: E402

from pydantic import ValidationError  # noqa: E402

import zlayout._pydantic_plugins  # noqa: F401,E402  (before zlayout.spec builds its models: see there)
from zlayout.messages import (GIB_PER_UNIT, GIB_UNIT_RE, exception_text, parse_count_with_unit,  # noqa: E402
                              parse_whole_number, printable, quoted)
from zlayout.spec import (BOUNDS, GiB, HardwareSpec, Layout, ModelSpec, PlanInput, TrainingSpec,  # noqa: E402
                          ZeroKnobs)

if _collecting:
    gc.enable()

SUBCOMMANDS = ("plan", "breakeven", "presets", "export", "show", "check", "diff", "verify", "calibrate",
               "serve", "app", "learn")

OFFLOAD_CHOICES = ("none", "cpu", "nvme")

# spec field -> the flag that sets it, so messages name what the user typed
FLAG_OF_FIELD = {
    "kv_heads": "--kv-heads", "micro_batch": "--micro-batch", "grad_accum": "--grad-accum",
    "gpus_per_node": "--gpus-per-node", "host_ram_bytes": "--host-ram-gib",
    "nvme_bytes": "--nvme-gib", "nvme_gbps": "--nvme-gbps", "headroom_fraction": "--headroom",
    "reduce_bucket_size": "--reduce-bucket-size", "allgather_bucket_size": "--allgather-bucket-size",
    "stage3_prefetch_bucket_size": "--prefetch-bucket-size",
    "stage3_max_live_parameters": "--max-live-parameters",
    "stage3_param_persistence_threshold": "--persistence-threshold",
    "offload_optimizer": "--offload-optimizer", "offload_param": "--offload-param",
}
# the architecture flags a model size (--params) replaces
ARCHITECTURE_FLAGS = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "mlp", "norm",
                      "no_bias", "tie_embeddings", "qkv_bias", "experts", "top_k", "expert_ffn")


class UsageError(Exception):
    """Bad input from the user: printed as one line (plus an optional hint line), exit code 2."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


def one_line(text: str) -> str:
    """`text` with every line break and every other character a terminal acts on (escape
    sequences, bells, tabs) escaped: a message is one line that prints as written whatever the
    user typed or a file held (a path, a folder's name, a preset's name)."""
    return printable(text.strip())


def _flag_hints(extras: Sequence[str], flags: Sequence[str]) -> str:
    """' (did you mean --seq?)' for one unknown flag; for several, each named, those with the
    same answer together: ' (--num-gpus: did you mean --gpus-per-node?; --mbs: did you mean
    --micro-batch?)'."""
    # zlayout.suggest (and difflib) is imported where a suggestion is made, for bad input only
    from zlayout.suggest import did_you_mean_flag

    unknown = [arg for arg in extras if arg.startswith("-")] or list(extras[:1])
    grouped: dict[str, list[str]] = {}
    for arg in unknown:
        hint = did_you_mean_flag(arg, flags).strip()
        if hint:
            grouped.setdefault(hint, []).append(arg.split("=", 1)[0])
    if len(unknown) == 1:
        return f" {next(iter(grouped))}" if grouped else ""
    return (" (" + "; ".join(f"{', '.join(args)}: {hint[1:-1]}" for hint, args in grouped.items()) + ")"
            if grouped else "")


class ZlayoutParser(argparse.ArgumentParser):
    """argparse with zlayout's error format: one line and a hint, never the usage block.

    add_subparsers makes every subcommand's parser this class too, so argparse's own errors
    (bad choice, missing --out, unknown flag) read like zlayout's.
    """

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        try:
            parsed, extras = super().parse_known_args(args, namespace)
        except UsageError as exc:
            # `zlayout show --presets`: the missing PROFILE was reported before the unknown
            # flag, whose meaning is the better answer
            if self._subparsers is not None and str(exc).startswith("the following arguments are required"):
                self._unknown_flag_first(list(sys.argv[1:] if args is None else args))
            raise
        return self._check_extras(parsed, extras)

    def _subcommand(self, command: object) -> argparse.ArgumentParser | None:
        return next((a.choices.get(command) for a in self._actions
                     if isinstance(a, argparse._SubParsersAction)), None)

    def _unknown_flag_first(self, args: list[str]) -> None:
        """Raise the unknown-flag error for the first flag the subcommand lacks that has a
        suggestion by meaning; return when there is none."""
        sub = self._subcommand(args[0]) if args else None
        if sub is None:
            return
        from zlayout.suggest import did_you_mean_flag

        flags = [o for action in sub._actions for o in action.option_strings]
        for arg in args[1:]:
            if arg == "--":
                return
            if arg.startswith("--") and arg.split("=", 1)[0] not in flags:
                hint = did_you_mean_flag(arg, flags)
                if hint:
                    raise UsageError(f"unrecognized arguments: {arg}{hint}",
                                     hint=f"`{sub.prog} --help` lists every flag")

    def _check_extras(self, parsed, extras):
        if extras and self._subparsers is not None:
            # Unknown flags surface at the top parser: suggest from the subcommand's own flags.
            sub = self._subcommand(getattr(parsed, "command", None))
            if sub is not None:
                flags = [o for action in sub._actions for o in action.option_strings]
                raise UsageError(f"unrecognized arguments: {' '.join(extras)}{_flag_hints(extras, flags)}",
                                 hint=f"`{sub.prog} --help` lists every flag")
        return parsed, extras

    def error(self, message: str) -> NoReturn:
        raise UsageError(self._rewrite(message), hint=f"`{self.prog} --help` lists every flag")

    def _rewrite(self, message: str) -> str:
        choice = re.match(r"argument (\S+?): invalid choice: '?(.*?)'? \(choose from (.*)\)$", message, re.S)
        if choice:
            from zlayout.suggest import did_you_mean, did_you_mean_choice

            flag, value, options = choice.groups()
            names = [o.strip(" '") for o in options.split(",")]
            if flag == "COMMAND":
                return f"unknown command {value!r}{did_you_mean(value, names)}; commands: {', '.join(names)}"
            return (f"{flag}: {value!r} is not one of {', '.join(names)}"
                    f"{did_you_mean_choice(value, names)}")
        typed = re.match(r"argument (\S+?): invalid (int|float|\w+) value: (.*)$", message, re.S)
        if typed:
            flag, kind, value = typed.groups()
            word = {"int": "a whole number", "float": "a number"}.get(kind, f"a valid {kind}")
            example = {"int": "2", "float": "1.5"}.get(kind, "")
            return f"{flag}: {value} is not {word}" + (f" (e.g. {flag} {example})" if example else "")
        unknown = re.match(r"unrecognized arguments: (.*)$", message, re.S)
        if unknown:
            flags = [o for action in self._actions for o in action.option_strings]
            return f"unrecognized arguments: {unknown.group(1)}{_flag_hints(unknown.group(1).split(), flags)}"
        return message.removeprefix("argument ")


# flags whose value is a count of elements (DeepSpeed's knobs): 5e8 is a common way to type them
ELEMENT_COUNT_FLAGS = ("--reduce-bucket-size", "--allgather-bucket-size", "--prefetch-bucket-size",
                       "--max-live-parameters", "--persistence-threshold")
# fraction-valued flags (0.05 is 5%): '5%' reads as 0.05, a bare 5 gets "did you mean 0.05 (5%)?"
FRACTION_FLAGS = ("--headroom",)


def _expected(bound_field: str | None, word: str) -> str:
    """' (expected a whole number from 1 to 1,000)': what to type, with the range when it has one."""
    bound = BOUNDS.get(bound_field) if bound_field else None
    return f" (expected {word} {bound.describe()})" if bound is not None else f" (expected {word})"


def finite_float(text: str, bound_field: str | None = None) -> float:
    """A float flag's value: a finite number ('inf' and 'nan' would poison every figure)."""
    try:
        value = float(text.strip().replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{quoted(text)} is not a number"
                                         f"{_expected(bound_field, 'a number')}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{quoted(text)} is not a finite number"
                                         f"{_expected(bound_field, 'a number')}")
    return value


def whole_number(text: str, bound_field: str | None = None) -> int:
    """An int flag's value; '1_000' and '1,000' read as 1000."""
    number = parse_whole_number(text)
    if number is None:
        raise argparse.ArgumentTypeError(f"{quoted(text)} is not a whole number"
                                         f"{_expected(bound_field, 'a whole number')}")
    return number


# flags counting tokens or widths: '4k' is 4,096 (messages.parse_count_with_unit)
DEFAULT_SEQ = 2048  # tokens a sequence, where --seq is not given
UNIT_FLAGS = ("--seq", "--hidden", "--ffn", "--vocab", "--expert-ffn")


def count_with_unit(text: str, bound_field: str | None = None) -> int:
    """A token or width count: a whole number, or with k or M (binary: --seq 4k is 4,096,
    --seq 32K is 32,768, --ffn 14k is 14,336, --seq 1M is 1,048,576)."""
    number = parse_count_with_unit(text)
    if number is None:
        raise argparse.ArgumentTypeError(f"{quoted(text)} is not a whole number"
                                         f"{_expected(bound_field, 'a whole number')[:-1]}, "
                                         "or with k = 1,024, e.g. 4k)")
    return number


# flags in GiB that also take a unit: '2T' / '2TiB' is 2,048 GiB, '3.84TB' (decimal, as drives
# are sold) is 3,576.3 GiB
GIB_FLAGS = ("--host-ram-gib", "--nvme-gib")


def gib_amount(text: str, bound_field: str | None = None) -> float:
    """A size in GiB: a number (512), or with a unit: 512G or 512GiB, 2T or 2TiB (binary, the
    flag's unit), 3.84TB or 960GB (decimal bytes, converted)."""
    match = GIB_UNIT_RE.fullmatch(text.strip())
    if match is None:
        return finite_float(text, bound_field)
    try:
        return finite_float(match.group(1), bound_field) * GIB_PER_UNIT[match.group(2).lower()]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{quoted(text)} is not a size"
                                         f"{_expected(bound_field, 'a size')[:-1]}, e.g. 512, 2T or 3.84TB)") from None


def fraction(text: str, bound_field: str | None = None) -> float:
    """A fraction flag's value (--headroom 0.05); a percentage written with its sign, '5%',
    reads as 0.05. A bare 5 is left to the spec's range, which asks "did you mean 0.05 (5%)?"."""
    stripped = text.strip()
    if stripped.endswith("%"):
        number = stripped[:-1].strip()
        try:
            return finite_float(number, bound_field) / 100
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"{quoted(text)} is not a percentage"
                                             f"{_expected(bound_field, 'a fraction')}, e.g. 0.05 or 5%") from None
    return finite_float(text, bound_field)


def element_count(text: str, bound_field: str | None = None) -> int:
    """A count of elements (DeepSpeed's bucket sizes): a whole number, also typed as 5e8.

    Read as a float and then truncated, 0.5 became 0 and the message said "(got 0)"; 1e40
    reached pydantic's integer parser and came back as its own wording."""
    value = finite_float(text, bound_field)
    bound = BOUNDS.get(bound_field) if bound_field else None
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"{quoted(text)} is not a whole number of elements"
                                         f"{_expected(bound_field, 'a whole number')}")
    if bound is not None and not bound.low <= value <= bound.high:
        raise argparse.ArgumentTypeError(f"must be {bound.describe()} (got {text.strip()})")
    return int(value)


def _choice(choices: Sequence[str]):
    """A choice flag's type: case-insensitive, and a refusal that quotes the value as typed
    (argparse's own check sees it lower-cased) with a suggestion by meaning."""
    def choice(text: str) -> str:
        if text.lower() in choices:
            return text.lower()
        from zlayout.suggest import did_you_mean_choice

        raise argparse.ArgumentTypeError(f"{quoted(text)} is not one of {', '.join(choices)}"
                                         f"{did_you_mean_choice(text, choices)}")

    return choice


def _bound_field(action: argparse.Action) -> str | None:
    """The BOUNDS key of a flag's value (its spec field), or None."""
    fields = {flag: field for field, flag in FLAG_OF_FIELD.items()}
    for option in action.option_strings:
        if option in fields and fields[option] in BOUNDS:
            return fields[option]
    return action.dest if action.dest in BOUNDS and action.option_strings else None


def _typed(parse, action: argparse.Action):
    field = _bound_field(action)
    choices = tuple(action.choices) if action.choices else ()

    def typed(text: str):
        try:
            return parse(text, field)
        except argparse.ArgumentTypeError as exc:
            if choices:  # --stage: the choices are what to type (zero3 and z3 mean 3)
                from zlayout.suggest import did_you_mean_choice

                raise argparse.ArgumentTypeError(
                    f"{quoted(text)} is not one of {', '.join(map(str, choices))}"
                    f"{did_you_mean_choice(text, choices)}") from None
            raise exc

    typed.__name__ = parse.__name__  # argparse names the type in its own messages
    return typed


def _polish(parser: argparse.ArgumentParser) -> None:
    """Every parser's choices case-insensitive, ints and floats checked the same way, each
    message quoting what was typed and saying what is expected. No flag is taken from a
    prefix (argparse's allow_abbrev): `--gpus 16` read as `--gpus-per-node 16` planned 16
    GPUs per node for a user who meant 16 in all."""
    parser.allow_abbrev = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _polish(sub)
        elif action.type is None and action.choices and all(isinstance(c, str) for c in action.choices):
            action.type = _choice(tuple(action.choices))
        elif action.type is float and any(o in ELEMENT_COUNT_FLAGS for o in action.option_strings):
            action.type = _typed(element_count, action)
        elif action.type is float and any(o in GIB_FLAGS for o in action.option_strings):
            action.type = _typed(gib_amount, action)
        elif action.type is float and any(o in FRACTION_FLAGS for o in action.option_strings):
            action.type = _typed(fraction, action)
        elif action.type is float:
            action.type = _typed(finite_float, action)
        elif action.type is int and any(o in UNIT_FLAGS for o in action.option_strings):
            action.type = _typed(count_with_unit, action)
        elif action.type is int:
            action.type = _typed(whole_number, action)


def _knob_default(field: str) -> str:
    """DeepSpeed's default of a sizing knob as its docs write it: 5e8."""
    value = ZeroKnobs.model_fields[field].default
    return f"{value:.0e}".replace("e+0", "e").replace("e+", "e")


def add_plan_arguments(parser: argparse.ArgumentParser, with_layout: bool = True) -> None:
    """The flags every planning command shares (README.md, "The command line")."""
    model = parser.add_argument_group("model (an architecture, --preset NAME, --params SIZE or --hf-config PATH)")
    model.add_argument("--preset", help="model preset name, e.g. llama3-8b (`zlayout presets models` lists them)")
    model.add_argument("--hf-config", metavar="PATH",
                       help="a Hugging Face model's config.json (or its directory); read without transformers")
    model.add_argument("--params", help="model size with a unit (350M, 70B, 1.5T or 13e9), "
                                         "mapped onto --family's shape")
    model.add_argument("--family", default=None, help="model family for --params (default llama3; "
                                                        "`zlayout presets models` shows each family)")
    model.add_argument("--layers", type=int, help=f"transformer blocks ({BOUNDS['layers'].describe()})")
    model.add_argument("--hidden", type=int, help=f"hidden size ({BOUNDS['hidden'].describe()}; 4k = 4096)")
    model.add_argument("--heads", type=int, help="attention heads (divide --hidden)")
    model.add_argument("--kv-heads", type=int, help="key/value heads for GQA (divide --heads)")
    model.add_argument("--ffn", type=int, help="MLP inner size (default 4*hidden; 14k = 14336)")
    model.add_argument("--vocab", type=int, help=f"vocabulary ({BOUNDS['vocab'].describe()}; "
                                                 "k = 1024: 32k = 32768)")
    model.add_argument("--mlp", choices=("gelu", "swiglu"),
                       help="MLP kind: gelu (two matrices, GPT) or swiglu (gated, three: Llama); default gelu")
    model.add_argument("--norm", choices=("layernorm", "rmsnorm"),
                       help="norm kind: layernorm (weight and bias) or rmsnorm (weight); default layernorm")
    model.add_argument("--no-bias", action="store_true", help="no biases in linear layers")
    model.add_argument("--tie-embeddings", action="store_true",
                       help="the output head shares the input embedding's weights")
    model.add_argument("--qkv-bias", action="store_true", help="biases on q/k/v only (Qwen2)")
    model.add_argument("--experts", type=int, help="mixture of experts: routed experts per block")
    model.add_argument("--top-k", type=int, help="mixture of experts: experts each token goes through")
    model.add_argument("--expert-ffn", type=int, help="mixture of experts: one expert's MLP size (default --ffn)")

    train = parser.add_argument_group("training")
    train.add_argument("--seq", type=int, default=None,
                       help=f"sequence length in tokens (default 2048, or a model's learned positions where "
                            f"fewer: GPT-2's 1024; {BOUNDS['seq'].describe()}; k = 1024: 4k = 4096, 32K = 32768)")
    train.add_argument("--micro-batch", type=int, default=1,
                       help=f"sequences per GPU per forward pass (default 1; {BOUNDS['micro_batch'].describe()})")
    train.add_argument("--grad-accum", type=int, default=1,
                       help="micro-batches accumulated per optimizer step (default 1; "
                            f"{BOUNDS['grad_accum'].describe()})")
    train.add_argument("--precision", choices=("bf16", "fp16", "fp32"), default="bf16",
                       help="training precision: bf16, fp16 or fp32 (default bf16)")
    train.add_argument("--checkpointing", choices=("none", "full"), default="none",
                       help="activation checkpointing: full recomputes each block in the backward "
                            "(default none)")
    train.add_argument("--impl", choices=("zlayout", "hf"), default=None,
                       help="training code: zlayout's GPT or the Hugging Face model class "
                            "(transformers, sdpa; default hf with --hf-config, else zlayout)")
    train.add_argument("--init", choices=("auto", "fp32-cpu", "bf16-gpu", "zero-init", "meta"), default="auto",
                       help="how the training script builds the model: auto (fp32 on the host; "
                            "zero.Init for ZeRO-3), fp32-cpu, bf16-gpu, zero-init, meta")
    train.add_argument("--allocator", choices=("default", "expandable"), default="default",
                       help="PyTorch's CUDA allocator: default segments or expandable_segments:True")
    train.add_argument("--loop", choices=("deepspeed", "trainer"), default="deepspeed",
                       help="training loop: deepspeed (outputs = engine(...); engine.backward(outputs.loss): "
                            "the bf16 logits live until the next forward) or trainer (HF Trainer: dropped "
                            "once the loss is taken)")

    hw = parser.add_argument_group("hardware")
    hw.add_argument("--gpu", default="h200",
                    help="GPU preset: h100, h200, a100-40gb, a100-80gb, ... (default h200; "
                         "`zlayout presets gpus` lists them with their memory)")
    hw.add_argument("--gpus-per-node", type=int, default=8,
                    help=f"GPUs per node, as torchrun's --nproc_per_node (default 8; "
                         f"{BOUNDS['gpus_per_node'].describe()})")
    hw.add_argument("--nodes", type=int, default=1,
                    help=f"nodes (default 1; {BOUNDS['nodes'].describe()}); more than one needs --inter-link")
    hw.add_argument("--intra-link", default=None,
                    help="intra-node link preset (default: the GPU's; `zlayout presets links`)")
    hw.add_argument("--inter-link", default="ib-ndr",
                    help="inter-node link preset (default ib-ndr; `zlayout presets links`)")
    hw.add_argument("--host-ram-gib", type=float, default=None,
                    help="host RAM per node, GiB (default 2048; 2T = 2048, 1.5TB = 1397 GiB)")
    hw.add_argument("--nvme-gib", type=float, default=0.0,
                    help="NVMe capacity per node, GiB (default 0; 3.84TB = 3576 GiB)")
    hw.add_argument("--nvme-gbps", type=float, default=6.0,
                    help="NVMe read/write bandwidth per node, GB/s (default 6; from 0.1 to 1,000)")
    hw.add_argument("--host-cores", type=int, default=None,
                    help="CPU cores per node shared by its ranks (default: the GPU preset's per GPU x GPUs)")
    hw.add_argument("--calibration", default=None, metavar="FILE",
                    help="step-time calibration from `zlayout calibrate` (default: the shipped model)")

    ds = parser.add_argument_group("DeepSpeed knobs (default: DeepSpeed 0.19.8's)")
    ds.add_argument("--reduce-bucket-size", type=float,
                    help=f"gradient reduce bucket, elements (reduce_bucket_size; default {_knob_default('reduce_bucket_size')})")
    ds.add_argument("--allgather-bucket-size", type=float,
                    help=f"stage 1-2 parameter all-gather bucket, elements (allgather_bucket_size; default {_knob_default('allgather_bucket_size')})")
    ds.add_argument("--prefetch-bucket-size", type=float,
                    help=f"stage 3 prefetch, elements (stage3_prefetch_bucket_size; default {_knob_default('stage3_prefetch_bucket_size')})")
    ds.add_argument("--max-live-parameters", type=float,
                    help="stage 3 gathered parameters kept at once, elements "
                         f"(stage3_max_live_parameters; default {_knob_default('stage3_max_live_parameters')})")
    ds.add_argument("--persistence-threshold", type=float,
                    help="stage 3 parameters this small stay gathered, elements "
                         f"(stage3_param_persistence_threshold; default {_knob_default('stage3_param_persistence_threshold')})")
    ds.add_argument("--no-overlap-comm", action="store_true",
                    help="overlap_comm false: communication does not overlap the backward "
                         "(DeepSpeed's default true)")
    ds.add_argument("--headroom", type=float, default=0.05,
                    help="fraction of the card the step's needs (allocated peak, fragmentation, CUDA "
                         "context) must leave when judging 'fits' (default 0.05, i.e. 5%%; '5%%' reads as "
                         "0.05); the caching allocator may still fill it with cache")

    if with_layout:
        lay = parser.add_argument_group("layout (without --stage: every layout)")
        lay.add_argument("--stage", type=int, choices=(0, 1, 2, 3),
                         help="ZeRO stage: 0 (plain data parallel), 1 (optimizer states sharded), "
                              "2 (+ gradients), 3 (+ parameters)")
        lay.add_argument("--offload-optimizer", choices=OFFLOAD_CHOICES, default="none",
                         help="optimizer states and step on the host (cpu, stage 1-3) or NVMe "
                              "(nvme, stage 3); default none")
        lay.add_argument("--offload-param", choices=OFFLOAD_CHOICES, default="none",
                         help="parameters on the host (cpu) or NVMe (nvme); stage 3 only; default none")
    parser.add_argument("--presets-dir", action="append", default=[],
                        help="extra directory of preset TOML files (repeatable)")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")


def _given_architecture_flags(args: argparse.Namespace) -> list[str]:
    given = []
    for name in ARCHITECTURE_FLAGS:
        value = getattr(args, name, None)
        if value is not None and value is not False:
            given.append("--" + name.replace("_", "-"))
    return given


def _model_from_args(args: argparse.Namespace):
    from zlayout import catalog, hfconfig

    dirs = tuple(args.presets_dir)
    sources = [flag for flag, value in (("--preset", args.preset), ("--params", args.params),
                                         ("--hf-config", args.hf_config)) if value is not None]
    if len(sources) > 1:
        raise UsageError(f"give one of {', '.join(sources)}, not several")
    if args.params is not None:
        # Refused rather than ignored: the size alone picks every one of these.
        extra = _given_architecture_flags(args)
        if extra:
            raise UsageError(f"{', '.join(extra)} cannot be combined with --params: the size picks "
                             "the whole shape from --family; drop them, or describe the model with "
                             "--layers --hidden --heads --vocab and no --params")
    elif args.family is not None:
        raise UsageError("--family applies only to --params (a size mapped onto the family's "
                         "shape): add --params 13B, or drop --family")
    arch_flags = {
        "layers": args.layers, "hidden": args.hidden, "heads": args.heads,
        "kv_heads": args.kv_heads, "ffn": args.ffn, "vocab": args.vocab,
        "mlp": args.mlp, "norm": args.norm,
        "experts": args.experts, "top_k": args.top_k, "expert_ffn": args.expert_ffn,
    }
    given = {k: v for k, v in arch_flags.items() if v is not None}
    if args.no_bias:
        given["bias"] = False
    if args.tie_embeddings:
        given["tie_embeddings"] = True
    if args.qkv_bias:
        given["qkv_bias"] = True
    if args.preset or args.hf_config:
        base = hfconfig.load(args.hf_config) if args.hf_config else catalog.load_model(args.preset, dirs)
        # Re-validate: architecture flags on top of a preset must still form a valid model.
        # One that changes the preset's architecture is a custom model, of no preset's family
        # (break-even then scales its own shape in depth), as in the app.
        data = base.model_dump()
        changed = [key for key, value in given.items() if data.get(key) != value]
        if changed:
            # the same model at another depth keeps its name, said so; any other change makes a
            # model of its own
            name = f"{base.name} at {given['layers']} layers" if changed == ["layers"] else "custom"
            data.update(given, name=name, family=None)
            if "layers" in given and data.get("dense_layers"):
                # a MoE model cut into its first dense blocks (DeepSeek-V3's 3) keeps those it has
                data["dense_layers"] = tuple(i for i in data["dense_layers"] if i < given["layers"])
            custom = ModelSpec.model_validate(data)  # the layer count's own bounds first
            if changed == ["layers"] and base.card is not None \
                    and (why := base.card.depth_refusal(custom.layers)) is not None:
                # the hand model would plan another model: no figure rather than a wrong one
                raise UsageError(f"--layers {custom.layers}: {why}")
            if base.card is not None and custom.card is None:
                flags = ", ".join(f"--{key.replace('_', '-')}" for key in changed)
                _note(args, f"the model card {base.card.source} describes {base.name}'s own shape; with "
                            f"{flags} its activations come from zlayout's hand model of "
                            f"{base.hf_model_type or 'this architecture'} (--layers alone keeps the card)")
            return custom
        if args.hf_config and base.card is not None and base.card.depth_note():
            # no card was learned from this config; one of the same config at another depth was
            _note(args, f"{base.card.depth_note()} (`zlayout learn --hf-config {shlex.quote(args.hf_config)}` "
                        "learns this depth's own)")
        # the file is read again only for the few types whose causal-LM class drops a vision tower
        if args.hf_config and base.hf_model_type in hfconfig.LANGUAGE_MODEL_ONLY and (
                text_only := hfconfig.language_model_only_note(hfconfig.read_config(args.hf_config)[0],
                                                               args.hf_config)):
            _note(args, text_only)
        if args.hf_config and base.card is None:
            _note(args, f"no model card for {args.hf_config}: its activations come from zlayout's hand "
                        f"model of {base.hf_model_type}; `zlayout learn --hf-config {shlex.quote(args.hf_config)}` "
                        "learns them from the transformers class")
        from zlayout.core.card import STATE_SPACE_TORCH  # a card of Mamba-2 blocks alone runs no attention

        if args.hf_config and base.card is not None and base.card.attention == "sdpa" \
                and not base.card.attention_kernels and base.card.linear_attention != STATE_SPACE_TORCH:
            _note(args, f"the model card {base.card.source} was learned before zlayout priced the attention "
                        "kernel CUDA runs (the math fallback where no fused kernel takes the inputs, as "
                        f"Falcon's); `zlayout learn --force --hf-config {shlex.quote(args.hf_config)}` learns it again")
        if args.hf_config and base.card is not None and base.card.attention == "sdpa" \
                and not base.card.attention_dropout_counted \
                and hfconfig.attention_dropout(hfconfig.read_config(args.hf_config)[0]) > 0:
            _note(args, f"the model card {base.card.source} was learned before zlayout priced attention dropout "
                        "(the fused kernel draws it per score: its step time is under); "
                        f"`zlayout learn --force --hf-config {shlex.quote(args.hf_config)}` learns it again")
        installed = _installed("transformers") if args.hf_config and base.card is not None else None
        if installed and base.card.transformers and installed != base.card.transformers:
            # a release changes what a model's code asks for (5.25.0 runs Falcon's multi-query
            # attention on a fused kernel where 5.24.0 ran the math path): verify trains the
            # installed one
            _note(args, f"the model card {base.card.source} was learned from transformers "
                        f"{base.card.transformers}'s code; {installed} is installed, whose code may ask for "
                        f"other tensors: `zlayout learn --force --hf-config {shlex.quote(args.hf_config)}` "
                        "learns it from this one")
        return ModelSpec.model_validate(data)
    if args.params is not None:
        try:
            size = catalog.parse_size(args.params)
        except ValueError as exc:
            raise UsageError(f"--params: {exc}") from None
        model = catalog.model_for_size(size, family=args.family or "llama3", extra_dirs=dirs)
        kv = f", {model.num_kv_heads} kv heads" if model.num_kv_heads != model.heads else ""
        _note(args, f"--params {args.params.strip()} is {model.name} from the {model.family} family "
                    f"({model.layers} layers, hidden {model.hidden}, {model.heads} heads{kv}, "
                    f"{model.params:,} params); --family picks another family")
        return model
    missing = [f"--{k}" for k in ("layers", "hidden", "heads", "vocab") if k not in given]
    if missing:
        raise UsageError(f"the model needs {', '.join(missing)} (or --preset NAME, --params 13B "
                         "or --hf-config config.json)")
    return ModelSpec(**given)


def _installed(distribution: str) -> str | None:
    """An installed package's version, read from its metadata (nothing imported), or None."""
    version = _dist_info_version(distribution)
    if version is not None:
        return version
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _dist_info_version(distribution: str) -> str | None:
    """`importlib.metadata.version` where the package is found as it finds it in the common case:
    the first `<name>-<version>.dist-info` folder (name normalized) of the first folder on sys.path
    holding one, its METADATA's Version header. A carded `zlayout plan` asks for transformers'
    version on every run, and importlib.metadata (email, zipfile, csv) cost it 10-13 ms. None
    wherever the lookup could differ (another metadata finder, a zip or an egg on the path, an
    unusual METADATA) or nothing is found: the caller then asks importlib.metadata."""
    from importlib.machinery import PathFinder

    if any(hasattr(finder, "find_distributions") and finder is not PathFinder for finder in sys.meta_path):
        return None
    wanted = re.sub(r"[-_.]+", "_", distribution).lower()
    for entry in sys.path:
        root = entry or "."
        try:
            children = os.listdir(root)
        except FileNotFoundError:
            continue
        except OSError:
            return None  # a zip file, or unreadable: importlib.metadata knows what to make of it
        for child in children:
            low = child.lower()
            if low.endswith(".egg-info") or low == "egg-info":
                if re.sub(r"[-_.]+", "_", low.rpartition(".")[0].partition("-")[0]) == wanted or low == "egg-info":
                    return None
            elif low.endswith(".dist-info") and re.sub(r"[-_.]+", "_", low[:-10].partition("-")[0]) == wanted:
                return _metadata_version(os.path.join(root, child, "METADATA"))
    return None


def _metadata_version(path: str) -> str | None:
    """The Version header of a METADATA file (the email-style headers before the first blank line)."""
    try:
        with open(path, encoding="utf-8") as file:
            lines = iter(file.read().splitlines())
    except (OSError, UnicodeDecodeError):
        return None
    for line in lines:
        if not line:
            return None
        if line.lower().startswith("version:"):
            following = next(lines, "")
            value = line[8:].strip()
            # a folded (continued) header or an empty value: left to the email parser
            return value if value and not following[:1].isspace() else None
    return None


def _note(args: argparse.Namespace, text: str) -> None:
    """A note for stderr, printed by `main` once the command succeeded (an error prints alone)."""
    notes = getattr(args, "notes", None)
    if notes is None:
        notes = []
        setattr(args, "notes", notes)
    notes.append(text)


def _check_presets_dirs(dirs: Sequence[str]) -> None:
    for folder in dirs:
        try:
            ok = os.path.isdir(folder)
        except (OSError, ValueError):  # a NUL byte or a name too long
            ok = False
        if not ok:
            raise UsageError(f"--presets-dir {folder!r}: no such directory; give a directory holding "
                             "gpus/, links/ or models/ folders of TOML files")


def _gib_to_bytes(gib: float, flag: str, field: str) -> int:
    nbytes = gib * GiB
    if not math.isfinite(nbytes) or abs(nbytes) > 2**80:
        raise UsageError(f"{flag}: must be {BOUNDS[field].describe()} (got {gib:g})")
    return int(nbytes)


def plan_input_from_args(args: argparse.Namespace) -> PlanInput:
    """Build and validate the inputs; raises UsageError with a readable message."""
    from zlayout import catalog

    dirs = tuple(args.presets_dir)
    _check_presets_dirs(dirs)
    try:
        model = _model_from_args(args)
        gpu = catalog.load_gpu(args.gpu, dirs)
        intra = catalog.load_link(args.intra_link or catalog.default_intra_link(args.gpu, dirs), dirs)
        inter = catalog.load_link(args.inter_link, dirs)
        hw_kwargs = dict(gpu=gpu, gpus_per_node=args.gpus_per_node, nodes=args.nodes,
                         intra_link=intra, inter_link=inter,
                         nvme_bytes=_gib_to_bytes(args.nvme_gib, "--nvme-gib", "nvme_bytes"),
                         nvme_gbps=args.nvme_gbps)
        if args.host_ram_gib is not None:
            hw_kwargs["host_ram_bytes"] = _gib_to_bytes(args.host_ram_gib, "--host-ram-gib",
                                                        "host_ram_bytes")
        if args.host_cores is not None:
            hw_kwargs["host_cores"] = args.host_cores
        hardware = HardwareSpec(**hw_kwargs)
        seq = args.seq
        if seq is None:
            seq = DEFAULT_SEQ
            if 0 < model.position_embeddings < DEFAULT_SEQ:  # GPT-2's 1,024 learned positions
                seq = model.position_embeddings
                _note(args, f"--seq defaults to {seq}, {model.name}'s learned positions (n_positions)")
            longest, shortest = (getattr(model.card, name, None) for name in ("longest_sequence", "shortest_sequence"))
            if longest is not None and longest < seq:  # BERT's 512 (core.card.ModelCard)
                seq = longest
                _note(args, f"--seq defaults to {seq}, the positions {model.name} holds")
            if shortest is not None and shortest > seq:  # a card learned from longer sequences on
                seq = shortest
                _note(args, f"--seq defaults to {seq}, the shortest sequence {model.name}'s model card holds")
        training = TrainingSpec(seq=seq,
                                micro_batch=args.micro_batch,
                                grad_accum=args.grad_accum, precision=args.precision,
                                checkpointing=args.checkpointing,
                                impl=args.impl or ("hf" if args.hf_config else "zlayout"), init=args.init,
                                allocator=args.allocator, loop=args.loop)
        knobs = {
            "reduce_bucket_size": args.reduce_bucket_size,
            "allgather_bucket_size": args.allgather_bucket_size,
            "stage3_prefetch_bucket_size": args.prefetch_bucket_size,
            "stage3_max_live_parameters": args.max_live_parameters,
            "stage3_param_persistence_threshold": args.persistence_threshold,
        }
        zero = ZeroKnobs(**{k: v for k, v in knobs.items() if v is not None},  # whole: element_count
                         overlap_comm=not args.no_overlap_comm)
        extra = {}
        if args.calibration:
            from zlayout.profile.calibration import load_calibration

            extra["calibration"] = load_calibration(args.calibration)
        return PlanInput(model=model, hardware=hardware, training=training, zero=zero,
                         headroom_fraction=args.headroom, **extra)
    except ValidationError as exc:
        raise UsageError(format_validation_error(exc)) from None
    except (KeyError, ValueError) as exc:
        raise UsageError(exception_text(exc)) from None


def layout_from_args(args: argparse.Namespace) -> Layout | None:
    if args.stage is None:
        if args.offload_optimizer != "none" or args.offload_param != "none":
            raise UsageError("--offload-optimizer/--offload-param need --stage")
        return None
    try:
        return Layout(stage=args.stage, offload_optimizer=args.offload_optimizer,
                      offload_param=args.offload_param)
    except ValidationError as exc:
        raise UsageError(format_validation_error(exc)) from None


def format_validation_error(exc: ValidationError) -> str:
    """pydantic's errors as one line: '--flag: what is wrong; ...' (flags, never field names)."""
    parts = []
    for err in exc.errors():
        field = str(err["loc"][-1]) if err["loc"] else ""
        flag = FLAG_OF_FIELD.get(field, "--" + field.replace("_", "-")) if field else ""
        message = err["msg"].removeprefix("Value error, ")
        if message == "Input should be a finite number":
            message = "must be a finite number"
        part = f"{flag}: {message}" if flag else message
        if part not in parts:
            parts.append(part)
    return "; ".join(parts)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or with `only` (a subcommand's name) that subcommand alone:
    `zlayout plan` then imports neither the profile writer nor the app (about 40 ms)."""
    parser = ZlayoutParser(
        prog="zlayout",
        description="Plan DeepSpeed ZeRO layouts: memory per GPU/host/NVMe, step time, "
                    "break-even sizes; verify on real GPUs; export a validated profile. "
                    "Without a subcommand, opens the terminal app.")
    from zlayout import __version__

    parser.add_argument("--version", action="version", version=f"zlayout {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in (only,) if only in SUBCOMMANDS else SUBCOMMANDS:
        try:
            module = importlib.import_module(f"zlayout.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"zlayout.commands.{name}":
                raise
            continue
        module.register(sub)
    _polish(parser)
    return parser


def _path_error(exc: OSError) -> UsageError:
    """A file-system error as one line naming the path (a bad path is input, not a crash)."""
    name = exc.filename if exc.filename is not None else ""
    shown = str(name) if len(str(name)) <= 120 else str(name)[:60] + "..." + str(name)[-40:]
    if exc.errno == errno.ENAMETOOLONG:
        return UsageError(f"{shown!r}: a file or folder name is too long (at most 255 bytes "
                          "per name); choose a shorter path")
    return UsageError(f"{shown!r}: {exc.strerror or exc}" if name else str(exc.strerror or exc))


_NEGATIVE_VALUE = re.compile(r"-[0-9.][0-9A-Za-z._,%]*")


def _negative_values_attached(words: list[str]) -> list[str]:
    """`--params -5B` as `--params=-5B`: argparse reads a value that starts with '-' and is not a
    plain number as the next option ("expected one argument"); attached, the flag's own check
    says what is wrong with it (a negative size). Only for a long flag followed by such a value."""
    out: list[str] = []
    for index, word in enumerate(words):
        if word == "--":  # what follows is passed on as written
            return out + words[index:]
        if out and out[-1].startswith("--") and "=" not in out[-1] and _NEGATIVE_VALUE.fullmatch(word):
            out[-1] = f"{out[-1]}={word}"
        else:
            out.append(word)
    return out


# Commands that, once they have printed, have nothing left to do at exit: no thread, no file
# open, no atexit hook. Python's own shutdown (tearing down pydantic's and the planner's modules
# and objects) took 7 ms of a `zlayout plan`.
FAST_EXIT_COMMANDS = ("plan",)


def _exit_at_once(code: int) -> None:
    """End the process now with `code`, its output flushed, without the interpreter's shutdown;
    returns (leaving the ordinary exit to report it) where the output cannot be flushed or a
    thread other than this one runs."""
    import threading

    if threading.active_count() > 1:
        return
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):  # a closed pipe: the ordinary exit deals with it, as before
        return
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        if not (sys.argv[1:] if argv is None else argv):
            # plain `zlayout`: the app, without building the parser first (it imports every
            # subcommand and the planner: ~300 ms before the app's first frame)
            from zlayout.tui.app import run_app

            return run_app()
        words = list(sys.argv[1:] if argv is None else argv)
        if words[0].startswith("-") and words[0] not in ("-h", "--help", "--version"):
            # `zlayout --preset llama3-70b` is the app on those inputs, as plain `zlayout` is the
            # app (it read the flag's value as a command: "unknown command 'llama3-70b'")
            words.insert(0, "app")
        if argv is None:
            gc.disable()  # the subcommand's imports, as this module's own (above)
        try:
            parser = build_parser(only=words[0] if words else None)
            args = parser.parse_args(_negative_values_attached(words))
        finally:
            if argv is None and _collecting:
                gc.enable()
        if args.command is None:
            from zlayout.tui.app import run_app

            return run_app()
        if argv is None:
            # This process runs one command and ends: what the imports made (pydantic's schemas,
            # the modules) lives to the end, so the collector need not walk it again in each full
            # collection, in each forked replay (replaycache) or at exit (10-15 ms of a plan).
            gc.freeze()
        code = int(args.func(args) or 0)
        for note in getattr(args, "notes", ()):
            print(f"zlayout: note: {one_line(note)}", file=sys.stderr)
        if argv is None and args.command in FAST_EXIT_COMMANDS:
            _exit_at_once(code)
        return code
    except UsageError as exc:
        print(f"zlayout: error: {one_line(str(exc))}", file=sys.stderr)
        if exc.hint:
            print(f"zlayout: hint: {one_line(exc.hint)}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except OSError as exc:
        error = _path_error(exc)
        print(f"zlayout: error: {one_line(str(error))}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
