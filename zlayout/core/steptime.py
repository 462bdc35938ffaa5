"""Step time per layout: the passes' GPU work and host overheads, the communication that cannot
hide, the offload.

The GPU-resident step is modelled phase by phase, as `zlayout verify` times it (forward, backward,
optimizer); `micro_step_work` counts what each pass of a micro-step does and a handful of
constants, fitted by `benchmarks/steptime_fit.py` on the measured phases (docs/tradeoffs.md:
the values, the evidence, in-sample, leave-one-out and held-out errors), price it:

- GEMMs: 2 FLOPs per active block and head parameter per token forward, twice that backward,
  the blocks' forward again with full checkpointing (the head is never recomputed), at an
  efficiency that grows with the hidden size (`GEMM_EFFICIENCY` * h / (h + `GEMM_HALF_WIDTH`));
  the head's GEMMs much slower when the vocabulary is not a multiple of 8.
- Flash attention: 4 x layers x q width x seq FLOPs per token forward, halved by the causal
  kernel; backward 2.5 forwards' FLOPs, the recompute one more. Each at the kernels' measured
  efficiency for the head size, the sequence and the call's query tiles, forward and backward
  apart, with or without dropout (`ATTENTION_KERNEL_EFFICIENCY`, `attention_kernel_s`).
  Given an explicit mask (a sliding window past its width; a card's `masked_attention_*` ops) the
  full square, at `MASKED_ATTENTION_EFFICIENCY`.
- Elementwise, norm, activation, rotary, loss and gradient-bookkeeping work: counted HBM bytes at
  80% of the HBM bandwidth; transformers classes (`impl = "hf"`) add their unfused RMSNorm,
  rotary and repeat_kv bytes.
- A carded model (`--impl hf` with a model card that records its work, `card_work`): GEMMs, eager
  attention's batched matmuls, the fused attention kernels, the memory-bound ops' bytes, the
  kernel launches and the ops that launch them come from the card, op by op as the transformers
  class runs them, priced with the same constants; the per-family counts below (kernels,
  elementwise bytes, the loss's bytes per logit) are the model for everything else (`hand_work`).
  docs/memory-model.md, "Model cards".
- The host's side of a pass (`host_pass_s`): a time per op it issues, one kernel each (kernels
  counted per block: transformers classes launch about three times as many; an op of several
  kernels, a sort's radix passes, a launch's time for each further one), a fixed part per forward,
  stages 1-2's gradient hooks, all measured on the host-floor rows (128 tokens a micro-step, where
  the kernels take microseconds); stage 3's hooks (per module per pass: forward, backward, the
  recompute's forward; per parameter tensor: the backward's gradient hook) on top. The host runs
  ahead of the kernels (nothing in a pass waits on the compute stream), so a pass takes a smooth
  maximum of its GPU side and its host side (`pass_s`): the GPU's time on a large model, the
  host's on a small one, more than either where the two are close.
- The optimizer phase: the GPU optimizer's HBM passes over the rank's partition at the
  (lower) rate its kernels reach, the engine's Python per parameter tensor (stages 1-2; stage 3:
  its per-gradient norm kernels) and per step; ZeRO-0's FP16_Optimizer per parameter tensor (its
  overflow check syncs on each), with no fixed part; offloaded, the CPU optimizer below.
- Communication: each collective's bytes over the bus bandwidth of the link it crosses
  (intra- vs inter-node, the slower share paces the ring), plus a latency per ring step.
  What overlaps: stage 1-3 gradient reductions run in the backward hooks on a side stream
  with overlap_comm, hidden behind the backward pass except the last bucket; stage 3's
  prefetch hides part of the parameter all-gathers behind forward and backward; stage 0's
  all-reduce and stage 1-2's post-step all-gather are fully exposed.
- The large-vocabulary loss: the head's logits matmul is in the GEMMs (never recomputed:
  checkpointing wraps the blocks); the softmax/cross-entropy passes over tokens x vocab (a bf16
  slice copy, the fp32 cast, log-softmax and its backward) are memory-bound: bytes per logit.
- Offload: PCIe copies at the GPU's achieved host<->device bandwidth (gradients going down
  overlap with backward, parameters coming up after the step do not); the CPU optimizer
  step (DeepSpeedCPUAdam plus gradient clipping and the fp32->bf16 cast) per parameter at
  one thread, over the threads each rank runs with (cores per node / ranks per node, as
  the launchers zlayout writes set OMP_NUM_THREADS) on a measured scaling curve, and never
  faster than the node's host memory bandwidth shared by its GPUs allows; NVMe reads and
  writes at the node's NVMe bandwidth, not overlapped.
- What the plan and the app show (`step_time_parts`): the step part by part, and a host-bound note
  where the host's unhidden side is a quarter of the step or more: that side is the host's Python,
  which runs at different speeds in different processes on one host (one layout: 0.197-0.359 s over
  six runs), so such a figure is a median, not a bound.
- A calibration (`PlanInput.calibration`, from `zlayout calibrate`) scales the four groups
  of parts: GPU kernels, Python overheads (the host's side of a pass, the per-step part), the CPU
  optimizer, exposed transfers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from zlayout.core.comm import Collective, CommEstimate, estimate_comm, stage3_fetched_modules
from zlayout.core.tensors import gemm_weight_alignment
from zlayout.spec import Layout, LinkSpec, PlanInput

# The GPU-resident step, phase by phase: forward, backward (with checkpointing's recompute), and
# the optimizer step, each priced from the work it does. The fitted constants (benchmarks/
# steptime_fit.py fits them by least squares on the forward/backward/optimizer times verify
# records, and on whole steps where a row has no phases; docs/tradeoffs.md lists the evidence):
# float32 matmuls without TF32 (PyTorch's default, torch.backends.cuda.matmul.allow_tf32 False) run
# on the CUDA cores: H100/H200 SXM 67 TFLOP/s against 989 dense bf16 (NVIDIA's H100 datasheet),
# A100 19.5 against 312. Profiled on one H200 (h200-2026-12-12 profiles/, Falcon-7B's math attention at
# 6 layers, 2 x 2048 and 4 x 1024: cuBLAS's sm80_xmma ffma kernels): 39.6 and 42.4 TFLOP/s in the forward
# and backward, 59% and 63% of the 67; priced at 0.61 (they were at the bf16 GEMMs' 0.711: 16% fast).
FP32_NON_TENSOR_FRACTION = 67 / 989
FP32_GEMM_EFFICIENCY = 0.61
GEMM_EFFICIENCY = 0.711  # large GEMMs' achieved / peak bf16 FLOP/s (the asymptote in the hidden size)
# A GEMM of hidden size h reaches GEMM_EFFICIENCY * h / (h + GEMM_HALF_WIDTH): the narrow GEMMs of a
# small model fill fewer tiles per wave and spend more of their time in prologue and epilogue.
GEMM_HALF_WIDTH = 140
# A vocabulary that is not a multiple of 8 leaves the logits' rows misaligned for 16-byte tensor-core
# loads (GPT-2's 50257; nanoGPT pads it to 50304 for this): the head's three GEMMs and the loss's
# passes run on slower kernels, the head's GEMMs at this achieved / peak.
UNALIGNED_HEAD_EFFICIENCY = 0.127
# A vocabulary of an even size that is not a multiple of 8 (CTRL's 246,534, openai-gpt's 40,478,
# BigBird's 50,358) aligns its rows to 2 or 4 elements: cuBLAS then runs CUTLASS's sm80 16816
# kernels for 2-element alignment, not the sm75 1688 ones an odd vocabulary gets. FITTED (in-sample)
# on one profile: CTRL at 16 layers, 32 x 256 tokens, one H100 (h200-2026-12-31 profiles/prof-12:
# the head's three GEMMs, 5.17 TFLOP each, in 20.06, 19.96 and 18.53 ms: 0.268 of the peak, where the
# odd vocabularies' run at 0.10-0.15: GPT-2, granite-3.0-1b in h200-2026-12-13/-16's profiles).
HALF_ALIGNED_HEAD_EFFICIENCY = 0.268
# Memory-bound kernels on misaligned tensors (a card's `elementwise_unaligned`: rows of an odd
# length, strided slices) run without vector loads, at this share of the aligned ones' bandwidth.
# FITTED (in-sample) on one row: GPT-OSS-20B cut to 4 layers, ZeRO-2, 4096 tokens (h200-2026-12-06,
# results/results-j.jsonl line 2): its eager attention with sinks works on rows of T + 1 logits, and
# the fraction that makes the forward and backward's sum the run's is 0.347 (forward -23%, backward
# +18% there: the phases' split is not modelled; its profile, results/prof-2-batch-heldout-j.json,
# has the concatenation and softmax forward far slower than their backward). Held out, batch k
# (h200-2026-12-07, predicted with 0.36, fitted when any misaligned tensor, the loss's labels too,
# made an op misaligned): four rows within -12.2..+11.2%. Not fitted on, moved by it: GPT-2-medium
# (h200-2026-12-02c, vocabulary 50257: the loss's passes) -5.7% -> +1.3%.
# REFITTED (same row, in-sample) to 0.305 once an elementwise op or copy walked as one contiguous run
# counts as misaligned only where an operand starts off a 16-byte boundary (zlayout.learn.trace.
# _one_walk: GPT-2's logits cast to float32, rows of 50257, runs vectorized; h200-2026-12-13
# profiles/prof-1: its log-softmax, row by row, ran at 2.3 TB/s forward and 3.0 backward), and the
# broadcast ops among the sinks' are strided: that row -5.7% at 0.347 -> -1.4%; held out (batch k's
# GPT-OSS rows) -11.3% -> -11.9% and -5.1% -> -6.4%; GPT-2 at micro-batch 48 (h200-2026-12-05)
# +16.4% -> +14.0%.
UNALIGNED_HBM_FRACTION = 0.305
# Pointwise ops over a broadcast or strided operand (a card's `elementwise_strided`,
# not zlayout.learn.trace._one_walk) run on PyTorch's offset-computing elementwise kernel at this share
# of the vectorized kernels' bandwidth. MEASURED on one profile (h200-2026-12-12 profiles/, Falcon-7B
# at 6 layers, 4 x 1024, one H200): its math attention's two such ops a block, the causal mask added
# over batch and heads (float32 + bfloat16, 1.325 ms for 2.39 GB) and `_safe_softmax`'s fill of fully
# masked rows (0.94 ms for 2.38 GB), moved 4.77 GB in 2.27 ms: 2.11 TB/s, 0.55 of the 3.84 the
# vectorized rate (HBM_EFFICIENCY) prices.
STRIDED_HBM_FRACTION = 0.55
# Accumulating index_puts (a card's `elementwise_scatter`: autograd's backward of a gather by index, a
# transformers MoE block's tokens sorted by expert and back, two a block) sort their indices and add
# each destination row's sources in turn (indexing_backward_kernel), at this share of the vectorized
# rate. MEASURED on one profile (h200-2026-12-13 profiles/prof-3, granite-3.0-1b-a400m at 4 x 4096 on
# one H200): 48 such kernels, 16.36 ms, for the 27.47 GB its card records: 1.68 TB/s, 0.437 of 3.84.
SCATTER_HBM_FRACTION = 0.437
ATTENTION_EFFICIENCY = 0.546  # causal flash attention forward (SDPA): achieved / peak on its halved FLOPs
# SDPA's fused attention kernels by shape (torch 2.11 runs cuDNN's on sm90, causal, bfloat16): achieved /
# peak on the causal half's FLOPs, forward (4 x b x h x s^2/2 x d) and backward (2.5 times that), by head
# size (rows) and sequence length (ATTENTION_SEQS), without and with dropout (GPT-2's attn_pdrop,
# StarCoder's and Granite's attention_dropout: the kernel draws a Philox number per score, and again in its
# backward; a card's ATTENTION_DROPOUT_* scores say which calls do). MEASURED, not fitted to step rows:
# benchmarks/measurements/h200-2026-12-31f/probes/attention-sweep.json (tools/attention_probe.py --sweep:
# the kernels' own time from torch.profiler, one H100 80GB HBM3; 16,384 tokens a call, 2,048 / d heads,
# d = 256 at 8 heads). Efficiency grows with the sequence (a query tile's row of key tiles is longer) and
# the head size; the backward is 2.7-5 forwards' time, not the 2.5 its FLOPs say. The H200 has the same
# SMs and clocks; another GPU takes the same fractions of its own peak.
ATTENTION_SEQS = (512, 1024, 2048, 4096, 8192)
ATTENTION_KERNEL_EFFICIENCY = {  # head size: ((forward by ATTENTION_SEQS), (backward by them))
    64: ((0.268, 0.349, 0.406, 0.449, 0.472), (0.154, 0.238, 0.322, 0.389, 0.434)),
    80: ((0.240, 0.310, 0.365, 0.403, 0.425), (0.153, 0.223, 0.285, 0.325, 0.351)),
    96: ((0.288, 0.369, 0.432, 0.471, 0.497), (0.169, 0.253, 0.328, 0.386, 0.415)),
    128: ((0.349, 0.467, 0.548, 0.600, 0.633), (0.174, 0.294, 0.402, 0.481, 0.536)),
    256: ((0.335, 0.477, 0.561, 0.615, 0.646), (0.159, 0.244, 0.320, 0.373, 0.422)),
}
ATTENTION_DROPOUT_KERNEL_EFFICIENCY = {  # the same at dropout 0.1 (the draw's cost, not p's)
    64: ((0.128, 0.152, 0.167, 0.176, 0.182), (0.143, 0.203, 0.256, 0.290, 0.313)),
    80: ((0.130, 0.157, 0.173, 0.180, 0.189), (0.137, 0.190, 0.234, 0.267, 0.285)),
    96: ((0.157, 0.186, 0.205, 0.212, 0.218), (0.154, 0.217, 0.265, 0.307, 0.339)),
    128: ((0.204, 0.242, 0.266, 0.279, 0.283), (0.170, 0.261, 0.337, 0.390, 0.438)),
    256: ((0.124, 0.152, 0.171, 0.180, 0.184), (0.147, 0.212, 0.270, 0.311, 0.363)),
}
# A call with fewer query tiles (b x h x s / 128) than the sweep's fills the GPU's 132 SMs less well
# (the causal rows' unequal lengths leave the last waves part-empty): efficiency scales by n / (n + n0).
# n0 FITTED on the probe's four shapes off the sweep (GPT-2-XL 4 x 25 x 1,024 x 64, GPT-2-medium
# 8 x 16 x 1,024, 2 x 16 x 2,048 x 64, 1 x 32 x 4,096 x 128), with and without dropout: 220 forward and
# 150 backward leave them within -3.1..+2.6% forward and -2.9..+2.1% backward (without the scaling: up to
# +33% and +27%).
ATTENTION_QUERY_TILE = 128
ATTENTION_FILL_TILES = (220.0, 150.0)  # forward, backward
ATTENTION_SWEEP_TOKENS = 16384
# Attention given an explicit attn_mask (transformers' sliding window once the sequence reaches it):
# every kernel that takes a mask (cuDNN with a bias, memory-efficient) does the full square, read
# tile by tile with the bias, none skipped (the card records these FLOPs in full, core.card
# MASKED_ATTENTION_OPS). Achieved / peak on those full FLOPs, forward; the backward as flash's.
# FITTED (benchmarks/steptime_masked.py) on the 3 masked rows before h200-2026-12-03b (gemma-3-1b,
# phi3-medium, falcon-40b; step within -13.3%..+1%), held out: batch g's 3 (phi3-mini, starcoder2-7b,
# mistral-7b), docs/tradeoffs.md.
MASKED_ATTENTION_EFFICIENCY = 0.250
ATTENTION_BACKWARD_RATIO = 2.5  # flash attention's backward takes this many forwards' time (counted, not fitted)
# The GPU's own cost per kernel beyond its work (the gap between back-to-back kernels), on the GPU's
# side of a pass. It was 1.92 us, fitted as an addend when a pass was its kernels plus launches;
# once the host's side is priced (below) the fit puts it at zero: the per-kernel time it stood for
# was the host's. Kept as a term so a refit on other hosts can find it.
KERNEL_OVERHEAD_S = 0.0
# The host's side of a pass (`host_pass_s`), measured where nothing else takes time: the host-floor
# rows (benchmarks/measurements/h200-2026-12-02/hostfloor-results.jsonl, `python benchmarks/
# steptime_fit.py --host-floor`): five layouts at 128 tokens a micro-step on the 16-core host of
# issue 13, where the kernels take microseconds and each pass is the host's time. Per kernel the
# host runs the module's Python, the dispatcher, autograd and the launch: 27.5 us, the same for
# transformers' decoder layer (1.05 ms a layer forward: 37 kernels) and zlayout's GPT block (11),
# and for the backward (autograd's kernels, 70 a transformers layer: 2.1 ms); the layer count
# (L32 against L8) puts a fixed part on the forward only (the engine's and the model's entry,
# the mask and rotary tables, the loss), none on the backward. Stages 1-2's backward adds a
# gradient hook per parameter tensor (the copy into the reduction bucket and its bookkeeping:
# ZeRO-2 against ZeRO-0 at the same model, 30 ms more for 290 tensors). Least squares over the
# ten passes: within 14% each (the host's own noise: a row's steady steps spread 10-20%). A MoE
# block's router and experts are not in it (`PhaseWork.host_kernels`). Every op of those rows
# launches one kernel: the 27.5 us is an op's, its Python, dispatch, autograd and one launch.
HOST_S_PER_KERNEL = 27.5e-6
# An op that launches more kernels (a card's `calls` above its `ops`: a sort's copy, index fill and
# radix passes, an accumulating index_put's sort, zlayout.learn.launches) costs the host its op once
# and only a launch (cudaLaunchKernel, cub's dispatch, a scratch allocation) for each further kernel.
# DERIVED from one measurement, not fitted to step rows (`python benchmarks/host_extra_kernel.py`):
# the h200-2026-12-14 host probe timed granite-3.0-1b-a400m's sort of 131,072 int64 expert ids
# (12 kernels) at 182 us of host time a call (24 a forward, the model alone), so (182 - 27.5) / 11
# = 14.0 us a further kernel (against the probe's own one-kernel ops, 25.9 us a call: 14.2).
# Checked, not fitted: OLMoE's sort in the same probe (12 kernels, 180.5 us: 13.9); least squares
# over every multi-kernel op of every block both models ran (sort, topk, histc, cumsum,
# _grouped_mm, slice_backward; weighted by calls) 14.6; the two-kernel ops alone 15-30 us over a
# one-kernel op (mean 20-22: topk's two outputs, _grouped_mm's group table are host work of their
# own); embedding_dense_backward's 21 kernels, one call a step, 13.0 and 18.4. The profiler's own
# cudaLaunchKernel took 7.0-9.4 us a call, cuLaunchKernelEx 9.8-16.6 (h200-2026-12-16 prof-1 and
# prof-2, under CUPTI). The GPU's side prices every kernel as before.
HOST_S_PER_EXTRA_KERNEL = 14.0e-6
HOST_FORWARD_FIXED_S = 6.6e-3
HOST_GRAD_HOOK_S = 0.119e-3
# How the two sides of a pass combine (`pass_s`): the exponent of their smooth maximum, the one
# constant of the host's side fitted on the step rows (`steptime_fit.py --overlap-p`).
OVERLAP_P = 2.5
# The backward's exponent. Autograd's engine issues the backward from C++ (no module Python between
# ops, only the gradient hooks), so its host side wanders less than the forward's and a pass comes
# closer to the plain maximum. Chosen on the GPU-resident card rows (`benchmarks/steptime_overlap.py`):
# with p = 2.5 for both passes the backward was over by 16.7% on average where its two sides were
# within 15% of each other (14 rows) and by 7.1% at 50-70% (34 rows), on every ZeRO stage; the
# hard maximum was under by 8.5% and 2.6% there. At 4: +5.3% and +0.3%, and within 6% on average in
# every band of the sides' ratio.
BACKWARD_OVERLAP_P = 4.0
# ZeRO-3's hooks are host time on the pass's host side, after the host floor's (`host_pass_s`). Per module per
# pass (forward, backward, the recompute's forward): the pre-forward hook's fetch_sub_module (trace
# check, prefetch queue, the handles' waits), the post-forward hook's release_sub_module, and the two
# autograd Functions each module's hooks wrap its inputs and outputs in (their backward fetches and
# releases the module again). Per parameter tensor, in the backward: the gradient hook
# (reduce_partition_and_remove_grads: the copy into the reduction bucket on a side stream, the
# bookkeeping) and its share of the epilogue's partition_grads.
STAGE3_FETCH_OVERHEAD_S = 0.279e-3
STAGE3_GRAD_HOOK_S = 0.207e-3
GPU_OPTIMIZER_HBM_EFFICIENCY = 0.446  # the optimizer step's kernels (norm, clip, multi-tensor Adam, casts)
# Per optimizer step, DeepSpeed's engine runs Python around the optimizer's kernels: a fixed part,
# and a part per parameter tensor (bookkeeping, per-tensor norms and copies).
STEP_BASE_OVERHEAD_S = 4.21e-3
STEP_OVERHEAD_PER_TENSOR_S = 0.121e-3
# ZeRO-0 (bf16 without ZeRO) steps through a different optimizer: DeepSpeed's FP16_Optimizer with FusedAdam
# (runtime/fp16/fused_optimizer.py, step()), which walks the parameter tensors one at a time, three
# times: the overflow check (CheckOverflow.has_overflow_serial, runtime/utils.py: per gradient
# has_inf_or_nan's amax, amin, two isfinite, logical_and and logical_not, which the `if` then reads on
# the host, a device->host copy and a wait per tensor), the flatten's fp32 cast of each gradient, and
# the unflatten's copy back into each bf16 parameter: 14 kernels and a host sync per tensor (counted in
# benchmarks/measurements/h200-2026-12-01f/profiles/p-z0-*.json: 4096 kernels and 295 device->host
# copies for 290 tensors, 2751 and 199 for 194). Its fixed work (one flatten, one norm, FusedAdam's
# multi-tensor launches on one flat buffer) is small beside stages 1-2's ZeRO optimizer's, whose
# fixed part STEP_BASE_OVERHEAD_S is: the fit, given a fixed part of its own, puts it at zero.
STAGE0_STEP_OVERHEAD_PER_TENSOR_S = 0.124e-3
# Counted, not fitted: elementwise, norm, activation, rotary and loss kernels stream HBM at this share
# of nominal; bytes per element are counted in `micro_step_work`.
HBM_EFFICIENCY = 0.8
GPU_OPTIMIZER_BYTES_PER_PARAM = 42  # fused Adam r/w of fp32 master+moments, grad read, bf16 write, clip
# Transformers classes run elementwise work zlayout's GPT fuses (its norms are torch's fused kernels;
# it has no rotary). Bytes per element, forward (backward: twice): LlamaRMSNorm-style norms upcast to
# fp32 and run ~7 kernels (x.float r2 w4, pow r4 w4, mean r4, add-rsqrt, mul r4 w4, .to(bf16) r4 w2,
# weight-mul r2 w2: ~40) where the fused kernel moves ~4; rotary (q*cos, rotate_half's slices, neg
# and cat, *sin, add: ~20) on the queries' and keys' widths; repeat_kv's copies of keys and values
# to the queries' width (GQA).
HF_RMSNORM_BYTES_PER_ELEMENT = 40
HF_ROPE_BYTES_PER_ELEMENT = 20
# Kernels launched, counted from the modules' forward code (backward: autograd's kernels for them).
# zlayout's GPT block: 2 fused norms, 4 linears, SDPA, the output's transpose copy, 2 residual adds,
# the activation (GELU 1; SwiGLU's silu and mul 2).
ZLAYOUT_BLOCK_KERNELS = (11, 22)  # (forward, backward), GELU; SwiGLU +1 / +2; biases +4 backward
# transformers' decoder layer: 2 unfused RMSNorms (7 each), q/k/v/o and gate/up/down linears (7),
# rotary on q and k (10), SDPA and its transpose copy (2), 2 adds, silu and mul (2); repeat_kv +2.
HF_BLOCK_KERNELS = (37, 70)
# Around the blocks, per micro-step: embedding, final norm, head, the loss's slice/cast/log-softmax/
# nll (transformers adds the rotary tables and the mask).
TOP_KERNELS = {"zlayout": (8, 12), "hf": (24, 24)}
# A transformers MoE block (MixtralSparseMoeBlock and the other classes behind transformers'
# experts interface) runs its experts as grouped GEMMs (`grouped_mm`, the default a model built by
# from_config gets; no Python loop over the experts, no host sync): router, top-k, sort by expert,
# gather, histogram and offsets, two grouped GEMMs, SwiGLU, the routing weights, the per-token sum.
# Measured on one H200 against a dense SwiGLU MLP of the same active FLOPs, five shapes from 4 to 64
# experts (benchmarks/measurements/tools/moe_block_bench.py, measurements/h200-2026-12-01e/moe-block.jsonl):
# - kernels: 49 forward and 86-87 backward whatever the experts (the profiler's count);
# - forward: the dense MLP's time (grouped GEMMs as fast as dense ones) plus routing work, 0.91 ms
#   per block and 44 bytes of HBM per routed element (tokens x top-k x hidden): in-sample within
#   11%, leave-one-out worst +51% (the 64-expert shape, predicted from the 4-8-expert ones);
# - backward: the expert GEMMs at 1/1.36 of dense speed (the weight gradients' grouped GEMMs) plus
#   0.25 ms and 80 bytes per routed element: in-sample within 3%, leave-one-out worst -26%.
MOE_BLOCK_KERNELS = (49, 87)
MOE_ROUTING_FIXED_S = (0.91e-3, 0.25e-3)
MOE_ROUTED_BYTES = (44, 80)
MOE_BACKWARD_GEMM_FACTOR = 1.36
HOST_MEM_EFFICIENCY = 0.55  # DeepSpeedCPUAdam's achieved / nominal host memory bandwidth
CPU_OPTIMIZER_BYTES_PER_PARAM = 42  # clip r/w 8 + Adam r 16 w 12 + fp32->bf16 cast r 4 w 2
# The CPU optimizer step per parameter (DeepSpeedCPUAdam + clipping + the bf16 cast) and how it
# scales with threads: t threads take (1 + c(t-1)) / t of one thread's time (Amdahl-like: the
# threads contend for the memory bus, so it saturates near 1/c times one thread's speed).
# Source: benchmarks/measurements/cpu-adam-scaling.jsonl, rows "h200-32core" (step-derived with
# estimate_step_time's PCIe model: refitted when stage 3's gradient round trip and the duplex backward were added,
# 2.670e-9 / 0.115 -> 2.638e-9 / 0.115; fitted there by
# `python benchmarks/measurements/tools/cpu_adam_scaling.py --fit`): the 2-GPU torchrun rows (1 thread per rank)
# and the 1-GPU rows (32 threads) of the 32-core H200 host; the 16-core host was held out.
# Then scaled by 0.92 (2.638e-9 -> 2.427e-9), the least-squares factor of the relative step errors of
# the offloaded one-GPU verify rows measured before h200-2026-12-31g (`python -m benchmarks
# steptime_cpu_optimizer`; the fit first read 86 rows, three of them twice, and took 0.92; on the
# 85 runs, each once, 54 on the lent H200 nodes' 16-core hosts and 31 on the H100 nodes', it reads
# 0.91, rms 12.1% either way): in-sample rms 13.9% -> 12.1%, rows beyond 25% 7 -> 4 (the H200
# hosts' mean -0.5% -> -6.2%, the H100 hosts' +14.0% -> +7.1%: the two kinds of host run
# DeepSpeedCPUAdam some 15% apart, and one H100 node from the next up to 25%). h200-2026-12-31g (six rows on one H100 node, left out of the fit and
# scored after it): mean +28.8% -> +21.0%, three rows beyond 25% either way. `zlayout calibrate`
# fits a cluster's own factor from its verify runs.
CPU_OPTIMIZER_S_PER_PARAM_ONE_THREAD = 2.427e-9
CPU_THREAD_CONTENTION = 0.115
# Softmax/cross-entropy bytes per logit (tokens x vocab), forward+backward, as the worker's loss
# runs it (`cross_entropy(logits[:, :-1].flatten(0, 1).float(), ...)`): forward, the slice's
# copy (bf16 r2 w2), the fp32 cast (r2 w4), log-softmax (a row of a large vocabulary does not fit
# shared memory: max, sum and write passes, r12 w4); backward, nll's zero-filled gradient (w4),
# log-softmax backward (sum pass, then r8 w4: r12 w4), the bf16 cast (r4 w2), the slice's
# zero-filled gradient and copy (w2, r2 w2). Transformers' loss upcasts the same way (its labels
# are shifted instead of the logits: 10 bytes fewer, not modelled apart).
LOSS_BYTES_PER_LOGIT = 58
# Stage 3 with the optimizer offloaded and the parameters on the GPU: PyTorch's fp32(host) ->
# bf16(GPU) copy casts on the CPU into a fresh pageable temporary and copies from pageable
# memory; measured (two layouts, one thread per rank) as this many more bytes' worth per param.
STAGE3_HOST_CAST_BYTES_PER_PARAM = 30
STAGE3_GATHER_OVERHEAD_S = 0.075e-3  # more per fetch with world > 1: gather buffers, waits, record_stream
STAGE3_PREFETCH_OVERLAP = 0.0  # share of fwd+bwd compute stage-3 prefetch hides gathers behind (measured: ~none)



def steady_steps(step_times_s: list[float]) -> list[float]:
    """The steps that count as steady: the third and later (the first pays one-time costs, the
    second still warms up where DeepSpeed builds state on it: ZeRO-3's prefetch trace, H200:
    0.62 s, then 0.38-0.39 s; checkpointed runs, 0.54 s, then 0.32-0.33 s). With two steps, the
    second; with one, that one."""
    steps = [float(x) for x in step_times_s]
    return steps[2:] if len(steps) >= 3 else steps[-1:]


def steady_step_s(step_times_s: list[float]) -> float | None:
    """The step time this model predicts, read from measured per-step times: the median of the
    steady steps (`steady_steps`)."""
    later = sorted(steady_steps(step_times_s))
    if not later:
        return None
    mid = len(later) // 2
    return later[mid] if len(later) % 2 else (later[mid - 1] + later[mid]) / 2


@dataclass(frozen=True, slots=True)
class StepTimeEstimate:
    compute_s: float
    comm_s: float  # exposed (not overlapped) communication
    offload_s: float  # CPU optimizer step, PCIe and NVMe traffic not hidden
    step_time_s: float
    tokens_per_s: float
    mfu: float
    gpu_optimizer_s: float = 0.0  # optimizer step and gradient bookkeeping on the GPU (HBM-bound)
    step_overhead_s: float = 0.0  # fixed per step: engine and Python
    host_overhead_s: float = 0.0  # the host's time (its kernels' issue, hooks) the GPU's side does not hide
    comm_total_s: float = 0.0  # all network communication, hidden or not
    cpu_optimizer_s: float = 0.0  # of offload_s: the optimizer step on the host
    pcie_s: float = 0.0  # of offload_s: exposed PCIe copies
    nvme_s: float = 0.0  # of offload_s: NVMe reads and writes
    tokens_per_step: int = 0  # all GPUs together
    model_flops_per_step: float = 0.0  # 6 * active params * tokens (what MFU counts)
    loss_s: float = 0.0  # of compute_s: the memory-bound softmax/cross-entropy passes over the logits
    cpu_threads_per_rank: int = 0  # the CPU optimizer's threads the estimate assumed
    launch_overhead_s: float = 0.0  # the GPU's per-kernel cost
    # the phases verify times apart (GPU side; exposed communication and PCIe not included):
    forward_s: float = 0.0  # the forward passes: a smooth maximum of the GPU's side and the host's
    backward_s: float = 0.0  # the same for the backward passes, recompute included
    optimizer_s: float = 0.0  # GPU optimizer, the per-step overhead, the CPU optimizer
    allocator_flush_s: float = 0.0  # the caching allocator freeing its cache and retrying (core.fit)


# A step whose unhidden host side is at least this share of it is host-bound: its time is the host's
# Python (the kernels' issue, ZeRO-3's hooks), which varies from process to process on one host.
# Measured on one H200 (16 cores): a transformers ZeRO-3 layout whose host side is 44% of its
# predicted step took 0.197-0.359 s over six processes (docs/tradeoffs.md, "Run to run").
HOST_BOUND_SHARE = 0.25


# A step whose offload (the CPU optimizer, the PCIe copies not hidden, NVMe) is at least half of it is
# offload-bound: its time is the host's memory bandwidth, threads and copies, which vary from process to
# process on one host. Measured on one H200 host (16 cores; h200-2026-12-04, batch h and two profiles):
# Mixtral-8x7B-L2 at ZeRO-3 with the optimizer on the CPU took 4.05 s a step in verify's process and
# 3.19 s in a profile's on a fresh node (its optimizer phase 3.13-3.82 s against 2.57-2.98 s);
# Qwen3-30B-A3B-L6 4.23 s and 4.56 s.
OFFLOAD_BOUND_SHARE = 0.5


def _bound_share(part_s: float | None, step_time_s: float | None, threshold: float) -> float | None:
    """The share of a step `part_s` takes when it is `threshold` or more; None otherwise or for
    missing figures."""
    if not part_s or not step_time_s or step_time_s <= 0:
        return None
    share = part_s / step_time_s
    return share if share >= threshold else None


def offload_bound_share(offload_s: float | None, step_time_s: float | None) -> float | None:
    """The share of a step its offload takes, when that makes the step offload-bound
    (OFFLOAD_BOUND_SHARE or more); None otherwise or for missing figures. The plan, a profile's
    step-time alert and verify's report all decide offload-bound here."""
    return _bound_share(offload_s, step_time_s, OFFLOAD_BOUND_SHARE)


def offload_bound_note(t: StepTimeEstimate) -> str | None:
    """Why an offload-bound step's figure is less certain than a GPU-bound one's, or None."""
    share = offload_bound_share(t.offload_s, t.step_time_s)
    if share is None:
        return None
    return (f"{share:.0%} of this step is offload (the CPU optimizer and host copies), whose speed varies "
            "from process to process on one host (one such layout: 3.13-4.46 s a step over three processes "
            "on 4 KiB host pages, 2.49-2.83 s over two on huge pages, which verify and the launch scripts "
            "set); `zlayout calibrate` fits your hosts' factors from verify results")


def step_time_parts(t: StepTimeEstimate) -> list[tuple[str, float, str]]:
    """A step's parts as the plan and the app show them, (name, seconds, why): they add up to the
    step. Parts that take no time are left out, except the kernels."""
    parts = [
        ("GPU kernels", t.compute_s + t.launch_overhead_s,
         f"GEMMs, attention, elementwise and loss kernels ({t.mfu:.0%} MFU)"),
        ("host, not hidden", t.host_overhead_s,
         "the host's Python, kernel issue and ZeRO-3's hooks beyond what the kernels cover"),
        ("optimizer (GPU)", t.gpu_optimizer_s + t.step_overhead_s,
         "the optimizer's kernels and the engine's Python per step"),
        ("communication", t.comm_s, f"exposed, of {t.comm_total_s:.3f} s in all"),
        ("allocator flushes", t.allocator_flush_s,
         "the card is full: the caching allocator synchronizes, frees its cache and retries cudaMalloc"),
        ("offload", t.offload_s, ", ".join(
            text for seconds, text in (
                (t.cpu_optimizer_s, f"CPU optimizer {t.cpu_optimizer_s:.3f} s ({t.cpu_threads_per_rank} threads a rank)"),
                (t.pcie_s, f"PCIe copies not hidden {t.pcie_s:.3f} s"),
                (t.nvme_s, f"NVMe {t.nvme_s:.3f} s")) if seconds > 0)),
    ]
    return [part for part in parts if part[1] > 0 or part[0] == "GPU kernels"]


def host_bound_share(host_overhead_s: float | None, step_time_s: float | None) -> float | None:
    """The share of a step its unhidden host side takes, when that makes the step host-bound
    (HOST_BOUND_SHARE or more); None for a kernel-bound step or missing figures. The plan, a
    profile's step-time alert and verify's report all decide host-bound here."""
    return _bound_share(host_overhead_s, step_time_s, HOST_BOUND_SHARE)


def host_bound_note(t: StepTimeEstimate) -> str | None:
    """Why a host-bound step's figure is less certain than a kernel-bound one's, or None."""
    share = host_bound_share(t.host_overhead_s, t.step_time_s)
    if share is None:
        return None
    return (f"{share:.0%} of this step is the host's side, which varies from process to process and "
            "node to node (one such layout: -28% to +31% of its prediction over six runs on one host; a "
            "ZeRO-3 MoE: +27% and +44% on two nodes); `zlayout calibrate` fits your hosts' factor from "
            "verify results")


def step_time_notes(t: StepTimeEstimate) -> list[tuple[str, str]]:
    """(label, note) for each reason this step's figure varies from process to process (host-bound,
    offload-bound), as the plan and the app print them under the step's parts."""
    notes = (("host-bound", host_bound_note(t)), ("offload-bound", offload_bound_note(t)))
    return [(label, note) for label, note in notes if note]


def matmul_params(inp: PlanInput) -> int:
    """Parameters that take part in one token's matmuls: the blocks (a MoE block's router,
    top-k experts and shared experts, not every expert) and the output head (not the lookup)."""
    m = inp.model
    return m.active_blocks_params() + m.vocab * m.hidden


def matmul_flops_per_token(inp: PlanInput) -> float:
    """Dense-layer FLOPs per token, forward+backward (+ the blocks' recomputed forward).

    The head (6 * hidden * vocab per token: the logits matmul and its two backward matmuls)
    sits outside the checkpointed blocks, so it is never recomputed.
    """
    m = inp.model
    block_params = m.active_blocks_params()  # a MoE block: its router, top-k and shared experts
    return (8 if inp.training.checkpointing == "full" else 6) * block_params + 6 * m.vocab * m.hidden


def loss_bytes_per_micro_step(inp: PlanInput) -> float:
    """HBM traffic of the softmax/cross-entropy over one micro-batch's logits, forward+backward
    (a card with work: its head's memory-bound ops, the embedding and the final norm with the loss)."""
    t = inp.training
    card = card_with_work(inp)
    if card is not None:
        head_fwd, head_bwd = card.pass_work(t.micro_batch, t.seq, t.checkpointing == "full")[2:]
        return head_fwd.memory_bytes + head_bwd.memory_bytes
    return LOSS_BYTES_PER_LOGIT * t.micro_batch * t.seq * inp.model.vocab


def attention_flops_per_token(inp: PlanInput) -> float:
    """QK^T and AV: 4*hidden*seq per layer forward, twice that backward, once more recomputed."""
    m, t = inp.model, inp.training
    # the queries' width: hidden, unless config.json sets head_dim (Gemma) or MLA
    attention = (16 if t.checkpointing == "full" else 12) * m.layers * m.q_size * t.seq
    if t.flash_attention:
        attention *= 0.5  # the causal flash kernel skips the fully masked blocks
    return attention


def compute_flops_per_token(inp: PlanInput) -> float:
    """Hardware FLOPs one token costs in forward+backward, recompute included."""
    return matmul_flops_per_token(inp) + attention_flops_per_token(inp)


def collective_time_s(coll: Collective, inp: PlanInput) -> float:
    """Bandwidth time of the slower share plus a link latency per hop for every launch.

    Hops: a pass around the GPUs of a node, then around the nodes (what a ring pays when its
    node-local steps pipeline over NVLink); an all-reduce makes two passes.
    """
    hw = inp.hardware
    intra_s = coll.intra_node_bytes / _bus_bytes_per_s(hw.intra_link)
    inter_s = 0.0
    latency_s = (hw.gpus_per_node - 1) * hw.intra_link.latency_us * 1e-6
    if hw.nodes > 1 and hw.inter_link is not None:
        inter_s = coll.inter_node_bytes / _bus_bytes_per_s(hw.inter_link)
        latency_s += (hw.nodes - 1) * hw.inter_link.latency_us * 1e-6
    passes = 2 if coll.kind == "all_reduce" else 1
    return max(intra_s, inter_s) + coll.calls_per_step * passes * latency_s


def _bus_bytes_per_s(link: LinkSpec) -> float:
    return link.bandwidth_gbps * link.efficiency * 1e9


def cpu_optimizer_s_per_param(threads: int) -> float:
    """One rank's CPU optimizer step per parameter of its partition, on `threads` threads."""
    threads = max(1, threads)
    return CPU_OPTIMIZER_S_PER_PARAM_ONE_THREAD * (1 + CPU_THREAD_CONTENTION * (threads - 1)) / threads


def host_optimizer_s_per_param(inp: PlanInput, cpu_threads_per_rank: int | None,
                               host_bytes_per_param: float = CPU_OPTIMIZER_BYTES_PER_PARAM) -> float:
    """The CPU optimizer's time per parameter of one rank: its threads' speed, or the rank's share
    of the node's host memory bandwidth when that is slower (many ranks on one node).

    `cpu_threads_per_rank` None: the launchers' share, host cores / ranks on the node.
    """
    hw = inp.hardware
    threads = hw.cpu_threads_per_rank if cpu_threads_per_rank is None else cpu_threads_per_rank
    by_threads = cpu_optimizer_s_per_param(threads) * host_bytes_per_param / CPU_OPTIMIZER_BYTES_PER_PARAM
    shared_bytes_per_s = hw.host_mem_gbps * HOST_MEM_EFFICIENCY * 1e9 / hw.gpus_per_node
    return max(by_threads, host_bytes_per_param / shared_bytes_per_s)


@dataclass(frozen=True, slots=True)
class PhaseWork:
    """What one pass (forward, or backward with its recompute) of one micro-step does on one GPU."""

    gemm_flops: float = 0.0  # dense layers' and the head's matmuls
    unaligned_gemm_flops: float = 0.0  # the head's, when the vocabulary is odd
    attention_flops: float = 0.0  # flash attention, in forward FLOPs (causal: halved) times forward-equivalents
    hbm_bytes: float = 0.0  # elementwise, norm, activation, rotary, loss and bookkeeping traffic
    kernels: float = 0.0  # kernel launches the host issues
    stage3_fetches: float = 0.0  # ZeRO-3 module fetches (hooks)
    stage3_grad_hooks: float = 0.0  # ZeRO-3 gradient hooks (one per parameter tensor, backward)
    fixed_s: float = 0.0  # GPU time priced per call, not per FLOP or byte (a MoE block's routing)
    host_kernels: float = 0.0  # of `kernels`, those the host floor prices (a MoE block's experts: not)
    # of `host_kernels`, those beyond their op's first (a sort's radix passes, a card's `calls` less
    # its `ops`): a launch each (HOST_S_PER_EXTRA_KERNEL), the op's Python and dispatch paid once
    host_extra_kernels: float = 0.0
    grad_hooks: float = 0.0  # stages 1-2's gradient hooks (one per parameter tensor, backward)
    host_fixed_s: float = 0.0  # the host's Python per pass beyond its kernels (HOST_FORWARD_FIXED_S)
    batched_gemm_flops: float = 0.0  # eager attention's T^2 matmuls (a card's bmm/baddbmm): narrow GEMMs
    fp32_gemm_flops: float = 0.0  # matmuls on float32 inputs (the math attention's): CUDA cores, not tensor cores
    masked_attention_flops: float = 0.0  # fused attention given an attn_mask: the full square, forward-equivalents
    unaligned_hbm_bytes: float = 0.0  # memory-bound ops on misaligned tensors (a card's `*_unaligned`)
    strided_hbm_bytes: float = 0.0  # pointwise ops over broadcast or strided operands (a card's `*_strided`)
    scatter_hbm_bytes: float = 0.0  # accumulating index_puts (a card's `*_scatter`)
    half_aligned_gemm_flops: float = 0.0  # the head's, when the vocabulary is even but not a multiple of 8
    # attention scores with dropout: (forward draws, backward draws; a recompute's are forward draws)
    dropout_scores: tuple[float, float] = (0.0, 0.0)
    attention_backward_flops: float = 0.0  # of attention_flops, the backward kernels' (the rest: forward kernels)


def head_gemm_alignment(vocab: int) -> int:
    """The elements the head's GEMM rows align to: 8 (tensor cores' 16-byte loads), else 4, 2 or 1
    (`UNALIGNED_HEAD_EFFICIENCY`, `HALF_ALIGNED_HEAD_EFFICIENCY`)."""
    return min(8, vocab & -vocab) if vocab > 0 else 8


@dataclass(frozen=True, slots=True)
class GpuStepConstants:
    """The fitted constants of the GPU-resident step (their values: the module's constants)."""

    gemm_efficiency: float = GEMM_EFFICIENCY
    gemm_half_width: float = GEMM_HALF_WIDTH
    unaligned_head_efficiency: float = UNALIGNED_HEAD_EFFICIENCY
    attention_efficiency: float = ATTENTION_EFFICIENCY
    masked_attention_efficiency: float = MASKED_ATTENTION_EFFICIENCY
    kernel_overhead_s: float = KERNEL_OVERHEAD_S
    stage3_fetch_overhead_s: float = STAGE3_FETCH_OVERHEAD_S
    stage3_grad_hook_s: float = STAGE3_GRAD_HOOK_S
    optimizer_hbm_efficiency: float = GPU_OPTIMIZER_HBM_EFFICIENCY
    step_overhead_per_tensor_s: float = STEP_OVERHEAD_PER_TENSOR_S
    step_base_overhead_s: float = STEP_BASE_OVERHEAD_S
    stage0_step_overhead_per_tensor_s: float = STAGE0_STEP_OVERHEAD_PER_TENSOR_S
    overlap_p: float = OVERLAP_P
    backward_overlap_p: float = BACKWARD_OVERLAP_P


SHIPPED = GpuStepConstants()


def _block_kernels(inp: PlanInput) -> tuple[float, float]:
    """Kernels one dense block launches, forward and backward."""
    m, t = inp.model, inp.training
    swiglu = m.mlp == "swiglu"
    if t.impl == "hf":
        fwd, bwd = HF_BLOCK_KERNELS
        if m.num_kv_heads != m.heads:
            fwd, bwd = fwd + 2, bwd + 2  # repeat_kv's copies, and their sums backward
        if m.norm != "rmsnorm":
            fwd, bwd = fwd - 12, bwd - 20  # fused LayerNorms
        if m.position_embeddings:
            fwd, bwd = fwd - 10, bwd - 10  # no rotary
        if not swiglu:
            fwd, bwd = fwd - 2, bwd - 3
        return float(fwd), float(bwd)
    fwd, bwd = ZLAYOUT_BLOCK_KERNELS
    if swiglu:
        fwd, bwd = fwd + 1, bwd + 2
    if m.bias:
        bwd += 4  # the bias gradients' reductions
    return float(fwd), float(bwd)


def _moe_block_kernels(inp: PlanInput) -> tuple[float, float]:
    """Kernels a MoE block launches beyond its attention half: router and grouped experts, shared experts."""
    m, t = inp.model, inp.training
    if t.impl != "hf":  # zlayout's GPT has no MoE blocks: priced as dense
        return 0.0, 0.0
    fwd, bwd = MOE_BLOCK_KERNELS
    fwd += m.shared_experts * 5 + (3 if m.shared_expert_gate else 0)
    bwd += m.shared_experts * 8 + (3 if m.shared_expert_gate else 0)
    return float(fwd), float(bwd)


def _elementwise_bytes_per_token(inp: PlanInput) -> tuple[float, float]:
    """HBM bytes per token of the blocks' elementwise work, forward and backward (all layers)."""
    m, t = inp.model, inp.training
    h, q, kv = m.hidden, m.q_size, m.kv_size
    # per token, a dense block's MLP activations, and a MoE block's top-k experts' (and shared
    # experts'): a MoE model's dense blocks (DeepSeek's first three; all of them, cut to those) have
    # the dense MLP
    per = 10 if m.mlp == "swiglu" else 4  # silu r2 w2 + mul r4 w2; gelu r2 w2
    moe_ffn = (m.top_k or 1) * m.expert_ffn_size + m.shared_experts * m.shared_expert_ffn_size if m.is_moe else 0
    acts = per * (m.ffn_size * m.dense_layer_count + moe_ffn * m.moe_layer_count)
    fwd = 4 * m.norms_per_layer * h + 12 * h + 4 * m.attn_out_size  # fused norms, 2 adds, transpose copy
    if t.impl == "hf":
        if m.norm == "rmsnorm":
            fwd += (HF_RMSNORM_BYTES_PER_ELEMENT - 4) * m.norms_per_layer * h
        if m.position_embeddings == 0:
            fwd += HF_ROPE_BYTES_PER_ELEMENT * (q + kv)
        if m.num_kv_heads != m.heads:
            fwd += 2 * (2 * q + 2 * kv)  # repeat_kv: read keys and values, write them at the queries' width
    fwd = fwd * m.layers + acts
    return fwd, 2 * fwd


def card_with_work(inp: PlanInput):
    """The model card whose recorded work prices the passes (`card_work`), or None: the hand-counted
    model (no card, impl "zlayout", a card learned before work was recorded, or a MoE model's card
    learned before it counted the grouped experts' FLOPs: the MOE_* constants price those)."""
    from zlayout.core.memory import card_of

    card = card_of(inp.model, inp.training)
    if card is None or not card.has_work():
        return None
    return card if not inp.model.moe_layer_count or card_counts_experts(inp, card) else None


def card_counts_experts(inp: PlanInput, card) -> bool:
    """Whether a MoE model's card records its experts' matmuls: its blocks' forward matmul FLOPs
    reach two per parameter a token passes through (the attention, router, top-k and shared
    experts; a model that runs every expert on every token, Llama-4's bmm, records more). Cards
    learned before the learner counted `_grouped_mm` hold the attention's and the router's only
    (a third of it for Qwen3-30B-A3B); 0.9 leaves room for the norms' parameters."""
    seq = inp.training.seq
    return card.block_matmul_flops(1, seq) >= 0.9 * 2 * inp.model.active_blocks_params() * seq


def card_work(inp: PlanInput, card, weights: tuple[dict[int, float], int] | None = None) -> tuple[PhaseWork, PhaseWork]:
    """The model's own work in a micro-step's forward and backward, from what the card recorded
    op by op (`ModelCard.pass_work`): layers x each kind of block, and the head. GEMMs, batched
    GEMMs (eager attention's T^2 matmuls) and the fused attention kernels by their FLOPs, every
    other op (dropout, activations, norms, softmax over T^2, casts, the loss) by the bytes it moves,
    each op the kernels CUDA launches for it (zlayout.learn.launches: one, a sort's radix passes
    more), each on the GPU's side; the host issues the op once and launches its further kernels
    (`host_floor_s`; a card learned before its ops were recorded: each launch an op). With
    checkpointing the card's backward holds the recompute as the run does it (non-reentrant: it
    stops once backward has what it needs).

    `weights` (tensors.gemm_weight_alignment), where the layout leaves weights off a 16-byte boundary:
    the GEMMs that read such a weight (the forward's, the recompute's, and the backward's input
    gradients; a weight gradient reads only activations) run on cuBLAS's 2- or 4-element kernels
    (`HALF_ALIGNED_HEAD_EFFICIENCY`), or its 1-element ones."""
    t = inp.training
    blocks_fwd, blocks_bwd, head_fwd, head_bwd = card.pass_work(t.micro_batch, t.seq, t.checkpointing == "full")
    # the head's GEMMs on the slower kernels of a misaligned vocabulary (head_gemm_alignment), or of
    # a head weight packed off a boundary
    align = head_gemm_alignment(inp.model.vocab)
    shares, head_weight = weights if weights is not None else ({}, 8)
    ckpt = t.checkpointing == "full"
    # The grouped experts' GEMMs run as fast as dense ones, their gradients' MOE_BACKWARD_GEMM_FACTOR
    # slower (the backward's recompute, with checkpointing, is a forward).
    recomputed = blocks_fwd.grouped_gemm_flops if t.checkpointing == "full" else 0.0
    grouped = (blocks_fwd.grouped_gemm_flops,
               recomputed + MOE_BACKWARD_GEMM_FACTOR * (blocks_bwd.grouped_gemm_flops - recomputed))
    passes = []
    for backward, (blocks, head, fixed_s, experts) in enumerate(
            ((blocks_fwd, head_fwd, HOST_FORWARD_FIXED_S, grouped[0]), (blocks_bwd, head_bwd, 0.0, grouped[1]))):
        whole = blocks + head
        # the share of a pass's GEMM FLOPs that reads the weights: all of the forward's; the
        # backward's recompute and half of the rest (input gradients, not weight gradients)
        recompute = blocks_fwd.gemm_flops if backward and ckpt else 0.0
        reading = blocks.gemm_flops if not backward else recompute + (blocks.gemm_flops - recompute) / 2
        off = {a: share * reading for a, share in shares.items()}
        head_align = align if align < 8 else head_weight
        head_reading = head.gemm_flops / (2 if backward else 1)
        # a misaligned vocabulary's head GEMMs, wherever the card recorded them (a card learned
        # before the learner marked misaligned operands holds them as aligned); a head weight off a
        # boundary slows the GEMMs that read it
        head_gemm = (head.gemm_flops + head.unaligned_gemm_flops if align < 8
                     else head_reading if head_weight < 8 else 0.0)
        head_moved = head.gemm_flops if align < 8 else head_gemm
        passes.append(PhaseWork(
            gemm_flops=whole.gemm_flops - head_moved - sum(off.values()) + experts,
            unaligned_gemm_flops=(whole.unaligned_gemm_flops - (head.unaligned_gemm_flops if align < 8 else 0.0)
                                  + (head_gemm if head_align == 1 else 0.0) + off.get(1, 0.0)),
            half_aligned_gemm_flops=(head_gemm if head_align in (2, 4) else 0.0) + off.get(2, 0.0) + off.get(4, 0.0),
            unaligned_hbm_bytes=whole.unaligned_memory_bytes,
            strided_hbm_bytes=whole.strided_memory_bytes, scatter_hbm_bytes=whole.scatter_memory_bytes,
            batched_gemm_flops=whole.batched_gemm_flops, attention_flops=whole.attention_flops,
            fp32_gemm_flops=whole.fp32_gemm_flops, masked_attention_flops=whole.masked_attention_flops,
            hbm_bytes=whole.memory_bytes, kernels=whole.kernels, host_kernels=whole.kernels,
            host_extra_kernels=max(0.0, whole.kernels - whole.ops), host_fixed_s=fixed_s,
            dropout_scores=(whole.dropout_forward_scores, whole.dropout_backward_scores),
            attention_backward_flops=whole.attention_backward_flops))
    return passes[0], passes[1]


def hand_work(inp: PlanInput) -> tuple[PhaseWork, PhaseWork]:
    """The model's own work in a micro-step's forward and backward, counted by hand per family
    (zlayout's GPT, transformers' Llama-style decoder layer, MoE blocks)."""
    m, t = inp.model, inp.training
    tokens = t.seq * t.micro_batch
    ckpt = t.checkpointing == "full"
    blocks = m.active_blocks_params()
    head = m.vocab * m.hidden
    align = head_gemm_alignment(m.vocab)
    unaligned = align < 8
    gemm_fwd = 2 * tokens * (blocks + (0 if unaligned else head))
    gemm_bwd = 2 * gemm_fwd + (2 * tokens * blocks if ckpt else 0)  # the head is never recomputed
    head_fwd = 2 * tokens * head if unaligned else 0.0
    attention = attention_flops_per_token(inp) * tokens  # already halved for the causal flash kernel
    # attention_flops_per_token counts 12 (16) x layers x q x seq fwd+bwd(+recompute); its forward: 4
    attn_fwd = attention * 4 / (16 if ckpt else 12)
    attn_bwd = attn_fwd * (ATTENTION_BACKWARD_RATIO + (1 if ckpt else 0))
    elem_fwd, elem_bwd = _elementwise_bytes_per_token(inp)
    logits = tokens * m.vocab
    bytes_fwd = elem_fwd * tokens + 26 * logits  # the loss: slice copy, fp32 cast, log-softmax
    bytes_bwd = elem_bwd * tokens + (LOSS_BYTES_PER_LOGIT - 26) * logits + (elem_fwd * tokens if ckpt else 0)
    moe_fixed_fwd = moe_fixed_bwd = 0.0
    if m.moe_layer_count and t.impl == "hf":  # transformers' grouped experts (MOE_* above)
        routed = m.moe_layer_count * tokens * (m.top_k or 1) * m.hidden
        bytes_fwd += MOE_ROUTED_BYTES[0] * routed
        bytes_bwd += MOE_ROUTED_BYTES[1] * routed + (MOE_ROUTED_BYTES[0] * routed if ckpt else 0)
        moe_fixed_fwd = MOE_ROUTING_FIXED_S[0] * m.moe_layer_count
        moe_fixed_bwd = MOE_ROUTING_FIXED_S[1] * m.moe_layer_count + (moe_fixed_fwd if ckpt else 0.0)
        gate_up = 2 if m.mlp == "swiglu" else 1
        expert_gemm_fwd = 2 * tokens * (m.top_k or 1) * (gate_up + 1) * m.expert_ffn_size * m.hidden * m.moe_layer_count
        gemm_bwd += (MOE_BACKWARD_GEMM_FACTOR - 1) * 2 * expert_gemm_fwd
    dense_fwd, dense_bwd = _block_kernels(inp)
    moe_fwd, moe_bwd = _moe_block_kernels(inp)
    moe_layers = m.moe_layer_count
    # The host floor's kernels: a MoE block's router and grouped experts are timed whole, the host's
    # time with them (moe_block_bench: wall = CUDA events' time, 49 kernels in 1.5-1.8 ms, the host
    # floor's ~30 us each; MOE_ROUTING_FIXED_S is most of it), so only its attention half counts here.
    host_fwd, host_bwd = m.layers * dense_fwd, m.layers * dense_bwd
    if moe_layers and t.impl == "hf":  # the MLP half of a MoE block is the router and the grouped experts
        mlp_fwd, mlp_bwd = (5, 8) if m.mlp == "swiglu" else (3, 5)
        layer_fwd = m.layers * dense_fwd + moe_layers * (moe_fwd - mlp_fwd)
        layer_bwd = m.layers * dense_bwd + moe_layers * (moe_bwd - mlp_bwd)
        host_fwd, host_bwd = host_fwd - moe_layers * mlp_fwd, host_bwd - moe_layers * mlp_bwd
    else:
        layer_fwd, layer_bwd = host_fwd, host_bwd
    top_fwd, top_bwd = TOP_KERNELS["hf" if t.impl == "hf" else "zlayout"]
    odd, even = (head_fwd, 0.0) if align == 1 else (0.0, head_fwd)
    return (PhaseWork(gemm_fwd, odd, attn_fwd, bytes_fwd, layer_fwd + top_fwd, fixed_s=moe_fixed_fwd,
                      host_kernels=host_fwd + top_fwd, host_fixed_s=HOST_FORWARD_FIXED_S, half_aligned_gemm_flops=even),
            PhaseWork(gemm_bwd, 2 * odd, attn_bwd, bytes_bwd, layer_bwd + top_bwd + (layer_fwd if ckpt else 0),
                      fixed_s=moe_fixed_bwd, host_kernels=host_bwd + top_bwd + (host_fwd if ckpt else 0),
                      half_aligned_gemm_flops=2 * even, attention_backward_flops=attn_fwd * ATTENTION_BACKWARD_RATIO))


def micro_step_work(inp: PlanInput, layout: Layout) -> tuple[PhaseWork, PhaseWork]:
    """The forward and the backward (recompute included) of one micro-step on one GPU: the model's
    own work (the card's record, `card_work`, where the model has one; else `hand_work`) and
    DeepSpeed's around it (gradient bookkeeping, ZeRO-3's gathers and hooks)."""
    m = inp.model
    ckpt = inp.training.checkpointing == "full"
    card = card_with_work(inp)
    fwd, bwd = card_work(inp, card, gemm_weight_alignment(inp, layout)) if card is not None else hand_work(inp)
    bytes_fwd, bytes_bwd = fwd.hbm_bytes, bwd.hbm_bytes
    # gradient bookkeeping in the backward hooks: stage 0 accumulates bf16 grads into fp32 (r2 r4 w4);
    # stages 1-3 copy them into the reduction buckets (r2 w2). Only for the gradients a step makes:
    # a multimodal model trained on text gives its vision tower none, and its hooks never fire
    trained_tensors, trained_params = trained_parameters(inp)
    bytes_bwd += (10 if layout.stage == 0 else 4) * trained_params
    if layout.stage == 3:
        # each pass gathers every partition into the full parameters (r2 w2: the gathered flat buffer
        # split into the parameters); on one GPU there is nothing to gather: the fetch points the
        # parameter at its partition, which is the whole tensor (NoGatherHandle), no copy
        gathered = 4 * m.params if inp.hardware.world > 1 else 0.0
        bytes_fwd += gathered
        bytes_bwd += gathered * (2 if ckpt else 1) + 6 * m.params / inp.hardware.world  # + fp32 grad partition
    fetches_fwd = fetches_bwd = stage3_grad_hooks = 0.0
    if layout.stage == 3:
        fetches_fwd = float(stage3_hooked_modules(inp))
        fetches_bwd = fetches_fwd * (2 if ckpt else 1)  # the recompute's forward fetches again
        stage3_grad_hooks = float(trained_tensors)
    grad_hooks = float(trained_tensors) if layout.stage in (1, 2) else 0.0
    hook_kernels = trained_tensors  # each gradient's copy into the bucket (stage 0: its accumulation)
    return (replace(fwd, hbm_bytes=bytes_fwd, stage3_fetches=fetches_fwd),
            replace(bwd, hbm_bytes=bytes_bwd, kernels=bwd.kernels + hook_kernels,
                    host_kernels=bwd.host_kernels + hook_kernels, stage3_fetches=fetches_bwd,
                    stage3_grad_hooks=stage3_grad_hooks, grad_hooks=grad_hooks))


def stage3_hooked_modules(inp: PlanInput) -> int:
    """Modules ZeRO-3's hooks run on in each pass: every module of the model, parameters or not
    (DeepSpeed registers them recursively; a module with only persistent parameters still runs
    the Python that checks them). zlayout's GPT block: itself, 2 norms, qkv, proj, fc1, fc2;
    a transformers decoder layer: the calls its card counted (`ModelCard.stage3_modules`), else by
    hand: itself, attention, q/k/v/o, MLP, gate/up/down, the activation, 2 norms (GPT-2-style
    fused qkv: 4 fewer)."""
    m, t = inp.model, inp.training
    if t.impl != "hf":
        return 7 * m.layers + 4
    counted = m.card.stage3_modules() if m.card is not None else None
    if counted is not None:  # the model's own module calls, counted by the learner (Qwen3: 15 a layer)
        return counted
    dense = 13 if m.mlp == "swiglu" else 9
    attention_half = dense - 5 if m.mlp == "swiglu" else dense - 3
    moe = attention_half + 3 + 5 * m.shared_experts + (1 if m.shared_expert_gate else 0)  # block, router, experts
    return m.dense_layer_count * dense + m.moe_layer_count * moe + 6


def optimizer_work(inp: PlanInput, layout: Layout) -> tuple[float, int]:
    """The GPU optimizer step's HBM bytes (zero when the optimizer is offloaded), and the tensors it visits."""
    m, n = inp.model, inp.hardware.world
    partition = m.params / n if layout.stage >= 1 else m.params
    hbm_bytes = 0.0
    if layout.offload_optimizer == "gpu":
        hbm_bytes += GPU_OPTIMIZER_BYTES_PER_PARAM * partition
        if layout.stage in (1, 2):
            hbm_bytes += 6 * partition  # the gradient partition cast to fp32 (stage 3: in the backward hooks)
    # stage 3 steps its flat fp32 sub-groups (sub_group_size), not one parameter tensor at a time
    # (its per-tensor gradient norm: `optimizer_kernels`)
    return hbm_bytes, (1 if layout.stage == 3 else parameter_tensors(inp))


def optimizer_kernels(inp: PlanInput, layout: Layout) -> int:
    """Kernels stage 3's step launches one tensor at a time, priced at the host floor's rate (tiny
    kernels: the host issuing them is the time): its gradient norm runs per gradient (stage3.py,
    get_grad_norm_direct: g.double() and .norm(2), two kernels each).
    Stages 1-2's per-tensor Python is STEP_OVERHEAD_PER_TENSOR_S's, ZeRO-0's STAGE0_STEP_OVERHEAD_PER_TENSOR_S's."""
    return 2 * parameter_tensors(inp) if layout.stage == 3 else 0


def peak_flops(inp: PlanInput) -> float:
    """The GPU's peak FLOP/s in the training precision (fp32: half the bf16 peak)."""
    return inp.hardware.gpu.peak_bf16_flops * (0.5 if inp.training.precision == "fp32" else 1.0)


def hbm_bytes_per_s(gpu) -> float:
    """The GPU's nominal HBM bandwidth, in the H200's terms (`GpuSpec.hbm_efficiency_factor`): what the
    model's HBM efficiencies, fitted on H200 runs, are shares of."""
    return gpu.hbm_gbps * gpu.hbm_efficiency_factor * 1e9


def elementwise_bytes_per_s(inp: PlanInput) -> float:
    """HBM bytes per second that elementwise, norm and loss kernels stream."""
    return hbm_bytes_per_s(inp.hardware.gpu) * HBM_EFFICIENCY


def gemm_seconds_per_flop(inp: PlanInput, c: GpuStepConstants = SHIPPED) -> float:
    """1 / the dense GEMMs' achieved FLOP/s, which grows with the hidden size towards the asymptote."""
    return (1 + c.gemm_half_width / inp.model.hidden) / (peak_flops(inp) * c.gemm_efficiency)


def batched_gemm_seconds_per_flop(inp: PlanInput, c: GpuStepConstants = SHIPPED) -> float:
    """1 / eager attention's batched matmuls' achieved FLOP/s: q @ k^T and probs @ v per head, whose
    narrow side is the head's width (64-256) where a dense layer's is the hidden size: the same
    efficiency curve at the head's width (head_dim 256: 0.46 of peak, 128: 0.34, 64: 0.22)."""
    head_width = inp.model.q_size / inp.model.heads
    return (1 + c.gemm_half_width / head_width) / (peak_flops(inp) * c.gemm_efficiency)


def stage3_hooks_s(inp: PlanInput, work: PhaseWork, c: GpuStepConstants = SHIPPED) -> float:
    """Host time of ZeRO-3's hooks in a pass: per module fetched (more with world > 1: the gather
    buffers, the waits on the all-gather stream) and per gradient hook."""
    per_fetch_s = c.stage3_fetch_overhead_s + (STAGE3_GATHER_OVERHEAD_S if inp.hardware.world > 1 else 0.0)
    return work.stage3_fetches * per_fetch_s + work.stage3_grad_hooks * c.stage3_grad_hook_s


def host_floor_s(work: PhaseWork) -> float:
    """The host's time for a pass as the host-floor rows measure it: its ops (HOST_S_PER_KERNEL each:
    the Python, dispatch and autograd of an op and its first kernel's launch) and the further kernels
    an op launches (HOST_S_PER_EXTRA_KERNEL each: a sort's radix passes), the forward's fixed Python,
    stages 1-2's gradient hooks."""
    ops = work.host_kernels - work.host_extra_kernels
    return (work.host_fixed_s + ops * HOST_S_PER_KERNEL + work.host_extra_kernels * HOST_S_PER_EXTRA_KERNEL
            + work.grad_hooks * HOST_GRAD_HOOK_S)


def host_pass_s(inp: PlanInput, work: PhaseWork, c: GpuStepConstants = SHIPPED) -> float:
    """The host's time for a pass: the host floor's (`host_floor_s`) and ZeRO-3's hooks, one thread
    running them one after another."""
    return host_floor_s(work) + stage3_hooks_s(inp, work, c)


def pass_weights(gpu_s: float, host_s: float, p: float) -> tuple[float, float]:
    """d pass / d side for `pass_s`'s smooth maximum; a pass is exactly w_gpu * gpu_s + w_host * host_s
    (the p-norm is homogeneous of degree one), which is what lets steptime_fit.py stay linear."""
    longer = max(gpu_s, host_s)
    if longer <= 0 or math.isinf(p):  # the hard maximum
        return (1.0, 0.0) if gpu_s >= host_s else (0.0, 1.0)
    g, h = gpu_s / longer, host_s / longer  # over the longer side: no overflow at large p
    norm = (g ** p + h ** p) ** (1 / p)
    return (g / norm) ** (p - 1), (h / norm) ** (p - 1)


def pass_s(gpu_s: float, host_s: float, p: float | None = None) -> float:
    """A pass's time from its GPU side (kernels and their per-kernel cost) and its host side
    (`host_pass_s`): a smooth maximum, (gpu^p + host^p)^(1/p), p = OVERLAP_P.

    The host queues kernels and runs on without waiting for them: nothing in a pass synchronizes
    (ZeRO-3's hooks neither, DeepSpeed 0.19, partitioned_param_coordinator.py and
    partition_parameters.py: on one GPU a fetch points the parameter at its partition,
    NoGatherHandle, no copy, and the handle's wait synchronizes only the all-gather stream; with
    more GPUs the host waits on that stream's all-gathers, never on the compute stream). verify
    synchronizes between phases, so each pass starts with an empty queue. With the queue between
    them, kernel k starts at the latest of (host time to issue j + GPU time of j..k-1) over j <= k,
    and the pass ends at the largest of host-time-so-far + GPU-time-left: the longer side plus the
    largest lead the other side builds up along the way. With steady per-layer times that lead is
    one layer's, and the pass is the plain maximum; but neither side is steady (the host floor's
    steps spread 10-20% around their median; a layer's GEMMs and its Python alternate), and the
    largest excursion of a difference that wanders is largest when the two sides' means are equal
    and fades as one side dominates: a smooth maximum. At p = 2.5 two equal sides take 1.32 times
    one; a side at 70% of the other adds 15%, at 50% 6.7%, at 30% 1.9%. Measured: ZeRO-0
    transformers L32 h1024 s4096 b2, forward 56 ms where the kernels kept the GPU busy 44 ms (the
    profile) and the host floor is 39 ms: 1.3 times the longer side.
    p is the one constant fitted on the step rows for this (`python benchmarks/steptime_fit.py
    --overlap-p`: the fit's loss over the in-sample rows at p = 2-8 and the hard maximum; 2.5 is
    the least, 0.249 against 0.318 for the hard maximum). It shares what it explains with
    GEMM_HALF_WIDTH (narrow models are the ones whose host is near their GPU): the fit moved that
    from 307 to 140, and the per-kernel GPU cost to zero.
    Tried and not adopted: the plain maximum (held out 21.0% worst, the row above -21%); the sum of
    the kernel classes' longer sides (GEMMs against their launches, elementwise kernels against
    theirs, no lead carried over: forward +24% mean, +87% worst).
    """
    p = OVERLAP_P if p is None else p
    w_gpu, w_host = pass_weights(gpu_s, host_s, p)
    return w_gpu * gpu_s + w_host * host_s


def phase_kernel_s(inp: PlanInput, work: PhaseWork, c: GpuStepConstants = SHIPPED) -> float:
    """The GPU's own time for a pass: GEMMs, attention, HBM-bound elementwise work."""
    peak = peak_flops(inp)
    return (work.gemm_flops * gemm_seconds_per_flop(inp, c)
            + work.batched_gemm_flops * batched_gemm_seconds_per_flop(inp, c)
            + work.unaligned_gemm_flops / (peak * c.unaligned_head_efficiency)
            + work.half_aligned_gemm_flops / (peak * HALF_ALIGNED_HEAD_EFFICIENCY)
            + attention_kernel_s(inp, work, c)
            + work.masked_attention_flops / (peak * c.masked_attention_efficiency)
            + work.fp32_gemm_flops / (peak * FP32_NON_TENSOR_FRACTION * FP32_GEMM_EFFICIENCY)
            + work.hbm_bytes / elementwise_bytes_per_s(inp)
            + work.unaligned_hbm_bytes / (elementwise_bytes_per_s(inp) * UNALIGNED_HBM_FRACTION)
            + work.strided_hbm_bytes / (elementwise_bytes_per_s(inp) * STRIDED_HBM_FRACTION)
            + work.scatter_hbm_bytes / (elementwise_bytes_per_s(inp) * SCATTER_HBM_FRACTION)
            + work.fixed_s)


def attention_kernel_efficiency(head_size: int, seq: int, query_tiles: float, backward: bool,
                                dropout: bool) -> float:
    """The fused attention kernels' achieved / peak at a shape (ATTENTION_KERNEL_EFFICIENCY): linear
    in log2(seq) and in the head size between the measured ones, held at the table's edges, scaled
    by how well `query_tiles` fill the GPU against the sweep's."""
    table = ATTENTION_DROPOUT_KERNEL_EFFICIENCY if dropout else ATTENTION_KERNEL_EFFICIENCY

    def by_seq(row: tuple[float, ...]) -> float:
        x = min(max(math.log2(max(seq, 1)), math.log2(ATTENTION_SEQS[0])), math.log2(ATTENTION_SEQS[-1]))
        i = min(int(x - math.log2(ATTENTION_SEQS[0])), len(ATTENTION_SEQS) - 2)
        f = x - math.log2(ATTENTION_SEQS[i])
        return row[i] + f * (row[i + 1] - row[i])

    sizes = sorted(table)
    d = min(max(head_size, sizes[0]), sizes[-1])
    upper = next(size for size in sizes if size >= d)
    lower = max(size for size in sizes if size <= d)
    low, high = (by_seq(table[size][int(backward)]) for size in (lower, upper))
    efficiency = low if upper == lower else low + (d - lower) / (upper - lower) * (high - low)
    n0 = ATTENTION_FILL_TILES[int(backward)]
    sweep_heads = 2048 // d if d <= 128 else 8  # the sweep's calls: 2,048 / d heads, 8 at d = 256
    sweep_tiles = ATTENTION_SWEEP_TOKENS * sweep_heads / ATTENTION_QUERY_TILE
    # never above the sweep's own: a larger call than it ran is not extrapolated to
    fill = min(1.0, (query_tiles / (query_tiles + n0)) / (sweep_tiles / (sweep_tiles + n0)))
    return efficiency * fill


def attention_kernel_s(inp: PlanInput, work: PhaseWork, c: GpuStepConstants = SHIPPED) -> float:
    """A pass's causal fused attention kernels: forward and backward FLOPs, each split by the share
    that draws dropout (a score costs 4 x d FLOPs forward, 10 x d backward), at the kernels'
    measured efficiency for the model's head size, the sequence and the call's query tiles.
    `c.attention_efficiency` scales the table (ATTENTION_EFFICIENCY: as measured)."""
    m, t = inp.model, inp.training
    if work.attention_flops <= 0:
        return 0.0
    d = m.mla.qk_head_dim if m.mla else m.head_dim
    tiles = t.micro_batch * m.heads * t.seq / ATTENTION_QUERY_TILE
    scale = c.attention_efficiency / ATTENTION_EFFICIENCY
    seconds = 0.0
    dropout_forward, dropout_backward = work.dropout_scores
    for backward, flops, scores, per_score in (
            (False, work.attention_flops - work.attention_backward_flops, dropout_forward, 4 * d),
            (True, work.attention_backward_flops, dropout_backward, 10 * d)):
        if flops <= 0:
            continue
        dropped = min(1.0, scores * per_score / flops)
        for dropout, share in ((False, 1.0 - dropped), (True, dropped)):
            if share > 0:
                seconds += share * flops / (attention_kernel_efficiency(d, t.seq, tiles, backward, dropout) * scale)
    return seconds / peak_flops(inp)


def trained_parameters(inp: PlanInput) -> tuple[int, int]:
    """The parameter tensors, and their elements, that a step gives gradients: all but those a
    model card records as reached by none (a multimodal model's vision tower and projector when
    it trains on text; LLaVA-1.5 with 4 text layers: 395 of 434 tensors, each a hook that never fires)."""
    card = inp.model.card if inp.training.impl == "hf" else None
    if card is None or card.untrained_tensors is None:
        return parameter_tensors(inp), inp.model.params
    return parameter_tensors(inp) - card.untrained_tensors, inp.model.params - card.untrained_params


def parameter_tensors(inp: PlanInput) -> int:
    """The model's parameter tensors as the trained class registers them (the per-tensor Python of
    the backward's gradient hooks and of the optimizer step runs once per tensor): each block's,
    the embedding, the head unless tied, the final norm (a LayerNorm's weight and bias: two).
    A transformers Llama-family layer has separate q/k/v and gate/up weights: 9 tensors where
    the reference GPT's fused block has 6 (allocator_sim.parameter_tensor_sizes)."""
    from zlayout.core.allocator_sim import parameter_tensor_sizes

    m = inp.model
    return len(parameter_tensor_sizes(m, inp.training.impl)) + (1 if m.norm == "layernorm" else 0)


def estimate_step_time(inp: PlanInput, layout: Layout, comm: CommEstimate | None = None,
                       cpu_threads_per_rank: int | None = None,
                       constants: GpuStepConstants | None = None,
                       allocator_flush_s: float | None = None) -> StepTimeEstimate:
    """Wall time of one optimizer step (all micro-steps) and what it buys.

    `cpu_threads_per_rank`: the threads each rank's CPU optimizer runs with (None: host cores /
    ranks per node, what the launchers zlayout writes set OMP_NUM_THREADS to).
    `allocator_flush_s`: what the caching allocator's retries add to a step where the card is
    full (None: from the layout's memory estimate, `core.fit`).
    """
    if allocator_flush_s is None:
        from zlayout.core.memory import estimate_memory

        allocator_flush_s = estimate_memory(inp, layout).gpu_fit.flush_cost_s
    if comm is None:
        comm = estimate_comm(inp, layout)
    m, t, hw = inp.model, inp.training, inp.hardware
    n, accum = hw.world, t.grad_accum
    tokens_per_micro = t.seq * t.micro_batch  # per GPU
    cal = inp.calibration
    c = SHIPPED if constants is None else constants
    params = m.params
    fwd, bwd = micro_step_work(inp, layout)
    micro_fwd_kernels_s = phase_kernel_s(inp, fwd, c) * cal.gpu_factor
    micro_bwd_kernels_s = phase_kernel_s(inp, bwd, c) * cal.gpu_factor
    compute_s = (micro_fwd_kernels_s + micro_bwd_kernels_s) * accum
    loss_s = loss_bytes_per_micro_step(inp) / elementwise_bytes_per_s(inp) * cal.gpu_factor * accum
    # The GPU's per-kernel cost, on the GPU's side of the pass (scaled with the host's Python, as the
    # launch cost it was)
    launch_fwd_s = fwd.kernels * c.kernel_overhead_s * cal.overhead_factor
    launch_bwd_s = bwd.kernels * c.kernel_overhead_s * cal.overhead_factor
    launch_overhead_s = (launch_fwd_s + launch_bwd_s) * accum

    micro_forward_s = pass_s(micro_fwd_kernels_s + launch_fwd_s, host_pass_s(inp, fwd, c) * cal.overhead_factor,
                             c.overlap_p)
    micro_backward_s = pass_s(micro_bwd_kernels_s + launch_bwd_s, host_pass_s(inp, bwd, c) * cal.overhead_factor,
                              c.backward_overlap_p)
    # the host's time the GPU's side does not hide
    host_overhead_s = (micro_forward_s + micro_backward_s
                       - micro_fwd_kernels_s - micro_bwd_kernels_s - launch_fwd_s - launch_bwd_s) * accum

    # The GPU optimizer step: memory-bound passes over the rank's partition, and Python per tensor
    opt_bytes, tensors = optimizer_work(inp, layout)
    gpu_optimizer_s = opt_bytes / (hbm_bytes_per_s(hw.gpu) * c.optimizer_hbm_efficiency) * cal.gpu_factor
    if layout.stage == 0 and layout.offload_optimizer == "gpu":  # FP16_Optimizer: per tensor, no fixed part
        base_s, per_tensor_s = 0.0, c.stage0_step_overhead_per_tensor_s
    else:
        base_s, per_tensor_s = c.step_base_overhead_s, c.step_overhead_per_tensor_s
    step_overhead_s = (base_s + per_tensor_s * tensors
                       + HOST_S_PER_KERNEL * optimizer_kernels(inp, layout)) * cal.overhead_factor

    # What hides behind compute: two side streams, each serial (a bucket is reduced, then its
    # partition copied to the host; a module's partition comes up, then is gathered), each
    # hidden behind its pass except the piece that has nothing to wait behind.
    pcie_bytes_per_s = hw.gpu.pcie_gbps * 1e9 / cal.transfer_factor
    down_s = comm.pcie_to_host_bytes / pcie_bytes_per_s
    fetch_s = comm.pcie_param_fetch_bytes / pcie_bytes_per_s
    grad_return_s = comm.pcie_grad_return_bytes / pcie_bytes_per_s
    up_after_step_s = (comm.pcie_to_gpu_bytes - comm.pcie_param_fetch_bytes
                       - comm.pcie_grad_return_bytes) / pcie_bytes_per_s
    comm_total_s = 0.0
    exposed_comm_s = 0.0
    # The backward's copies: the gradients' (down, and stage 3's round trip back up) are serial on
    # the reduce stream; stage 3's parameter fetches come up on the all-gather stream at the same
    # time, and PCIe carries each direction at its own rate: the longer of the two is the time.
    streams = {"forward": [0.0, 0.0, fetch_s / 2],
               "backward": [0.0, 0.0, max(down_s + grad_return_s, grad_return_s + fetch_s / 2)]}
    for coll in comm.collectives:  # stream: [network s, longest single launch s, PCIe s]
        coll_s = collective_time_s(coll, inp) * cal.transfer_factor
        comm_total_s += coll_s
        if coll.phase in ("after_backward", "after_step"):
            exposed_comm_s += coll_s
            continue
        stream = streams[coll.phase]
        stream[0] += coll_s
        stream[1] = max(stream[1], coll_s / max(1, coll.calls_per_step))
    windows = {
        "forward": STAGE3_PREFETCH_OVERLAP * micro_forward_s * accum,
        "backward": micro_backward_s * (1 if layout.stage == 1 else accum),
    }
    pcie_exposed_s = up_after_step_s
    for phase, (network_s, piece_s, pcie_s) in streams.items():
        busy_s = network_s + pcie_s
        if busy_s <= 0:
            continue
        # the piece with nothing to hide behind: the first gather, or the last bucket
        # reduced and its copy to the host
        tail_s = piece_s + pcie_s / max(1, accum * stage3_fetched_modules(inp))
        exposed_s = min(busy_s, max(tail_s, busy_s - windows[phase]))
        exposed_comm_s += exposed_s * network_s / busy_s
        pcie_exposed_s += exposed_s * pcie_s / busy_s

    threads = hw.cpu_threads_per_rank if cpu_threads_per_rank is None else max(1, cpu_threads_per_rank)
    cpu_optimizer_s = 0.0
    if layout.offload_optimizer != "gpu":
        host_bytes_per_param = CPU_OPTIMIZER_BYTES_PER_PARAM
        if layout.stage == 3 and layout.offload_param == "gpu":
            host_bytes_per_param += STAGE3_HOST_CAST_BYTES_PER_PARAM
        cpu_optimizer_s = (params / n * host_optimizer_s_per_param(inp, threads, host_bytes_per_param)
                           * cal.cpu_optimizer_factor)
    nvme_s = (comm.nvme_read_bytes + comm.nvme_write_bytes) / (hw.nvme_gbps * 1e9) * cal.transfer_factor
    offload_s = cpu_optimizer_s + pcie_exposed_s + nvme_s

    step_s = (compute_s + launch_overhead_s + step_overhead_s + gpu_optimizer_s + host_overhead_s
              + exposed_comm_s + offload_s + allocator_flush_s)
    tokens = tokens_per_micro * accum * n
    model_flops = 6 * m.active_params * tokens  # MoE: the parameters a token goes through
    return StepTimeEstimate(
        compute_s=compute_s,
        comm_s=exposed_comm_s,
        offload_s=offload_s,
        step_time_s=step_s,
        tokens_per_s=tokens / step_s,
        mfu=model_flops / (step_s * n * hw.gpu.peak_bf16_flops),
        gpu_optimizer_s=gpu_optimizer_s,
        step_overhead_s=step_overhead_s,
        host_overhead_s=host_overhead_s,
        comm_total_s=comm_total_s,
        cpu_optimizer_s=cpu_optimizer_s,
        pcie_s=pcie_exposed_s,
        nvme_s=nvme_s,
        tokens_per_step=tokens,
        model_flops_per_step=model_flops,
        loss_s=loss_s,
        cpu_threads_per_rank=threads,
        launch_overhead_s=launch_overhead_s,
        forward_s=micro_forward_s * accum,
        backward_s=micro_backward_s * accum,
        optimizer_s=gpu_optimizer_s + step_overhead_s + cpu_optimizer_s,
        allocator_flush_s=allocator_flush_s,
    )
