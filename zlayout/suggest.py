""""Did you mean" by meaning first, spelling last: choices, flag names and sizes typed the way
neighbouring tools (DeepSpeed, torchrun, Megatron, Hugging Face) write them.

Spelling alone answered `--checkpointing on` with "did you mean none?" (the opposite: 'on' is
close to 'none') and `--num-gpus 8` with "did you mean --nvme-gbps?". So a word with a known
meaning is answered by that meaning, and when its meaning matches no choice nothing is
suggested: a suggestion is never the opposite of what was typed.

Standard library only: the command line's error path and the app share it.
"""

from __future__ import annotations

import difflib
import re
from typing import Sequence

# Words for "on" and "off" whatever the flag; a choice flag with "none" maps them onto it.
TRUTHY = frozenset({"on", "true", "yes", "y", "1", "enable", "enabled", "t"})
FALSY = frozenset({"off", "false", "no", "n", "0", "disable", "disabled", "f", "null", "nil"})

# Other tools' words for a choice's value (keys normalised: lower case, '_' and ' ' as '-').
CHOICE_SYNONYMS: dict[str, str] = {
    # --precision
    "bfloat16": "bf16", "bf-16": "bf16", "bfloat": "bf16",
    "float16": "fp16", "half": "fp16", "fp-16": "fp16",
    "float32": "fp32", "float": "fp32", "single": "fp32", "fp-32": "fp32",
    # --checkpointing
    "all": "full", "activations": "full", "activation": "full", "recompute": "full",
    # --mlp (a gated MLP has three matrices whatever its activation; plain ones two)
    "silu": "swiglu", "swish": "swiglu", "swi-glu": "swiglu", "geglu": "swiglu", "gated": "swiglu",
    "gelu-new": "gelu", "gelu-tanh": "gelu", "gelu-pytorch-tanh": "gelu", "relu": "gelu",
    # --norm
    "ln": "layernorm", "layer-norm": "layernorm", "rms": "rmsnorm", "rms-norm": "rmsnorm",
    # --impl
    "transformers": "hf", "huggingface": "hf", "hugging-face": "hf", "native": "zlayout",
    # --allocator
    "expandable-segments": "expandable", "expandable-segments:true": "expandable",
    "caching": "default",
    # --init
    "zero.init": "zero-init", "zeroinit": "zero-init",
    # --loop
    "hf-trainer": "trainer", "huggingface-trainer": "trainer", "ds": "deepspeed", "engine": "deepspeed",
    # --offload-optimizer / --offload-param ('gpu' is where nothing is offloaded)
    "gpu": "none", "device": "none", "host": "cpu", "ram": "cpu", "ssd": "nvme", "disk": "nvme",
}
_STAGE_WORD = re.compile(r"^(?:zero|z|stage|zero-stage)[-.]?([0-3])$")


def normalise(word: str) -> str:
    return re.sub(r"[\s_]+", "-", str(word).strip().lower())


def choice_by_meaning(word: str, choices: Sequence[object]) -> tuple[bool, list[str]]:
    """(known, suggestions): whether `word` has a meaning zlayout knows, and the choices it
    means. Known with no suggestion: say nothing rather than guess by spelling."""
    names = [str(c) for c in choices]
    key = normalise(word)
    if key in names:  # only the separators differ: zero_init
        return True, [key]
    stage = _STAGE_WORD.match(key)
    if stage and stage.group(1) in names:  # --stage zero3 / z3 / ZeRO-3
        return True, [stage.group(1)]
    if CHOICE_SYNONYMS.get(key) in names:  # another flag's synonym is left to spelling
        return True, [CHOICE_SYNONYMS[key]]
    if key in TRUTHY or key in FALSY:
        if "none" not in names:
            return True, []
        if key in FALSY:
            return True, ["none"]
        return True, [name for name in names if name != "none"]
    return False, []


def did_you_mean_choice(word: str, choices: Sequence[object]) -> str:
    """' (did you mean full?)' by meaning, else by spelling, else ''."""
    known, meant = choice_by_meaning(word, choices)
    if known:
        return f" (did you mean {' or '.join(meant)}?)" if meant else ""
    return did_you_mean(word, [str(c) for c in choices])


def did_you_mean(word: str, options: Sequence[str]) -> str:
    """' (did you mean X?)' for the closest option by spelling, or ''. A flag that begins one
    or two flags names them (`--gpus`: --gpus-per-node): flags are not abbreviated
    (allow_abbrev off), so a shortened flag is an error with the full names, never a guess."""
    word = str(word)
    if word.startswith("--") and len(word) > 2:
        longer = [str(o) for o in options if str(o).startswith(word) and str(o) != word]
        if 0 < len(longer) <= 2:
            return f" (did you mean {' or '.join(longer)}?)"
    close = difflib.get_close_matches(word.lower(), [str(o) for o in options], n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


_NO_PARALLELISM = ("zlayout plans ZeRO data parallelism only: tensor, pipeline, sequence and "
                   "expert parallelism are not modelled")
_GLOBAL_BATCH = ("zlayout takes the per-GPU batch: give --micro-batch and --grad-accum (the global "
                 "batch is micro-batch x grad-accum x GPUs)")

_SENTENCES = (_NO_PARALLELISM, _GLOBAL_BATCH)

# Flags of neighbouring tools (normalised: lower case, '_' as '-') -> what zlayout calls them:
# a flag (with a value when the flag alone carries it, `--bf16`) or one of _SENTENCES.
NEIGHBOUR_FLAGS: dict[str, str] = {}
for _names, _target in (
    # torchrun, the deepspeed launcher, Lightning: GPUs per node
    (("--num-gpus", "--nproc-per-node", "--ngpus", "--n-gpus", "--num-gpus-per-node",
      "--gpus-per-host", "--devices", "--ngpus-per-node"), "--gpus-per-node"),
    (("--num-nodes", "--nnodes", "--node", "--n-nodes"), "--nodes"),
    (("--mbs", "--micro-batch-size", "--micro-bs", "--train-micro-batch-size-per-gpu",
      "--per-device-train-batch-size", "--batch-size-per-gpu", "--micro-batch-size-per-gpu",
      "--batch-size", "--bs", "--per-gpu-batch-size", "--micro-batches"), "--micro-batch"),
    (("--global-batch-size", "--train-batch-size", "--gbs"), _GLOBAL_BATCH),
    (("--gas", "--gradient-accumulation-steps", "--grad-accum-steps", "--accumulation-steps",
      "--accum", "--grad-acc", "--gradient-accumulation", "--accum-steps", "--ga"), "--grad-accum"),
    (("--zero-stage", "--zero", "--zero-optimization-stage", "--ds-stage", "--zero-optimization"),
     "--stage"),
    (("--tp", "--tp-size", "--tensor-parallel", "--tensor-parallel-size",
      "--tensor-model-parallel-size", "--pp", "--pp-size", "--pipeline-parallel-size",
      "--pipeline-model-parallel-size", "--sp", "--sequence-parallel", "--cp",
      "--context-parallel-size", "--ep", "--expert-parallel-size", "--expert-model-parallel-size"),
     _NO_PARALLELISM),
    (("--seq-len", "--seq-length", "--seqlen", "--max-seq-len", "--max-seq-length",
      "--sequence-length", "--seq-length-tokens", "--max-length", "--block-size", "--context-length",
      "--ctx-len", "--context", "--max-position-embeddings", "--sequence-len"), "--seq"),
    (("--hidden-size", "--d-model", "--n-embd", "--dim", "--model-dim", "--emb-dim", "--hidden-dim"),
     "--hidden"),
    (("--num-layers", "--num-hidden-layers", "--n-layer", "--n-layers", "--depth", "--nlayers"),
     "--layers"),
    (("--num-attention-heads", "--num-heads", "--n-head", "--n-heads", "--nheads", "--attention-heads"),
     "--heads"),
    (("--num-key-value-heads", "--num-kv-heads", "--n-kv-heads", "--num-query-groups", "--kv-head",
      "--kv"), "--kv-heads"),
    (("--ffn-hidden-size", "--intermediate-size", "--ffn-dim", "--d-ff", "--mlp-dim", "--ffn-size"),
     "--ffn"),
    (("--vocab-size", "--padded-vocab-size", "--n-vocab", "--vocabulary"), "--vocab"),
    (("--num-experts", "--num-local-experts", "--n-routed-experts", "--moe-num-experts"), "--experts"),
    (("--num-experts-per-tok", "--moe-router-topk", "--topk", "--moe-top-k", "--top-k-experts"),
     "--top-k"),
    (("--bf16",), "--precision bf16"), (("--fp16", "--half"), "--precision fp16"),
    (("--fp32",), "--precision fp32"),
    (("--gradient-checkpointing", "--activation-checkpointing", "--checkpoint-activations",
      "--recompute-activations", "--grad-ckpt", "--recompute"), "--checkpointing full"),
    (("--offload-optimizer-device", "--optimizer-offload"), "--offload-optimizer"),
    (("--cpu-offload", "--offload"), "--offload-optimizer cpu"),
    (("--offload-param-device", "--param-offload", "--offload-params"), "--offload-param"),
    (("--model", "--model-name", "--model-name-or-path", "--model-id"), "--preset or --hf-config"),
    (("--config", "--config-name", "--model-config", "--config-path"), "--hf-config"),
    (("--gpu-type", "--accelerator", "--gpu-model", "--device-type"), "--gpu"),
    (("--no-checkpointing", "--no-gradient-checkpointing", "--no-activation-checkpointing"),
     "--checkpointing none"),
    (("--no-offload", "--no-cpu-offload"), "--offload-optimizer none"),
    (("--tie-word-embeddings", "--tied-embeddings", "--tie-weights", "--share-embeddings"),
     "--tie-embeddings"),
    (("--world-size", "--gpus", "--num-gpus-total"), "--gpus-per-node and --nodes"),
    (("--headroom-fraction", "--margin", "--memory-margin"), "--headroom"),
    (("--presets", "--list-presets", "--list"), "`zlayout presets [gpus|models|links|profiles]`"),
):
    for _name in _names:
        NEIGHBOUR_FLAGS[_name] = _target


def _flags_in(target: str) -> list[str]:
    return re.findall(r"--[a-z][a-z0-9-]*", target)


LAYOUT_FLAGS = ("--stage", "--offload-optimizer", "--offload-param")


def _layout_flag_hint(key: str, target: str | None, flags: Sequence[str]) -> str:
    """A layout flag (or another tool's name for one) on a command that compares every layout
    (breakeven, the app: they take plan's model flags, not its layout flags): what the command
    does instead. By spelling, breakeven's --offload-param read 'did you mean --params?' (the
    model's size) and the app's --stage 'did you mean --seq?'."""
    meant = [key] if key in LAYOUT_FLAGS else [n for n in _flags_in(target or "") if n in LAYOUT_FLAGS]
    if "--preset" not in flags or not meant or all(name in flags for name in meant):
        return ""
    if "--stage" in flags:
        return " (this command compares every offload choice of each stage: --stage N narrows it to one stage)"
    return " (this command compares every layout: it takes no --stage or offload flags)"


def did_you_mean_flag(typed: str, flags: Sequence[str]) -> str:
    """' (did you mean --gpus-per-node?)' for an unknown flag: the same flag with '-' for '_',
    another tool's name for one of `flags`, a prefix of one or two of them, or its spelling."""
    flag = typed.split("=", 1)[0]
    key = normalise(flag)
    if key in flags and key != flag:
        return f" (did you mean {key}?)"  # --micro_batch, --Seq
    target = NEIGHBOUR_FLAGS.get(key)
    layout_hint = _layout_flag_hint(key, target, flags)
    if layout_hint:
        return layout_hint
    if target is not None:
        if target in _SENTENCES:  # what to do instead, not a flag
            return f" ({target})"
        named = _flags_in(target)
        if key == "--presets" and "--presets-dir" in flags:
            return f" (did you mean --presets-dir DIR, or {target} to list them?)"
        if target.startswith("`") or not named:
            return f" (did you mean {target}?)"
        if all(name in flags for name in named):
            return f" (did you mean {target}?)"
        if not any(name in flags for name in named):
            return ""  # the meaning is known and this command has no such flag: no guess by spelling
    # --bias next to --no-bias is the opposite of what was typed: say what the default is
    if key.startswith("--") and f"--no-{key[2:]}" in flags:
        return f" ({key[2:]} is the default; --no-{key[2:]} turns it off)"
    if key.startswith("--no-") and f"--{key[5:]}" in flags:
        return f" (--{key[5:]} is off unless given: leave it out)"
    return did_you_mean(flag, flags)
