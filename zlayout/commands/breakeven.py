"""`zlayout breakeven`: the largest model and micro-batch each layout carries, and the crossovers.

The largest model is of the current model's family (`--preset`'s or `--family`'s shape rule;
a custom architecture grows in depth at fixed width) that fits GPU memory with the
--headroom kept free, host RAM and NVMe. With --json, one object:
`{"params": N, "family": ..., "scaling": "family"|"depth", "layouts": [{"stage": 0-3,
"offload_optimizer": "none|cpu|nvme", "offload_param": ..., "max_params": N,
"max_micro_batch": N, "limited_by": "gpu|host|nvme|range", ...}, ...], "crossovers": [...]}`.
`--stage N` narrows both to that ZeRO stage's layouts (crossovers then name only those), and
the object carries `"stage": N` (null for every layout). A layout that will not run the model
whatever its memory (`plan`'s `will_not_run`: ZeRO-0, or ZeRO-3 on one GPU, of a model whose
grouped-experts weights DeepSpeed packs off a 16-byte boundary) has no size: its row's
`max_params`, `max_micro_batch`, `limited_by`, `next_params` and `max_model` are null and its
`will_not_run` says why (null in every other row); the object's `will_not_run`, present when
any layout will not run, maps each such layout's key to why, as `plan --json` does; the
table says "will not run" in its row, with a note why, and crossovers never name it.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from zlayout.cli import UsageError, add_plan_arguments, plan_input_from_args
from zlayout.catalog import PresetFileError, format_params
from zlayout.core.breakeven import BreakEven, Crossover, break_even, crossovers
from zlayout.core.memory import estimate_memory
from zlayout.core.serialize import layout_dict
from zlayout.spec import Layout, PlanInput, all_layouts


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "breakeven", help="the largest model and micro-batch each layout fits, and crossovers",
        description="For every layout: the largest model of the current model's family that fits "
                    "(GPU memory with --headroom free, host RAM, NVMe), what runs out first, the "
                    "largest micro-batch for the current model, and the sizes at which layouts "
                    "stop fitting and which one takes over.")
    add_plan_arguments(parser, with_layout=False)
    parser.add_argument("--stage", type=int, choices=(0, 1, 2, 3), default=None,
                        help="only this ZeRO stage's layouts (each offload choice); default every layout")
    parser.set_defaults(func=run)


def layout_breakeven_dict(inp: PlanInput, layout: Layout, be: BreakEven) -> dict[str, Any]:
    out = layout_dict(layout)
    if be.will_not_run is not None:  # no size runs there: no figure to misread as one
        out.update({"max_params": None, "max_micro_batch": None, "limited_by": None,
                    "fits_current_model": estimate_memory(inp, layout).fits, "next_params": None,
                    "max_model": None, "will_not_run": be.will_not_run})
        return out
    out.update({
        "max_params": be.max_params,
        "max_micro_batch": be.max_micro_batch,
        "limited_by": be.limited_by,
        # the plan's own verdict: near the card's edge a micro-batch below the largest that fits
        # may not (fitting is not monotone there)
        "fits_current_model": estimate_memory(inp, layout).fits,
        "next_params": be.next_params,
        "max_model": None if be.max_model is None else {
            "name": be.max_model.name, "layers": be.max_model.layers, "hidden": be.max_model.hidden,
            "heads": be.max_model.heads, "params": be.max_model.params},
        "will_not_run": None,
    })
    return out


def crossover_dict(c: Crossover, stage: int | None = None) -> dict[str, Any]:
    text = c.describe()
    if stage is not None and c.takes_over is None:
        # among one stage's layouts: another stage may still fit (ZeRO-3 beyond ZeRO-1)
        text = text.replace("nothing else fits", f"no other ZeRO-{stage} layout fits")
    return {"params": c.params, "stops_fitting": layout_dict(c.stops_fitting),
            "takes_over": None if c.takes_over is None else layout_dict(c.takes_over),
            "text": text}


def stage_layouts(stage: int | None = None) -> tuple[Layout, ...]:
    """Every layout, or those of one ZeRO stage."""
    return tuple(layout for layout in all_layouts() if stage is None or layout.stage == stage)


def breakeven_json(inp: PlanInput, presets_dirs: tuple[str, ...] = (),
                   stage: int | None = None) -> dict[str, Any]:
    layouts = stage_layouts(stage)
    evens = [(layout, break_even(inp, layout, presets_dirs)) for layout in layouts]
    wont = {layout.key: be.will_not_run for layout, be in evens if be.will_not_run is not None}
    return {
        "params": inp.model.params,
        "model": inp.model.name,
        "family": inp.model.family,
        "scaling": evens[0][1].scaling if evens else None,
        "world": inp.hardware.world,
        "headroom_fraction": inp.headroom_fraction,
        "stage": stage,
        "layouts": [layout_breakeven_dict(inp, layout, be) for layout, be in evens],
        "crossovers": [crossover_dict(c, stage) for c in crossovers(inp, layouts, presets_dirs)],
        **({"will_not_run": wont} if wont else {}),  # as plan --json: layout key -> why
    }


_LIMIT_WORDS = {"gpu": "GPU memory", "host": "host RAM", "nvme": "NVMe", "range": "(end of range)"}


def breakeven_table(inp: PlanInput, presets_dirs: tuple[str, ...] = (), stage: int | None = None) -> str:
    m, hw = inp.model, inp.hardware
    data = breakeven_json(inp, presets_dirs, stage)
    scaled = (f"the {m.family} family's shapes" if data["scaling"] == "family"
              else f"{m.name} deeper or shallower at hidden {m.hidden}")
    lines = [
        f"{m.name}: {format_params(m.params)} params now; sizes along {scaled}",
        f"{hw.nodes} x {hw.gpus_per_node} {hw.gpu.name}, seq {inp.training.seq}, "
        f"micro-batch {inp.training.micro_batch}, headroom {inp.headroom_fraction:.0%}"
        + (f"; ZeRO-{stage} layouts only" if stage is not None else ""),
        "",
        f"  {'layout':26} {'largest model':>14} {'layers x hidden':>16} {'runs out of':>13} {'max micro-batch':>16}",
    ]
    lines.append("-" * len(lines[-1]))
    for row in data["layouts"]:
        if row["will_not_run"] is not None:  # fits or not, no size of this model runs there
            lines.append(f"  {row['label']:26} {'will not run':>14} {'':>16} {'(Note)':>13} {'—':>16}")
            continue
        shape = ("" if row["max_model"] is None
                 else f"{row['max_model']['layers']} x {row['max_model']['hidden']}")
        size = format_params(row["max_params"]) if row["max_params"] else "none"
        micro = str(row["max_micro_batch"]) if row["max_micro_batch"] else "none fits"
        mark = "*" if row["fits_current_model"] else " "
        lines.append(f"{mark} {row['label']:26} {size:>14} {shape:>16} "
                     f"{_LIMIT_WORDS.get(row['limited_by'], row['limited_by']):>13} {micro:>16}")
    lines.append("* fits the current model")
    for why in dict.fromkeys(data.get("will_not_run", {}).values()):  # each reason once, as plan's notes
        lines.append(f"Note: {why}.")
    if hw.nvme_bytes == 0 and any(row["offload_optimizer"] == "nvme" or row["offload_param"] == "nvme"
                                  for row in data["layouts"]):
        lines.append("The NVMe layouts need NVMe: give its size per node with --nvme-gib N.")
    if data["crossovers"]:
        lines += ["", "Crossovers:"]
        lines += [f"  {c['text']}" for c in data["crossovers"]]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    inp = plan_input_from_args(args)
    dirs = tuple(args.presets_dir)
    try:  # a broken model preset is refused, as `plan --preset` and `--params` refuse it
        out = (json.dumps(breakeven_json(inp, dirs, args.stage)) if args.json
               else breakeven_table(inp, dirs, args.stage))
    except PresetFileError as exc:
        raise UsageError(str(exc)) from None
    print(out)
    return 0
