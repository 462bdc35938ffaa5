"""The profile file's schema: what a team keeps next to its training code.

One pydantic model per TOML table. `[inputs]` is exactly a `PlanInput` and `[layout]` exactly a
`Layout`, so loading a profile restores every input of the plan (`Profile.plan_input()`).
Models are frozen and reject unknown keys, so a hand-edited typo is an error that names the
field instead of a silently ignored setting. TOML has no null: optional fields are omitted.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from zlayout.profile.ds_config import DEFAULT_NVME_PATH, ds_config
from zlayout.spec import Layout, PlanInput

SCHEMA_VERSION = 1

# validated: measured within tolerance; mismatch: ran, but the measurement is off the prediction
# (alerts then follow the measurement); cpu-ok: ran end to end on CPU only, nothing measured on GPU.
Status = Literal["validated", "unverified", "failed", "does-not-fit", "mismatch", "cpu-ok"]
MEASURED_STATUSES = ("validated", "mismatch")  # a complete run whose figures alerts may follow
Basis = Literal["measured", "predicted"]
Where = Literal["gpu", "host", "nvme"]


class Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _as_utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError("times are UTC: write them with a trailing Z, e.g. 2026-11-30T01:02:03Z")
    return value.astimezone(timezone.utc).replace(microsecond=0)


def utc_now() -> datetime:
    return datetime.now(timezone.utc).replace(microsecond=0)


class RunSettings(Section):
    """How the team runs it: paths the launch scripts and `zlayout check` use."""

    train_script: str = Field(default="train.py",
                              description="the team's training script (launch scripts: ${TRAIN_SCRIPT:-...})")
    nvme_path: str = Field(default=DEFAULT_NVME_PATH, description="NVMe offload directory on every node")
    checkpoint_dir: str | None = Field(default=None, description="where the job saves DeepSpeed checkpoints")
    master_port: int = Field(default=29500, gt=0, lt=65536)

    @field_validator("train_script", "nvme_path", "checkpoint_dir")
    @classmethod
    def _one_line(cls, value: str | None) -> str | None:
        if value is not None and any(ord(c) < 32 for c in value):
            raise ValueError("a path on one line, without control characters")
        return value


class PredictedTerm(Section):
    name: str
    where: Where
    bytes: int
    category: str
    explanation: str


class Prediction(Section):
    """What the planner predicted for this layout when the profile was exported (per GPU / per node)."""

    planner: str = Field(description="the zlayout version that made the prediction")
    gpu_peak_allocated_bytes: int
    gpu_peak_reserved_bytes: int
    gpu_device_used_bytes: int
    host_peak_bytes: int
    nvme_bytes: int
    gpu_capacity_bytes: int
    gpu_usable_bytes: int
    gpu_headroom_bytes: int
    host_capacity_bytes: int
    nvme_capacity_bytes: int
    peak_phase: str
    fits: bool
    fits_gpu: bool
    fits_host: bool
    fits_nvme: bool
    step_time_s: float | None = None
    compute_s: float | None = None
    comm_s: float | None = None
    offload_s: float | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    intra_node_bytes: int | None = None
    inter_node_bytes: int | None = None
    pcie_bytes: int | None = None
    nvme_read_bytes: int | None = None
    nvme_write_bytes: int | None = None
    terms: list[PredictedTerm] = Field(min_length=1)

    def figures(self) -> dict[str, int | float]:
        """The headline numbers, keyed like the verification's `measured` figures."""
        keys = ("gpu_peak_allocated_bytes", "gpu_peak_reserved_bytes", "gpu_device_used_bytes",
                "host_peak_bytes", "nvme_bytes", "step_time_s", "tokens_per_s")
        return {k: getattr(self, k) for k in keys if getattr(self, k) is not None}


class Verification(Section):
    """The real run's result; `unverified` until `zlayout verify` has run the layout."""

    status: Status = "unverified"
    when: datetime | None = None
    gpus: str | None = Field(default=None, description="e.g. '8x NVIDIA H100 80GB HBM3'")
    gpu_count: int | None = None
    world: int | None = Field(default=None, description="processes the verification ran (the profile's world, "
                              "or fewer: one node of a multi-node profile)")
    driver: str | None = None
    cuda: str | None = None
    torch: str | None = None
    deepspeed: str | None = None
    steps: int | None = None
    message: str | None = None
    measured: dict[str, int | float] = {}
    predicted: dict[str, int | float] = {}
    error_fraction: dict[str, float] = Field(
        default={}, description="(predicted - measured) / measured, per figure")

    @field_validator("when")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        return None if value is None else _as_utc(value)


class RestartDrill(Section):
    """Did the job resume from its own checkpoint (kill, restart, same loss)?"""

    resumed_ok: bool
    resume_s: float | None = Field(default=None, description="restart to the first resumed step")
    restart_wall_s: float | None = None
    save_s: float | None = None
    step_before: int | None = None
    step_after: int | None = None
    loss_expected: float | None = None
    loss_resumed: float | None = None
    loss_exact: bool | None = None
    loss_max_rel_diff: float | None = None
    message: str | None = None


class GpuMemoryAlert(Section):
    basis: Basis
    peak_allocated_bytes: int
    warn_allocated_above_bytes: int = Field(description="torch.cuda.max_memory_allocated() per GPU")
    device_used_bytes: int
    warn_device_used_above_bytes: int = Field(description="nvidia-smi / DCGM framebuffer used per GPU")
    capacity_bytes: int
    margin_fraction: float
    why: str


class HostMemoryAlert(Section):
    basis: Basis
    peak_bytes: int
    warn_above_bytes: int = Field(description="resident memory of the training processes per node")
    capacity_bytes: int
    margin_fraction: float
    why: str


class StepTimeAlert(Section):
    basis: Basis
    step_time_s: float
    warn_above_s: float
    factor: float
    why: str


class LossSpikeAlert(Section):
    window_steps: int = Field(gt=0)
    factor: float = Field(gt=1)
    rule: str
    why: str


class Alerts(Section):
    """Thresholds an on-call engineer wires into monitoring, each with its reason."""

    gpu_memory: GpuMemoryAlert
    host_memory: HostMemoryAlert
    step_time: StepTimeAlert | None = None
    loss_spike: LossSpikeAlert  # written last: a file cut short loses a required key


class ChangeEntry(Section):
    when: datetime
    why: str
    basis: Basis
    layout_before: str | None = None
    layout_after: str
    gpu_peak_bytes_before: int | None = None
    gpu_peak_bytes_after: int
    host_peak_bytes_before: int | None = None
    host_peak_bytes_after: int
    step_time_s_before: float | None = None
    step_time_s_after: float | None = None

    @field_validator("when")
    @classmethod
    def _utc(cls, value: datetime) -> datetime:
        return _as_utc(value)


class Profile(Section):
    """A run configuration for specific hardware, with its reasons and measurements."""

    schema_version: Literal[1] = SCHEMA_VERSION
    name: str
    description: str
    zlayout_version: str
    inputs: PlanInput
    layout: Layout
    run: RunSettings = RunSettings()
    prediction: Prediction
    verification: Verification = Verification()
    restart_drill: RestartDrill | None = None
    changelog: list[ChangeEntry] = Field(min_length=1)
    alerts: Alerts

    def plan_input(self) -> PlanInput:
        return self.inputs

    def ds_config(self) -> dict[str, Any]:
        """The DeepSpeed config this profile runs with (what ds_config.json holds)."""
        return ds_config(self.inputs, self.layout, nvme_path=self.run.nvme_path)

    @property
    def world(self) -> int:
        return self.inputs.hardware.world

    @property
    def status(self) -> Status:
        return self.verification.status
