"""The DeepSpeed config a layout implies, exactly as `deepspeed.initialize` reads it.

Defaults match the config of the reference measurements (benchmarks/measurements/README.md:
bf16, AdamW from the config, gradient clipping 1.0, overlap_comm and contiguous_gradients on, every bucket at DeepSpeed's default). Knobs the user
moved away from DeepSpeed's defaults are written out; the rest are written too, so the file
documents what the memory model assumed.
"""

from __future__ import annotations

from typing import Any, Mapping

from zlayout.core.tensors import misaligned_weights
from zlayout.spec import Layout, PlanInput

DEFAULT_NVME_PATH = "/local_nvme"


def ds_config(inp: PlanInput, layout: Layout, nvme_path: str = DEFAULT_NVME_PATH,
              lr: float = 1e-4, team: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """zlayout's keys (ZeRO, batch, precision, clipping: zlayout.profile.team_config.OWNED_KEYS) and,
    with `team`, the team's own keys (their optimizer, scheduler, monitors) instead of zlayout's
    AdamW at `lr`."""
    t, z = inp.training, inp.zero
    zero: dict[str, Any] = {
        "stage": layout.stage,
        "overlap_comm": z.overlap_comm,
        "contiguous_gradients": z.contiguous_gradients,
        "reduce_bucket_size": z.reduce_bucket_size,
        "allgather_bucket_size": z.allgather_bucket_size,
    }
    if layout.stage == 3:
        zero.update({
            "stage3_prefetch_bucket_size": z.stage3_prefetch_bucket_size,
            "stage3_max_live_parameters": z.stage3_max_live_parameters,
            "stage3_max_reuse_distance": z.stage3_max_reuse_distance,
            "stage3_param_persistence_threshold": z.stage3_param_persistence_threshold,
            "sub_group_size": z.sub_group_size,
        })
    if layout.stage in (1, 2) and misaligned_weights(inp):
        # DeepSpeed packs the weights into one flat buffer without padding: a weight it puts off a
        # 16-byte boundary runs its GEMMs on cuBLAS's slower 2- or 4-element kernels, and torch's
        # grouped GEMM refuses an expert weight there; this pads each tensor to one
        zero["parameter_alignment"] = True
    if layout.offload_optimizer != "gpu":
        zero["offload_optimizer"] = _offload(layout.offload_optimizer, z.pin_memory, nvme_path)
    if layout.offload_param != "gpu":
        zero["offload_param"] = _offload(layout.offload_param, z.pin_memory, nvme_path)
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": t.micro_batch,
        "gradient_accumulation_steps": t.grad_accum,
        "train_batch_size": t.micro_batch * t.grad_accum * inp.hardware.world,
        "zero_optimization": zero,
        "optimizer": {"type": "AdamW", "params": {"lr": lr, "weight_decay": 0.0}},
        "gradient_clipping": z.gradient_clipping,
        "steps_per_print": 1_000_000_000,
        "wall_clock_breakdown": False,
    }
    if t.precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif t.precision == "fp16":
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    card = inp.model.card
    if card is not None and card.buffer_dtype is not None and t.precision != "fp32":
        # DeepSpeed casts only the weights unless told (engine._cast_module_mixed_precision); this
        # model's float32 buffers meet its bf16 activations and the next matmul fails without it
        config["data_types"] = {"buffer_dtype": t.precision}
    if team is not None:
        for key in ("optimizer", "steps_per_print", "wall_clock_breakdown"):
            config.pop(key)
        config.update(team)
    return config


def _offload(device: str, pin_memory: bool, nvme_path: str) -> dict[str, Any]:
    block: dict[str, Any] = {"device": device, "pin_memory": pin_memory}
    if device == "nvme":
        block["nvme_path"] = nvme_path
    return block
