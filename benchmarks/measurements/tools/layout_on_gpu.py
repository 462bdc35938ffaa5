"""One layout, given as `zlayout verify` arguments, built on this GPU exactly as the verify
worker builds it: the measurement scripts (allocator_trace.py, steptime_profile.py) share it
so what they measure is what `zlayout verify` runs."""

from __future__ import annotations

import os
import sys
from typing import Any


def parse_layout(argv: list[str]) -> tuple[Any, Any, dict]:
    """(plan input, layout, DeepSpeed config) of `zlayout verify ARGV`, after applying verify's
    own corrections to this process's environment (the H200 node's TORCH_CUDA_ARCH_LIST=9.0a is
    not parsed by DeepSpeed 0.19.8's op builder when it JIT-builds fused Adam)."""
    from zlayout.cli import build_parser, layout_from_args, plan_input_from_args
    from zlayout.profile.ds_config import ds_config
    from zlayout.verify.environment import corrected_env

    env, notes = corrected_env(dict(os.environ))
    for key in set(os.environ) - set(env):
        del os.environ[key]
    os.environ.update(env)
    for note in notes:
        print(f"NOTE {note}", file=sys.stderr)
    args = build_parser().parse_args(["verify", *argv])
    inp = plan_input_from_args(args)
    layout = layout_from_args(args)
    return inp, layout, ds_config(inp, layout)


def hf_config_to_build(inp: Any) -> dict | None:
    """The config.json verify's launcher hands its worker (`--hf-config`: the user's own file,
    with the plan's shape laid over it); None for the hand-written families' models."""
    if inp.training.impl != "hf" or not inp.model.hf_config:
        return None
    from zlayout.hfconfig import config_to_build, read_config

    config, _ = read_config(inp.model.hf_config)
    return config_to_build(config, inp.model)


def build_model(inp: Any, layout: Any, cfg: dict) -> Any:
    """The worker's model (ZeRO-3 under zero.Init, transformers weights initialised per module)."""
    import deepspeed

    from zlayout.verify.worker import initialise_partitioned_hf_weights
    from zlayout.verify.worker_model import builder

    t = inp.training
    build = builder(inp.model, t.checkpointing == "full", t.impl, t.seq, hf_config_to_build(inp), loop=t.loop)
    if layout.stage != 3:
        return build()
    with deepspeed.zero.Init(config_dict_or_path=cfg):
        model = build()
    if t.impl == "hf":
        initialise_partitioned_hf_weights(deepspeed, model.model)
    return model


def start_distributed(emulate_world: int = 0) -> None:
    """NCCL over the ranks torchrun started; or, with `emulate_world` N > 1, this one process as
    rank 0 of N on torch's fake process group (collectives return at once, moving nothing).
    DeepSpeed then partitions, buckets and gathers exactly as rank 0 of N GPUs would, so the
    caching allocator sees rank 0's requests of an N-GPU run on one GPU. What it cannot show:
    NCCL's own buffers (outside the allocator) and frees that wait on a real collective's stream."""
    import deepspeed
    import torch

    if emulate_world > 1:  # no torchrun: this process is the node's only rank
        from zlayout.verify.worker import join_emulated_world

        os.environ.update(LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
        torch.cuda.set_device(0)
        join_emulated_world(emulate_world)
    else:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    deepspeed.init_distributed(dist_backend="nccl")
