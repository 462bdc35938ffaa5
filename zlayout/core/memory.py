"""Memory per GPU, per host and on NVMe for one layout, as named terms.

Pure arithmetic over a `PlanInput`: no I/O, no torch. Each term is one allocation (or one
family of allocations) that DeepSpeed 0.19.8 and PyTorch make, with a line a user can read.

The peak is not the sum of every term: DeepSpeed allocates in phases, and the peak is the
largest phase. `torch.cuda.max_memory_allocated()` sees

* after `deepspeed.initialize`: the resident states (weights, fp32 master, DeepSpeed's
  persistent buffers);
* forward/backward: resident + Adam moments (created lazily by the first `step()`, so from
  step 2 on) + saved activations + the loss's logits + gradient buffers;
* the optimizer step: resident + Adam moments + the gradients flattened and cast to fp32.

Sources for each size are the DeepSpeed 0.19.8 code paths named in each function's docstring;
the activation sizes follow the reference GPT's forward (../shared/reference/ds_probe.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from zlayout.spec import GiB, Layout, ModelSpec, PlanInput, TrainingSpec, ZeroKnobs

Where = Literal["gpu", "host", "nvme"]
Category = Literal["model_states", "activations", "deepspeed_buffers", "overhead"]

FP32_BYTES = 4
ADAM_MOMENTS = 2  # exp_avg and exp_avg_sq, fp32 each

# PyTorch's caching allocator rounds blocks and keeps freed blocks cached; the stage-specific
# fraction below is what `max_memory_reserved` adds over `max_memory_allocated` on the
# measured layouts (benchmarks/accuracy.py prints the error of this estimate).
ALLOCATOR_RESERVE_FRACTION = 0.22

# Resident host memory of one training process before any model state: the Python
# interpreter, torch + CUDA runtime libraries, NCCL, DeepSpeed. Measured as ru_maxrss minus
# the states on the H200 runs (benchmarks/measurements/).
HOST_PROCESS_BASE_BYTES = int(3.0 * GiB)

# Small tensors every step allocates outside the big terms (loss, norms, overflow flags,
# clip coefficients, NCCL staging): measured at about 70 MiB on the reference rows.
MISC_GPU_BYTES = 70 * 2**20


@dataclass(frozen=True, slots=True)
class MemoryTerm:
    name: str
    where: Where
    bytes: int
    category: Category
    explanation: str


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    layout: Layout
    terms: tuple[MemoryTerm, ...]
    gpu_peak_allocated_bytes: int
    gpu_peak_reserved_bytes: int
    gpu_device_used_bytes: int  # reserved + CUDA context: what nvidia-smi shows
    host_peak_bytes: int  # per node
    nvme_bytes: int  # per node
    gpu_capacity_bytes: int
    host_capacity_bytes: int
    nvme_capacity_bytes: int
    gpu_usable_bytes: int  # capacity minus the requested headroom
    peak_phase: str  # "forward", "backward" or "optimizer step"
    after_init_bytes: int  # torch.cuda.memory_allocated() right after deepspeed.initialize

    @property
    def gpu_headroom_bytes(self) -> int:
        return self.gpu_capacity_bytes - self.gpu_device_used_bytes

    @property
    def gpu_headroom_fraction(self) -> float:
        return self.gpu_headroom_bytes / self.gpu_capacity_bytes

    @property
    def fits_gpu(self) -> bool:
        return self.gpu_device_used_bytes <= self.gpu_usable_bytes

    @property
    def fits_host(self) -> bool:
        return self.host_peak_bytes <= self.host_capacity_bytes

    @property
    def fits_nvme(self) -> bool:
        return self.nvme_bytes <= self.nvme_capacity_bytes

    @property
    def fits(self) -> bool:
        return self.fits_gpu and self.fits_host and self.fits_nvme

    @property
    def limited_by(self) -> str | None:
        """The first resource that does not fit, or None."""
        for name, ok in (("gpu", self.fits_gpu), ("host", self.fits_host), ("nvme", self.fits_nvme)):
            if not ok:
                return name
        return None

    def gpu_terms(self) -> tuple[MemoryTerm, ...]:
        return tuple(t for t in self.terms if t.where == "gpu")

    def host_terms(self) -> tuple[MemoryTerm, ...]:
        return tuple(t for t in self.terms if t.where == "host")

    def nvme_terms(self) -> tuple[MemoryTerm, ...]:
        return tuple(t for t in self.terms if t.where == "nvme")

    def gpu_bytes_by_category(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for term in self.gpu_terms():
            out[term.category] = out.get(term.category, 0) + term.bytes
        return out


# --------------------------------------------------------------------------- sizes


def weight_bytes_per_param(training: TrainingSpec) -> int:
    return 4 if training.precision == "fp32" else 2


def activation_bytes_per_element(training: TrainingSpec) -> int:
    return weight_bytes_per_param(training)


def layer_activation_bytes(model: ModelSpec, training: TrainingSpec) -> int:
    """Tensors one transformer block saves for backward, for one micro-batch (no checkpointing).

    Per token, at the activation dtype: the norm inputs and outputs (4h), the fused QKV output
    that scaled_dot_product_attention keeps as q/k/v (h + 2*kv), the attention output and its
    contiguous copy for the output projection (2h), and the MLP: GELU keeps its input and
    output (2*ffn); SwiGLU keeps the gate/up projection (2*ffn), SiLU's output and the product
    (2*ffn). Flash attention stores no seq x seq matrix, only a float32 log-sum-exp per head.
    Norms keep float32 statistics per token.
    """
    h, kv, f = model.hidden, model.kv_size, model.ffn_size
    elem = activation_bytes_per_element(training)
    mlp = (4 if model.mlp == "swiglu" else 2) * f
    per_token = elem * (4 * h + (h + 2 * kv) + 2 * h + mlp)
    stats_per_token = FP32_BYTES * ((2 if model.norm == "layernorm" else 1) * 2 + model.heads)
    if not training.flash_attention:
        # The math kernel materialises softmax probabilities (and their dropout-free copy).
        per_token += elem * model.heads * training.seq
    return tokens_per_micro_batch(training) * (per_token + stats_per_token)


def tokens_per_micro_batch(training: TrainingSpec) -> int:
    return training.micro_batch * training.seq


def saved_activation_bytes(model: ModelSpec, training: TrainingSpec) -> int:
    """Activations alive at the end of the forward pass, all layers."""
    if training.checkpointing == "full":
        # Non-reentrant checkpointing keeps only each block's input.
        elem = activation_bytes_per_element(training)
        return model.layers * tokens_per_micro_batch(training) * model.hidden * elem
    return model.layers * layer_activation_bytes(model, training)


def recompute_bytes(model: ModelSpec, training: TrainingSpec) -> int:
    """With checkpointing, one block's activations are rebuilt during its backward."""
    if training.checkpointing == "full":
        return layer_activation_bytes(model, training)
    return 0


def head_activation_bytes(model: ModelSpec, training: TrainingSpec) -> int:
    """Saved at the head: the final norm's input and the head's input (bf16), and the float32
    log-softmax that cross-entropy keeps for backward."""
    tokens = tokens_per_micro_batch(training)
    elem = activation_bytes_per_element(training)
    return tokens * (2 * model.hidden * elem + FP32_BYTES * model.vocab)


def logits_transient_bytes(model: ModelSpec, training: TrainingSpec) -> int:
    """The loss computed on logits cast to float32 briefly holds, per token: the logits (bf16),
    the shifted contiguous copy (bf16) and its float32 cast, on top of the saved log-softmax.
    The same amount is live again at the start of backward (float32 gradient of the logits,
    its bf16 cast and the padded gradient of the un-shifted logits)."""
    elem = activation_bytes_per_element(training)
    return tokens_per_micro_batch(training) * model.vocab * (2 * elem + FP32_BYTES)


# ------------------------------------------------------------------ DeepSpeed's buffers


def ipg_bucket_bytes(zero: ZeroKnobs, stage: int, training: TrainingSpec, offload: bool) -> int:
    """Stage 1/2: `setup_buckets` allocates `reduce_bucket_size` elements at the gradient dtype
    for the first backward hook, and a second one when `overlap_comm` double-buffers.
    Stage 3: one flat IPG bucket of `reduce_bucket_size`, allocated at initialization."""
    elem = weight_bytes_per_param(training)
    if stage in (1, 2):
        return zero.reduce_bucket_size * elem * (2 if zero.overlap_comm else 1)
    if stage == 3 and zero.contiguous_gradients:
        return zero.reduce_bucket_size * elem
    return 0


def stage0_allreduce_bucket_bytes(zero: ZeroKnobs, params: int, world: int, training: TrainingSpec) -> int:
    """Stage 0 on several GPUs flattens gradients into buckets for the data-parallel all-reduce."""
    if world == 1:
        return 0
    return min(zero.reduce_bucket_size, params) * weight_bytes_per_param(training)


def stage3_live_param_bytes(model: ModelSpec, zero: ZeroKnobs, training: TrainingSpec) -> int:
    """Stage 3 re-gathers each layer's full weights for forward and backward; weights whose next
    use is within `stage3_max_reuse_distance` elements stay gathered across the
    forward->backward turn (the last blocks and the head), capped by `max_live_parameters`."""
    kept = min(zero.stage3_max_reuse_distance, zero.stage3_max_live_parameters, model.params)
    prefetch = zero.stage3_prefetch_bucket_size
    largest = model.largest_tensor_numel()
    return (max(kept, largest) + prefetch) * weight_bytes_per_param(training)


def persistent_small_param_bytes(model: ModelSpec, zero: ZeroKnobs, training: TrainingSpec) -> int:
    """Stage 3 keeps parameters under `stage3_param_persistence_threshold` elements gathered
    on every GPU (norm weights, biases): no all-gather for them, whole copies instead."""
    threshold = zero.stage3_param_persistence_threshold
    h, kv, f = model.hidden, model.kv_size, model.ffn_size
    small_per_layer = [n for n in _layer_tensor_sizes(model) if n < threshold]
    total = model.layers * sum(small_per_layer)
    total += sum(n for n in (model.final_norm_params(),) if n < threshold)
    del h, kv, f
    return total * weight_bytes_per_param(training)


def _layer_tensor_sizes(model: ModelSpec) -> list[int]:
    h, kv, f = model.hidden, model.kv_size, model.ffn_size
    sizes = [h * (h + 2 * kv), h * h, (2 if model.mlp == "swiglu" else 1) * f * h, f * h]
    norm = [h, h] if model.norm == "layernorm" else [h]
    sizes += norm * 2
    has_qkv_bias = model.bias if model.qkv_bias is None else model.qkv_bias
    if has_qkv_bias:
        sizes.append(h + 2 * kv)
    if model.bias:
        sizes += [h, (2 if model.mlp == "swiglu" else 1) * f, h]
    return sizes


# ------------------------------------------------------------------ the estimate


def estimate_memory(inp: PlanInput, layout: Layout) -> MemoryEstimate:
    """Peak GPU (allocated and reserved), host and NVMe bytes for one layout."""
    model, training, hw, zero = inp.model, inp.training, inp.hardware, inp.zero
    p, n, stage = model.params, hw.world, layout.stage
    w = weight_bytes_per_param(training)
    opt_on_gpu = layout.offload_optimizer == "gpu"
    param_on_gpu = layout.offload_param == "gpu"
    # The fp32 precision keeps no separate master copy.
    master_bytes = 0 if training.precision == "fp32" else FP32_BYTES * p
    shard = n if stage >= 1 else 1

    gpu: list[MemoryTerm] = []
    host: list[MemoryTerm] = []
    nvme: list[MemoryTerm] = []

    ranks = hw.gpus_per_node

    def add(where: Where, name: str, nbytes: int, category: Category, why: str) -> MemoryTerm:
        """GPU terms are per GPU; host and NVMe terms are per node (all its ranks)."""
        per_gpu = int(nbytes)
        if where != "gpu" and ranks > 1:
            why += f" (x{ranks} ranks on the node)"
        node_term = MemoryTerm(name, where, per_gpu * (ranks if where != "gpu" else 1), category, why)
        {"gpu": gpu, "host": host, "nvme": nvme}[where].append(node_term)
        return MemoryTerm(name, where, per_gpu, category, why)

    # --- model states ------------------------------------------------------------
    param_shard = n if stage == 3 else 1
    param_where: Where = {"gpu": "gpu", "cpu": "host", "nvme": "nvme"}[layout.offload_param]
    params_term = add(param_where, "parameters", w * p // param_shard, "model_states",
                      f"{training.precision} weights" + (f", 1/{n} per GPU (ZeRO-3)" if stage == 3 else
                                                         ", a full copy on every GPU"))
    opt_where: Where = {"gpu": "gpu", "cpu": "host", "nvme": "nvme"}[layout.offload_optimizer]
    master_term = add(opt_where, "master_weights", master_bytes // shard, "model_states",
                      "fp32 master copy of the weights the optimizer updates"
                      + (f", 1/{n} per GPU" if shard > 1 else ""))
    moments_term = add(opt_where, "adam_moments", ADAM_MOMENTS * FP32_BYTES * p // shard, "model_states",
                       "AdamW exp_avg + exp_avg_sq in fp32; created lazily by the first step()")

    if stage == 0:
        grads = add("gpu", "gradients", w * p, "model_states",
                    f"{training.precision} .grad of every weight, full size, alive from backward to step")
    elif stage in (1, 2):
        grads = add("gpu" if opt_on_gpu else "gpu", "gradients",
                    (w * p // n) if opt_on_gpu else 0, "model_states",
                    f"{training.precision} gradient partition (contiguous_gradients), 1/{n} per GPU"
                    if opt_on_gpu else "gradients stream to the host optimizer; none kept on the GPU")
    else:
        grad_where: Where = "gpu" if opt_on_gpu else "host"
        grads = add(grad_where, "gradients", w * p // n, "model_states",
                    f"flat {training.precision} gradient partition allocated at initialization, 1/{n} per GPU")
    if stage == 0 and training.precision != "fp32":
        # FP16_Optimizer-style wrapper: step() casts every gradient to fp32 one by one, then
        # flattens the list: both copies are briefly alive.
        step_grad_fp32 = 2 * FP32_BYTES * p
    elif stage in (1, 2) and opt_on_gpu:
        # flatten(averaged_gradients) (a gradient-dtype copy) then .to(fp32)
        step_grad_fp32 = w * p // n + FP32_BYTES * p // n
    elif stage == 3 and opt_on_gpu:
        # per sub-group: flatten(...).to(fp32); sub-groups are at most sub_group_size elements
        step_grad_fp32 = FP32_BYTES * min(zero.sub_group_size, -(-p // n))
    else:
        step_grad_fp32 = 0
    step_term = add("gpu", "step_fp32_gradients", step_grad_fp32, "deepspeed_buffers",
                    "gradients flattened and cast to fp32 inside step() (freed after the update)")

    # --- DeepSpeed buffers -------------------------------------------------------
    ipg = add("gpu", "reduce_buckets", ipg_bucket_bytes(zero, stage, training, not opt_on_gpu),
              "deepspeed_buffers",
              f"reduce_bucket_size={zero.reduce_bucket_size:.0e} elements"
              + (" x2 (overlap_comm double-buffers)" if zero.overlap_comm and stage in (1, 2) else "")
              if stage else "stage 0 has no IPG buckets")
    allreduce = add("gpu", "allreduce_bucket", stage0_allreduce_bucket_bytes(zero, p, n, training) if stage == 0 else 0,
                    "deepspeed_buffers", "stage 0: flattened gradient bucket for the data-parallel all-reduce")
    offload_staging = 0
    if stage in (1, 2) and not opt_on_gpu:
        # temp_grad_buffer_for_gpu_offload: the largest parameter, at the gradient dtype.
        offload_staging = model.largest_tensor_numel() * w
    offload_term = add("gpu", "offload_staging", offload_staging, "deepspeed_buffers",
                       "GPU staging buffer for gradients copied to the host optimizer (largest tensor)")
    live = persistent = 0
    if stage == 3:
        live = stage3_live_param_bytes(model, zero, training)
        persistent = persistent_small_param_bytes(model, zero, training)
    live_term = add("gpu", "stage3_live_parameters", live, "deepspeed_buffers",
                    f"ZeRO-3 gathered weights: up to max_reuse_distance/max_live_parameters "
                    f"({zero.stage3_max_live_parameters:.0e}) kept between forward and backward, "
                    f"plus the prefetch bucket ({zero.stage3_prefetch_bucket_size:.0e})")
    persist_term = add("gpu", "stage3_persistent_parameters", persistent, "deepspeed_buffers",
                       f"ZeRO-3 keeps tensors under {zero.stage3_param_persistence_threshold:.0e} "
                       "elements (norms, biases) whole on every GPU")

    # --- activations -------------------------------------------------------------
    saved = add("gpu", "activations", saved_activation_bytes(model, training), "activations",
                f"{model.layers} blocks x micro-batch {training.micro_batch} x seq {training.seq}"
                + (": only block inputs (checkpointing)" if training.checkpointing == "full"
                   else " (flash attention: no seq x seq matrix)"))
    recompute = add("gpu", "recompute", recompute_bytes(model, training), "activations",
                    "one block's activations rebuilt during its backward (checkpointing)")
    head = add("gpu", "head_activations", head_activation_bytes(model, training), "activations",
               "head input and the fp32 log-softmax cross-entropy keeps")
    logits = add("gpu", "logits_transient", logits_transient_bytes(model, training), "activations",
                 "logits, their shifted copy and fp32 cast while the loss is computed")
    misc = add("gpu", "misc", MISC_GPU_BYTES, "overhead", "loss, norms, flags and small NCCL buffers")

    # --- phases ------------------------------------------------------------------
    resident = (params_term.bytes * (param_where == "gpu") + master_term.bytes * opt_on_gpu
                + ipg.bytes * (stage == 3) + persist_term.bytes
                + (grads.bytes if stage == 3 and opt_on_gpu else 0) + offload_term.bytes)
    if stage == 0:
        # FP16_Optimizer's initialize_optimizer_states runs one step: moments exist from init.
        resident += moments_term.bytes
        lazy_moments = 0
    else:
        lazy_moments = moments_term.bytes * opt_on_gpu
    after_init = resident
    forward = resident + lazy_moments + saved.bytes + head.bytes + logits.bytes + live_term.bytes \
        - (head.bytes - tokens_per_micro_batch(training) * model.hidden * 2 * activation_bytes_per_element(training))
    backward_grads = {0: grads.bytes, 3: 0}.get(stage, grads.bytes if opt_on_gpu else 0)
    backward = (resident + lazy_moments + saved.bytes + head.bytes + logits.bytes + recompute.bytes
                + live_term.bytes + ipg.bytes * (stage in (1, 2)) + allreduce.bytes
                + backward_grads * 0.5 + model.head_params() * w * (stage != 0))
    if stage == 0:
        step_peak = resident + grads.bytes + step_term.bytes
    elif stage in (1, 2):
        step_peak = resident + lazy_moments + grads.bytes + step_term.bytes
    else:
        step_peak = resident + lazy_moments + step_term.bytes
    phases = {"forward": forward, "backward": backward, "optimizer step": step_peak}
    peak_phase = max(phases, key=phases.__getitem__)
    peak = int(phases[peak_phase]) + misc.bytes
    reserved = int(peak * (1 + ALLOCATOR_RESERVE_FRACTION))
    device_used = reserved + hw.gpu.cuda_context_bytes
    add("gpu", "allocator_reserve", reserved - peak, "overhead",
        "PyTorch caching allocator: freed blocks kept for reuse, block rounding")
    add("gpu", "cuda_context", hw.gpu.cuda_context_bytes, "overhead",
        "CUDA context, cuBLAS and NCCL workspaces outside PyTorch's allocator")

    # --- host and NVMe (per node) --------------------------------------------------
    add("host", "process_baseline", HOST_PROCESS_BASE_BYTES, "overhead",
        f"Python, torch, CUDA and NCCL libraries, {HOST_PROCESS_BASE_BYTES / GiB:.1f} GiB per rank")
    if stage < 3:
        add("host", "model_construction", FP32_BYTES * p, "model_states",
            "each rank builds the model in fp32 on the host before DeepSpeed moves it "
            "(stage 3 builds it partitioned on the GPU under zero.Init)")
    pinned_staging = 0
    if not opt_on_gpu and stage in (1, 2):
        # fp32 gradient partition (pinned) + the bf16 copy of the partition for upload.
        pinned_staging = (FP32_BYTES + w) * p // n
    elif not opt_on_gpu and stage == 3:
        pinned_staging = FP32_BYTES * p // n  # fp32 sub-group gradient buffers (pinned)
    if pinned_staging:
        add("host", "offload_pinned_buffers", pinned_staging, "deepspeed_buffers",
            "pinned fp32 gradient partition (and bf16 upload copy)")
    host_peak = sum(t.bytes for t in host)
    nvme_total = sum(t.bytes for t in nvme)
    terms = tuple(t for t in gpu + host + nvme if t.bytes or t.name == "process_baseline")

    cap = hw.gpu.memory_bytes
    return MemoryEstimate(
        layout=layout, terms=terms,
        gpu_peak_allocated_bytes=peak, gpu_peak_reserved_bytes=reserved,
        gpu_device_used_bytes=device_used, host_peak_bytes=host_peak, nvme_bytes=nvme_total,
        gpu_capacity_bytes=cap, host_capacity_bytes=hw.host_ram_bytes,
        nvme_capacity_bytes=hw.nvme_bytes,
        gpu_usable_bytes=int(cap * (1 - inp.headroom_fraction)),
        peak_phase=peak_phase, after_init_bytes=after_init,
    )
