"""Every command-line error is one line (`zlayout: error: ...`) plus at most one hint line, exit 2.

Each case here was a wall of usage text, a traceback, a hang or a silent change before.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from zlayout.cli import main

ARCH = ["--layers", "2", "--hidden", "128", "--heads", "4", "--vocab", "1000"]


def run(capsys, *argv: str) -> tuple[int, str, list[str]]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err.splitlines()


def assert_one_line_error(code: int, out: str, err: list[str]) -> str:
    assert code == 2 and out == ""
    assert 1 <= len(err) <= 2, err
    assert err[0].startswith("zlayout: error: "), err
    if len(err) == 2:
        assert err[1].startswith("zlayout: hint: "), err
    return err[0].removeprefix("zlayout: error: ")


@pytest.mark.parametrize(("argv", "message"), [
    (["plan", *ARCH, "--stage", "4"], "--stage: '4' is not one of 0, 1, 2, 3"),
    (["plan", *ARCH, "--nodes", "two"], "--nodes: 'two' is not a whole number"),
    (["export", *ARCH, "--stage", "3"], "the following arguments are required: --out"),
    (["plan", *ARCH, "--checkpointing", "fulll"], "'fulll' is not one of none, full (did you mean full?)"),
    (["plan", *ARCH, "--nodez", "2"], "unrecognized arguments: --nodez 2 (did you mean --nodes?)"),
    (["plna"], "unknown command 'plna' (did you mean plan?)"),
    (["plan", "--preset", "lama3-70b"], "unknown model 'lama3-70b' (did you mean llama3-70b?)"),
    (["plan", "--params", "7B", "--family", "lama"], "unknown model family 'lama' (did you mean llama3?)"),
    (["plan", *ARCH, "--gpu", "h300"], "unknown GPU 'h300' (did you mean h200?)"),
    (["plan", "--params", "7"], "--params: size 7 has no unit: did you mean 7B?"),
    (["plan", "--params", "13000000000"], "did you mean 13B?"),
    (["plan", "--params", "30T"], "from 10M to 20T"),
    (["plan", "--params", "13B", "--layers", "-1"], "--layers cannot be combined with --params"),
    (["plan", "--params", "13B", "--mlp", "gelu", "--tie-embeddings"],
     "--mlp, --tie-embeddings cannot be combined with --params"),
    (["plan", "--family", "qwen2.5", *ARCH], "--family applies only to --params"),
    (["plan", *ARCH, "--micro-batch", "0"], "--micro-batch: must be from 1 to 4,096 (got 0)"),
    (["plan", *ARCH, "--micro-batch", "10000000000"], "--micro-batch: must be from 1 to 4,096"),
    (["plan", *ARCH, "--seq", "0"], "--seq: must be from 1 to 1,048,576 (got 0)"),
    (["plan", "--layers", "2", "--hidden", "1000000007", "--heads", "3", "--vocab", "10"],
     "--hidden: must be from 1 to 262,144"),
    (["plan", "--layers", "1000000000000000", "--hidden", "128", "--heads", "4", "--vocab", "10"],
     "--layers: must be from 1 to 1,000"),
    (["plan", *ARCH, "--nodes", "1000000000000000"], "--nodes: must be from 1 to 65,536"),
    (["plan", *ARCH, "--gpus-per-node", "0"], "--gpus-per-node: must be from 1 to 128 (got 0)"),
    (["plan", *ARCH, "--nvme-gib", "inf"], "--nvme-gib: 'inf' is not a finite number"),
    (["plan", *ARCH, "--host-ram-gib", "nan"], "--host-ram-gib: 'nan' is not a finite number"),
    (["plan", *ARCH, "--host-ram-gib", "1e308"], "--host-ram-gib: must be from 1 GiB to 1,048,576 GiB"),
    (["plan", *ARCH, "--nvme-gbps", "1e-320", "--json"], "--nvme-gbps: must be from 0.1 GB/s"),
    (["plan", *ARCH, "--headroom", "0.95"], "--headroom: must be from 0 to 0.9"),
    (["plan", *ARCH, "--reduce-bucket-size", "0"], "--reduce-bucket-size: must be from 1"),
    (["plan", *ARCH, "--presets-dir", "/no/such/dir"], "--presets-dir '/no/such/dir': no such directory"),
    (["plan", "--layers", "2", "--hidden", "100", "--heads", "3", "--vocab", "10"],
     "hidden (100) must be divisible by heads (3); try --heads 2"),
    (["plan", *ARCH, "--gpu", "a" * 300], "unknown GPU 'aaaa"),
    (["show", "x" * 300], "too long"),
    (["plan", *ARCH, "--gpu", "x\ny"], "unknown GPU 'x\\ny'"),
    (["plan", *ARCH, "--gpu", "x\u2028y"], "unknown GPU 'x\\u2028y'"),
])
def test_each_error_is_one_line_that_says_what_to_type(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert message in assert_one_line_error(code, out, err)


def test_choices_are_case_insensitive(capsys):
    code, out, _ = run(capsys, "plan", *ARCH, "--stage", "3", "--offload-optimizer", "CPU",
                       "--checkpointing", "Full", "--precision", "BF16", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["offload_optimizer"] == "cpu" and data["stage"] == 3


def test_params_says_which_family_it_maps_onto(capsys):
    code, out, err = run(capsys, "plan", "--params", "7b", "--stage", "3", "--json")
    assert code == 0 and json.loads(out)["model"]["family"] == "llama3"
    assert err == ["zlayout: note: --params 7b is llama3-6.9B from the llama3 family (27 layers, "
                   "hidden 4096, 32 heads, 8 kv heads, 6,939,701,248 params); --family picks another family"]


def test_pydantic_field_names_never_reach_the_user(capsys):
    for flags in (["--micro-batch", "0"], ["--grad-accum", "0"], ["--gpus-per-node", "999"],
                  ["--kv-heads", "3"], ["--host-ram-gib", "0"], ["--nvme-gib", "-1"]):
        code, out, err = run(capsys, "plan", *ARCH, *flags)
        line = assert_one_line_error(code, out, err)
        for internal in ("micro_batch", "grad_accum", "gpus_per_node", "kv_heads", "host_ram_bytes",
                         "nvme_bytes", "Value error", "Input should"):
            assert internal not in line, line


def test_a_preset_family_with_absurd_depth_is_refused_naming_the_file(capsys, tmp_path):
    # layers = 1e8 ran the family table for 15 s and 3.9 GB before it was bounded.
    models = tmp_path / "models"
    models.mkdir()
    (models / "deep.toml").write_text('family = "deepfam"\nlayers = 100000000\nhidden = 128\n'
                                      'heads = 1\nvocab = 100\n')
    code, out, err = run(capsys, "plan", "--params", "1B", "--family", "deepfam",
                         "--presets-dir", str(tmp_path))
    line = assert_one_line_error(code, out, err)
    assert "deep.toml" in line and "layers: " in line and "1,000" in line


def test_the_installed_entry_point_prints_one_line_for_argparse_errors():
    proc = subprocess.run([sys.executable, "-m", "zlayout", "plan", "--stage", "4"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == ["zlayout: error: --stage: '4' is not one of 0, 1, 2, 3",
                                        "zlayout: hint: `zlayout plan --help` lists every flag"]


@pytest.mark.parametrize("text", ["[" * 100_000, '{"a":' * 5_000,
                                  '{"model_type": "llama", "x": ' + "[" * 40 + "]" * 40 + "}"],
                         ids=["100k-brackets", "5k-objects", "deep-inside-a-config"])
def test_a_deeply_nested_hf_config_is_one_line_not_a_recursion_error(tmp_path, text):
    """`plan --hf-config` crashed with RecursionError and a 31-line traceback; it now reads
    through the same nesting guard as profiles and presets (`show`, ctrl+o)."""
    path = tmp_path / "deep.json"
    path.write_text(text)
    proc = subprocess.run([sys.executable, "-m", "zlayout", "plan", "--hf-config", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert proc.stderr.splitlines() == [f"zlayout: error: {path}: nested more than 32 levels deep "
                                        "(line 1): not a model's config.json"]


def test_the_app_reads_a_deep_config_json_through_the_same_reader(tmp_path):
    """ctrl+o on a file named config.json goes to hfconfig.load too: the same ValueError line."""
    from zlayout.hfconfig import HfConfigError, load

    (tmp_path / "config.json").write_text("[" * 100_000)
    with pytest.raises(HfConfigError, match="nested more than 32 levels deep"):
        load(tmp_path)


@pytest.mark.parametrize("argv, meant", [
    (["plan", "--preset", "llama3-8b", "--gpus", "16"], "--gpus-per-node"),
    (["plan", *ARCH, "--micro", "2"], "--micro-batch"),
    (["breakeven", "--gpu", "h100", "--gpus", "8"], "--gpus-per-node"),
])
def test_a_shortened_flag_is_an_error_naming_the_flag_not_a_guess(capsys, argv, meant):
    # argparse takes any unique prefix: `--gpus 16` planned 16 GPUs per node for a user who
    # meant 16 in all, with nothing on screen to say so
    message = assert_one_line_error(*run(capsys, *argv))
    assert "unrecognized arguments" in message and f"did you mean {meant}" in message


def test_learn_refuses_remote_code_before_asking_for_force(capsys, tmp_path, monkeypatch):
    """A remote-code config whose card file exists: learn said "add --force", and with --force
    refused the remote code. The remote code is the reason: said first, --force or not."""
    from zlayout import cards

    config = {"model_type": "internlm2", "auto_map": {"AutoModelForCausalLM": "m.M"}, "num_hidden_layers": 2}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(tmp_path / "cards"))
    (tmp_path / "cards").mkdir()
    (tmp_path / "cards" / f"{cards.config_key(config)}.toml").write_text("# a card that is there\n")
    for force in ([], ["--force"]):
        message = assert_one_line_error(*run(capsys, "learn", "--hf-config", str(path), *force))
        assert "auto_map" in message and "--force" not in message


def test_learn_refuses_a_state_space_model_at_once(capsys, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "rwkv", "hidden_size": 768, "num_hidden_layers": 24}))
    message = assert_one_line_error(*run(capsys, "learn", "--hf-config", str(path), "--out", str(tmp_path / "x")))
    assert "state-space" in message and not (tmp_path / "x").exists()


def test_a_negative_value_is_the_flags_own_error_not_a_missing_argument(capsys):
    """argparse read `--params -5B` as a flag with no value ("expected one argument", found by a QA
    pass); the value is handed to the flag, whose check says what is wrong with it."""
    message = assert_one_line_error(*run(capsys, "plan", "--params", "-5B"))
    assert "--params" in message and "-5B" in message and "expected one argument" not in message
    message = assert_one_line_error(*run(capsys, "plan", *ARCH, "--seq", "-4k"))
    assert "--seq" in message and "expected one argument" not in message
