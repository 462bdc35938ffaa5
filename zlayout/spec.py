"""Validated inputs: the model, the hardware, the training setup, DeepSpeed's knobs, the layout.

Everything the planner computes is a pure function of a `PlanInput`. Every model here is
frozen, so a plan can be cached and compared, and every validator says what to type instead.
Sizes are bytes, bandwidths GB/s (1e9 bytes per second), rates FLOP/s.

Every number has a range users recognise (`BOUNDS`), checked here so the command line, the
app and preset files share it: inputs outside it would make the planner's searches run for
minutes or its figures overflow, and no real training run needs them. A bound's message
says the range and not the field, so each front end can put its own name in front.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import (BaseModel, ConfigDict, Field, ValidationInfo, field_validator,
                      model_validator)

Stage = Literal[0, 1, 2, 3]
Device = Literal["gpu", "cpu", "nvme"]
Precision = Literal["bf16", "fp16", "fp32"]
Checkpointing = Literal["none", "full"]
MlpKind = Literal["gelu", "swiglu"]
NormKind = Literal["layernorm", "rmsnorm"]
# Which training code runs the model: zlayout's own GPT (the verify worker's) or the Hugging
# Face `transformers` model class (AutoModelForCausalLM, sdpa attention, its own loss).
Implementation = Literal["zlayout", "hf"]
# PyTorch's CUDA caching allocator: the default (fixed segments) or expandable segments
# (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True).
AllocatorKind = Literal["default", "expandable"]

GiB = 2**30
TiB = 2**40


class Bound:
    """An inclusive range [low, high]; `unit` and `scale` say how the message shows it."""

    def __init__(self, low: float, high: float, unit: str = "", scale: float = 1.0,
                 low_open: bool = False) -> None:
        self.low, self.high, self.unit, self.scale, self.low_open = low, high, unit, scale, low_open

    def _show(self, value: float) -> str:
        shown = value / self.scale
        text = f"{shown:,}" if float(shown).is_integer() else f"{shown:,.6g}"
        return text.removesuffix(".0") + (f" {self.unit}" if self.unit else "")

    def describe(self) -> str:
        low = f"more than {self._show(self.low)}" if self.low_open else self._show(self.low)
        return f"from {low} to {self._show(self.high)}"

    def check(self, value: Any) -> Any:
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"must be a finite number {self.describe()}")
        too_low = value <= self.low if self.low_open else value < self.low
        if too_low or value > self.high:
            raise ValueError(f"must be {self.describe()} (got {self._show(value)})")
        return value


# field name -> its range. Model shapes: beyond today's largest models by 10x or more.
BOUNDS: dict[str, Bound] = {
    # ModelSpec
    "layers": Bound(1, 1000),
    "hidden": Bound(1, 262_144),
    "heads": Bound(1, 4096),
    "kv_heads": Bound(1, 4096),
    "ffn": Bound(1, 1_048_576),
    "vocab": Bound(1, 10_000_000),
    # TrainingSpec
    "seq": Bound(1, 1_048_576),
    "micro_batch": Bound(1, 4096),
    "grad_accum": Bound(1, 65_536),
    # HardwareSpec
    "gpus_per_node": Bound(1, 128),
    "nodes": Bound(1, 65_536),
    "host_ram_bytes": Bound(GiB, 1024 * TiB, "GiB", GiB),
    "host_mem_gbps": Bound(1, 100_000, "GB/s"),
    "nvme_bytes": Bound(0, 1024 * TiB, "GiB", GiB),
    "nvme_gbps": Bound(0.1, 1000, "GB/s"),
    "host_cores": Bound(1, 65_536),
    # GpuSpec
    "memory_bytes": Bound(GiB, 64 * TiB, "GiB", GiB),
    "peak_bf16_flops": Bound(1e9, 1e18, "FLOP/s"),
    "hbm_gbps": Bound(1, 1_000_000, "GB/s"),
    "pcie_gbps": Bound(0.1, 100_000, "GB/s"),
    "cuda_context_bytes": Bound(0, 64 * GiB, "GiB", GiB),
    "host_cores_per_gpu": Bound(1, 4096),
    # LinkSpec
    "bandwidth_gbps": Bound(0.01, 1_000_000, "GB/s"),
    "latency_us": Bound(0, 1_000_000, "us"),
    "efficiency": Bound(0, 1, low_open=True),
    # ZeroKnobs (elements, as DeepSpeed counts them)
    "reduce_bucket_size": Bound(1, 10**12),
    "allgather_bucket_size": Bound(1, 10**12),
    "stage3_prefetch_bucket_size": Bound(0, 10**12),
    "stage3_max_live_parameters": Bound(0, 10**15),
    "stage3_max_reuse_distance": Bound(0, 10**15),
    "stage3_param_persistence_threshold": Bound(0, 10**15),
    "sub_group_size": Bound(1, 10**15),
    "gradient_clipping": Bound(0, 1e9),
    # PlanInput
    "headroom_fraction": Bound(0, 0.9),
    # StepTimeCalibration (zlayout calibrate keeps its factors within 0.2-5)
    "gpu_factor": Bound(0.01, 100),
    "overhead_factor": Bound(0.01, 100),
    "cpu_optimizer_factor": Bound(0.01, 100),
    "transfer_factor": Bound(0.01, 100),
}
# A model size given as a count (--params, the app's Size): the family tables span this.
PARAMS_BOUND = Bound(10**7, 2 * 10**13)


def check_model_size(params: float) -> float:
    """`params` if it is a model size zlayout can shape (10M to 20T), else ValueError."""
    if not math.isfinite(params) or not PARAMS_BOUND.low <= params <= PARAMS_BOUND.high:
        raise ValueError(f"a model size must be from 10M to 20T parameters (got {params:.3g})")
    return params


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _within_bounds(cls, value: Any, info: ValidationInfo) -> Any:
        bound = BOUNDS.get(info.field_name or "")
        return value if bound is None else bound.check(value)


class ModelSpec(Frozen):
    """A decoder-only transformer, described by its architecture."""

    name: str = "custom"
    family: str | None = None
    layers: int
    hidden: int
    heads: int
    kv_heads: int | None = Field(default=None, description="defaults to heads (no GQA)")
    ffn: int | None = Field(default=None, description="MLP inner size; defaults to 4*hidden")
    vocab: int
    mlp: MlpKind = "gelu"
    norm: NormKind = "layernorm"
    bias: bool = True
    qkv_bias: bool | None = Field(default=None, description="bias on q/k/v only (Qwen2); defaults to bias")
    tie_embeddings: bool = False

    @model_validator(mode="after")
    def _shape_is_consistent(self) -> "ModelSpec":
        if self.hidden % self.heads:
            raise ValueError(
                f"hidden ({self.hidden}) must be divisible by heads ({self.heads}); "
                f"try --heads {_nearest_divisor(self.hidden, self.heads)}"
            )
        if self.heads % self.num_kv_heads:
            raise ValueError(
                f"heads ({self.heads}) must be a multiple of kv-heads ({self.num_kv_heads})"
            )
        return self

    @property
    def num_kv_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def ffn_size(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def layer_params(self) -> int:
        """Parameters of one transformer block (exact, counting biases and norms)."""
        h, kv, f = self.hidden, self.kv_size, self.ffn_size
        attn = h * (h + 2 * kv) + h * h
        mlp = (3 if self.mlp == "swiglu" else 2) * h * f
        norms = 2 * (2 * h if self.norm == "layernorm" else h)
        has_qkv_bias = self.bias if self.qkv_bias is None else self.qkv_bias
        biases = (h + 2 * kv) if has_qkv_bias else 0
        if self.bias:
            biases += h + (2 if self.mlp == "swiglu" else 1) * f + h
        return attn + mlp + norms + biases

    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    def head_params(self) -> int:
        return 0 if self.tie_embeddings else self.vocab * self.hidden

    def final_norm_params(self) -> int:
        return 2 * self.hidden if self.norm == "layernorm" else self.hidden

    @property
    def params(self) -> int:
        return (self.layers * self.layer_params() + self.embedding_params()
                + self.head_params() + self.final_norm_params())

    def largest_tensor_numel(self) -> int:
        """The largest single parameter (sizes DeepSpeed's stage-3 fetch of one module)."""
        h = self.hidden
        return max(self.vocab * h, h * (h + 2 * self.kv_size), self.ffn_size * h)


def _nearest_divisor(n: int, near: int) -> int:
    """The divisor of n closest to `near` (O(sqrt n): n may be any accepted hidden size)."""
    divisors = set()
    for d in range(1, math.isqrt(n) + 1):
        if n % d == 0:
            divisors.update((d, n // d))
    return min(divisors, key=lambda d: (abs(d - near), d))


class GpuSpec(Frozen):
    name: str
    memory_bytes: int
    peak_bf16_flops: float = Field(description="dense bf16 tensor-core FLOP/s")
    hbm_gbps: float = 3350.0
    pcie_gbps: float = Field(default=55.0, description="host<->device copy bandwidth achieved")
    cuda_context_bytes: int = Field(default=int(1.29 * GiB),
                                    description="CUDA context + cuBLAS workspace outside the allocator "
                                                "(1.29 GiB measured on H200, torch 2.11)")
    host_cores_per_gpu: int = Field(default=14,
                                    description="CPU cores per GPU of the GPU's usual 8-GPU node "
                                                "(DGX H100/H200: 2 x 56 cores / 8 GPUs = 14)")


class LinkSpec(Frozen):
    name: str
    bandwidth_gbps: float = Field(description="per-GPU unidirectional bandwidth, GB/s")
    latency_us: float = 5.0
    efficiency: float = Field(default=0.8, description="achieved bus bandwidth / nominal")


class HardwareSpec(Frozen):
    gpu: GpuSpec
    gpus_per_node: int
    nodes: int = 1
    intra_link: LinkSpec
    inter_link: LinkSpec | None = None
    host_ram_bytes: int = Field(default=2048 * GiB, description="per node")
    host_mem_gbps: float = Field(default=500.0,
                                 description="host memory bandwidth per node (two-socket 8-GPU servers: ~500)")
    nvme_bytes: int = Field(default=0, description="per node")
    nvme_gbps: float = Field(default=6.0, description="per node, read/write")
    host_cores: int | None = Field(default=None,
                                   description="CPU cores per node its ranks share (what nproc shows); "
                                               "default: the GPU preset's cores per GPU x GPUs per node")

    @property
    def world(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def node_host_cores(self) -> int:
        """The node's CPU cores: as given, or the GPU preset's share per GPU times the GPUs."""
        return self.host_cores or self.gpu.host_cores_per_gpu * self.gpus_per_node

    @property
    def cpu_threads_per_rank(self) -> int:
        """What the launchers zlayout writes give each rank: OMP_NUM_THREADS = cores / ranks on the node."""
        return max(1, self.node_host_cores // self.gpus_per_node)

    @model_validator(mode="after")
    def _multi_node_needs_a_link(self) -> "HardwareSpec":
        if self.nodes > 1 and self.inter_link is None:
            raise ValueError("nodes > 1 needs an inter-node link: add --inter-link (e.g. ib-ndr)")
        return self


class TrainingSpec(Frozen):
    seq: int
    micro_batch: int = 1
    grad_accum: int = 1
    precision: Precision = "bf16"
    checkpointing: Checkpointing = "none"
    optimizer: Literal["adamw"] = "adamw"
    flash_attention: bool = True
    impl: Implementation = "zlayout"
    allocator: AllocatorKind = "default"


class ZeroKnobs(Frozen):
    """DeepSpeed's sizing knobs, at DeepSpeed 0.19.8's defaults (users change these)."""

    overlap_comm: bool = True
    contiguous_gradients: bool = True
    reduce_bucket_size: int = 500_000_000
    allgather_bucket_size: int = 500_000_000
    stage3_prefetch_bucket_size: int = 50_000_000
    stage3_max_live_parameters: int = 1_000_000_000
    stage3_max_reuse_distance: int = 1_000_000_000
    stage3_param_persistence_threshold: int = 100_000
    sub_group_size: int = 1_000_000_000
    pin_memory: bool = True
    gradient_clipping: float = 1.0


class Layout(Frozen):
    stage: Stage
    offload_optimizer: Device = "gpu"
    offload_param: Device = "gpu"

    @field_validator("offload_optimizer", "offload_param", mode="before")
    @classmethod
    def _none_means_gpu(cls, value: object) -> object:
        return "gpu" if value in (None, "none") else value

    @model_validator(mode="after")
    def _deepspeed_rules(self) -> "Layout":
        if self.offload_param != "gpu" and self.stage != 3:
            raise ValueError(f"parameter offload needs ZeRO stage 3 (got stage {self.stage}): "
                             "use --stage 3 or --offload-param none")
        if "nvme" in (self.offload_param, self.offload_optimizer) and self.stage != 3:
            raise ValueError(f"NVMe offload needs ZeRO stage 3 (got stage {self.stage}): use --stage 3")
        if self.offload_optimizer != "gpu" and self.stage == 0:
            raise ValueError("optimizer offload needs ZeRO stage 1 or higher: use --stage 1, 2 or 3")
        if self.offload_param == "nvme" and self.offload_optimizer == "gpu":
            raise ValueError("NVMe parameter offload needs the optimizer offloaded too: "
                             "add --offload-optimizer cpu or nvme")
        return self

    @property
    def label(self) -> str:
        parts = [f"ZeRO-{self.stage}"]
        if self.offload_optimizer != "gpu":
            parts.append(f"opt→{self.offload_optimizer}")
        if self.offload_param != "gpu":
            parts.append(f"param→{self.offload_param}")
        return " ".join(parts)

    @property
    def key(self) -> str:
        """A stable short id, e.g. 'z3-opt_cpu-param_cpu'."""
        return f"z{self.stage}-opt_{self.offload_optimizer}-param_{self.offload_param}"


def offload_flag(device: Device) -> str:
    """A device as the command line and JSON outputs spell it: 'gpu' (nothing offloaded) is 'none'."""
    return "none" if device == "gpu" else device


def all_layouts() -> tuple[Layout, ...]:
    """Every layout DeepSpeed accepts, in a stable order."""
    layouts = [Layout(stage=0)]
    for stage in (1, 2):
        layouts += [Layout(stage=stage), Layout(stage=stage, offload_optimizer="cpu")]
    for opt in ("gpu", "cpu", "nvme"):
        for param in ("gpu", "cpu", "nvme"):
            try:
                layouts.append(Layout(stage=3, offload_optimizer=opt, offload_param=param))
            except ValueError:
                continue
    return tuple(layouts)


class StepTimeCalibration(Frozen):
    """Factors on the step-time model's parts, fitted by `zlayout calibrate` on a cluster's own runs.

    1.0 everywhere is the model as shipped (fitted on H200 measurements). `source` names the
    calibration file (and its SHA-256 prefix) so a profile records which one it used.
    """

    source: str | None = None
    gpu_factor: float = Field(default=1.0, description="GPU kernels: compute, loss, GPU optimizer")
    overhead_factor: float = Field(default=1.0,
                                   description="Python around the kernels: per-step and stage-3 hook overheads")
    cpu_optimizer_factor: float = Field(default=1.0, description="the CPU optimizer step")
    transfer_factor: float = Field(default=1.0, description="exposed network, PCIe and NVMe time")

    @property
    def is_default(self) -> bool:
        return (self.gpu_factor, self.overhead_factor, self.cpu_optimizer_factor,
                self.transfer_factor) == (1.0, 1.0, 1.0, 1.0)


class PlanInput(Frozen):
    """Everything a plan depends on."""

    model: ModelSpec
    hardware: HardwareSpec
    training: TrainingSpec
    zero: ZeroKnobs = ZeroKnobs()
    headroom_fraction: float = Field(default=0.05,
                                     description="GPU memory kept free when judging 'fits'")
    calibration: StepTimeCalibration = StepTimeCalibration()
