"""Build a config.json's transformers class on the meta device and learn its card.

`learn(config)` returns the card as a dict (`zlayout.cards.write_card` writes it). Only a few
blocks run: one of each kind of block the model has (blocks whose parameter shapes differ:
a MoE model's dense first blocks and its expert blocks), and two of the most common kind, so
that the block measured has a block before it, as every block but the first has in training.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import re
from collections import Counter
from typing import Any, Mapping, Sequence

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from zlayout.core.card import (LINEAR_ATTENTION_FLA, SCATTER_SUFFIX, STATE_SPACE_KERNELS, STATE_SPACE_TORCH,
                               STRIDED_SUFFIX, UNALIGNED_SUFFIX, linear_attention_assumed)
from zlayout.hfconfig import per_block_flags
from zlayout.learn.trace import (StorageLedger, Swaps, UnpricedKernel, Window, exceptional_frees, fused_attention,
                                 linear_kernels_patch, value_answers_patch)

# Token counts traced (one sequence): three fix a quadratic term (attention's FLOPs; eager
# attention keeps tokens x tokens probabilities); the check count is traced too and compared.
FIT_TOKENS = (1024, 2048, 4096)
CHECK_TOKENS = 3072
# A fit that misses the checked count by more than this is refused (the card would mislead).
MAX_FIT_ERROR = 0.01


class LearnError(ValueError):
    """A config the learner cannot build or trace: one line saying why."""


# --------------------------------------------------------------------------- building


def build_model(config: Mapping[str, Any]) -> tuple[nn.Module, str]:
    """The model transformers' auto class builds from `config` on the meta device, and its
    attention implementation (transformers picks sdpa where the class supports it, eager
    otherwise: Gemma-2's softcapping is eager). Causal LMs first, then image-text-to-text
    (LLaVA, Qwen2.5-VL: the whole model, vision tower included)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    config = dict(config)
    model_type = config.pop("model_type", None)
    if not isinstance(model_type, str):
        raise LearnError("the config has no 'model_type' (is this a transformers config.json?)")
    if config.get("auto_map"):
        raise LearnError(f"model_type {model_type!r} is built by the model's own remote code (auto_map), "
                         "which zlayout does not run; plan it with --layers --hidden --heads --vocab")
    for key in ("_name_or_path", "transformers_version", "architectures"):
        config.pop(key, None)
    try:
        hf_config = AutoConfig.for_model(model_type, **config)
    except (ValueError, KeyError) as exc:
        raise LearnError(f"transformers cannot read model_type {model_type!r}: {str(exc).splitlines()[0]}") from None
    for auto in (AutoModelForCausalLM, AutoModelForImageTextToText):
        if type(hf_config) not in auto._model_mapping:
            continue
        # the rule the verify worker builds with (zlayout.verify.worker_model.hf_builder)
        attention = "sdpa" if getattr(auto._model_mapping[type(hf_config)], "_supports_sdpa", False) else "eager"
        with torch.device("meta"):
            model = auto.from_config(hf_config, attn_implementation=attention)
        if any(t.device.type != "meta" for t in itertools.chain(model.parameters(), model.buffers())):
            # a tensor the device context does not reach (DiffLlama's lambdas: `torch.normal` with
            # float mean and std makes them on the CPU) goes where the run's `model.to(device)`
            # moves it; on the CPU, its gradient's copy back from the meta device fails
            model.to("meta")
        return model, attention
    raise LearnError(f"transformers has no causal-LM or image-text-to-text class for model_type {model_type!r}")


def shallower_build(config: Mapping[str, Any], blocks: int) -> tuple[int, nn.Module] | None:
    """The class built again at fewer blocks on the meta device (a second of building, no trace):
    one fewer, else two fewer, else half (Gemma-4's config builds only where its full-attention
    blocks keep their overrides' pattern); None where no such depth builds."""
    from zlayout.hfconfig import config_at_depth

    for depth in dict.fromkeys(d for d in (blocks - 1, blocks - 2, blocks // 2) if d >= 1):
        shallower = config_at_depth(config, depth)
        if shallower is None:
            return None
        try:
            other, _ = build_model(shallower)
        except Exception:  # noqa: BLE001: a config valid at some depths only (its own checks)
            continue
        if len(block_list(other)) == depth:
            return depth, other
    return None


def outside_growth(model: nn.Module, blocks: nn.ModuleList, shallower: tuple[int, nn.Module] | None) -> dict[str, int]:
    """Elements each tensor outside the blocks gains per block, where it grows with the depth
    (Gemma-3n's and Gemma-4's per-layer embeddings, vocabulary x blocks x 256, and the projection
    into them), from the class built at fewer blocks (`shallower_build`); {} where none grows."""
    if shallower is None:
        return {}
    depth, other = shallower
    inside = {id(p) for p in block_list(other).parameters()}
    fewer = {name: p.numel() for name, p in other.named_parameters() if id(p) not in inside}
    inside = {id(p) for p in blocks.parameters()}
    added = len(blocks) - depth
    return {name: (p.numel() - fewer[name]) // added for name, p in model.named_parameters()
            if id(p) not in inside and name in fewer and p.numel() != fewer[name]
            and (p.numel() - fewer[name]) % added == 0}


def resizes_exactly(card: Mapping[str, Any], shallower: tuple[int, nn.Module] | None) -> bool:
    """Whether the card resized to the shallower depth (`ModelCard.at_layers`) counts what the class
    builds there: a family whose blocks change with the depth otherwise (Gemma-3n's last blocks
    reuse earlier blocks' keys and values, so which blocks have them moves) cannot be planned at
    another depth from its card. True where no shallower class was built to check against."""
    from zlayout.core.card import CardError, card_from_dict

    if shallower is None:
        return True
    depth, other = shallower
    # a digest of its own: cards are told apart by key and digest (at_layers' cache among them)
    digest = hashlib.sha256(json.dumps(card, sort_keys=True, default=str).encode()).hexdigest()
    try:
        resized = card_from_dict(card, "check", digest=digest).at_layers(depth)
    except CardError:  # it cannot tell its blocks' tensors apart: at_layers refuses any depth already
        return True
    return resized.params == sum(p.numel() for p in other.parameters())


def _tied(model: nn.Module) -> bool:
    """Whether the output head's weight is the input embedding's (what the config's keys say under
    names of their own: LFM2's `tie_embedding`)."""
    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    return head is not None and embedding is not None and head.weight is embedding.weight


def block_list(model: nn.Module) -> nn.ModuleList:
    """The repeated blocks of the language model: the ModuleList holding the most parameters
    (a multimodal model's vision tower has blocks too, fewer parameters)."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m)]
    if not lists:
        raise LearnError(f"{type(model).__name__} has no list of blocks to trace")
    return max(lists, key=lambda m: sum(p.numel() for p in m.parameters()))


def block_kinds(blocks: nn.ModuleList, layer_types: Sequence[Sequence[str]] = ()) -> list[int]:
    """Each block's kind: blocks with the same parameter names and shapes, and the same types
    where the config lists them per block (`per_block_types`: Gemma-3's full-attention layers
    among its sliding ones run without the sliding mask's bias; DeepSeek-V4's first blocks route
    tokens to experts by a hash of their id: same weights, different requests), are one kind."""
    layer_types = [types for types in layer_types if len(types) == len(blocks)]
    signatures: dict[tuple, int] = {}
    kinds = []
    for index, block in enumerate(blocks):
        signature = tuple((name, tuple(p.shape)) for name, p in block.named_parameters())
        signature += tuple(str(types[index]) for types in layer_types)
        kinds.append(signatures.setdefault(signature, len(signatures)))
    return kinds


def per_block_types(config: Any, blocks: int) -> list[list[str]]:
    """The config's lists of one type name per block: `layer_types` (attention), `mlp_layer_types`
    (dense or sparse, DeepSeek-V4's hash or learned routing), `indexer_types` (HY-V4's blocks that
    share the indexer before them), in the config's order; then its other lists of per-block
    names or flags (`zlayout.hfconfig.per_block_flags`), as "key=value"; then Gemma-3n's
    per-block values, as names: `activation_sparsity_pattern` (its first blocks keep only the
    top of each activation: a sparse block asks for more than a dense one on the same weights)
    and `num_kv_shared_layers` (its last blocks reuse an earlier block's keys and values, and
    make none)."""
    values = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    types = [list(value) for key, value in values.items()
             if key.endswith("types") and isinstance(value, (list, tuple)) and len(value) == blocks
             and all(isinstance(name, str) for name in value)]
    types += [[f"{key}={name}" for name in value] for key, value in values.items()
              if not key.endswith("types") and per_block_flags(value, blocks)]
    sparsity = values.get("activation_sparsity_pattern")
    if isinstance(sparsity, (list, tuple)) and len(sparsity) == blocks \
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in sparsity):
        types.append(["sparse" if v > 0 else "dense" for v in sparsity])
    shared = kv_shared_blocks(values, blocks)
    if shared:
        types.append(["shared_kv" if i in shared else "own_kv" for i in range(blocks)])
    return types


def kv_shared_blocks(values: Mapping[str, Any], blocks: int) -> set[int]:
    """The blocks that reuse an earlier block's keys and values (Gemma-3n: the last
    `num_kv_shared_layers`)."""
    shared = values.get("num_kv_shared_layers")
    if isinstance(shared, int) and not isinstance(shared, bool) and 0 < shared < blocks:
        return set(range(blocks - shared, blocks))
    return set()


def traced_blocks(kinds: list[int]) -> list[int]:
    """Blocks to run: the first of each kind, the second of the most common one (measured
    after another block, as most blocks run), and the block after the last of those (a
    block's forward is measured up to the next block's start, when its input is freed)."""
    common = Counter(kinds).most_common(1)[0][0]
    chosen = sorted({kinds.index(k) for k in set(kinds)}
                    | set([i for i, k in enumerate(kinds) if k == common][:2]))
    if chosen[-1] + 1 < len(kinds):
        chosen.append(chosen[-1] + 1)
    return chosen


def _owner_config(model: nn.Module, blocks: nn.ModuleList):
    for module in model.modules():
        if any(child is blocks for child in module.children()):
            return getattr(module, "config", model.config)
    return model.config


@contextlib.contextmanager
def _truncated(model: nn.Module, blocks: nn.ModuleList, keep: list[int]):
    """The model with only the `keep` blocks (config counts and per-block lists cut to match)."""
    owner = next(m for m in model.modules() if any(c is blocks for c in m.children()))
    attr = next(name for name, c in owner.named_children() if c is blocks)
    config = _owner_config(model, blocks)
    saved = {}
    for key in ("num_hidden_layers", "layer_types"):
        if key in getattr(config, "__dict__", {}):
            saved[key] = getattr(config, key)
    setattr(owner, attr, nn.ModuleList([blocks[i] for i in keep]))
    if "num_hidden_layers" in saved:
        config.num_hidden_layers = len(keep)
    if isinstance(saved.get("layer_types"), list):
        config.layer_types = [saved["layer_types"][i] for i in keep]
    try:
        yield getattr(owner, attr)
    finally:
        setattr(owner, attr, blocks)
        for key, value in saved.items():
            setattr(config, key, value)


def cuda_dropout(original):
    """`torch.nn.functional.dropout` as it runs on a CUDA tensor. ATen's `dropout` (Dropout.cpp)
    takes the fused kernel, `native_dropout`, where `is_fused_kernel_acceptable`: a CUDA input,
    0 < p < 1, not in place. It returns the output and a one-byte boolean mask, which its backward
    keeps. On any other device (the meta device the learner runs on) it draws the noise in the
    input's dtype instead (`empty_like`, `bernoulli_`, `div_`, `mul`) and keeps that: two bytes an
    element in bf16 where CUDA keeps one (h200-2026-12-15: starcoderbase-1b's card held a 32 MiB
    tensor per dropout where the run holds 16; the plan was 3.1% over). In place, or at p 0 or 1,
    CUDA runs the same unfused code: left to torch."""

    def dropout(input, p=0.5, training=True, inplace=False):
        if training and not inplace and 0.0 < p < 1.0 and input.numel() > 0:
            return torch.native_dropout(input, p, True)[0]
        return original(input, p, training, inplace)

    return dropout


@contextlib.contextmanager
def _patched(ledger: StorageLedger):
    """What the meta device cannot run as CUDA does: the fused attention kernels (priced by
    `fused_attention`), dropout's fused kernel (`cuda_dropout`), and two checks of transformers'
    masks that read a value (`.item()`), answered as a real run's are for the learner's input, one
    unpadded sequence per row: it is not packed (`find_packed_sequence_indices`: None), and a
    padding mask a model makes for it (BART's decoder: `torch.ones`) is all ones (`fast_all`:
    True, so the causal mask is skipped for sdpa's is_causal, as on a GPU; a bidirectional
    model's, read by `_ignore_bidirectional_mask_sdpa`, is as none). The check behind a
    warning that reads the input's first and last token (`warn_if_padding_and_no_attention_mask`:
    RoFormer, BigBird, MegatronBERT, RemBERT) is skipped: it changes no tensor."""
    import transformers.masking_utils as masking
    from transformers.modeling_utils import PreTrainedModel

    functional = torch.nn.functional
    fast_all, bidirectional = masking.fast_all, masking._ignore_bidirectional_mask_sdpa
    stand_ins = [  # (owner, attribute, what runs in its place)
        (functional, "scaled_dot_product_attention", fused_attention(ledger, functional.scaled_dot_product_attention)),
        (functional, "dropout", cuda_dropout(functional.dropout)),
        (masking, "find_packed_sequence_indices", lambda position_ids: None),
        (masking, "fast_all", lambda tensor: True if tensor.is_meta else fast_all(tensor)),
        (masking, "_ignore_bidirectional_mask_sdpa", lambda padding_mask, *args, **kwargs: bidirectional(
            None if padding_mask is not None and padding_mask.is_meta else padding_mask, *args, **kwargs)),
        (PreTrainedModel, "warn_if_padding_and_no_attention_mask", lambda self, input_ids, attention_mask: None),
    ]
    swaps = Swaps()
    for owner, name, stand_in in stand_ins:
        swaps.swap(owner, name, stand_in)
    linear = linear_kernels_patch(ledger)  # GDN linear attention: fla's kernels (trace.py)
    values = value_answers_patch()  # JetMoE's router counts, XLM's longest length (trace.py)
    try:
        yield
    finally:
        values.restore()
        linear.restore()
        swaps.restore()


def _numel_bytes(tensor: torch.Tensor) -> int:
    """A tensor's bytes, every element counted (a buffer's size; trace._bytes is a kernel's traffic,
    which reads a broadcast tensor's storage once)."""
    return tensor.numel() * tensor.element_size()


def _first_tensor(values) -> torch.Tensor | None:
    if isinstance(values, torch.Tensor):
        return values
    if isinstance(values, (tuple, list)):
        for value in values:
            found = _first_tensor(value)
            if found is not None:
                return found
    if isinstance(values, dict):
        return _first_tensor(list(values.values()))
    return None


def weights_saved_as_views(model: nn.Module, blocks: nn.ModuleList, keep: list[int], tokens: int = 64) -> set[int]:
    """The ids of the blocks' weight matrices autograd saves for backward as a view of their
    storage outside `torch.nn.functional.linear` (FalconLinear's `input @ self.weight.T`). Under
    ZeRO-3, DeepSpeed replaces F.linear with a function that saves the parameter itself, whose
    data its release swaps out; a saved view keeps the gathered storage alive until the
    block's backward, which gathers the weight again (h200-2026-12-09, falcon-7b-L8 with the
    weights on the CPU: every block's four weights held from the forward to the backward,
    3.7 GiB the replay had freed)."""
    weights = {p.untyped_storage()._cdata: id(p) for i in keep for p in blocks[i].parameters() if p.dim() == 2}
    held: set[int] = set()
    inside_linear = [0]
    original_linear = torch.nn.functional.linear

    def linear(input, weight, bias=None):  # as DeepSpeed's zero3_linear_wrap: its saves do not count
        inside_linear[0] += 1
        try:
            return original_linear(input, weight, bias)
        finally:
            inside_linear[0] -= 1

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if not inside_linear[0] and not isinstance(tensor, nn.Parameter):
            owner = weights.get(tensor.untyped_storage()._cdata)
            if owner is not None:
                held.add(owner)
        return tensor

    ledger = StorageLedger()
    ids = torch.zeros(1, tokens, dtype=torch.long, device=next(model.parameters()).device)
    torch.nn.functional.linear = linear
    try:
        with _truncated(model, blocks, keep), _patched(ledger), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(input_ids=ids, labels=ids, use_cache=False)
    finally:
        torch.nn.functional.linear = original_linear
    return held


class SameDtypeProducts(TorchDispatchMode):
    """Raises where a matrix product or a convolution meets two floating dtypes, as CUDA's kernels
    do ("expected mat1 and mat2 to have the same dtype", "Input type (float) and weight type
    (c10::BFloat16) should be the same"); the meta device returns the wider one. Norms are not
    checked: CUDA's layer norm takes a bf16 input with float32 weights."""

    PRODUCTS = (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm, torch.ops.aten.baddbmm,
                torch.ops.aten.addbmm, torch.ops.aten.convolution)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in self.PRODUCTS:
            operands = args[:3] if func.overloadpacket is torch.ops.aten.convolution else args  # input, weight, bias
            dtypes = {a.dtype for a in operands if isinstance(a, torch.Tensor) and a.is_floating_point()}
            if len(dtypes) > 1:
                raise RuntimeError(f"{func}: expected the same dtype, got {sorted(map(str, dtypes))}")
        return func(*args, **(kwargs or {}))


def buffer_cast_needed(model: nn.Module, blocks: nn.ModuleList, keep: list[int], tokens: int) -> bool:
    """Whether the model fails to run with bf16 weights beside its buffers as built, as DeepSpeed
    0.19 trains it, and runs with them cast: the engine casts the parameters only and keeps each
    buffer's dtype unless the config sets `data_types.buffer_dtype`
    (engine._cast_module_mixed_precision). openai-gpt multiplies its float32 causal mask into the
    attention weights, xglm adds its float32 sinusoidal table to the embeddings; the next matmul
    meets bf16 weights and raises. Such a model trains only with the buffers cast (the card's
    `buffer_dtype`, which profile.ds_config writes); every other keeps its buffers, as its code
    expects (rotary inv_freq in float32). A model that fails either way (Inkling-2's router casts
    its input to float32 for a weight DeepSpeed makes bf16) cannot train in bf16 under DeepSpeed:
    LearnError. A forward and backward of the traced blocks at `tokens` (the first count traced);
    an error that is not about dtypes is left to the learning that follows."""
    as_built = _dtype_error(model, blocks, keep, tokens, cast_buffers=False)
    if as_built is None:
        return False
    cast = _dtype_error(model, blocks, keep, tokens, cast_buffers=True)
    if cast is not None:
        raise LearnError(f"its code runs a product of float32 and bf16 tensors ({cast}) with every weight "
                         "and buffer in bf16, as DeepSpeed casts them: it cannot train in bf16 under DeepSpeed "
                         "as written; plan it by shape (--layers, --hidden, ...: the hand model)")
    return True


def cast_as_deepspeed(model: nn.Module, buffers: bool) -> None:
    """The dtypes DeepSpeed trains the model in: every floating parameter in bf16
    (engine._cast_module_mixed_precision), a buffer only with `data_types.buffer_dtype` set (the
    card's `buffer_dtype`); the others keep their dtype, and an op that meets one runs in it (CodeGen's
    and GPT-J's float32 sin/cos table makes their rotary float32)."""
    for p in model.parameters():
        if p.is_floating_point():
            p.data = p.data.to(torch.bfloat16)
    if buffers:
        for m in model.modules():
            for name, b in m._buffers.items():
                if b is not None and b.is_floating_point():
                    m._buffers[name] = b.to(torch.bfloat16)


def _dtype_error(model: nn.Module, blocks: nn.ModuleList, keep: list[int], tokens: int,
                 cast_buffers: bool) -> str | None:
    """The first line of the dtype error a bf16 step raises (weights cast, buffers as built or
    cast), or None where it runs (or fails otherwise: left to the learning)."""
    floating = [p for p in model.parameters() if p.is_floating_point()]
    before = [p.data for p in floating]
    buffers = [(m, name, b) for m in model.modules() for name, b in m._buffers.items()
               if b is not None and b.is_floating_point()]
    cast_as_deepspeed(model, buffers=cast_buffers)
    ids = torch.zeros(1, tokens, dtype=torch.long, device=before[0].device if before else "meta")
    try:
        with _truncated(model, blocks, keep), _patched(StorageLedger()), SameDtypeProducts():
            out = model(input_ids=ids, labels=ids, use_cache=False)
            (out.loss if hasattr(out, "loss") else out[0]).backward()
    except Exception as exc:  # noqa: BLE001: the model's own code, run on a few of its blocks
        return _gist(exc) if "dtype" in str(exc) or "scalar type" in str(exc) else None
    finally:
        for p, data in zip(floating, before):
            p.data, p.grad = data, None
        for m, name, b in buffers:
            m._buffers[name] = b
    return None


# --------------------------------------------------------------------------- one step


def trace_step(model: nn.Module, blocks: nn.ModuleList, tokens: int, checkpointing: bool,
               sequences: int = 1) -> dict[str, Any]:
    """One forward and backward of `sequences` sequences of `tokens`, its windows and op work."""
    head = model.get_output_embeddings()
    ledger = StorageLedger(logits_width=getattr(head, "out_features", None))
    state = {"backward": False, "head_backward": None, "head_forward": None, "preamble": None}
    forward_windows: dict[int, Window] = {}
    backward_windows: dict[int, Window] = {}
    recompute_windows: dict[int, Window] = {}
    handles = []

    def opener(index: int):
        def open_backward(grad):
            if state["head_backward"] is not None:
                ledger.close_window(state["head_backward"])
                state["head_backward"] = None
            backward_windows[index] = ledger.open_window("backward", index)
        return open_backward

    def closer(index: int):
        def close_backward(grad):
            if index in backward_windows:
                ledger.close_window(backward_windows[index])
            if index in recompute_windows:  # checkpoint's recompute stopped early
                ledger.close_window(recompute_windows[index])
        return close_backward

    for index, block in enumerate(blocks):
        def pre(module, args, kwargs, index=index):
            phase = "recompute" if state["backward"] else "forward"
            if phase == "forward" and index == 0 and state["preamble"] is not None:
                ledger.close_window(state["preamble"])
                state["preamble"] = None
            if phase == "forward" and index - 1 in forward_windows:
                # the previous block's window ends here: its input (the hidden state before
                # it) is freed once it has returned, and the window must see that free
                ledger.close_window(forward_windows.pop(index - 1))
            forward_windows[index] = ledger.open_window(phase, index)
            hidden = _first_tensor(args) if args else _first_tensor(kwargs.get("hidden_states"))
            if phase == "forward" and hidden is not None and hidden.requires_grad:
                hidden.register_hook(closer(index))

        def post(module, args, kwargs, output, index=index):
            window = forward_windows[index]
            if window.phase != "forward" or index == len(blocks) - 1:
                ledger.close_window(forward_windows.pop(index))
            out = _first_tensor(output)
            if window.phase == "forward" and out is not None and out.requires_grad:
                out.register_hook(opener(index))
            if window.phase == "forward" and index == len(blocks) - 1:
                state["head_forward"] = ledger.open_window("head_forward", -1)

        handles.append(block.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(block.register_forward_hook(post, with_kwargs=True))
        # transformers checkpoints a block's forward inside its hooks: its recompute is seen
        # from its sub-modules, from the first one called to the last one registered (or to
        # the block's input gradient, when the recompute stops once it has what backward needs)
        children = list(block.children())

        def child_pre(module, args, index=index):
            if state["backward"] and index not in recompute_windows:
                recompute_windows[index] = ledger.open_window("recompute", index)

        def child_post(module, args, output, index=index):
            if index in recompute_windows:
                ledger.close_window(recompute_windows[index])

        for child in children:
            handles.append(child.register_forward_pre_hook(child_pre))
        if children:
            handles.append(children[-1].register_forward_hook(child_post))
    trained: set[int] = set()  # the parameters a gradient reached (a multimodal model's vision tower: none)

    def took_gradient(parameter):
        trained.add(id(parameter))
        parameter.grad = None  # DeepSpeed takes each gradient into its buckets as it is made: none accumulates here

    for parameter in model.parameters():
        if parameter.requires_grad:
            handles.append(parameter.register_post_accumulate_grad_hook(took_gradient))

    # every module forward the step calls, by block (-1: outside the blocks), forward only: what
    # ZeRO-3's pre-forward hook runs on (DeepSpeed hooks every module; one not called fetches nothing)
    module_calls: Counter = Counter()
    block_of = {id(block): index for index, block in enumerate(blocks)}
    inside = [-1]

    def count_call(module, args):
        if state["backward"]:
            return
        index = block_of.get(id(module))
        if index is not None:
            inside[0] = index
        module_calls[inside[0]] += 1

    def leave_block(module, args, output):
        if id(module) in block_of and not state["backward"]:
            inside[0] = -1

    handles.append(torch.nn.modules.module.register_module_forward_pre_hook(count_call))
    handles.append(torch.nn.modules.module.register_module_forward_hook(leave_block))

    # as the verify worker: non-reentrant checkpointing of every block
    if checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.activation_checkpointing_disable()
    model.train()
    ids = torch.zeros(sequences, tokens, dtype=torch.long, device=next(model.parameters()).device)
    ledger.exclude([*model.parameters(), *model.buffers(), ids])
    try:
        with _patched(ledger), ledger, torch.autograd.graph.saved_tensors_hooks(
                lambda t: (ledger.saved(t), t)[1], lambda t: t):
            # the model's forward up to its first block: the embedding, the attention masks, the
            # rotary tables (held to its return: core.card.Regime.head_preamble)
            state["preamble"] = ledger.open_window("preamble", -1)
            outputs = model(input_ids=ids, labels=ids, use_cache=False)
            loss = outputs.loss
            del outputs  # dropped as HF Trainer's compute_loss does; the loss alone is kept
            ledger.close_window(state["head_forward"])
            head_window = ledger.open_window("head_backward", -1)
            state["head_backward"], state["backward"] = head_window, True
            forward_work = (Counter(ledger.op_flops), Counter(ledger.op_bytes), Counter(ledger.op_calls),
                            Counter(ledger.op_ops))
            ledger.run_backward(loss)
            del loss
            if state["head_backward"] is not None:
                ledger.close_window(head_window)
    finally:
        for handle in handles:
            handle.remove()
    return {"windows": ledger.closed, "forward_work": forward_work, "trained": trained,
            "attention_kernels": set(ledger.sdpa_kernels), "module_calls": module_calls,
            "flops": ledger.op_flops, "bytes": ledger.op_bytes, "calls": ledger.op_calls, "ops": ledger.op_ops}


def op_work(flops: Counter, moved: Counter, calls: Counter, ops: Counter) -> dict[str, dict[str, int]]:
    """A phase's work by op: each FLOP-counted op (the matmuls, the attention kernels) on its own,
    every other op (elementwise, norms, copies, reductions: memory-bound) summed as "elementwise"
    ("elementwise_unaligned" those on tensors 16-byte loads cannot walk, `trace._vector_aligned`;
    "elementwise_strided" the pointwise ops over a broadcast or strided operand, `trace._one_walk`;
    "elementwise_scatter" the accumulating index_puts, `trace.INDEX_PUTS`);
    each with its FLOPs, the bytes it moves, its kernel launches and the ops that launched them (a
    sort: one op, a dozen kernels; the host issues the op once, `trace.StorageLedger.add_work`)."""
    table = {"elementwise": {"flops": 0, "bytes": 0, "calls": 0, "ops": 0}}
    for op in sorted(calls):
        suffix = next((end for end in (UNALIGNED_SUFFIX, STRIDED_SUFFIX, SCATTER_SUFFIX) if op.endswith(end)), "")
        memory = "elementwise" + suffix
        entry = table.setdefault(op if flops[op] > 0 else memory, {"flops": 0, "bytes": 0, "calls": 0, "ops": 0})
        entry["flops"] += flops[op]
        entry["bytes"] += moved[op]
        entry["calls"] += calls[op]
        entry["ops"] += ops[op]
    return table


def measure(step: dict[str, Any], blocks_traced: int) -> dict[str, Any]:
    """Per traced block and for the head: the requests of each phase (+bytes allocated,
    -bytes freed, in order) and the work of each op (`op_work`) in its forward and backward (with
    checkpointing the backward holds the recompute)."""
    windows = step["windows"]

    def one(phase: str, index: int) -> Window | None:
        found = [w for w in windows if w.phase == phase and w.block == index]
        return found[0] if found else None

    blocks = {}
    in_blocks = {phase: [Counter(), Counter(), Counter(), Counter()] for phase in ("forward", "backward")}
    for index in range(blocks_traced):
        fwd, bwd, rec = one("forward", index), one("backward", index), one("recompute", index)
        if fwd is None or bwd is None:
            # Llama-3.2-Vision's cross-attention blocks skip a step without an image
            raise LearnError(f"traced block {index} ran no {'forward' if fwd is None else 'backward'} in a "
                             "text-only step (a block that waits for an image, as Llama-3.2-Vision's "
                             "cross-attention ones): the learner traces text steps only")
        for phase, window in (("forward", fwd), ("backward", bwd)):  # the recompute runs inside the backward's window
            for total, counted in zip(in_blocks[phase], (window.flops, window.moved, window.calls, window.ops)):
                total.update(counted)
        blocks[index] = {
            "forward": fwd.events, "backward": bwd.events, "recompute": rec.events if rec else [],
            "frees": {"forward": exceptional_frees(fwd.events, fwd.frees),
                      "backward": exceptional_frees(bwd.events, bwd.frees)},
            "forward_reductions": fwd.reductions, "backward_reductions": bwd.reductions,
            "saved_by_dtype": dict(fwd.saved_by_dtype),
            "work_forward": op_work(fwd.flops, fwd.moved, fwd.calls, fwd.ops),
            "work_backward": op_work(bwd.flops, bwd.moved, bwd.calls, bwd.ops),
        }
    head_forward, head_backward, preamble = one("head_forward", -1), one("head_backward", -1), one("preamble", -1)
    # the embedding, the final norm, the head and the loss: the step's work outside the blocks
    step_forward = step["forward_work"]
    step_backward = [Counter(total) for total in (step["flops"], step["bytes"], step["calls"], step["ops"])]
    for total, forward in zip(step_backward, step_forward):
        total.subtract(forward)
    head = {"forward": head_forward.events, "backward": head_backward.events,
            "preamble": preamble.events if preamble else [],
            "frees": {"forward": exceptional_frees(head_forward.events, head_forward.frees),
                      "backward": exceptional_frees(head_backward.events, head_backward.frees),
                      "preamble": exceptional_frees(preamble.events, preamble.frees) if preamble else []},
            "forward_reductions": head_forward.reductions, "backward_reductions": head_backward.reductions,
            "preamble_reductions": preamble.reductions if preamble else {},
            "work_forward": op_work(*(Counter(total) - counted
                                      for total, counted in zip(step_forward, in_blocks["forward"]))),
            "work_backward": op_work(*(total - counted
                                       for total, counted in zip(step_backward, in_blocks["backward"])))}
    return {"blocks": blocks, "head": head}


# --------------------------------------------------------------------------- fitting


def fit(points: list[tuple[int, float]]) -> list[float]:
    """[q, a, c] with q*T^2 + a*T + c through the points (two: q = 0; three: exact)."""
    if len(points) == 2:
        (t1, y1), (t2, y2) = points
        a = (y2 - y1) / (t2 - t1)
        return [0.0, a, y1 - a * t1]
    (t1, y1), (t2, y2), (t3, y3) = points
    d1, d2 = (y2 - y1) / (t2 - t1), (y3 - y2) / (t3 - t2)
    q = (d2 - d1) / (t3 - t1)
    a = d1 - q * (t1 + t2)
    return [q, a, y1 - q * t1 * t1 - a * t1]


def evaluate(poly: list[float], tokens: int) -> float:
    q, a, c = poly
    return q * tokens * tokens + a * tokens + c


def net_and_peak(events: list[float]) -> tuple[float, float]:
    """What a phase leaves allocated (the sum of its requests) and the most it holds at once
    above what it started with."""
    live = peak = 0.0
    for event in events:
        live += event
        peak = max(peak, live)
    return live, peak


def _fit_terms(samples: list[tuple[int, Any]], check: tuple[int, Any], errors: list) -> Any:
    """Fit every number in a nested structure of measurements. A list of requests is fitted
    request by request and checked by what it leaves and its peak; one whose length differs
    between token counts (the code took another path) cannot be fitted: LearnError."""
    first = samples[0][1]
    if isinstance(first, dict):
        keys = set().union(*(s[1].keys() for s in samples))

        def absent(k: str) -> Any:
            # a term one token count does not have: an op a short sequence never runs is no work
            # there (an empty entry), a number is 0
            present = next(v[k] for _, v in samples if k in v)
            return {} if isinstance(present, dict) else 0
        return {k: _launches(samples, k) if k in ("calls", "ops") else _same_frees(samples, check, k) if k == "frees"
                else _fit_terms([(t, v.get(k, absent(k))) for t, v in samples],
                                (check[0], check[1].get(k, absent(k))), errors)
                for k in sorted(keys)}
    if isinstance(first, list):
        if len({len(v) for _, v in samples} | {len(check[1])}) != 1:
            raise _PathChanged(f"the blocks' requests differ in number between token counts "
                               f"({sorted({len(v) for _, v in samples})}){LOOP_OVER_TOKENS}")
        polys = [fit([(t, v[i]) for t, v in samples]) for i in range(len(first))]
        predicted = net_and_peak([evaluate(poly, check[0]) for poly in polys])
        for guess, measured in zip(predicted, net_and_peak(check[1])):
            errors.append((abs(guess - measured), abs(measured)))
        return polys
    poly = fit([(t, float(v)) for t, v in samples])
    errors.append((abs(evaluate(poly, check[0]) - check[1]), abs(check[1])))
    return poly


def _same_frees(samples: list[tuple[int, Any]], check: tuple[int, Any], key: str) -> dict:
    """A phase's exceptional frees (`trace.exceptional_frees`): the pairs every trace has (the same code
    at another length). A pair only some traces have is two tensors whose sizes meet at that length
    (Mixtral's logits gradient and head weight gradient at as many tokens as the hidden size, 4,096),
    which the replay's own rule orders at any other; it no longer drops the phase's other pairs
    (Mixtral-8x7B's head backward lost its saved log-softmax's free: h200-2026-12-25 trace-4)."""
    traced = [v.get(key, {}) for _, v in samples] + [check[1].get(key, {})]
    common = {phase: [pair for pair in pairs if all(pair in t.get(phase, []) for t in traced)]
              for phase, pairs in traced[0].items()}
    return {phase: pairs for phase, pairs in common.items() if pairs}


def _launches(samples: list[tuple[int, Any]], key: str) -> list[float]:
    """An op's kernel launches (or the ops that launched them): a constant, the count at the longest
    sequence traced. They do not grow with the tokens, but a few ops change kernels with their size
    (a sort of at most 4,096 keys in one kernel, a longer one by radix passes; an index_put's sort
    over the bits of its rows: zlayout.learn.launches), which a polynomial through the traces would
    extrapolate; the longest trace is the nearest to the sequences a run trains on."""
    tokens, value = max(samples, key=lambda sample: sample[0])
    return [0.0, 0.0, float(value.get(key, 0))]


# why a model whose requests grow in number with the tokens has no card, and what to do instead
LOOP_OVER_TOKENS = (": its code loops over the sequence in Python (as MiniMax's lightning attention does, 256 tokens "
                    "at a time), which is not a card this learner can fit; plan a transformer of its size "
                    "with --layers --hidden --heads --vocab")


class _PathChanged(LearnError):
    """The code took another path between token counts (a sliding window's mask), so no polynomial
    holds the requests over the counts traced."""


def sliding_window(config: Mapping[str, Any]) -> int | None:
    """The attention window a config sets (its text model's for a multimodal one), if any."""
    for source in (config, config.get("text_config") or {}):
        window = source.get("sliding_window")
        if isinstance(window, int) and not isinstance(window, bool) and window > 0 \
                and source.get("use_sliding_window", True) is not False:
            return window
    return None


def model_positions(config: Mapping[str, Any]) -> int | None:
    """The longest sequence a config says its model holds, if it says (its text model's for a multimodal one)."""
    for source in (config, config.get("text_config") or {}):
        for key in ("n_positions", "max_position_embeddings", "max_seq_len"):
            value = source.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def regimes_to_trace(config: Mapping[str, Any]) -> list[tuple[int | None, tuple[int, ...], int]]:
    """(the longest sequence a regime holds, the token counts fitted, the count checked):
    one regime; with a sliding window, one up to the window and one past it."""
    window = sliding_window(config)
    if window is None:
        return [(None, FIT_TOKENS, CHECK_TOKENS)]
    past = -(-window // 8) * 8  # Phi-3's window of 2047: 2048
    if window > 2 * max(FIT_TOKENS):
        positions = model_positions(config)
        if positions is not None and window >= positions:  # Phi-3.5-MoE's window: all 131,072 positions
            return [(None, FIT_TOKENS, CHECK_TOKENS)]
        # a window longer than 8,192 tokens: the usual counts below it, and past it (the meta device
        # traces any length at the same cost)
        return [(window - 1, FIT_TOKENS, CHECK_TOKENS), (None, (past, 2 * past, 4 * past), 3 * past)]
    # transformers builds the window's mask once a sequence is as long as the window. The counts
    # traced below it are multiples of 8, as sequences are trained: a T x T tensor's rows are then
    # 16-byte aligned in bf16 as they are in the run (an odd count would record its ops as
    # misaligned, `trace._vector_aligned`, and the fit would see them change kind).
    below = [n // 8 * 8 for n in (window // 4, window // 2, 3 * window // 4, window - 1)]
    return [(window - 1, tuple(below[:3]), below[3]),
            (None, (past, 2 * past, 4 * past), 3 * past)]


def _total_requests(measured: Any) -> int:
    """The number of requests in all of a measurement's lists."""
    if isinstance(measured, dict):
        return sum(_total_requests(v) for k, v in measured.items() if k != "frees")
    return len(measured) if isinstance(measured, list) else 0


def _request_counts(measured: Any) -> Any:
    """The number of requests in each list of a measurement (its shape, not its sizes)."""
    if isinstance(measured, dict):
        return {k: _request_counts(v) for k, v in measured.items() if k != "frees"}
    return len(measured) if isinstance(measured, list) else None


def per_sequence(fitted: Any, sequences: int) -> Any:
    """Polynomials fitted on `sequences` sequences a step as one sequence's: what grows with the
    tokens is divided by them (the planner multiplies it by the micro-batch, `core.card.bytes_at`),
    what does not (a weight's gradient, a kernel's launches) stays."""
    if isinstance(fitted, dict):
        return {k: per_sequence(v, sequences) for k, v in fitted.items()}
    if isinstance(fitted, list) and len(fitted) == 3 and all(isinstance(x, float) for x in fitted):
        q, a, c = fitted
        return [q / sequences, a / sequences, c]
    if isinstance(fitted, list):
        return [per_sequence(v, sequences) for v in fitted]
    return fitted


# Sequences a step holds when its blocks' requests depend on more than the token count: a reshape
# that merges the batch with the heads is a view for one sequence and a copy for two. Falcon's
# multi-query attention on the math path expands k and v to every head: at 4 x 2048 each block
# keeps two float32 copies of 142 MiB that one sequence never makes (h200-2026-12-09, falcon-7b-L8 at
# ZeRO-3: the plan 4.5 GiB under the run until the card was learned from two sequences).
BATCHED_SEQUENCES = 2


def _learn_regime(model, blocks, keep, fit_tokens, check_tokens,
                  long_tokens: int | None = None) -> tuple[dict, float, set, set, int, bool, Counter, dict | None]:
    """The regime's fitted requests and work, the fit's worst miss, the parameters trained, the
    attention kernels, the sequences a step held (1, or BATCHED_SEQUENCES where two sequences
    make requests one does not), whether the requests grow as the micro-batch from there
    (_linear_in_sequences), a forward's module calls by traced block (-1: outside), and, where
    two sequences were traced, one sequence's own fit (None: the same path, or none fits).
    `long_tokens`: a second check past the longest count fitted, which a kink inside the counts
    fitted misses by far (DeepSeek-V3.2's indexer keeps min(T, 2048) tokens: a quadratic through
    1,024, 2,048 and 4,096 tokens bends down past them); the meta device traces any length alike."""
    trained: set[int] = set()
    kernels: set[str] = set()
    module_calls: Counter = Counter()

    # a class transformers cannot checkpoint (CTRL, openai-gpt) is traced without: its card's
    # checkpointed phases repeat the plain ones, which plan never reads (ModelCard.checkpointing)
    checkpointable = getattr(model, "supports_gradient_checkpointing", False)

    def traces(sequences: int) -> dict[bool, list[tuple[int, dict]]]:
        runs: dict[bool, list[tuple[int, dict]]] = {False: [], True: []}
        for checkpointing in (False, True) if checkpointable else (False,):
            for tokens in (*fit_tokens, check_tokens, *([long_tokens] if long_tokens else [])):
                step = trace_step(model, traced, tokens, checkpointing, sequences)
                trained.update(step["trained"])
                kernels.update(step["attention_kernels"])
                if not module_calls:
                    module_calls.update(step["module_calls"])
                measured = measure(step, len(keep))
                # another number of requests is another path, which no fit holds (_fit_terms): said
                # at once, before the longer traces (MiniMax's lightning attention loops over
                # 256-token blocks: 1,660 requests at 1,024 tokens, 3,100 at 2,048)
                if runs[checkpointing] and (_request_counts(measured) != _request_counts(runs[checkpointing][0][1])):
                    first, count = runs[checkpointing][0], _total_requests(measured)
                    raise _PathChanged(f"the blocks' requests differ in number between token counts "
                                       f"({_total_requests(first[1]):,} at {first[0]:,} tokens, {count:,} at "
                                       f"{tokens:,}){LOOP_OVER_TOKENS}")
                runs[checkpointing].append((tokens, measured))
        if not checkpointable:
            runs[True] = runs[False]
        return runs

    with _truncated(model, blocks, keep) as traced:
        _settle(model, max(fit_tokens + (check_tokens, long_tokens or 0)))  # its blocks are the kept ones here
        single = runs = traces(1)
        sequences = 1
        batched = measure(trace_step(model, traced, fit_tokens[0], False, BATCHED_SEQUENCES), len(keep))
        # the blocks decide: every head's loss copies its shifted labels for two sequences (a few
        # bytes a token), which a card learned from one sequence is not meaningfully short of
        if _request_counts(batched["blocks"]) != _request_counts(runs[False][0][1]["blocks"]):
            runs, sequences = traces(BATCHED_SEQUENCES), BATCHED_SEQUENCES
    checks = [t for t in (check_tokens, long_tokens) if t]
    fits, worst = _fit_runs(runs, len(fit_tokens), checks)
    fitted = {ck: per_sequence(fits[ck], sequences) for ck in (False, True)}
    one = None
    if sequences > 1:  # the one sequence's own requests, which a micro-batch of 1 plans with
        # where its path changes with the tokens, none: the per-sequence card holds it
        with contextlib.suppress(_PathChanged):
            one = _fit_runs(single, len(fit_tokens), checks)[0]
    linear = sequences == 1 or _linear_in_sequences(model, blocks, keep, fitted[False], check_tokens, 2 * sequences)
    per_step = _per_step_requests(single[False][0][1]["head"]["preamble"], batched["head"]["preamble"])
    for fit, traced_sequences in [*((f, sequences) for f in fitted.values()), *((f, 1) for f in (one or {}).values())]:
        # a request made once a step is held as made, not per sequence of the traces
        fit["head"]["preamble"] = [[q * traced_sequences, a * traced_sequences, c] if i in per_step else [q, a, c]
                                   for i, (q, a, c) in enumerate(fit["head"]["preamble"])]
        fit["head"]["preamble_per_step"] = sorted(per_step)
    return fitted, worst, trained, kernels, sequences, linear, module_calls, one


def _per_step_requests(one: list[int], two: list[int]) -> set[int]:
    """The preamble's requests made once a step: those as large with two sequences as with one
    (a (1, 1, T, T) mask, rotary tables over positions of shape (1, T)), where the card holds the
    rest per sequence (`per_sequence`). Qwen3-8B's rotary tables at 2 x 4,096 tokens are 2 MiB
    each on the H200, not 4 (h200-2026-12-12 trace-q-3). None where the two paths differ."""
    if len(one) != len(two):
        return set()
    return {i for i, (a, b) in enumerate(zip(one, two)) if a == b and a != 0}


def _settle(model: nn.Module, tokens: int) -> None:
    """One forward of `tokens` tokens without autograd before a regime's traces. A model that grows a
    buffer to the sequence in its first step (XGLM's sinusoidal table, past its 2,048 rows) grows it
    here, as a run's first step does: the traces are of the steps after it, which a run repeats
    (traced as they came, the longest count's requests outnumbered the others' by the growth)."""
    ledger = StorageLedger()
    ids = torch.zeros(1, tokens, dtype=torch.long, device=next(model.parameters()).device)
    with _patched(ledger), ledger, torch.no_grad():
        model(input_ids=ids, use_cache=False)


def _fit_runs(runs: dict[bool, list[tuple[int, dict]]], fitted_at: int, checks: list[int]) -> tuple[dict, float]:
    """Each mode's (plain, checkpointed) terms fitted through its first `fitted_at` traces, and the
    fit's miss at the first check; _PathChanged where a check misses by more than MAX_FIT_ERROR."""
    fitted, worst = {}, 0.0
    for checked, tokens in enumerate(checks):
        errors: list[tuple[float, float]] = []
        fits = {ck: _fit_terms(runs[ck][:fitted_at], runs[ck][fitted_at + checked], errors) for ck in (False, True)}
        # the large terms decide the check: a few-byte term off by a few bytes is not a miss
        scale = max(measured for _, measured in errors)
        miss = max(missed / max(measured, 0.01 * scale) for missed, measured in errors)
        if miss > MAX_FIT_ERROR:
            raise _PathChanged(f"the fit misses the {tokens}-token trace by {miss:.1%}: the model's memory "
                               "is not a function of the token count the card can hold")
        if not checked:  # the card records the fit and its miss at the first check
            fitted, worst = fits, miss
    return fitted, worst


def _linear_in_sequences(model, blocks, keep, fitted: dict, tokens: int, sequences: int) -> bool:
    """Whether the blocks' requests at `sequences` sequences a step are no more than the per-sequence
    fit's (bytes_at: linear in the micro-batch). DeepSeek-V3.2's and GLM-5's indexer mask the
    (B, S, T) scores with a (B, 1, S, T) mask: a (B, B, S, T) tensor, which no card linear in B
    holds. Less is safe: openai-gpt's (1, 1, T, T) mask is made once a step, which the card prices
    once a sequence (a few MiB over at a large micro-batch, transient in the forward)."""
    with _truncated(model, blocks, keep) as traced:
        step = measure(trace_step(model, traced, tokens, False, sequences), len(keep))
    for index in range(len(keep)):
        block, measured = fitted["blocks"][index], step["blocks"][index]
        for phase in ("forward", "backward"):
            predicted = net_and_peak([sequences * (q * tokens * tokens + a * tokens) + c for q, a, c in block[phase]])
            actual = net_and_peak(measured[phase])
            if any(m - p > MAX_FIT_ERROR * max(abs(m), 1.0) for p, m in zip(predicted, actual)):
                return False
    return True


def _learn_regimes(config: Mapping[str, Any], model: nn.Module, blocks: nn.ModuleList, kinds: list[int],
                   keep: list[int], every_block: bool = False,
                   to_trace: list[tuple[int | None, tuple[int, ...], int]] | None = None,
                   long_check: bool = True) -> tuple[list[dict], float, set, dict, set]:
    """Each regime's card entries from traces of the `keep` blocks: (regimes, the worst fit error,
    the attention kernels, the module calls, the parameters a gradient reached). Where `keep` is
    every block, each kind's blocks must ask for the same (_same_requests); `every_block` (the
    fallback for models whose blocks cannot run alone) also takes each kind's entry from a block
    inside its kind's run. `to_trace`: the regimes (default `regimes_to_trace`); `long_check`:
    check the unbounded one past its counts too (not for a model that holds no longer sequence)."""
    traced = to_trace or regimes_to_trace(config)
    # probed at the first count traced: a shorter probe can switch the model for good (BigBird turns
    # its block-sparse attention into full attention below 704 tokens, in the model, not the call)
    held = weights_saved_as_views(model, blocks, keep, tokens=min(traced[0][1]))
    regimes, worst, attention_kernels, module_calls = [], 0.0, set(), None
    for max_tokens, fit_tokens, check_tokens in traced:
        try:
            fitted, error, trained, kernels, sequences, linear, calls, one = _learn_regime(
                model, blocks, keep, fit_tokens, check_tokens,
                long_tokens=LONG_CHECK * max(fit_tokens) if max_tokens is None and long_check else None)
        except _PathChanged:
            if to_trace is not None:
                raise
            # The model's memory steps with the sequence where these counts were traced: a short
            # window's regimes (DeepSeek-V4: a window of 128 and KV compressed every 4 and 128
            # tokens), or an indexer's top-k that stops growing inside the counts fitted
            # (DeepSeek-V3.2: min(T, 2048) tokens; V4: min(T / 4, 512)). One regime traced at
            # longer sequences holds it past those, and the card holds no shorter one (min_tokens).
            return _learn_long_regime(config, model, blocks, kinds, keep, every_block)
        if len(keep) == len(blocks):  # every block ran: a kind whose blocks differ is seen, and refused
            owner = _owner_config(model, blocks)
            shared = kv_shared_blocks(owner.to_dict() if hasattr(owner, "to_dict") else {}, len(blocks))
            _same_requests(kinds, fitted, config.get("model_type"), {kinds[i] for i in shared})
        if module_calls is None:  # the same at any token count: the first regime's
            module_calls = {"per_kind": [calls[keep.index(kinds.index(kind))] for kind in sorted(set(kinds))],
                            "outside": calls[-1]}
        attention_kernels |= kernels
        worst = max(worst, error)
        longest = max(fit_tokens)  # the token count a reduction's flags are read at (reduction_rows)
        regime = {"tokens_fitted": list(fit_tokens), "tokens_checked": check_tokens, "fit_error": round(error, 6),
                  **_regime_entries(fitted, kinds, keep, blocks, held, every_block, longest)}
        if one is not None:  # a micro-batch of 1 plans with these (core.card.Regime.single_sequence)
            regime["single_sequence"] = _regime_entries(one, kinds, keep, blocks, held, every_block, longest)
        if sequences > 1:  # learned from two sequences a step, stored per sequence (BATCHED_SEQUENCES)
            regime = {"sequences_traced": sequences, **regime}
        if not linear:  # exact at the sequences traced only: planned at no larger micro-batch
            regime = {"max_micro_batch": sequences, **regime}
        if max_tokens is not None:
            regime = {"max_tokens": max_tokens, **regime}
        regimes.append(regime)
    return regimes, worst, attention_kernels, module_calls, trained


def _regime_entries(fitted: dict, kinds: list[int], keep: list[int], blocks: nn.ModuleList, held: set[int],
                    every_block: bool, longest: int) -> dict[str, Any]:
    """A regime's card entries from its fitted terms: one block a kind, and the head."""
    kind_blocks = []
    for kind in sorted(set(kinds)):
        # the last traced block of this kind with a traced block after it (the most common
        # kind's has one before it too)
        measured = [i for i, block in enumerate(keep) if kinds[block] == kind]
        index = max([i for i in measured if i < len(keep) - 1] or measured)
        if every_block and len(measured) >= 3:
            index = measured[1]  # one inside its kind's run: the first and last free what the kind shares
        plain, checkpointed = fitted[False]["blocks"][index], fitted[True]["blocks"][index]
        runs = {"forward": plain, "backward": plain, "checkpointed_forward": checkpointed,
                "checkpointed_backward": checkpointed}  # the trace each phase's entries come from
        kind_blocks.append({
            "kind": kind, "traced_block": keep[index],
            "forward": plain["forward"], "backward": plain["backward"],
            "checkpointed_forward": checkpointed["forward"], "checkpointed_backward": checkpointed["backward"],
            "recompute": checkpointed["recompute"],
            **_free_entries(runs), **_reduction_entries(runs, longest),
            "saved_by_dtype": plain["saved_by_dtype"],
            "work": work(plain, checkpointed),
        })
        views = [p.numel() for p in blocks[keep[index]].parameters() if id(p) in held]
        if views:  # ZeRO-3 keeps these gathered until the block's backward (core.card.BlockCard)
            kind_blocks[-1]["zero3_held"] = views
    head, checkpointed_head = fitted[False]["head"], fitted[True]["head"]
    head_runs = {"preamble": head, "forward": head, "backward": head, "checkpointed_forward": checkpointed_head,
                 "checkpointed_backward": checkpointed_head}
    return {"blocks": kind_blocks,
            "head": {"preamble": head["preamble"], "preamble_per_step": head["preamble_per_step"],
                     "forward": head["forward"], "backward": head["backward"],
                     "checkpointed_forward": checkpointed_head["forward"],
                     "checkpointed_backward": checkpointed_head["backward"],
                     **_free_entries(head_runs), **_reduction_entries(head_runs, longest),
                     "work": work(head, checkpointed_head)}}


# The fewest positions a model may hold for the learner to trace within them (positions_regime)
MIN_POSITIONS = 128
# The unbounded regime's second check, at this many times its longest count fitted (16,384 tokens
# for FIT_TOKENS). Where the regimes fail, `_learn_long_regime` fits from each of these counts on
# until one holds: a card learned from 8,192 tokens covers the long-context runs that have such kinks.
LONG_CHECK = 4
LONG_REGIME_STARTS = (1024, 2048, 4096, 8192)


def _learn_long_regime(config: Mapping[str, Any], model: nn.Module, blocks: nn.ModuleList, kinds: list[int],
                       keep: list[int], every_block: bool) -> tuple[list[dict], float, set, dict, set]:
    """`_learn_regimes` for a model whose memory no polynomial holds over the usual token counts:
    one regime fitted at (T, 2T, 4T) for the first T of LONG_REGIME_STARTS past the sliding window
    that its two checks pass, and one up to T fitted at (T/4, T/2, 3T/4) where its check at 7T/8
    passes; where it does not, the card holds sequences of T tokens or more (min_tokens)."""
    window = sliding_window(config) or 0
    failed: _PathChanged | None = None
    for start in (t for t in LONG_REGIME_STARTS if t >= window):
        try:
            regimes, *rest = _learn_regimes(config, model, blocks, kinds, keep, every_block, to_trace=[
                (None, (start, 2 * start, 4 * start), 3 * start)])
        except _PathChanged as exc:
            failed = exc
            continue
        # below the start, where the model's memory may still be a polynomial (up to DeepSeek-V3.2's
        # kink the indexer keeps every token): a regime up to it, or none and the card starts there
        below = (start - 1, (start // 4, start // 2, 3 * start // 4), 7 * start // 8)
        if window < start // 4:
            try:
                shorter, error, kernels, *_ = _learn_regimes(config, model, blocks, kinds, keep, every_block,
                                                            to_trace=[below])
                worst, attention_kernels, *others = rest
                return [*shorter, *regimes], max(worst, error), attention_kernels | kernels, *others
            except _PathChanged:
                pass
        return [{"min_tokens": start, **regimes[0]}], *rest
    raise failed or _PathChanged(f"its sliding window ({window:,} tokens) is longer than the sequences the "
                                 "learner traces")


def _same_requests(kinds: list[int], fitted: dict, model_type: Any, shared_kv_kinds: set[int] = frozenset()) -> None:
    """With every block traced: LearnError where two blocks of one kind ask for different requests
    (Gemma-3n's first layers run a sparse activation the others do not, on the same weights),
    which one card entry per kind cannot hold. Each kind's first and last block are left out (the
    first's backward and the last's forward free what every block of the kind uses: Gemma-4's
    full-attention rotary tables), and the model's last block (measured up to the final norm). The
    last two of a kind are left out where its blocks read keys and values an earlier block made
    (Gemma-3n's `num_kv_shared_layers`): autograd keeps the last block's gradient of them as the sum's
    buffer, adds the next one's out of place, and the others' in place, so the kind's last two ask
    for less and more than the rest."""
    runs = {kind: [i for i, k in enumerate(kinds[:-1]) if k == kind] for kind in set(kinds)}
    for kind, indices in runs.items():
        inner = indices[1:-2] if kind in shared_kv_kinds else indices[1:-1]
        for index in inner[1:]:
            for phase in ("forward", "backward"):
                a, b = fitted[False]["blocks"][inner[0]][phase], fitted[False]["blocks"][index][phase]
                if len(a) != len(b) or any(abs(x - y) > 1e-6 * max(1.0, abs(x), abs(y))
                                           for p, q in zip(a, b) for x, y in zip(p, q)):
                    raise LearnError(f"transformers' {model_type!r} blocks {inner[0]} and {index} have the same "
                                     f"weights but ask for different memory in their {phase}: not a card this "
                                     "learner can hold; plan it by shape (--layers, --hidden, ...: the hand model)")


REDUCTION_FLAGS = ("fastest", "contiguous", "reduce_dims", "ndim", "output_vec", "acc_bytes", "max_threads")


def reduction_rows(fitted: dict[int, dict[str, list[float]]], tokens: int) -> list[list[float]]:
    """A phase's reductions as the card holds them (core.card `_reductions`): the placeholders'
    index, the outputs' and the inputs' polynomials, then the flags, which do not change with the
    tokens (where one would, its value at `tokens`, the longest sequence fitted)."""
    rows = []
    for at, shape in sorted(fitted.items()):
        flags = [round(q * tokens * tokens + a * tokens + c) for q, a, c in (shape[f] for f in REDUCTION_FLAGS)]
        rows.append([at, *shape["outputs"], *shape["inputs"], *flags])
    return rows


def work(plain: dict, checkpointed: dict) -> dict[str, dict]:
    """A block's (or the head's) fitted work per phase: op -> [flops, bytes, calls, ops] polynomials
    (kernel launches, and the ops that launched them: core.card `OpWork`)."""
    return {phase: {op: [entry["flops"], entry["bytes"], entry["calls"], entry["ops"]]
                    for op, entry in run[f"work_{half}"].items()}
            for phase, run, half in (("forward", plain, "forward"), ("backward", plain, "backward"),
                                     ("checkpointed_forward", checkpointed, "forward"),
                                     ("checkpointed_backward", checkpointed, "backward"))}


def _free_entries(runs: dict[str, dict]) -> dict[str, list]:
    """`<phase>_frees` for the phases that have exceptional frees (a checkpointed phase's are its run's)."""
    out = {}
    for phase, run in runs.items():
        pairs = run.get("frees", {}).get(phase.removeprefix("checkpointed_"))
        if pairs:
            out[f"{phase}_frees"] = pairs
    return out


def _reduction_entries(runs: dict[str, dict], tokens: int) -> dict[str, list]:
    """`<phase>_reductions` for the phases that have any (a checkpointed_forward's are its run's
    forward's, a checkpointed_backward's its backward's, the recompute inside it)."""
    out = {}
    for phase, run in runs.items():
        rows = reduction_rows(run[phase.removeprefix("checkpointed_") + "_reductions"], tokens)
        if rows:
            out[f"{phase}_reductions"] = rows
    return out


GIST_CHARS = 300


def _gist(exc: BaseException) -> str:
    """An error's first line, with the next where the first only introduces it (transformers'
    config validation: "Validation error for field 'attn_pdrop':" then what is wrong)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    gist = f"{lines[0]} {lines[1]}" if len(lines) > 1 and lines[0].endswith(":") else lines[0] if lines else ""
    return gist if len(gist) <= GIST_CHARS else gist[:GIST_CHARS] + "..."  # a value printed whole can be huge


def learn(config: Mapping[str, Any]) -> dict[str, Any]:
    """The model card of `config` (a parsed config.json), as a dict. LearnError (one line)
    when transformers cannot build or run the model from it."""
    try:
        return _learn(config)
    except LearnError:
        raise
    except UnpricedKernel as exc:
        raise LearnError(f"transformers' {config.get('model_type')!r}: {exc}: this model type cannot be learned "
                         "yet; plan it by shape (--layers, --hidden, ...: the hand model)") from None
    except Exception as exc:  # noqa: BLE001: the model's own code fails in its own ways
        # (DeepSeek-V3 with more expert groups than routed experts: topk's "k not in range")
        first_line = _gist(exc)
        what = f"{type(exc).__name__}{': ' + first_line if first_line else ''}"
        if _reads_tensor_values(exc):
            # Qwen4-Exp selects tokens with torch.nonzero: the meta device holds no values,
            # so no trace without data can follow it (JetMoE's, XLM's and DBRX's reads are answered: trace.py)
            raise LearnError(f"transformers' {config.get('model_type')!r} code reads tensor values while it "
                             f"runs ({what}), which a trace on the meta device has none of: this model type "
                             "cannot be learned here; plan it by shape (--layers, --hidden, ...: the hand "
                             "model)") from exc
        positions = model_positions(config) or model_positions(_class_defaults(config))
        if positions is not None and MIN_POSITIONS <= positions < LONG_CHECK * max(FIT_TOKENS) \
                and (sliding_window(config) or positions) >= positions:
            # GPT-Neo's and MPT's 2,048-token causal mask and ALiBi buffers, BERT's 512-row token-type
            # buffer: such a model cannot run the 1,024-4,096 tokens traced, nor train on them (BigBird's
            # 4,096-row table runs those but not the long check's 16,384; XLM leaves its 512 to its class).
            # Traced within its positions, the card holds what it can train on
            try:
                return _learn(config, positions)
            except LearnError:
                raise
            except Exception as within:  # noqa: BLE001: its code fails within its positions too
                line = _gist(within)
                if (type(within), line) != (type(exc), first_line):  # else the same error: not the positions
                    what = (f"{type(within).__name__}{': ' + line if line else ''} (traced within the "
                            f"{positions:,} positions this config holds)")
        raise LearnError(f"transformers' {config.get('model_type')!r} code cannot run this config: {what}") from exc


def linear_attention_entry(config: Mapping[str, Any], regimes: list[dict]) -> dict[str, str]:
    """The card's `linear_attention`: core.card.LINEAR_ATTENTION_FLA where its blocks ran the
    stand-ins of fla's and causal-conv1d's kernels (trace.linear_kernels_patch), STATE_SPACE_TORCH
    for a Mamba-2 model (transformers' torch reference ran), else nothing. The card's key holds the
    assumption (cards.config_key): the two must agree, or a card priced one way would be served
    under the other's key."""
    def ran(work: str) -> bool:
        return any(work in block["work"]["forward"] for regime in regimes for block in regime["blocks"])

    assumed = linear_attention_assumed(config)
    for work, kernels, types in (("linear_attention_forward", LINEAR_ATTENTION_FLA, "LINEAR_ATTENTION_MODEL_TYPES"),
                                 ("selective_scan_forward", STATE_SPACE_KERNELS, "MAMBA_KERNEL_MODEL_TYPES")):
        if ran(work) != (assumed == kernels):
            raise LearnError(f"{config.get('model_type')!r}: its {'linear attention' if 'linear' in work else 'scan'} "
                             "ran " + (f"the stand-ins of {kernels}'s kernels (as priced), which its model type is "
                                       "not known to" if ran(work) else "transformers' torch loop, which the card "
                                       "cannot hold") + f" use (zlayout.core.card.{types})")
    if assumed != STATE_SPACE_TORCH:
        return {} if assumed is None else {"linear_attention": assumed}
    # the torch reference pads the sequence to a multiple of the scan's chunk (`pad_tensor_by_size`):
    # the card's requests, fitted at multiples, hold there only (spec.training_limits says so)
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else config
    chunk = next((text[k] for k in ("chunk_size", "mamba_chunk_size") if isinstance(text.get(k), int)), None)
    if chunk is None or isinstance(chunk, bool) or not 1 <= chunk <= max(FIT_TOKENS):
        raise LearnError(f"{config.get('model_type')!r}: no chunk_size or mamba_chunk_size of 1-{max(FIT_TOKENS)} "
                         "tokens, which its state-space scan pads the sequence to")
    return {"linear_attention": assumed, "token_quantum": chunk}


def _class_defaults(config: Mapping[str, Any]) -> dict[str, Any]:
    """The config as transformers' config class completes it (a config.json may leave a key to the
    class's default: XLM's 512 positions); empty where the class cannot read it."""
    from transformers import AutoConfig

    given = {k: v for k, v in config.items() if k not in ("model_type", "_name_or_path", "transformers_version",
                                                          "architectures")}
    try:
        return AutoConfig.for_model(config.get("model_type"), **given).to_dict()
    except Exception:  # noqa: BLE001: build_model has said what is wrong with it
        return {}


def _reads_tensor_values(exc: BaseException) -> bool:
    """Whether the model's code failed because it read a meta tensor's values (`.item()`,
    `.tolist()`, a data-dependent shape, `torch.nonzero`: Qwen4-Exp's QSA indexer selects each
    query's visible tokens with it): torch's own messages for it."""
    text = str(exc)
    return ("Cannot copy out of meta tensor" in text or "data-dependent" in text.lower()
            or "Tensor.item() cannot be called on meta tensors" in text
            or "register_meta function for torch.nonzero()" in text)


# The names transformers gives a learned absolute-position table (GPT-2's wpe, OPT's and Whisper's
# embed_positions, BERT's position_embeddings, openai-gpt's positions_embed): a longer sequence
# indexes past its rows. A fixed table of sines computed once (CTRL's pos_encoding, GPT-J's and
# CodeGen's rotary embed_positions) is a floating buffer with "pos" in its name, indexed alike.
POSITION_TABLE_NAME = re.compile(r"(^|\.)(wpe|embed_positions|position_embeddings|positions_embed)$")


def position_table(model: nn.Module) -> int | None:
    """The positions the language model's position tables hold (the fewest, where it has several),
    if it has one: an embedding's rows less those no position reads (`_rows_in_front`), a table
    buffer's rows. On the meta device an index past the table runs; on a GPU it stops
    the step (Whisper's decoder: 448 rows, which no config key the learner reads says). Rotary
    models computing their angles each step, and ALiBi ones, have none. Tables of a vision or
    audio tower (Moss's 1,500 audio positions) are not the text's: only those inside the module
    that holds both the blocks and the input embedding (`transformer.`, `roformer.`, Moss's
    `model.language_model.`) count."""
    names = {id(m): n for n, m in model.named_modules()}
    embedding = names.get(id(model.get_input_embeddings()), "")
    owner = names.get(id(block_list(model)), "")
    while owner and not embedding.startswith(owner + "."):
        owner = owner.rpartition(".")[0]
    prefix = owner + "." if owner else ""
    rows = [module.num_embeddings - _rows_in_front(module) for n, module in model.named_modules()
            if n.startswith(prefix) and isinstance(module, nn.Embedding) and POSITION_TABLE_NAME.search(n)]
    rows += [buffer.shape[0] for n, buffer in model.named_buffers()
             if n.startswith(prefix) and buffer.is_floating_point() and buffer.dim() == 2
             and "pos" in n.rpartition(".")[2].lower()]
    return min(rows) if rows else None


def _rows_in_front(table: nn.Embedding) -> int:
    """The rows of a position table no position reads: OPT's and BART's `offset` (2), and where the
    table has a padding row, it and those before it (RoBERTa's positions start at padding_idx + 1:
    514 rows hold 512 positions; ProphetNet's at 1)."""
    offset = int(getattr(table, "offset", 0) or 0)
    return max(offset, table.padding_idx + 1 if table.padding_idx is not None else 0)


def positions_regime(positions: int) -> list[tuple[None, tuple[int, ...], int]]:
    """The regime to trace for a model that cannot run FIT_TOKENS (a table or mask buffer of
    `positions` rows): fitted at a quarter, half and three quarters of them, checked at seven
    eighths. Not at all of them: a mask sliced from a buffer of `positions` rows is a strided view
    below them and the whole buffer at them (openai-gpt's elementwise work changes kind there)."""
    fit = tuple(positions * k // 8 // 8 * 8 for k in (2, 4, 6))
    return [(None, fit, positions * 7 // 8 // 8 * 8)]


def _learn(config: Mapping[str, Any], positions: int | None = None) -> dict[str, Any]:
    """`learn`; `positions`: trace sequences within that many tokens (positions_regime)."""
    import transformers

    model, attention = build_model(config)
    parameters = [(name, list(p.shape), str(p.dtype).removeprefix("torch."))
                  for name, p in model.named_parameters()]
    blocks = block_list(model)
    shallower = shallower_build(config, len(blocks))
    growth = outside_growth(model, blocks, shallower)
    kinds = block_kinds(blocks, per_block_types(_owner_config(model, blocks), len(blocks)))
    keep = traced_blocks(kinds)
    # the buffers as built, before the cast: outside the blocks, and one block's of each kind
    block_buffers = {id(b) for b in blocks.buffers()}
    buffer_bytes = sum(_numel_bytes(b) for b in model.buffers() if id(b) not in block_buffers)
    block_buffer_bytes = [sum(_numel_bytes(b) for b in blocks[kinds.index(kind)].buffers())
                          for kind in range(max(kinds) + 1)]
    within = {} if positions is None else {"to_trace": positions_regime(positions), "long_check": False}
    # at the first count traced, as _learn_regimes probes: BigBird turns its block-sparse attention
    # into full attention for good below 704 tokens
    try:
        buffer_cast = buffer_cast_needed(model, blocks, keep,
                                         tokens=min((within.get("to_trace") or regimes_to_trace(config))[0][1]))
    except LearnError as exc:
        raise LearnError(f"transformers' {config.get('model_type')!r}: {exc}") from None
    cast_as_deepspeed(model, buffers=buffer_cast)
    in_blocks = {id(p) for p in blocks.parameters()}
    try:
        regimes, worst, attention_kernels, module_calls, trained = _learn_regimes(config, model, blocks, kinds, keep,
                                                                                  **within)
    except (LearnError, UnpricedKernel):
        raise
    except Exception as exc:  # noqa: BLE001: the model's code, run on a few of its blocks
        if len(keep) == len(blocks) or _reads_tensor_values(exc):  # every block would fail alike
            raise
        # Gemma-3n's and Gemma-4's per-layer inputs are one table reshaped by the layer count: a
        # few blocks cannot run alone. Run them all (slower), and keep the card only where every
        # block of a kind asks for the same (_same_requests)
        keep = list(range(len(blocks)))
        regimes, worst, attention_kernels, module_calls, trained = _learn_regimes(
            config, model, blocks, kinds, keep, every_block=True, **within)
    table = position_table(model)
    if table is not None and (positions is None or table < positions):
        positions = table
    if positions is not None:  # plan refuses a longer sequence (core.card.ModelCard.longest_sequence)
        regimes[-1] = {"max_positions": positions, **regimes[-1]}
    card = {
        "format": 1,
        "model_type": config.get("model_type"),
        "attention": attention,
        # the kernels scaled_dot_product_attention runs on a CUDA GPU (trace.cuda_sdpa_kernel)
        "attention_kernels": sorted(attention_kernels),
        # the fused attention's dropout is counted, per score (trace._dropout_scores)
        "attention_dropout_counted": True,
        "dtype": "bfloat16",
        # DeepSpeed must cast the buffers too (data_types.buffer_dtype): `buffer_cast_needed`
        **({"buffer_dtype": "bfloat16"} if buffer_cast else {}),
        "transformers": transformers.__version__,
        "torch": torch.__version__.split("+")[0],
        "fit_error": round(worst, 6),
        "parameters": {"count": sum(p.numel() for p in model.parameters()),
                       # the output head is the input embedding's tensor (transformers tied them)
                       "tied_embeddings": _tied(model),
                       # host memory while the training script builds the model (core.memory)
                       "buffer_bytes": buffer_bytes, "block_buffer_bytes": block_buffer_bytes,
                       # outside the blocks (every block's are trained): the tensors no gradient
                       # reached in a text-only step, whose hooks never fire (a vision tower's)
                       "untrained": [name for name, p in model.named_parameters()
                                     if id(p) not in trained and id(p) not in in_blocks],
                       "names": [n for n, _, _ in parameters], "shapes": [s for _, s, _ in parameters],
                       "dtypes": [d for _, _, d in parameters],
                       # outside the blocks, the tensors that grow with the depth (`outside_growth`):
                       # the card resized to another depth resizes them too (core.card.ModelCard.at_layers)
                       **({"per_block": growth} if growth else {})},
        # module forwards a step calls (ZeRO-3 runs its hooks on each): per block of each kind, and
        # outside the blocks (the model, the embedding, rotary tables, the final norm, the head)
        "layers": {"count": len(kinds), "kinds": kinds, "module_calls": module_calls["per_kind"],
                   "module_calls_outside": module_calls["outside"]},
        **linear_attention_entry(config, regimes),
        # transformers' gradient_checkpointing_enable refuses the class (CTRL, openai-gpt): plan
        # then refuses --checkpointing full (core.card.ModelCard.checkpointing)
        **({} if getattr(model, "supports_gradient_checkpointing", False) else {"checkpointing": False}),
        "regimes": regimes,
    }
    if not resizes_exactly(card, shallower):
        card["layers"]["resizable"] = False  # plan refuses another depth from it (ModelCard.at_layers)
    return card
