"""Preflight lines: pass/fail with the number and what to do, blocking only where the run
cannot start. GPUs are given as nvidia-smi would list them (no GPU on CI)."""

from __future__ import annotations

import os
import resource

import pytest

from zlayout.core.memory import estimate_memory
from zlayout.spec import GiB, Layout
from zlayout.verify import preflight
from zlayout.verify.launcher import VerifyOptions
from zlayout.verify.preflight import Check, GpuInfo

from .conftest import tiny_input


def gpus(n: int, free_gib: float = 140.0, name: str = "NVIDIA H200") -> list[GpuInfo]:
    return [GpuInfo(i, name, int(143.7 * GiB), int(free_gib * GiB), "580.95") for i in range(n)]


def test_enough_gpus_pass_and_say_how_many():
    checks = preflight.check_gpus(tiny_input(gpus=2), Layout(stage=1), 2, gpus(2))
    assert all(c.ok for c in checks), [c.line() for c in checks]
    assert checks[0].line().startswith("preflight PASS gpus: 2 visible")


def test_too_few_gpus_block_and_suggest_processes():
    checks = preflight.check_gpus(tiny_input(gpus=4), Layout(stage=1), 4, gpus(2))
    count = checks[0]
    assert not count.ok and count.blocking
    assert "2 visible, the layout needs 4" in count.line() and "--processes 2" in count.line()


def test_no_gpu_blocks_and_points_to_cpu_mode():
    (check,) = preflight.check_gpus(tiny_input(), Layout(stage=0), 1, [])
    assert not check.ok and check.blocking and "--cpu" in check.fix


def test_little_free_memory_warns_with_both_numbers():
    inp = tiny_input()
    need = estimate_memory(inp, Layout(stage=0)).gpu_needed_bytes  # what the run needs at the least
    checks = preflight.check_gpus(inp, Layout(stage=0), 1, gpus(1, free_gib=need / GiB / 2))
    memory = next(c for c in checks if c.name == "gpu memory")
    assert not memory.ok and not memory.blocking
    assert memory.line().startswith("preflight WARN gpu memory")
    assert f"{need / GiB:.1f} GiB" in memory.detail


def test_another_gpu_kind_warns():
    checks = preflight.check_gpus(tiny_input(), Layout(stage=0), 1, gpus(1, name="NVIDIA A100-SXM4-80GB"))
    kind = next(c for c in checks if c.name == "gpu kind")
    assert not kind.ok and not kind.blocking and "--gpu" in kind.fix


def test_pinned_memory_limit_is_checked_for_offload_only():
    inp = tiny_input()
    names = [c.name for c in preflight.check_host(inp, Layout(stage=2, offload_optimizer="cpu"), 1)]
    assert names == ["host ram", "pinned memory (ulimit -l)"]
    assert [c.name for c in preflight.check_host(inp, Layout(stage=2), 1)] == ["host ram"]
    pinned = preflight.check_host(inp, Layout(stage=2, offload_optimizer="cpu"), 1)[1]
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    assert ("unlimited" in pinned.detail) == (soft == resource.RLIM_INFINITY)
    assert "ulimit -l unlimited" in pinned.fix


def test_writable_dir_passes_with_its_free_space_and_creates_nothing(tmp_path):
    (check,) = preflight.check_writable_dir("checkpoint dir", tmp_path / "out" / "ckpt", 0, "use --out")
    assert check.ok and "writable" in check.detail
    assert list(tmp_path.iterdir()) == []  # checked at the nearest existing parent


def test_missing_nvme_path_blocks(tmp_path):
    (check,) = preflight.check_writable_dir("nvme path", tmp_path / "nope", 0, "pass --nvme-path DIR",
                                            must_exist=True)
    assert not check.ok and check.blocking and "does not exist" in check.detail


def test_not_enough_room_blocks(tmp_path):
    (check,) = preflight.check_writable_dir("nvme path", tmp_path, 1 << 60, "pass --nvme-path DIR")
    assert not check.ok and check.blocking and "needs" in check.detail


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_read_only_dir_blocks(tmp_path):
    tmp_path.chmod(0o500)
    try:
        (check,) = preflight.check_writable_dir("checkpoint dir", tmp_path, 0, "use --out")
    finally:
        tmp_path.chmod(0o700)
    assert not check.ok and "not writable" in check.detail


def test_cpu_mode_skips_gpus_and_checks_versions(tmp_path):
    checks = preflight.run_checks(tiny_input(), Layout(stage=3, offload_optimizer="nvme",
                                                       offload_param="nvme"),
                                  VerifyOptions(cpu=True, out_dir=tmp_path,
                                                nvme_path=str(tmp_path / "missing-nvme")), 1)
    by_name = {c.name: c for c in checks}
    assert "skipped" in by_name["gpus"].detail and by_name["gpus"].ok
    assert by_name["torch+deepspeed"].ok and "deepspeed 0.19.8" in by_name["torch+deepspeed"].detail
    assert not by_name["nvme path"].ok and by_name["nvme path"].blocking
    assert by_name["checkpoint dir"].ok


def test_missing_torch_blocks_with_the_install_command(tmp_path):
    fake_python = tmp_path / "python"
    fake_python.write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named torch' >&2\nexit 1\n")
    fake_python.chmod(0o755)
    check, facts = preflight.check_versions(str(fake_python), cpu=True)
    assert not check.ok and check.blocking and facts == {}
    assert "No module named torch" in check.detail and "pip install" in check.fix


def test_query_gpus_without_nvidia_smi_is_empty(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert preflight.query_gpus() == []


def test_query_gpus_parses_nvidia_smi_and_respects_visible_devices(monkeypatch, tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, NVIDIA H200, 143771, 143000, 580.95.05'\n"
                   "echo '1, NVIDIA H200, 143771, 100000, 580.95.05'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    found = preflight.query_gpus()
    assert [g.name for g in found] == ["NVIDIA H200"] * 2
    assert found[1].memory_free_bytes == 100000 * 2**20 and found[0].driver == "580.95.05"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert [g.index for g in preflight.query_gpus()] == [1]


def test_check_line_format():
    assert Check("x", True, "fine").line() == "preflight PASS x: fine"
    assert Check("x", False, "3 < 4", "do y").line() == "preflight FAIL x: 3 < 4 -> do y"
    assert Check("x", False, "3 < 4", "do y", blocking=False).line().startswith("preflight WARN")


def test_the_ops_a_layout_loads():
    assert preflight.ops_for(Layout(stage=2), cpu=False) == ["fused_adam"]
    assert preflight.ops_for(Layout(stage=2, offload_optimizer="cpu"), cpu=False) == ["cpu_adam"]
    assert preflight.ops_for(Layout(stage=3, offload_optimizer="nvme", offload_param="nvme"),
                             cpu=False) == ["cpu_adam", "async_io"]
    # CPU mode: no Adam op, but deepspeed.comm's shared-memory op, which it builds at start-up
    assert preflight.ops_for(Layout(stage=2, offload_optimizer="cpu"), cpu=True) == ["shm_comm"]


def fake_probe_python(tmp_path, facts: dict) -> str:
    """A Python that answers the probe with `facts` and logs its arguments."""
    import json

    script = tmp_path / "python"
    script.write_text("#!/bin/sh\n"
                      f"echo \"$@\" >> {tmp_path / 'calls.log'}\n"
                      f"cat <<'EOF'\n{preflight.PROBE_MARKER}{json.dumps(facts)}\nEOF\n")
    script.chmod(0o755)
    return str(script)


FACTS = {"torch": "2.11.0+cu128", "deepspeed": "0.19.8", "cuda": "12.8", "cuda_devices": 2,
         "cuda_names": ["NVIDIA H200"] * 2, "cuda_total_bytes": [int(143.7 * GiB)] * 2}


@pytest.mark.parametrize("toolchain, torch_cuda, wanted", [
    ({"ninja": False, "cuda_home": "/usr/local/cuda", "nvcc_cuda": "12.8"}, "12.8", "pip install ninja"),
    ({"ninja": True, "cuda_home": None, "nvcc_cuda": None}, "12.8", "module load cuda/12.8"),
    ({"ninja": True, "cuda_home": "/usr/local/cuda", "nvcc_cuda": "13.0"}, "12.8",
     "nvcc is CUDA 13.0, torch was built with CUDA 12.8"),
    ({"ninja": True, "cuda_home": "/usr/local/cuda", "nvcc_cuda": "12.8"}, None, "is a CPU build"),
])
def test_an_op_that_cannot_be_built_fails_with_what_to_type(tmp_path, monkeypatch, toolchain,
                                                            torch_cuda, wanted):
    facts = {**FACTS, "cuda": torch_cuda, "toolchain": toolchain,
             "ops": [{"name": "fused_adam", "prebuilt": False, "ok": False, "load_s": 0.4,
                      "error": "RuntimeError: Error building extension 'fused_adam'"}]}
    python = fake_probe_python(tmp_path, facts)
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, NVIDIA H200, 143771, 143000, 580.95'\n"
                   "echo '1, NVIDIA H200, 143771, 143000, 580.95'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    checks = preflight.run_checks(tiny_input(gpus=2), Layout(stage=2),
                                  VerifyOptions(python=python, out_dir=tmp_path / "out"), 2)
    op = next(c for c in checks if c.name == "op fused_adam")
    assert not op.ok and op.blocking and wanted in op.fix
    assert op.line().startswith("preflight FAIL op fused_adam: cannot be built (0.4 s)")
    assert "--ops fused_adam" in (tmp_path / "calls.log").read_text()


def test_a_built_op_reports_its_time(tmp_path):
    facts = {**FACTS, "toolchain": {"ninja": True, "cuda_home": "/usr/local/cuda", "nvcc_cuda": "12.8"},
             "ops": [{"name": "cpu_adam", "prebuilt": False, "ok": True, "load_s": 117.3}]}
    (check,) = preflight.check_ops(["cpu_adam"], facts, cpu=False, python="python")
    assert check.ok and check.seconds == 117.3
    assert check.line() == "preflight PASS op cpu_adam: loaded from the op cache in 117.3 s"


def test_no_op_is_built_when_an_earlier_check_blocks(tmp_path):
    python = fake_probe_python(tmp_path, FACTS)
    checks = preflight.run_checks(
        tiny_input(), Layout(stage=3, offload_optimizer="nvme", offload_param="nvme"),
        VerifyOptions(cpu=True, python=python, out_dir=tmp_path / "out",
                      nvme_path=str(tmp_path / "no-nvme")), 1)
    assert "--ops" not in (tmp_path / "calls.log").read_text()
    ops = next(c for c in checks if c.name == "deepspeed ops")
    assert not ops.ok and not ops.blocking and "async_io not built" in ops.detail


def test_an_op_build_that_never_answers_points_to_a_stale_lock(tmp_path, monkeypatch):
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\nsleep 30\n")  # torch waiting on a lock a killed build left
    python.chmod(0o755)
    monkeypatch.setattr(preflight, "OP_BUILD_TIMEOUT_S", 1.0)
    check, facts = preflight.check_versions(str(python), cpu=False, ops=["fused_adam"], env={})
    assert not check.ok and check.blocking and facts == {}
    assert "did not answer in 1 s building fused_adam" in check.detail and "lock" in check.fix


def _run_input(inp, processes):
    from zlayout.verify.options import input_for_run
    return input_for_run(inp, processes)


def _llama405b_48_gpus():
    from zlayout.cli import build_parser, plan_input_from_args
    args = build_parser().parse_args(["plan", "--preset", "llama3-405b", "--gpu", "a100-40gb",
                                      "--gpus-per-node", "8", "--nodes", "6", "--checkpointing", "full"])
    return plan_input_from_args(args)


OFFLOADED = Layout(stage=3, offload_optimizer="cpu", offload_param="cpu")


def test_host_ram_far_below_what_the_cpu_run_must_hold_blocks(monkeypatch):
    """A 405B model verified on CPU with 2 processes holds its optimizer states (12 bytes per
    parameter, ~4.5 TiB) in RAM: with 18.7 GiB available that was a WARN and the ranks were
    started anyway (an OOM of a shared login node). It is now a blocking FAIL."""
    monkeypatch.setattr(preflight, "host_available_bytes", lambda: int(18.7 * GiB))
    run = _run_input(_llama405b_48_gpus(), 2)
    (ram,) = [c for c in preflight.check_host(run, OFFLOADED, 2, cpu=True) if c.name == "host ram"]
    assert not ram.ok and ram.blocking
    assert ram.line().startswith("preflight FAIL host ram: 18.7 GiB available; this run holds at "
                                 "least 45")  # 12 B x 406e9 = 4536 GiB
    assert preflight.host_floor_bytes(run, OFFLOADED, cpu=True) == 12 * run.model.params


def test_host_ram_over_the_prediction_but_above_the_floor_only_warns(monkeypatch):
    """Borderline: the prediction exceeds what is free but what the run must hold does not
    (the estimate may be high; the run decides): WARN, as before."""
    inp = tiny_input(layers=4, hidden=256)
    run = _run_input(inp, 2)
    mem = estimate_memory(run, OFFLOADED)
    predicted = mem.host_peak_bytes + 2 * mem.gpu_peak_allocated_bytes
    floor = preflight.host_floor_bytes(run, OFFLOADED, cpu=True)
    assert 0 < floor < predicted
    monkeypatch.setattr(preflight, "host_available_bytes", lambda: max(floor + 1, int(predicted / 1.05)))
    (ram,) = [c for c in preflight.check_host(run, OFFLOADED, 2, cpu=True) if c.name == "host ram"]
    assert not ram.ok and not ram.blocking and ram.line().startswith("preflight WARN host ram")
    monkeypatch.setattr(preflight, "host_available_bytes", lambda: predicted + GiB)
    (ram,) = [c for c in preflight.check_host(run, OFFLOADED, 2, cpu=True) if c.name == "host ram"]
    assert ram.ok


def test_host_ram_far_below_the_prediction_blocks(monkeypatch):
    """The plan's host peak more than its error above what is free: the kernel would kill a rank
    after init (llama3-8b-1xh200-offload on a 125 GiB H200 node), so verify does not start."""
    inp = tiny_input(layers=4, hidden=256)
    run = _run_input(inp, 2)
    mem = estimate_memory(run, OFFLOADED)
    predicted = mem.host_peak_bytes + 2 * mem.gpu_peak_allocated_bytes
    floor = preflight.host_floor_bytes(run, OFFLOADED, cpu=True)
    available = max(floor + 1, int(predicted / 1.2))
    assert available * (1 + preflight.HOST_PREDICTION_SLACK) < predicted
    monkeypatch.setattr(preflight, "host_available_bytes", lambda: available)
    (ram,) = [c for c in preflight.check_host(run, OFFLOADED, 2, cpu=True) if c.name == "host ram"]
    assert ram.blocking and ram.line().startswith("preflight FAIL host ram") and "--no-preflight" in ram.line()


def test_on_gpus_without_offload_the_optimizer_states_are_not_in_ram(monkeypatch):
    monkeypatch.setattr(preflight, "host_available_bytes", lambda: 1 * GiB)
    run = _run_input(_llama405b_48_gpus(), 8)
    assert preflight.host_floor_bytes(run, Layout(stage=3), cpu=False) == 0
    assert preflight.host_floor_bytes(run, Layout(stage=3, offload_optimizer="nvme"), cpu=True) == 0
    (ram,) = preflight.check_host(run, Layout(stage=3), 8)
    assert not ram.blocking  # the host side of a GPU run: the prediction only warns


def test_the_cli_refuses_to_launch_a_cpu_run_the_machine_cannot_hold(tmp_path):
    """The QA command, for real: exit non-zero, one FAIL line, no rank started (no spec
    written, no rank output)."""
    import subprocess
    import sys

    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "zlayout", "verify", "--preset", "llama3-405b", "--gpu", "a100-40gb",
         "--gpus-per-node", "8", "--nodes", "6", "--checkpointing", "full", "--stage", "3",
         "--offload-optimizer", "cpu", "--offload-param", "cpu", "--cpu", "--processes", "2",
         "--out", str(out)], capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    fails = [x for x in output.splitlines() if x.startswith("preflight FAIL")]
    assert len(fails) == 1 and fails[0].startswith("preflight FAIL host ram:"), output
    assert "[rank" not in output and not (out / "spec.json").exists()


def test_an_emulated_rank_holds_its_share_of_the_optimizer_states_not_the_models(monkeypatch):
    # `verify --emulate` of Llama-3-405B's shape over 48 GPUs with the optimizer on the host:
    # one process holds rank 0's partition (12 B x params / 48, ~95 GiB), not 12 B x 406e9
    # (the CPU check's floor): the old check would refuse to start it on a 128 GiB node
    monkeypatch.setattr(preflight, "host_available_bytes", lambda: int(120 * GiB))
    plan = _llama405b_48_gpus()
    (ram,) = [c for c in preflight.check_host(plan, OFFLOADED, 1, cpu=False, emulate=True) if c.name == "host ram"]
    assert not ram.blocking and "rank 0's share" in ram.line()
    (whole,) = [c for c in preflight.check_host(plan, OFFLOADED, 1, cpu=True) if c.name == "host ram"]
    assert whole.blocking  # the same model's CPU check on this machine: its whole states
