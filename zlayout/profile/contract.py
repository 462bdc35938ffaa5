"""What the training script must do for the profile's figures to hold: the plan's assumptions about
the team's own code, each with the figure it protects (the plan's, against what the planner gives
when the script does otherwise), for RUNBOOK.md's "What the training script must do".

A ZeRO-3 model built in fp32 on every rank instead of under deepspeed.zero.Init made a profile's host
peak about 9x the plan (229 against 24.3 GiB per node); eager attention, unpadded long batches or a
loop that keeps the outputs move the GPU peak the same way. The figures are the planner's, from the
profile's inputs with the one assumption changed.
"""

from __future__ import annotations

from dataclasses import dataclass

from zlayout.core.card import STATE_SPACE_KERNELS, STATE_SPACE_TORCH, TORCH_LOOP_ACTIVATIONS
from zlayout.core.memory import card_of, model_init
from zlayout.core.tensors import misaligned_weights
from zlayout.profile.schema import Profile
from zlayout.profile.summary import gib
from zlayout.spec import BOUNDS, PlanInput


@dataclass(frozen=True, slots=True)
class Requirement:
    what: str  # what the script must do
    how: str  # the code or setting that does it
    protects: str  # the figure it protects, and what the other way costs


def _peaks(inp: PlanInput, profile: Profile, **training) -> tuple[int, int] | None:
    """(GPU peak allocated, host peak) with the training inputs changed; None when the change is
    outside what the planner takes."""
    from zlayout.profile.build import predict

    try:
        changed = inp.model_copy(update={"training": inp.training.model_copy(update=training)})
        prediction = predict(PlanInput.model_validate(changed.model_dump()), profile.layout)
    except (ValueError, ArithmeticError):
        return None
    return prediction.gpu_peak_allocated_bytes, prediction.host_peak_bytes


def _times(after: int, before: int) -> str:
    if before and after / before >= 1.05:
        return f", {after / before:.1f}x"
    return " (no more here)" if after <= before * 1.05 else ""


def script_contract(profile: Profile) -> list[Requirement]:
    inp, pred, layout = profile.inputs, profile.prediction, profile.layout
    t, hw = inp.training, inp.hardware
    gpu_plan, host_plan = pred.gpu_peak_allocated_bytes, pred.host_peak_bytes
    hf = t.impl == "hf"
    out: list[Requirement] = []

    init = model_init(t.init, layout.stage)
    fp32 = _peaks(inp, profile, init="fp32-cpu") if init != "fp32-cpu" else None
    other = "" if fp32 is None else (f"; built in fp32 on the host by every rank it is {gib(fp32[1])} per node"
                                     f"{_times(fp32[1], host_plan)}")
    build = {
        "zero-init": ("Build the model under `deepspeed.zero.Init`, so each rank only ever holds its ZeRO-3 "
                      "partition of the weights",
                      "`with deepspeed.zero.Init(config_dict_or_path=args.deepspeed_config): model = build()` "
                      + ("(transformers: `from_pretrained` does this itself when `HfDeepSpeedConfig` is "
                         "created first)" if hf else "")),
        "fp32-cpu": ("Build the model once per rank, in fp32 on the host, then hand it to deepspeed.initialize "
                     "(the plan counts that copy; a second one, or keeping the host copy, is not counted)",
                     "`model = build()` then `deepspeed.initialize(model=model, ...)`; no `.to()` copies kept"),
        "bf16-gpu": ("Build the model in bf16 directly on the GPU",
                     "`torch.set_default_dtype(torch.bfloat16)`; `with torch.device('cuda'): model = build()`"
                     + (" (transformers: `torch_dtype=torch.bfloat16, device_map={'': local_rank}`)" if hf else "")),
        "meta": ("Build the model on the meta device and materialise it on the GPU",
                 "`with torch.device('meta'): model = build()`, then `model.to_empty(device='cuda')` and load "
                 "the weights"),
    }[init]
    out.append(Requirement(build[0], build[1], f"host peak {gib(host_plan)} per node{other}"))

    if t.flash_attention:
        eager = _peaks(inp, profile, flash_attention=False)
        how = ("`attn_implementation=\"sdpa\"` (or \"flash_attention_2\") when loading the model" if hf
               else "fused attention (`torch.nn.functional.scaled_dot_product_attention`), never a materialised "
                    "softmax(QK^T)")
        cost = "" if eager is None else (f"; eager attention, which materialises {t.seq:,}^2 scores per head, "
                                         f"gives {gib(eager[0])}{_times(eager[0], gpu_plan)}")
        out.append(Requirement("Use memory-efficient attention", how,
                               f"GPU peak {gib(gpu_plan)} allocated per GPU{cost}"))

    card = card_of(inp.model, t)
    if card is not None and card.linear_attention == STATE_SPACE_TORCH:
        # the card priced transformers' torch reference scan (core.card.STATE_SPACE_TORCH)
        out.append(Requirement(
            "Train the Mamba-2 blocks with transformers' torch reference, as planned: an environment without "
            "mamba-ssm and causal-conv1d (transformers warns that `mamba_chunk_scan_combined` is \"falling back to "
            "its reference PyTorch implementation\")",
            "`python -c 'import mamba_ssm'` fails in the job's environment; with mamba-ssm installed the run keeps "
            "less and steps faster than this profile says, and `zlayout verify` stops before training rather than "
            "compare",
            f"GPU peak {gib(gpu_plan)} allocated per GPU, priced as the torch reference"))
    elif card is not None and card.linear_attention == STATE_SPACE_KERNELS:
        # the card priced mamba-ssm's selective scan and causal-conv1d's kernel (core.card.STATE_SPACE_KERNELS)
        out.append(Requirement(
            "Install mamba-ssm and causal-conv1d in the environment the job runs in, so that transformers binds "
            "the selective-scan and convolution kernels when it imports the model",
            "`pip install mamba-ssm causal-conv1d --no-build-isolation` (both build against the node's CUDA); "
            "transformers warns that `selective_scan_fn` is \"falling back to its reference PyTorch implementation\" "
            "when they do not import, and then loops over every token; `zlayout verify` stops before training then",
            f"GPU peak {gib(gpu_plan)} allocated per GPU, priced with those kernels (not yet measured on a GPU)"))
    elif card is not None and card.linear_attention_note() is not None:
        # the card priced fla's and causal-conv1d's kernels (core.card.LINEAR_ATTENTION_FLA); transformers
        # binds them only where they import when it imports the model (learn/trace.py)
        out.append(Requirement(
            "Install flash-linear-attention and causal-conv1d in the environment the job runs in, so that "
            "transformers binds its fused linear-attention kernels when it imports the model",
            "`pip install flash-linear-attention causal-conv1d` (causal-conv1d builds against the node's CUDA); "
            "on Hopper GPUs (H100, H200) also `pip install tilelang`, or a torch built with Triton 3.7.1 or later: "
            "fla's gated backward stops under Triton 3.4.0 up to 3.7.1 there (fla issue #640); "
            "transformers warns that `chunk_gated_delta_rule` is \"falling back to its reference PyTorch "
            "implementation\" when they do not import; `zlayout verify` stops before training then",
            f"GPU peak {gib(gpu_plan)} allocated per GPU, priced with those kernels (not yet measured on a GPU); "
            f"transformers' torch loop keeps about {TORCH_LOOP_ACTIVATIONS:.1f}x the linear blocks' activations"))

    longer = int(min(2 * t.seq, BOUNDS["seq"].high))
    long = _peaks(inp, profile, seq=longer) if longer > t.seq else None
    cost = "" if long is None else f"; batches of {longer:,} tokens need {gib(long[0])}{_times(long[0], gpu_plan)}"
    out.append(Requirement(
        f"Feed micro-batches of {t.micro_batch} sequence(s) of at most {t.seq:,} tokens per rank: pad or cut "
        "every batch to the planned sequence (a long document or a collator without `max_length` makes a "
        "longer one)",
        f"`tokenizer(..., max_length={t.seq}, truncation=True, padding=\"max_length\")`; "
        f"`train_micro_batch_size_per_gpu` {t.micro_batch} comes from ds_config.json",
        f"GPU peak {gib(gpu_plan)} allocated per GPU{cost}"))

    if t.checkpointing == "full":
        none = _peaks(inp, profile, checkpointing="none")
        cost = "" if none is None else f"; without it {gib(none[0])}{_times(none[0], gpu_plan)}"
        out.append(Requirement(
            "Checkpoint the activations of every transformer block",
            "`model.gradient_checkpointing_enable()` (transformers), or `torch.utils.checkpoint.checkpoint` "
            "around each block" if hf else "`torch.utils.checkpoint.checkpoint` around each block",
            f"GPU peak {gib(gpu_plan)} allocated per GPU{cost}"))

    loop_other = "trainer" if t.loop == "deepspeed" else "deepspeed"
    switched = _peaks(inp, profile, loop=loop_other)
    cost = "" if switched is None else f"; the {loop_other} loop gives {gib(switched[0])}{_times(switched[0], gpu_plan)}"
    if t.loop == "deepspeed":
        what = ("Run the loop DeepSpeed's examples write: `outputs = engine(batch)`, `engine.backward(outputs.loss)`, "
                "`engine.step()` (the plan counts the outputs, bf16 logits of tokens x vocab, held until the "
                "next forward)")
        how = "planned with `--loop deepspeed`; a loop that drops the outputs once the loss is taken needs less"
    else:
        what = ("Drop the model's outputs once the loss is taken, as Hugging Face's Trainer does: "
                "`loss = engine(batch).loss`, no reference to the logits kept across `backward`")
        how = "planned with `--loop trainer`; keeping `outputs` alive until the next forward needs more"
    out.append(Requirement(what, how, f"GPU peak {gib(gpu_plan)} allocated per GPU{cost}"))

    out.append(Requirement(
        "Accept `--local_rank` and put each rank on its own GPU before building the model",
        "`parser.add_argument('--local_rank', type=int, default=int(os.environ.get('LOCAL_RANK', -1)))` "
        "(the deepspeed launcher passes the flag; torchrun sets LOCAL_RANK); "
        "`torch.cuda.set_device(local_rank)`; `deepspeed.add_config_arguments(parser)` for `--deepspeed_config`",
        f"one rank per GPU: {gib(gpu_plan)} allocated per GPU; {hw.gpus_per_node} ranks on GPU 0 would need "
        f"{gib(gpu_plan * hw.gpus_per_node)} on one card"))

    out.append(Requirement(
        "Leave through the process group: after the last step every rank waits for the others, then destroys "
        "the group",
        "`torch.distributed.barrier()` then `torch.distributed.destroy_process_group()` at the end of the script",
        "the job's exit status: a rank that exits with the group alive can abort in NCCL's or gloo's destructors "
        "(`terminate called without an active exception`, SIGABRT) after every step ran, and the scheduler then "
        "records a finished run as FAILED (seen on the exported launch_slurm.sbatch with gloo, 2026-12-03)"))

    if layout.stage in (1, 2) and (misaligned := misaligned_weights(inp)):
        grouped = set(inp.model.card.grouped_gemm_weights) & set(misaligned)
        out.append(Requirement(
            "Keep ds_config.json's `zero_optimization.parameter_alignment`, and resume only from checkpoints "
            "saved with it",
            f"zlayout set it: packed without padding, {len(misaligned)} of the weights would start off a 16-byte "
            "boundary; DeepSpeed refuses to load a ZeRO-1/2 checkpoint saved with the other setting "
            "(stage_1_and_2.py), so a run resumed from one saved without it keeps that run's setting",
            f"step time {pred.step_time_s:.3f} s (weights off a boundary run their GEMMs on cuBLAS's 2- or "
            "4-element kernels)" + ("; without it torch's grouped GEMM refuses the experts at the first forward "
                                    "(\"expected data_ptr to be aligned to 16 bytes\")" if grouped else "")))
    return out
