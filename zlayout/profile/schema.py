"""The profile file's schema: what a team keeps next to its training code.

One pydantic model per TOML table. `[inputs]` is exactly a `PlanInput` and `[layout]` exactly a
`Layout`, so loading a profile restores every input of the plan (`Profile.plan_input()`).
Models are frozen and reject unknown keys, so a hand-edited typo is an error that names the
field instead of a silently ignored setting. TOML has no null: optional fields are omitted.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer, model_validator

from zlayout.profile.ds_config import DEFAULT_NVME_PATH, ds_config
from zlayout.spec import Bound, GiB, Layout, PlanInput, recorded_inputs

SCHEMA_VERSION = 2

# The spec's field suffix -> the file's (and back): the unit spelt out in the key.
SPEC_TO_FILE_SUFFIX = {"_gbps": "_gb_per_s", "_flops": "_flop_per_s"}

# validated: measured within tolerance; mismatch: ran, but the measurement is off the prediction
# (alerts then follow the measurement); cpu-ok: ran end to end on CPU only, nothing measured on GPU.
Status = Literal["validated", "unverified", "failed", "does-not-fit", "mismatch", "cpu-ok"]
MEASURED_STATUSES = ("validated", "mismatch")  # a complete run whose figures alerts may follow
# validated vs mismatch: zlayout.verify.result.TOLERANCE_FRACTION (verify imports this layer, not
# the other way; tests/profile check the two agree)
VALIDATED_TOLERANCE_FRACTION = 0.10
Basis = Literal["measured", "predicted"]
Where = Literal["gpu", "host", "nvme"]


HOST_RAM_SOURCE_TEXT = {"given": "given at export",
                        "assumed": "assumed: zlayout's default, not given at export with --host-ram-gib"}


class Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _as_utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError("times are UTC: write them with a trailing Z, e.g. 2026-11-30T01:02:03Z")
    return value.astimezone(timezone.utc).replace(microsecond=0)


def utc_now() -> datetime:
    return datetime.now(timezone.utc).replace(microsecond=0)


PROMETHEUS_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
MAX_PATH_CHARS = 4096
MAX_NAME_CHARS = 200
MAX_COMPONENT_BYTES = 255  # NAME_MAX on Linux file systems


def one_line_text(value: str, what: str, max_chars: int = MAX_NAME_CHARS) -> str:
    """Text that lands in a launch script, a comment or a file name: printable and on one line.

    Newlines, U+2028/U+2029, U+0085 and other controls could end a comment or a command in a
    script (or a line of a log), so they are refused here rather than escaped downstream."""
    bad = next((c for c in value if not c.isprintable()), None)
    if bad is not None:
        raise ValueError(f"{what} must be one line of printable text; it holds {ascii(bad)}: "
                         "remove it")
    if len(value) > max_chars:
        raise ValueError(f"{what} is {len(value)} characters long; at most {max_chars}")
    return value


def path_text(value: str, what: str) -> str:
    one_line_text(value, what, MAX_PATH_CHARS)
    if not value:
        raise ValueError(f"{what} is empty: give a path")
    long_part = next((part for part in value.split("/") if len(part.encode()) > MAX_COMPONENT_BYTES), None)
    if long_part is not None:
        raise ValueError(f"{what} has a path component of {len(long_part.encode())} bytes "
                         f"(file systems allow {MAX_COMPONENT_BYTES}): shorten it")
    return value


class RunSettings(Section):
    """How the team runs it: paths the launch scripts and `zlayout check` use."""

    train_script: str = Field(default="train.py",
                              description="the team's training script (launch scripts: ${TRAIN_SCRIPT:-...})")
    nvme_path: str = Field(default=DEFAULT_NVME_PATH, description="NVMe offload directory on every node")
    checkpoint_dir: str | None = Field(default=None, description="where the job saves DeepSpeed checkpoints")
    master_port: int = Field(default=29500, gt=0, lt=65536)
    alert_labels: dict[str, str] = Field(
        default={}, description="Prometheus label matchers that scope alerts.yml to this job (name -> value)")

    @field_validator("alert_labels")
    @classmethod
    def _label_matchers(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if not PROMETHEUS_LABEL.fullmatch(name) or name.startswith("__"):
                raise ValueError(f"alert label {ascii(name)} is not a Prometheus label name: letters, digits and _, "
                                 "not starting with a digit or __ (e.g. job=llama3-pretrain)")
            one_line_text(text, f"alert label {name}'s value")
            if not text:
                raise ValueError(f"alert label {name} has an empty value: an empty matcher selects series "
                                 "without the label; give the job's value")
        return value

    @field_validator("train_script", "nvme_path", "checkpoint_dir")
    @classmethod
    def _one_line(cls, value: str | None, info: Any) -> str | None:
        if value is None:
            return None
        path_text(value, info.field_name)
        if info.field_name == "train_script" and value.startswith("-"):
            # the launchers would read it as one of their own options
            raise ValueError(f"train_script {value!r} starts with '-': name the file, e.g. ./{value}")
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
    gpu_needed_bytes: int | None = Field(
        default=None, description="the least device memory the peak runs in (the allocator model): decides fits")
    gpu_flushes_per_step: int | None = Field(
        default=None, description="times a step the caching allocator flushes its cache at the card (core.fit)")
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
    host_overhead_s: float | None = Field(
        default=None, description="the host's side (Python, kernel issue, ZeRO-3's hooks) the kernels do not hide")
    tokens_per_s: float | None = None
    mfu: float | None = None
    intra_node_bytes: int | None = None
    inter_node_bytes: int | None = None
    pcie_bytes: int | None = None
    nvme_read_bytes: int | None = None
    nvme_write_bytes: int | None = None
    checkpoint_bytes: int | None = Field(
        default=None, description="one DeepSpeed checkpoint, all ranks: weights + fp32 optimizer state (estimate)")
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


# an alert's margin above the peak: a fraction (0.10 is 10%), never a percentage
MARGIN_BOUND = Bound(0, 1, fraction=True)


class GpuMemoryAlert(Section):
    basis: Basis
    peak_allocated_bytes: int
    warn_allocated_above_bytes: int = Field(description="torch.cuda.max_memory_allocated() per GPU")
    device_used_bytes: int
    warn_device_used_above_bytes: int | None = Field(
        default=None, description="nvidia-smi / DCGM framebuffer used per GPU; absent when the plan's caching "
                                  "allocator fills the card (then the framebuffer says nothing: allocated does)")
    capacity_bytes: int
    margin_fraction: float
    critical_device_used_above_bytes: int | None = Field(
        default=None, description="nearly full: framebuffer used per GPU above core.fit's threshold (97% of the "
                                  "card), whenever the plan is near the card or flushes its cache")
    # written by earlier exports; derived as absent now (a value there is refused as an edit: re-export)
    critical_free_below_bytes: int | None = None
    critical_allocated_above_bytes: int | None = None
    why: str

    @field_validator("margin_fraction")
    @classmethod
    def _margin(cls, value: float) -> float:
        return MARGIN_BOUND.check(value)


class HostMemoryAlert(Section):
    basis: Basis
    peak_bytes: int
    warn_above_bytes: int = Field(description="resident memory of the training processes per node")
    capacity_bytes: int
    margin_fraction: float
    why: str

    @field_validator("margin_fraction")
    @classmethod
    def _margin(cls, value: float) -> float:
        return MARGIN_BOUND.check(value)


class StepTimeAlert(Section):
    basis: Basis
    step_time_s: float
    warn_above_s: float
    factor: float
    why: str


class GpuHealthAlert(Section):
    """Signals of a broken GPU or a hung job that DCGM reports whatever the layout."""

    idle_util_below_percent: int = Field(gt=0, le=100)
    idle_for_minutes: int = Field(gt=0)
    xid_rule: str
    why: str


class DiskSpaceAlert(Section):
    path: str
    needed_bytes: int
    warn_free_below_bytes: int
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
    gpu_health: GpuHealthAlert | None = None
    checkpoint_space: DiskSpaceAlert | None = None
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


class LayoutLimit(Section):
    layout: str
    max_params: int = Field(description="largest model this layout carries here (0: none)")
    max_micro_batch: int
    limited_by: str = Field(description="what the next larger model runs out of: gpu, host, nvme; range: none within 10T; "
                                        "will_not_run: the layout will not run this model at any size (max_params 0)")


class Limits(Section):
    """Where the profile's layout stops fitting on its hardware (break-even), computed at export."""

    scaling: Literal["family", "depth"] = Field(
        description="family: the model family's shapes; depth: more layers at this width")
    max_params: int
    max_model: str | None = None
    next_params: int = Field(description="the first larger size that does not fit (0: none within range)")
    limited_by: str
    max_micro_batch: int
    takes_over: Layout | None = Field(default=None, description="the fastest layout that fits next_params")
    layouts: list[LayoutLimit] = []


class Summary(Section):
    """Rounded figures for people beside the exact bytes; derived from the profile on every save."""

    verdict: str
    model: str
    hardware: str
    layout: str
    basis: Basis
    fits: bool
    gpu_peak_allocated_gib: float
    gpu_peak_allocated_bytes: int
    gpu_device_used_gib: float
    gpu_device_used_bytes: int
    gpu_capacity_gib: float
    gpu_capacity_bytes: int
    host_peak_gib: float
    host_peak_bytes: int
    host_capacity_gib: float
    host_capacity_bytes: int
    host_capacity_source: str | None = Field(default=None, description="given at export, or assumed (a default)")
    nvme_gib: float
    nvme_bytes: int
    checkpoint_gib: float | None = None
    checkpoint_bytes: int | None = None
    step_time_s: float | None = Field(default=None, description="3 significant digits")
    tokens_per_s: int | None = None
    largest_model_params: int | None = None


def round_gib(n: int) -> float:
    return round(n / GiB, 1)


def _rename_keys(value: Any, suffixes: dict[str, str]) -> Any:
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            for old, new in suffixes.items():
                if isinstance(key, str) and key.endswith(old):
                    key = key[: -len(old)] + new
                    break
            out[key] = _rename_keys(item, suffixes)
        return out
    return value


def inputs_to_file(data: dict[str, Any]) -> dict[str, Any]:
    """PlanInput's dump -> the keys the file uses (units spelt out)."""
    return _rename_keys(data, SPEC_TO_FILE_SUFFIX)


def inputs_from_file(data: dict[str, Any]) -> dict[str, Any]:
    """The file's keys -> PlanInput's (the spec's own names pass unchanged: schema 1 used them)."""
    return _rename_keys(data, {new: old for old, new in SPEC_TO_FILE_SUFFIX.items()})


def without_custom_family(inp: Any) -> Any:
    """A model named "custom" (an architecture, or a preset someone changed) has no family:
    the preset's family on another shape reads as that model. Accepts a PlanInput or its dict."""
    if isinstance(inp, PlanInput):
        if inp.model.name == "custom" and inp.model.family is not None:
            return inp.model_copy(update={"model": inp.model.model_copy(update={"family": None})})
        return inp
    if isinstance(inp, dict) and isinstance(inp.get("model"), dict):
        model = inp["model"]
        if model.get("name", "custom") == "custom" and "family" in model:
            return {**inp, "model": {k: v for k, v in model.items() if k != "family"}}
    return inp


def _migrate_v1(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 1 -> 2: the spec's key names are still read (inputs_from_file passes them), the
    summary is derived, limits and the checkpoint estimate stay absent until the next export."""
    return {**data, "schema_version": 2}


MIGRATIONS = {1: _migrate_v1}
_SHA256 = re.compile(r"sha256:[0-9a-f]{64}")
_SET_FILE_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,99}")


class Profile(Section):
    """A run configuration for specific hardware, with its reasons and measurements."""

    schema_version: Literal[2] = SCHEMA_VERSION
    name: str
    description: str
    zlayout_version: str
    inputs: PlanInput
    layout: Layout
    run: RunSettings = RunSettings()
    prediction: Prediction
    verification: Verification = Verification()
    restart_drill: RestartDrill | None = None
    limits: Limits | None = None
    changelog: list[ChangeEntry] = Field(min_length=1)
    host_ram_source: Literal["given", "assumed"] = Field(
        default="assumed", description="given: --host-ram-gib at export; assumed: zlayout's default host RAM "
                                       "(2 TiB per node), not the nodes' (also every profile exported before this key)")
    ds_config_team: dict[str, Any] | None = Field(
        default=None, description="the team's keys of ds_config.json (optimizer, scheduler, monitors: from "
                                  "--ds-config or hand edits zlayout accepted); absent: zlayout's AdamW")
    hf_config_json: str | None = Field(
        default=None, description="the model's config.json as exported with --hf-config (written beside profile.toml "
                                  "as hf_config.json, hashed in the manifest); inputs.model.hf_config names that copy")
    manifest: dict[str, str] = Field(
        default={}, description="file name -> 'sha256:HEX' of every file written with this profile.toml "
                                "(ds_config.json, launch scripts); empty for a profile.toml on its own")
    alerts: Alerts

    @model_validator(mode="before")
    @classmethod
    def _from_file(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = {k: v for k, v in data.items() if k != "summary"}  # derived: recomputed on save
        version = data.get("schema_version")
        while isinstance(version, int) and version in MIGRATIONS:
            data = MIGRATIONS[version](data)
            version = data.get("schema_version")
        inputs = data.get("inputs")
        if isinstance(inputs, dict):
            # a profile exported before `training.loop` existed was verified with the loss-only loop
            inputs = recorded_inputs(inputs_from_file(inputs))
        if inputs is not None:
            data["inputs"] = without_custom_family(inputs)
        return data

    @model_serializer(mode="wrap")
    def _to_file(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        if isinstance(data.get("inputs"), dict):
            data["inputs"] = inputs_to_file(data["inputs"])
        summary = self.summary().model_dump()
        out: dict[str, Any] = {}
        for key, value in data.items():
            if key == "inputs":
                out["summary"] = summary  # first table: what a person opening the file reads
            out[key] = value
        return out

    def summary(self) -> Summary:
        """The figures that matter, as best known (measured after a complete run), rounded."""
        from zlayout.catalog import format_params

        inp, pred, alerts = self.inputs, self.prediction, self.alerts
        m, hw, v = inp.model, inp.hardware, self.verification
        if v.status == "unverified":
            verdict = f"unverified: predicted by {pred.planner}, not yet run on GPUs"
        else:
            where = f" on {v.gpus}" if v.gpus else ""
            when = f" at {v.when:%Y-%m-%d %H:%M} UTC" if v.when else ""
            verdict = f"{v.status}{where}{when}"
        nodes = f"{hw.nodes} nodes x " if hw.nodes > 1 else ""
        step = alerts.step_time.step_time_s if alerts.step_time else pred.step_time_s
        tokens = v.measured.get("tokens_per_s") if alerts.gpu_memory.basis == "measured" else None
        tokens = tokens if tokens is not None else pred.tokens_per_s
        return Summary(
            verdict=verdict,
            model=f"{m.name}: {format_params(m.params)} parameters, {m.layers} layers, hidden {m.hidden}",
            hardware=f"{nodes}{hw.gpus_per_node}x {hw.gpu.name} ({round_gib(hw.gpu.memory_bytes)} GiB each)",
            layout=self.layout.label, basis=alerts.gpu_memory.basis, fits=pred.fits,
            gpu_peak_allocated_gib=round_gib(alerts.gpu_memory.peak_allocated_bytes),
            gpu_peak_allocated_bytes=alerts.gpu_memory.peak_allocated_bytes,
            gpu_device_used_gib=round_gib(alerts.gpu_memory.device_used_bytes),
            gpu_device_used_bytes=alerts.gpu_memory.device_used_bytes,
            gpu_capacity_gib=round_gib(pred.gpu_capacity_bytes), gpu_capacity_bytes=pred.gpu_capacity_bytes,
            host_peak_gib=round_gib(alerts.host_memory.peak_bytes), host_peak_bytes=alerts.host_memory.peak_bytes,
            host_capacity_gib=round_gib(hw.host_ram_bytes), host_capacity_bytes=hw.host_ram_bytes,
            host_capacity_source=HOST_RAM_SOURCE_TEXT[self.host_ram_source],
            nvme_gib=round_gib(pred.nvme_bytes), nvme_bytes=pred.nvme_bytes,
            checkpoint_gib=None if pred.checkpoint_bytes is None else round_gib(pred.checkpoint_bytes),
            checkpoint_bytes=pred.checkpoint_bytes,
            step_time_s=None if step is None else float(f"{step:.3g}"),
            tokens_per_s=None if tokens is None else round(tokens),
            largest_model_params=self.limits.max_params if self.limits else None,
        )
    @field_validator("manifest")
    @classmethod
    def _manifest_names_files_beside_it(cls, value: dict[str, str]) -> dict[str, str]:
        for name, digest in value.items():
            if not _SET_FILE_NAME.fullmatch(name) or name == "profile.toml":
                raise ValueError(f"manifest: {name!r} is not a file of the profile's set")
            if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
                raise ValueError(f"manifest: {name} must be 'sha256:' and 64 hex digits")
        return value

    @model_validator(mode="after")
    def _script_text_is_one_line(self) -> "Profile":
        """Every string the launch scripts print passes here, however the parts were built
        (pydantic does not revalidate nested instances, and model_copy skips validators)."""
        hw, model = self.inputs.hardware, self.inputs.model
        texts = {"inputs.model.name": model.name, "inputs.model.family": model.family,
                 "inputs.hardware.gpu.name": hw.gpu.name, "inputs.hardware.intra_link.name": hw.intra_link.name,
                 "inputs.hardware.inter_link.name": hw.inter_link.name if hw.inter_link else None}
        for what, text in texts.items():
            if text is not None:
                one_line_text(text, what)
        # after the inputs: the default name and description are made of them
        one_line_text(self.name, "name")
        one_line_text(self.description, "description", 1000)
        one_line_text(self.zlayout_version, "zlayout_version")
        for what, number in (("inputs.hardware.nodes", hw.nodes), ("inputs.hardware.gpus_per_node", hw.gpus_per_node),
                             ("run.master_port", self.run.master_port)):
            if not isinstance(number, int) or isinstance(number, bool) or number <= 0:
                raise ValueError(f"{what} must be a positive integer")
        RunSettings.model_validate(self.run.model_dump())
        if self.ds_config_team is not None:
            from zlayout.profile.team_config import check_team

            try:
                check_team(self.ds_config_team)
            except ValueError as exc:
                raise ValueError(f"ds_config_team.{exc}") from None
        return self

    def plan_input(self) -> PlanInput:
        return self.inputs

    def ds_config(self) -> dict[str, Any]:
        """The DeepSpeed config this profile runs with (what ds_config.json holds)."""
        return ds_config(self.inputs, self.layout, nvme_path=self.run.nvme_path, team=self.ds_config_team)

    @property
    def world(self) -> int:
        return self.inputs.hardware.world

    @property
    def status(self) -> Status:
        return self.verification.status
