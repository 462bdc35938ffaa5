"""The team's own DeepSpeed config beside zlayout's: who owns which key of ds_config.json.

zlayout owns the keys its plan prices: ZeRO (`zero_optimization`, with the offload blocks), the
batch (`train_micro_batch_size_per_gpu`, `gradient_accumulation_steps`, `train_batch_size`),
precision (`bf16`, `fp16`) and `gradient_clipping`. Everything else is the team's: the
optimizer's learning rate and betas, the scheduler, monitors, logging. A team key that changes
memory is refused with its reason, unless the plan prices it: the optimizer must be Adam or AdamW
(two fp32 states per parameter, what the plan counts), without amsgrad or 8-bit states; offload
blocks must be the layout's. Keys zlayout does not know are refused too: it cannot say they are
free. Later hand edits of team keys in ds_config.json pass the same check (`team_edits`).
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping

OWNED_KEYS = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size",
              "zero_optimization", "gradient_clipping", "bf16", "fp16", "data_types")
# zlayout's own choice where the team gives none (what ds_config.json held before --ds-config)
DEFAULT_TEAM = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.0}},
                "steps_per_print": 1_000_000_000, "wall_clock_breakdown": False}
# top-level keys that log, schedule or time the run and hold no memory the plan counts
NO_MEMORY_KEYS = ("optimizer", "scheduler", "steps_per_print", "wall_clock_breakdown", "dump_state", "tensorboard",
                  "wandb", "csv_monitor", "comet", "flops_profiler", "comms_logger", "checkpoint",
                  "prescale_gradients", "gradient_predivide_factor", "zero_allow_untested_optimizer",
                  "memory_breakdown", "aio")
PRICED_OPTIMIZERS = ("adam", "adamw")  # DeepSpeed lower-cases the type
OPTIMIZER_PARAMS = ("lr", "betas", "eps", "weight_decay", "bias_correction", "adam_w_mode", "torch_adam", "fused",
                    "amsgrad")
REFUSED = {
    "amp": "NVIDIA apex AMP keeps its own fp32 copies: set the precision with --precision",
    "data_types": "data_types.grad_accum_dtype changes the gradient buffers' size: zlayout plans them in the "
                  "training precision",
    "activation_checkpointing": "partitioned or CPU activation checkpoints change activation memory: use "
                                "--checkpointing",
    "communication_data_type": "the communication dtype changes the reduce buckets' size",
    "pipeline": "pipeline parallelism is not a layout zlayout plans",
    "compression_training": "compression changes the model's states",
    "sparse_attention": "sparse attention changes activation memory",
    "curriculum_learning": "a curriculum changes the sequence length the plan sized activations for",
    "data_efficiency": "data efficiency changes the sequence length and batch the plan sized",
    "elasticity": "elastic training changes the batch and world the plan sized",
    "autotuning": "autotuning changes the batch and ZeRO settings zlayout chose",
}


class TeamConfigError(ValueError):
    """A team key zlayout cannot price; the message names the key and why."""


def split(config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(zlayout's keys, the team's keys) of a ds_config dict."""
    owned = {k: v for k, v in config.items() if k in OWNED_KEYS}
    return owned, {k: v for k, v in config.items() if k not in OWNED_KEYS}


def _check_value(value: Any, where: str) -> None:
    """Values a TOML profile can hold exactly: no null, finite numbers, no empty tables."""
    if value is None:
        raise TeamConfigError(f"{where} is null: TOML has no null; remove the key (DeepSpeed then uses its default)")
    if isinstance(value, float) and not math.isfinite(value):
        raise TeamConfigError(f"{where} is {value}: give a finite number")
    if isinstance(value, dict):
        if not value:
            raise TeamConfigError(f"{where} is an empty object: remove it (DeepSpeed then uses its default)")
        for key, item in value.items():
            _check_value(item, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_value(item, f"{where}[{i}]")


def check_team(team: Mapping[str, Any]) -> None:
    """Raise TeamConfigError naming the first team key that changes memory the plan does not price."""
    for key, value in team.items():
        _check_value(value, key)
        if key in REFUSED:
            raise TeamConfigError(f"{key}: changes memory zlayout does not price ({REFUSED[key]}); remove it")
        if key not in NO_MEMORY_KEYS:
            raise TeamConfigError(f"{key}: zlayout does not know whether this key changes memory, so it cannot keep "
                                  "it in a planned config; remove it (or plan and verify without zlayout)")
    optimizer = team.get("optimizer")
    if optimizer is None:
        return
    if not isinstance(optimizer, dict) or not isinstance(optimizer.get("type"), str):
        raise TeamConfigError('optimizer: give {"type": "AdamW", "params": {...}}')
    kind = optimizer["type"]
    if kind.lower() not in PRICED_OPTIMIZERS:
        raise TeamConfigError(f"optimizer.type {kind!r}: the plan prices Adam/AdamW's two fp32 states per "
                              f"parameter; {kind} keeps others (8-bit, one or no state), which zlayout cannot price "
                              "yet: use AdamW, or plan and verify that optimizer yourself")
    params = optimizer.get("params", {})
    if not isinstance(params, dict):
        raise TeamConfigError("optimizer.params: give an object of the optimizer's arguments")
    for name, value in params.items():
        if name not in OPTIMIZER_PARAMS:
            raise TeamConfigError(f"optimizer.params.{name}: zlayout does not know whether this changes the "
                                  f"optimizer's memory (it knows {', '.join(OPTIMIZER_PARAMS)}); remove it")
        if name == "amsgrad" and value:
            raise TeamConfigError("optimizer.params.amsgrad: keeps a third fp32 state per parameter; the plan "
                                  "prices AdamW's two: set it to false")
    extra = sorted(set(optimizer) - {"type", "params"})
    if extra:
        raise TeamConfigError(f"optimizer.{extra[0]}: not a key of DeepSpeed's optimizer block (type, params)")


def import_team_config(config: Any, zlayout_config: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The team's keys of `config` (their ds_config.json, parsed) and one note per key zlayout set
    over theirs. `zlayout_config` is the config the layout gives. Offload blocks of theirs that are
    not the layout's are refused: the layout must price them (--offload-optimizer/--offload-param)."""
    if not isinstance(config, dict):
        raise TeamConfigError("a ds_config.json holds one JSON object")
    owned, team = split(config)
    check_team(team)
    notes: list[str] = []
    zero = owned.get("zero_optimization") or {}
    planned = zlayout_config.get("zero_optimization", {})
    for block, flag in (("offload_optimizer", "--offload-optimizer"), ("offload_param", "--offload-param")):
        theirs = (zero.get(block) or {}).get("device", "none") if isinstance(zero, dict) else "none"
        ours = (planned.get(block) or {}).get("device", "none")
        if str(theirs).lower() != ours:
            raise TeamConfigError(f"zero_optimization.{block}.device is {theirs!r} in yours, {ours!r} in the layout: "
                                  f"an offload changes memory; export with {flag} {theirs} to plan it, or remove it")
    if "data_types" in owned and owned["data_types"] != zlayout_config.get("data_types"):
        # zlayout writes it only where the model needs its buffers cast (a card's buffer_dtype)
        raise TeamConfigError(f"data_types: changes memory zlayout does not price ({REFUSED['data_types']}); "
                              "remove it")
    for key in OWNED_KEYS:
        if key in owned and owned[key] != zlayout_config.get(key):
            notes.append(f"{key}: yours {_short(owned[key])}, zlayout's {_short(zlayout_config.get(key))}")
    return team, notes


def team_edits(stored: Mapping[str, Any], actual: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(dotted key, stored, edited) for each team key that differs in ds_config.json, after
    check_team accepted the edited keys (raises TeamConfigError otherwise)."""
    check_team(actual)
    out: list[tuple[str, Any, Any]] = []

    def walk(a: Any, b: Any, prefix: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for key in [*a, *(k for k in b if k not in a)]:
                walk(a.get(key), b.get(key), f"{prefix}.{key}" if prefix else str(key))
        elif not (a == b and type(a) is type(b)):
            out.append((prefix, a, b))
    walk(dict(stored), dict(actual), "")
    return out


def describe_edits(edits: list[tuple[str, Any, Any]]) -> str:
    return "; ".join(f"{key} {_short(before)} -> {_short(after)}" for key, before, after in edits)


def _short(value: Any) -> str:
    text = "(absent)" if value is None else json.dumps(value, sort_keys=True)
    return text if len(text) <= 60 else text[:57] + "..."
