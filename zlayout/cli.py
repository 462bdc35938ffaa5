"""The command line: `zlayout` (the app) and `zlayout plan|breakeven|export|show|check|diff|verify|serve`.

Each subcommand lives in `zlayout/commands/<name>.py` and exposes `register(subparsers)`;
this module owns only the shared plan flags and turning them into a `PlanInput`. Bad input
is a one-line message on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from pydantic import ValidationError

from zlayout.spec import GiB, HardwareSpec, Layout, ModelSpec, PlanInput, TrainingSpec, ZeroKnobs

SUBCOMMANDS = ("plan", "breakeven", "export", "show", "check", "diff", "verify", "serve")

OFFLOAD_CHOICES = ("none", "cpu", "nvme")


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


def add_plan_arguments(parser: argparse.ArgumentParser, with_layout: bool = True) -> None:
    """The flags every planning command shares (README.md, "The command line")."""
    model = parser.add_argument_group("model (an architecture, --preset NAME or --params SIZE)")
    model.add_argument("--preset", help="model preset name, e.g. llama3-8b (see `zlayout show --presets`)")
    model.add_argument("--params", help="model size such as 13e9 or 70B, mapped onto --family's shape")
    model.add_argument("--family", default=None, help="model family for --params (default llama3)")
    model.add_argument("--layers", type=int)
    model.add_argument("--hidden", type=int)
    model.add_argument("--heads", type=int)
    model.add_argument("--kv-heads", type=int)
    model.add_argument("--ffn", type=int, help="MLP inner size (default 4*hidden)")
    model.add_argument("--vocab", type=int)
    model.add_argument("--mlp", choices=("gelu", "swiglu"))
    model.add_argument("--norm", choices=("layernorm", "rmsnorm"))
    model.add_argument("--no-bias", action="store_true", help="no biases in linear layers")
    model.add_argument("--tie-embeddings", action="store_true")
    model.add_argument("--qkv-bias", action="store_true", help="biases on q/k/v only (Qwen2)")

    train = parser.add_argument_group("training")
    train.add_argument("--seq", type=int, default=None, help="sequence length (default 2048)")
    train.add_argument("--micro-batch", type=int, default=1)
    train.add_argument("--grad-accum", type=int, default=1)
    train.add_argument("--precision", choices=("bf16", "fp16", "fp32"), default="bf16")
    train.add_argument("--checkpointing", choices=("none", "full"), default="none")
    train.add_argument("--impl", choices=("zlayout", "hf"), default=None,
                       help="training code: zlayout's GPT or the Hugging Face model class "
                            "(transformers, sdpa; default zlayout)")
    train.add_argument("--allocator", choices=("default", "expandable"), default="default",
                       help="PyTorch's CUDA allocator: default segments or expandable_segments:True")

    hw = parser.add_argument_group("hardware")
    hw.add_argument("--gpu", default="h200", help="GPU preset (h100, h200, a100-80gb, ...)")
    hw.add_argument("--gpus-per-node", type=int, default=8)
    hw.add_argument("--nodes", type=int, default=1)
    hw.add_argument("--intra-link", default=None, help="intra-node link preset (default: the GPU's)")
    hw.add_argument("--inter-link", default="ib-ndr", help="inter-node link preset")
    hw.add_argument("--host-ram-gib", type=float, default=None, help="host RAM per node (default 2048)")
    hw.add_argument("--nvme-gib", type=float, default=0.0, help="NVMe capacity per node")
    hw.add_argument("--nvme-gbps", type=float, default=6.0, help="NVMe bandwidth per node, GB/s")

    ds = parser.add_argument_group("DeepSpeed knobs (default: DeepSpeed 0.19.8's)")
    ds.add_argument("--reduce-bucket-size", type=float)
    ds.add_argument("--allgather-bucket-size", type=float)
    ds.add_argument("--prefetch-bucket-size", type=float)
    ds.add_argument("--max-live-parameters", type=float)
    ds.add_argument("--persistence-threshold", type=float)
    ds.add_argument("--no-overlap-comm", action="store_true")
    ds.add_argument("--headroom", type=float, default=0.05,
                    help="fraction of GPU memory kept free when judging 'fits' (default 0.05)")

    if with_layout:
        lay = parser.add_argument_group("layout (without --stage: every layout)")
        lay.add_argument("--stage", type=int, choices=(0, 1, 2, 3))
        lay.add_argument("--offload-optimizer", choices=OFFLOAD_CHOICES, default="none")
        lay.add_argument("--offload-param", choices=OFFLOAD_CHOICES, default="none")
    parser.add_argument("--presets-dir", action="append", default=[],
                        help="extra directory of preset TOML files (repeatable)")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")


def _model_from_args(args: argparse.Namespace):
    from zlayout import catalog

    dirs = tuple(args.presets_dir)
    arch_flags = {
        "layers": args.layers, "hidden": args.hidden, "heads": args.heads,
        "kv_heads": args.kv_heads, "ffn": args.ffn, "vocab": args.vocab,
        "mlp": args.mlp, "norm": args.norm,
    }
    given = {k: v for k, v in arch_flags.items() if v is not None}
    if args.no_bias:
        given["bias"] = False
    if args.tie_embeddings:
        given["tie_embeddings"] = True
    if args.qkv_bias:
        given["qkv_bias"] = True
    if args.preset and args.params:
        raise UsageError("give either --preset or --params, not both")
    if args.preset:
        base = catalog.load_model(args.preset, dirs)
        # Re-validate: architecture flags on top of a preset must still form a valid model.
        return ModelSpec.model_validate({**base.model_dump(), **given}) if given else base
    if args.params:
        size = catalog.parse_size(args.params)
        return catalog.model_for_size(size, family=args.family or "llama3", extra_dirs=dirs)
    missing = [f"--{k}" for k in ("layers", "hidden", "heads", "vocab") if k not in given]
    if missing:
        raise UsageError(f"the model needs {', '.join(missing)} (or --preset NAME, or --params 13B)")
    return ModelSpec(**given)


def plan_input_from_args(args: argparse.Namespace) -> PlanInput:
    """Build and validate the inputs; raises UsageError with a readable message."""
    from zlayout import catalog

    dirs = tuple(args.presets_dir)
    try:
        model = _model_from_args(args)
        gpu = catalog.load_gpu(args.gpu, dirs)
        intra = catalog.load_link(args.intra_link or catalog.default_intra_link(args.gpu, dirs), dirs)
        inter = catalog.load_link(args.inter_link, dirs)
        hw_kwargs = dict(gpu=gpu, gpus_per_node=args.gpus_per_node, nodes=args.nodes,
                         intra_link=intra, inter_link=inter,
                         nvme_bytes=int(args.nvme_gib * GiB), nvme_gbps=args.nvme_gbps)
        if args.host_ram_gib is not None:
            hw_kwargs["host_ram_bytes"] = int(args.host_ram_gib * GiB)
        hardware = HardwareSpec(**hw_kwargs)
        training = TrainingSpec(seq=args.seq or 2048, micro_batch=args.micro_batch,
                                grad_accum=args.grad_accum, precision=args.precision,
                                checkpointing=args.checkpointing, impl=args.impl or "zlayout",
                                allocator=args.allocator)
        knobs = {
            "reduce_bucket_size": args.reduce_bucket_size,
            "allgather_bucket_size": args.allgather_bucket_size,
            "stage3_prefetch_bucket_size": args.prefetch_bucket_size,
            "stage3_max_live_parameters": args.max_live_parameters,
            "stage3_param_persistence_threshold": args.persistence_threshold,
        }
        zero = ZeroKnobs(**{k: int(v) for k, v in knobs.items() if v is not None},
                         overlap_comm=not args.no_overlap_comm)
        return PlanInput(model=model, hardware=hardware, training=training, zero=zero,
                         headroom_fraction=args.headroom)
    except ValidationError as exc:
        raise UsageError(format_validation_error(exc)) from None
    except (KeyError, ValueError) as exc:
        raise UsageError(str(exc).strip("'\"")) from None


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
    """pydantic's errors as one line each: 'field: what is wrong'."""
    lines = []
    for err in exc.errors():
        where = ".".join(str(part) for part in err["loc"])
        message = err["msg"].removeprefix("Value error, ")
        lines.append(f"{where}: {message}" if where else message)
    return "; ".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zlayout",
        description="Plan DeepSpeed ZeRO layouts: memory per GPU/host/NVMe, step time, "
                    "break-even sizes; verify on real GPUs; export a validated profile. "
                    "Without a subcommand, opens the terminal app.")
    from zlayout import __version__

    parser.add_argument("--version", action="version", version=f"zlayout {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"zlayout.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"zlayout.commands.{name}":
                raise
            continue
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command is None:
            from zlayout.tui.app import run_app

            return run_app()
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"zlayout: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
