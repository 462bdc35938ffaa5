"""A newcomer's mistakes answered by meaning: choices (`--checkpointing on` is full, not "did you
mean none?"), other tools' flag names (`--num-gpus`, `--mbs`, `--zero_stage`), fractions,
shape errors that name the likelier typo, sizes with units and ambiguous GPU names.

Each case is a command line a user typed, run through `zlayout.cli.main`.
"""

from __future__ import annotations

import json

import pytest

from zlayout.cli import main
from zlayout.suggest import NEIGHBOUR_FLAGS, did_you_mean_choice, did_you_mean_flag

ARCH = ["--layers", "2", "--hidden", "128", "--heads", "4", "--vocab", "1000"]


def error(capsys, *argv: str) -> str:
    code = main(list(argv))
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert code == 2 and out == "" and 1 <= len(lines) <= 2, (code, lines)
    assert lines[0].startswith("zlayout: error: ")
    return lines[0].removeprefix("zlayout: error: ")


def plan_json(capsys, *argv: str) -> dict:
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(("flag", "typed", "meant"), [
    ("--checkpointing", "on", "full"), ("--checkpointing", "true", "full"),
    ("--checkpointing", "yes", "full"), ("--checkpointing", "1", "full"),
    ("--checkpointing", "ENABLED", "full"),
    ("--checkpointing", "off", "none"), ("--checkpointing", "false", "none"),
    ("--checkpointing", "no", "none"), ("--checkpointing", "0", "none"),
    ("--offload-optimizer", "off", "none"), ("--offload-optimizer", "true", "cpu or nvme"),
    ("--offload-optimizer", "gpu", "none"), ("--offload-param", "host", "cpu"),
    ("--offload-param", "ssd", "nvme"),
    ("--precision", "bfloat16", "bf16"), ("--precision", "half", "fp16"), ("--precision", "float32", "fp32"),
    ("--mlp", "silu", "swiglu"), ("--mlp", "relu", "gelu"), ("--norm", "rms_norm", "rmsnorm"),
    ("--impl", "transformers", "hf"), ("--allocator", "expandable_segments", "expandable"),
    ("--init", "zero_init", "zero-init"), ("--stage", "zero3", "3"), ("--stage", "ZeRO-2", "2"),
    ("--stage", "z1", "1"),
])
def test_a_choice_is_suggested_by_what_the_word_means(capsys, flag, typed, meant):
    line = error(capsys, "plan", *ARCH, "--stage", "3", flag, typed)
    assert line.startswith(f"{flag}: {typed!r} is not one of ")
    assert line.endswith(f"(did you mean {meant}?)")


@pytest.mark.parametrize(("flag", "typed"), [
    ("--precision", "true"), ("--precision", "off"), ("--mlp", "yes"), ("--stage", "true"),
    ("--allocator", "on"),
])
def test_a_meaning_no_choice_has_gets_no_guess_by_spelling(capsys, flag, typed):
    line = error(capsys, "plan", *ARCH, flag, typed)
    assert "did you mean" not in line and "is not one of" in line


def test_a_suggestion_is_never_the_opposite_of_what_was_typed():
    """Spelling alone put 'on' next to 'none' and 'no' next to 'none' (fine) but also 'yes'
    nowhere: every on-word goes to the on-side choices, every off-word to none."""
    for word in ("on", "true", "yes", "y", "1", "enable", "enabled", "t", "On", "TRUE"):
        assert "none" not in did_you_mean_choice(word, ("none", "full"))
        assert "none" not in did_you_mean_choice(word, ("none", "cpu", "nvme"))
    for word in ("off", "false", "no", "n", "0", "disable", "disabled", "f", "Off"):
        assert did_you_mean_choice(word, ("none", "full")) == " (did you mean none?)"
    assert did_you_mean_choice("fulll", ("none", "full")) == " (did you mean full?)"  # spelling still works


@pytest.mark.parametrize(("typed", "meant"), [
    ("--num-gpus", "--gpus-per-node"), ("--num_gpus", "--gpus-per-node"),
    ("--nproc_per_node", "--gpus-per-node"), ("--nproc-per-node", "--gpus-per-node"),
    ("--nnodes", "--nodes"), ("--num_nodes", "--nodes"),
    ("--mbs", "--micro-batch"), ("--micro_batch_size", "--micro-batch"),
    ("--train_micro_batch_size_per_gpu", "--micro-batch"), ("--per_device_train_batch_size", "--micro-batch"),
    ("--micro_batch", "--micro-batch"),
    ("--gas", "--grad-accum"), ("--gradient_accumulation_steps", "--grad-accum"),
    ("--zero-stage", "--stage"), ("--zero_stage", "--stage"),
    ("--seq-len", "--seq"), ("--seq_len", "--seq"), ("--max_seq_len", "--seq"), ("--seq-length", "--seq"),
    ("--hidden_size", "--hidden"), ("--num_hidden_layers", "--layers"), ("--num-layers", "--layers"),
    ("--num_attention_heads", "--heads"), ("--num_key_value_heads", "--kv-heads"),
    ("--intermediate_size", "--ffn"), ("--vocab_size", "--vocab"), ("--num_experts", "--experts"),
    ("--num_experts_per_tok", "--top-k"),
    ("--bf16", "--precision bf16"), ("--fp16", "--precision fp16"),
    ("--gradient_checkpointing", "--checkpointing full"), ("--cpu-offload", "--offload-optimizer cpu"),
])
def test_other_tools_flag_names_point_at_zlayouts(capsys, typed, meant):
    line = error(capsys, "plan", *ARCH, typed, "8")
    assert line.startswith(f"unrecognized arguments: {typed}")
    assert line.endswith(f"(did you mean {meant}?)"), line


def test_the_same_flags_work_in_the_other_planning_commands(capsys):
    assert error(capsys, "breakeven", *ARCH, "--num-gpus", "8").endswith("(did you mean --gpus-per-node?)")
    assert error(capsys, "verify", *ARCH, "--zero_stage=3").endswith("(did you mean --stage?)")
    assert error(capsys, "export", *ARCH, "--out", "x", "--mbs", "2").endswith("(did you mean --micro-batch?)")


@pytest.mark.parametrize("typed", ["--tp", "--tensor-model-parallel-size", "--pp", "--pipeline_parallel_size"])
def test_parallelism_zlayout_does_not_model_is_said_not_guessed(capsys, typed):
    line = error(capsys, "plan", *ARCH, typed, "2")
    assert line.endswith("(zlayout plans ZeRO data parallelism only: tensor, pipeline, sequence and "
                         "expert parallelism are not modelled)")


def test_several_unknown_flags_each_get_their_answer(capsys):
    line = error(capsys, "plan", *ARCH, "--num-gpus", "8", "--mbs", "2", "--tp", "2", "--pp", "2")
    assert line == ("unrecognized arguments: --num-gpus 8 --mbs 2 --tp 2 --pp 2 (--num-gpus: did you mean "
                    "--gpus-per-node?; --mbs: did you mean --micro-batch?; --tp, --pp: zlayout plans ZeRO data "
                    "parallelism only: tensor, pipeline, sequence and expert parallelism are not modelled)")
    assert error(capsys, "plan", *ARCH, "--global_batch_size", "512").endswith(
        "(zlayout takes the per-GPU batch: give --micro-batch and --grad-accum (the global batch is "
        "micro-batch x grad-accum x GPUs))")


def test_every_neighbour_flag_points_at_flags_plan_has():
    """A table entry naming a flag plan lacks would suggest a flag that is refused in turn."""
    from zlayout.cli import build_parser

    parser = build_parser()
    plan = next(a for a in parser._actions if hasattr(a, "choices") and isinstance(a.choices, dict))
    flags = {o for action in plan.choices["plan"]._actions for o in action.option_strings}
    for typed, target in NEIGHBOUR_FLAGS.items():
        assert typed not in flags, typed
        named = [w for w in target.replace("`", " ").replace(",", " ").split() if w.startswith("--")]
        assert all(name in flags for name in named), (typed, target)
        assert did_you_mean_flag(typed, sorted(flags)), typed


def test_a_fraction_below_one_is_a_fraction_not_a_percentage(capsys):
    line = error(capsys, "plan", *ARCH, "--headroom", "0.95")
    assert line == "--headroom: must be from 0 to 0.9 (got 0.95); it is a fraction: 0.95 is 95%"
    assert "0.0095" not in line
    assert error(capsys, "plan", *ARCH, "--headroom", "5").endswith("did you mean 0.05 (5%)?")


@pytest.mark.parametrize(("hidden", "heads", "fix"), [
    (4095, 32, "try --hidden 4096"),  # the typo is in hidden: 4096 / 32 = 128 per head
    (4097, 32, "try --hidden 4096"),
    (4096, 31, "try --heads 32"),  # the typo is in heads
    (5120, 48, "try --heads 40"),  # 5120 / 40 = 128 per head (Llama 2 13B)
    (100, 3, "try --heads 2"),  # neither looks like a published shape: the heads, as before
])
def test_a_shape_error_names_the_likeliest_wrong_number(capsys, hidden, heads, fix):
    line = error(capsys, "plan", "--layers", "2", "--hidden", str(hidden), "--heads", str(heads),
                 "--vocab", "1000")
    assert line == f"hidden ({hidden}) must be divisible by heads ({heads}); {fix}"


def test_kv_heads_that_do_not_divide_heads_get_the_nearest_that_does(capsys):
    line = error(capsys, "plan", "--layers", "2", "--hidden", "4096", "--heads", "32", "--kv-heads", "7",
                 "--vocab", "1000")
    assert line == "heads (32) must be a multiple of kv-heads (7); try --kv-heads 8"


@pytest.mark.parametrize(("flag", "typed", "value", "key"), [
    ("--seq", "4k", 4096, "seq"), ("--seq", "32K", 32768, "seq"), ("--seq", "1.5k", 1536, "seq"),
    ("--seq", "1M", 1_048_576, "seq"), ("--seq", "2048", 2048, "seq"),
    ("--vocab", "32k", 32768, "vocab"), ("--vocab", "128k", 131072, "vocab"),
    ("--hidden", "4k", 4096, "hidden"), ("--ffn", "14k", 14336, "ffn"),
])
def test_token_and_width_counts_take_k_and_m_as_1024(capsys, flag, typed, value, key):
    args = ["--layers", "2", "--hidden", "256", "--heads", "4", "--vocab", "1000", "--stage", "1"]
    if flag in args:
        i = args.index(flag)
        args[i + 1] = typed
    else:
        args += [flag, typed]
    data = plan_json(capsys, *args)
    found = data["model"].get(key) if key != "seq" else None
    if key == "seq":
        assert main(["plan", *args]) == 0
        assert f"seq {value}," in capsys.readouterr().out
    else:
        assert found == value, data["model"]


def test_a_unit_that_leaves_a_fraction_of_a_token_is_refused(capsys):
    line = error(capsys, "plan", *ARCH, "--seq", "4.1k")
    assert line == ("--seq: '4.1k' is not a whole number (expected a whole number from 1 to 1,048,576, "
                    "or with k = 1,024, e.g. 4k)")
    assert "from 1 to 1,048,576" in error(capsys, "plan", *ARCH, "--seq", "2M")


@pytest.mark.parametrize("typed", ["a100", "A100", "a100_sxm4", "A100-PCIe"])
def test_an_ambiguous_gpu_name_is_a_question_listing_the_cards(capsys, typed):
    line = error(capsys, "plan", *ARCH, "--gpu", typed)
    assert line == (f"GPU {typed!r} is more than one card: a100-40gb (40 GiB) or a100-80gb (80 GiB)? "
                    "give its full name")


def test_the_full_a100_names_still_plan_their_own_memory(capsys):
    small = plan_json(capsys, *ARCH, "--gpu", "a100-40gb", "--stage", "1")
    large = plan_json(capsys, *ARCH, "--gpu", "A100_80GB", "--stage", "1")
    assert (small["gpu"], large["gpu"]) == ("a100-40gb", "a100-80gb")


@pytest.mark.parametrize(("typed", "gib"), [
    ("512", 512), ("512G", 512), ("512GiB", 512), ("2T", 2048), ("2tib", 2048),
    ("3.84TB", 3.84e12 / 2**30), ("960GB", 960e9 / 2**30),
])
def test_host_ram_and_nvme_sizes_take_a_unit(typed, gib):
    from zlayout.cli import build_parser, plan_input_from_args

    args = build_parser().parse_args(["plan", *ARCH, "--host-ram-gib", typed, "--nvme-gib", typed])
    hardware = plan_input_from_args(args).hardware
    assert hardware.host_ram_bytes == int(gib * 2**30) and hardware.nvme_bytes == int(gib * 2**30)


def test_a_size_with_a_unit_it_cannot_read_says_what_to_type(capsys):
    assert error(capsys, "plan", *ARCH, "--nvme-gib", "1xT") == (
        "--nvme-gib: '1xT' is not a size (expected a size from 0 GiB to 1,048,576 GiB, e.g. 512, 2T or 3.84TB)")


@pytest.mark.parametrize(("typed", "answer"), [
    ("--bias", "(bias is the default; --no-bias turns it off)"),
    ("--overlap-comm", "(overlap-comm is the default; --no-overlap-comm turns it off)"),
    ("--no-checkpointing", "(did you mean --checkpointing none?)"),
    ("--tie_word_embeddings", "(did you mean --tie-embeddings?)"),
    ("--no-tie-embeddings", "(--tie-embeddings is off unless given: leave it out)"),
])
def test_a_flag_is_never_answered_with_its_opposite(capsys, typed, answer):
    """Spelling put --bias next to --no-bias and --no-checkpointing next to --checkpointing."""
    assert error(capsys, "plan", *ARCH, typed).endswith(answer)
