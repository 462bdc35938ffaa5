"""Real DeepSpeed engines on CPU (gloo): every stage, optimizer and parameter offload, one and
two processes, the restart drill, cancel, an allocation failure and the command line.
Each test launches its ranks through torchrun exactly as on GPUs; models are tiny."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from zlayout.spec import Layout
from zlayout.verify.launcher import VerifyOptions, free_port, parse_event
from zlayout.verify.runner import run_verification

from .conftest import tiny_input

pytestmark = pytest.mark.slow


def run(inp, layout, tmp: Path, **options):
    lines: list[str] = []
    options.setdefault("steps", 2)
    result = run_verification(inp, layout, VerifyOptions(cpu=True, out_dir=tmp, **options),
                              on_line=lines.append)
    return result, lines


def events(lines: list[str], kind: str) -> list[dict]:
    return [e for e in map(parse_event, lines) if e and e["event"] == kind]


@pytest.fixture(scope="module")
def drill(tmp_path_factory):
    """ZeRO-3 with optimizer and parameters on CPU, 2 processes, GQA + SwiGLU + RMSNorm,
    checkpointing, and the restart drill: one launch pair, several checks."""
    inp = tiny_input(gpus=2, checkpointing="full", kv_heads=2, mlp="swiglu", norm="rmsnorm",
                     ffn=96, bias=False)
    layout = Layout(stage=3, offload_optimizer="cpu", offload_param="cpu")
    out = tmp_path_factory.mktemp("drill")
    result, lines = run(inp, layout, out, processes=2, steps=3, restart_drill=True)
    return inp, result, lines, out


def test_drill_run_completes_on_both_ranks(drill):
    inp, result, lines, _ = drill
    assert result["status"] == "cpu-ok", result.get("cause")
    assert [r["status"] for r in result["ranks"]] == ["ok", "ok"]
    assert result["measured"]["params"] == inp.model.params
    assert result["measured"]["steps_run"] == [1, 2, 3]
    assert all(math.isfinite(x) and x > 0 for x in result["measured"]["losses"])
    assert result["measured"]["host_peak_bytes"] > 0
    assert result["measured"]["step_time_s"] > 0 and result["measured"]["tokens_per_s"] > 0


def test_drill_resumes_at_the_saved_step_with_the_same_losses(drill):
    _, result, _, _ = drill
    d = result["restart_drill"]
    assert d["resumed_ok"] and d["loss_exact"], d
    assert d["step_before"] == 1 and d["step_after"] == 1
    assert d["loss_expected"] == d["loss_resumed"] == result["measured"]["losses"][1]
    assert d["losses_compared"] == 4  # steps 2 and 3 on both ranks
    assert d["resume_s"] > 0 and d["restart_wall_s"] > d["resume_s"]


def test_drill_times_every_phase_and_records_the_host(drill):
    _, result, lines, _ = drill
    phases = result["phase_s"]
    assert list(phases) == ["preflight", "op build", "init", "steps", "drill"]
    # CPU mode trains with torch's AdamW (no Adam op); DeepSpeed's shared-memory collectives
    # (shm_comm, which it would build at start-up in every rank) load once, in the preflight
    ops = [c for c in result["preflight"] if c["name"].startswith("op ")]
    assert [c["name"] for c in ops] == ["op shm_comm"] and all(c["ok"] for c in ops)
    assert phases["op build"] == pytest.approx(sum(c["seconds"] for c in ops), abs=0.01)
    assert all(phases[k] > 0 for k in ("preflight", "init", "steps", "drill"))
    assert phases["drill"] == pytest.approx(result["restart_drill"]["restart_wall_s"], abs=0.01)
    assert any(line.startswith("zlayout: time per phase: preflight ") for line in lines)
    m = result["measured"]
    assert len(m["forward_times_s"]) == len(m["backward_times_s"]) == len(m["optimizer_times_s"]) == 3
    assert all(0 < m[k] < m["step_time_s"] for k in ("forward_s", "backward_s", "optimizer_s"))
    env = result["environment"]
    assert env["host_cores"] == os.cpu_count() and env["host_cpu_model"]
    # the host memory's state, for offloaded step times that differ between processes on one node
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if thp.exists():
        assert f"[{env['host_transparent_hugepages']}]" in thp.read_text()
    assert 0 < env["host_mem_available_at_start_bytes"] and env["host_anon_huge_bytes"] >= 0
    assert env["host_minor_faults_training"] > 0 and env["host_system_s_training"] >= 0
    # an offloaded layout's ranks allocate large host tensors on huge pages, as the launch scripts do
    assert env["thp_mem_alloc_enable"] == os.environ.get("THP_MEM_ALLOC_ENABLE", "1")
    # gloo's two CPU ranks can abort while tearing down after the last step (SIGABRT at
    # shutdown, seen in CI on 2 cores): the runner reports that as a warning, every step measured;
    # any other warning fails here
    shutdown = ("a rank ended abnormally at shutdown, after every step",
                "a resumed rank ended abnormally at shutdown, after every")
    assert all(w.startswith(shutdown) for w in result["warnings"]), result["warnings"]
    assert result["measured_partial"] is False


def test_drill_streams_prefixed_rank_lines_and_preflight(drill):
    _, _, lines, _ = drill
    steps = events(lines, "step")
    assert {e["rank"] for e in steps} == {0, 1}
    assert any(line.startswith("[rank 1] {") for line in lines)
    assert any(line.startswith("preflight PASS torch+deepspeed") for line in lines)
    assert len(events(lines, "resumed")) == 2 and len(events(lines, "checkpoint")) == 2


def test_drill_writes_spec_config_and_result(drill):
    _, result, _, out = drill
    config = json.loads((out / "ds_config.json").read_text())
    zero = config["zero_optimization"]
    assert zero["stage"] == 3 and zero["offload_optimizer"]["device"] == "cpu"
    assert zero["offload_param"]["device"] == "cpu"
    assert json.loads((out / "result.json").read_text())["status"] == "cpu-ok"
    assert result["result_path"] == str(out / "result.json")
    assert (out / "checkpoint" / "latest").read_text().strip() == "step1"


@pytest.mark.parametrize("stage, offload, processes", [
    (0, "gpu", 1), (1, "gpu", 2), (2, "cpu", 1), (3, "gpu", 2),
], ids=["z0-p1", "z1-p2", "z2-opt_cpu-p1", "z3-p2"])
def test_every_stage_runs_on_cpu(tmp_path, stage, offload, processes):
    inp = tiny_input(gpus=processes)
    layout = Layout(stage=stage, offload_optimizer=offload)
    result, lines = run(inp, layout, tmp_path, processes=processes, run_preflight=False)
    assert result["status"] == "cpu-ok", result.get("cause")
    assert result["measured"]["world"] == processes
    assert len(result["measured"]["losses"]) == 2
    assert json.loads((tmp_path / "ds_config.json").read_text())["zero_optimization"]["stage"] == stage
    assert {e["rank"] for e in events(lines, "done")} == set(range(processes))
    # PyTorch's huge-page host allocations: offloaded layouts only (the environment's own value wins)
    expected = os.environ.get("THP_MEM_ALLOC_ENABLE", "1" if offload == "cpu" else None)
    assert result["environment"]["thp_mem_alloc_enable"] == expected


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def test_a_rank_dying_at_shutdown_is_a_warning_with_its_cause(tmp_path):
    # Every rank finishes its steps (and the drill its resume), then aborts on the way out,
    # as rank 0 did in 1 of 19 CPU verifies: the figures stand, the cause is shown.
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import atexit, os, sys\n"
        "if '--spec' in sys.argv:  # the worker only, not torchrun\n"
        "    def abort():\n"
        "        print('terminate called without an active exception', file=sys.stderr, flush=True)\n"
        "        os._exit(134)\n"
        "    atexit.register(abort)\n")
    root = Path(__file__).resolve().parents[2]
    pythonpath = os.pathsep.join(p for p in (str(site), str(root), os.environ.get("PYTHONPATH")) if p)
    result, lines = run(tiny_input(), Layout(stage=1), tmp_path / "out", steps=3,
                        restart_drill=True, run_preflight=False,
                        extra_env={"PYTHONPATH": pythonpath})
    assert result["status"] == "cpu-ok", result.get("cause")
    assert result["restart_drill"]["resumed_ok"] is True
    assert len(result["warnings"]) == 2, result["warnings"]
    assert all("at shutdown" in w and "terminate called" in w for w in result["warnings"])
    from zlayout.commands.verify import format_result

    assert "WARNING: a rank ended abnormally at shutdown" in format_result(result)


def test_cancel_kills_every_rank(tmp_path):
    inp = tiny_input(gpus=2)
    cancel = threading.Event()
    pids: list[int] = []

    def on_line(line: str) -> None:
        event = parse_event(line)
        if event and event["event"] == "init":
            pids.append(event["pid"])
        if event and event["event"] == "step":
            cancel.set()

    result = run_verification(inp, Layout(stage=2), VerifyOptions(
        cpu=True, processes=2, steps=100_000, out_dir=tmp_path, run_preflight=False),
        on_line=on_line, cancel=cancel)
    assert result["status"] == "cancelled"
    assert len(pids) == 2
    assert not any(_alive(pid) for pid in pids)


def test_an_allocation_failure_is_does_not_fit(tmp_path):
    # Inside the spec's bounds: 4096 x 1024 tokens (32 MiB of ids) over a tied 10M vocabulary
    # of width 4 (40M parameters) make fp32 logits of 160 TiB, beyond any address space.
    inp = tiny_input(micro_batch=4096, seq=1024, hidden=4, heads=1, vocab=10_000_000,
                     tie_embeddings=True)
    result, lines = run(inp, Layout(stage=1), tmp_path, run_preflight=False)
    assert result["status"] == "does-not-fit", result.get("cause")
    assert "rank 0" in result["cause"] and "train" in result["cause"]
    assert events(lines, "oom")


def test_bad_config_is_failed_with_the_cause(tmp_path):
    inp = tiny_input()
    bad = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
           "zero_optimization": {"stage": 2, "no_such_knob": 1},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}
    result, _ = run(inp, Layout(stage=2), tmp_path, run_preflight=False, ds_config=bad)
    assert result["status"] == "failed"
    assert "no_such_knob" in result["cause"]


TINY_FLAGS = ["--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "128", "--seq", "32",
              "--micro-batch", "2", "--gpus-per-node", "1"]


def zlayout(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zlayout", *args], capture_output=True, text=True,
                          **kwargs)


def test_command_line_json_and_live_log(tmp_path):
    proc = zlayout("verify", *TINY_FLAGS, "--stage", "1", "--offload-optimizer", "cpu", "--cpu",
                   "--steps", "3", "--restart-drill", "--json", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in ("status", "measured", "predicted", "restart_drill", "errors_pct", "environment",
                "layout", "inputs"):
        assert key in result
    assert result["status"] == "cpu-ok"
    assert result["restart_drill"]["resumed_ok"] is True
    assert result["layout"]["offload_optimizer"] == "cpu"
    assert "[rank 0] step 3/3: loss" in proc.stderr
    assert "preflight PASS" in proc.stderr


def test_command_line_needs_a_layout():
    proc = zlayout("verify", *TINY_FLAGS, "--cpu")
    assert proc.returncode == 2
    assert "add --stage" in proc.stderr


def test_command_line_verifies_a_profile_preflight(tmp_path):
    from zlayout.profile import build_profile
    from zlayout.profile.store import save_profile

    path = save_profile(build_profile(tiny_input(), Layout(stage=2)), tmp_path / "p")
    proc = zlayout("verify", str(path.parent), "--cpu", "--preflight-only", "--out", str(tmp_path / "o"))
    assert proc.returncode == 0, proc.stderr
    assert "preflight PASS gpus: skipped" in proc.stdout
    assert "preflight PASS checkpoint dir" in proc.stdout


def test_command_line_updates_a_profile_with_the_result(tmp_path):
    from zlayout.profile import build_profile, load_profile
    from zlayout.profile.store import save_profile

    path = save_profile(build_profile(tiny_input(), Layout(stage=2)), tmp_path / "p")
    proc = zlayout("verify", str(path), "--cpu", "--steps", "2", "--update-profile", "--json",
                   "--out", str(tmp_path / "o"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1])["status"] == "cpu-ok"
    profile = load_profile(path)
    assert profile.verification.status == "cpu-ok"
    assert profile.verification.torch and profile.verification.deepspeed == "0.19.8"


def test_command_line_writes_a_slurm_script_for_several_nodes(tmp_path):
    script = tmp_path / "verify.sbatch"
    proc = zlayout("verify", *TINY_FLAGS[:-1], "8", "--nodes", "2", "--inter-link", "ib-ndr",
                   "--stage", "3", "--restart-drill", "--slurm", str(script), "--out", str(tmp_path / "job"))
    assert proc.returncode == 0, proc.stderr
    assert "sbatch " in proc.stderr
    text = script.read_text()
    assert "#SBATCH --nodes=2" in text and text.count("srun ") == 3  # node preflight, run, drill
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    assert (tmp_path / "job" / "spec.json").exists()


def test_command_line_refuses_a_multi_node_plan_without_slurm():
    proc = zlayout("verify", *TINY_FLAGS[:-1], "8", "--nodes", "2", "--inter-link", "ib-ndr",
                   "--stage", "3")
    assert proc.returncode == 2 and "--slurm" in proc.stderr


def test_deepspeed_launcher_command_runs_the_worker_and_collects(tmp_path):
    from zlayout.verify import slurm

    job = slurm.prepare_job(tiny_input(gpus=2), Layout(stage=2),
                            VerifyOptions(cpu=True, steps=2, out_dir=tmp_path / "job"))
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    command = slurm.deepspeed_hostfile_command(job, hostfile)
    assert f"--hostfile {hostfile} " in command
    # DeepSpeed reaches every host of a hostfile over ssh (none on CI): run the same command on
    # this node only, through DeepSpeed's local launcher (which adds --local_rank to the worker).
    # A port free now, not a fixed one another run on this machine may hold.
    command = command.replace(f"--hostfile {hostfile} ", "").replace(
        "--master_port 29500", f"--master_port {free_port()}")
    # Its own op cache (kept between runs, beside the suite's: tests/conftest.py): a build made
    # under DeepSpeed's launcher makes torchrun's ranks rebuild theirs, and the other way round.
    op_cache = os.environ.get("TORCH_EXTENSIONS_DIR") or str(Path.home() / ".cache" / "torch_extensions")
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": "",
           "TORCH_EXTENSIONS_DIR": f"{op_cache}_deepspeed_launcher",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    # 900 s: on a fresh machine the launcher's ranks first compile DeepSpeed's shm op (215 s
    # alone on 2 cores; more beside the suite's other xdist worker)
    proc = subprocess.run(command, shell=True, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = slurm.collect_result(job.out_dir)
    assert result["status"] == "cpu-ok", result.get("cause")
    assert result["measured"]["world"] == 2 and len(result["measured"]["losses"]) == 2


@pytest.fixture(scope="module")
def emulated_batch(tmp_path_factory):
    """One `zlayout verify --batch` line that emulates rank 0 of 4 GPUs (ZeRO-3) in one CPU
    process: the run the two emulation tests below check (one DeepSpeed start, not two)."""
    folder = tmp_path_factory.mktemp("emulated")
    batch = folder / "batch.txt"
    batch.write_text(" ".join(TINY_FLAGS) + " --gpus-per-node 4 --stage 3 --cpu --emulate --steps 2\n")
    proc = zlayout("verify", "--batch", str(batch), "--out", str(folder / "out"))
    return batch, folder / "out", proc


def test_emulate_runs_rank_0_of_the_plans_world_in_one_process(emulated_batch):
    # --emulate: one process stands for rank 0 of 4 on torch's fake process group. DeepSpeed
    # checks train_batch_size == micro-batch x accumulation x world size, so the run finishing
    # with the 4-GPU batch size is DeepSpeed itself saying it sharded for 4
    _, out, proc = emulated_batch
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = out / "00-z3-opt_gpu-param_gpu-w4-emulated"
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "cpu-ok", result.get("cause")
    assert result["emulated_world"] == 4 and result["measured"]["world"] == 4
    rank, = result["ranks"]
    assert rank["world"] == 4 and rank["emulated_world"] == 4 and rank["rank"] == 0
    assert json.loads((run_dir / "ds_config.json").read_text())["train_batch_size"] == 4 * 2
    assert result["measured"]["params"] == tiny_input(gpus=4).model.params
    assert "as rank 0 of 4 GPUs on 1 CPU process (emulated" in proc.stderr


def test_a_batch_line_emulates_and_names_its_folder_by_the_world_it_stands_for(emulated_batch, tmp_path):
    batch, out, proc = emulated_batch
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "results.jsonl").read_text())
    assert result["status"] == "cpu-ok" and result["emulated_world"] == 4
    assert (out / "00-z3-opt_gpu-param_gpu-w4-emulated" / "result.json").exists()
    assert "emulated: rank 0 of 4 on one CPU process" in proc.stderr
    assert "GPU memory as on the full run" not in proc.stderr  # CPU: no memory compared
    # --preflight-only checks one run; with --batch it would have run every line
    refused = zlayout("verify", "--batch", str(batch), "--preflight-only", "--out", str(tmp_path / "again"))
    assert refused.returncode == 2 and "--preflight-only checks one run" in refused.stderr
    assert not (tmp_path / "again").exists()


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["deepspeed", "trainer"])
def test_the_worker_runs_the_loop_it_is_told_and_the_result_records_it(tmp_path, loop):
    inp = tiny_input()
    inp = inp.model_copy(update={"training": inp.training.model_copy(update={"loop": loop})})
    result = run_verification(inp, Layout(stage=2), VerifyOptions(
        cpu=True, steps=2, out_dir=tmp_path, run_preflight=False))
    assert result["status"] == "cpu-ok", result["cause"]
    assert result["loop"] == loop and result["inputs"]["training"]["loop"] == loop
    assert [r["loop"] for r in result["ranks"]] == [loop]


def test_a_batch_checks_each_line_until_one_passes_preflight(tmp_path):
    # preflight ran for the first line only: on a node that failed it (no GPU visible) the next
    # lines started unchecked and DeepSpeed fell back to its CPU accelerator. Here the first line
    # cannot hold its 70B model in this machine's RAM; the second must be checked, not assumed fit
    batch = tmp_path / "batch.txt"
    batch.write_text("--preset llama3-70b --gpus-per-node 1 --stage 2 --cpu --steps 2\n"
                     + " ".join(TINY_FLAGS) + " --stage 2 --cpu --steps 2\n"
                     + " ".join(TINY_FLAGS) + " --stage 1 --cpu --steps 2\n")
    proc = zlayout("verify", "--batch", str(batch), "--out", str(tmp_path / "out"))
    first, second, third = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert first["status"] == "failed" and first["cause"].startswith("preflight: host ram"), first.get("cause")
    assert second["status"] == "cpu-ok" and any(c["name"] == "host ram" and c["ok"] for c in second["preflight"])
    assert "preflight" not in third  # once a line passed, the node is known fit: no second check
    assert proc.returncode == 1 and proc.stderr.count("preflight PASS gpus") == 2
