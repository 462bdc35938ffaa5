"""Measured against predicted: folding rank reports, errors in percent, the verdict,
the restart drill's check, and the reference-format row (no torch needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zlayout.spec import GiB, Layout
from zlayout.commands.verify import format_result
from zlayout.verify.result import (TOLERANCE_FRACTION, build_result, errors_pct, measured_figures,
                                   oom_need_bytes, predicted_figures, reference_row,
                                   restart_drill_result)

from .conftest import tiny_input

LAYOUT = Layout(stage=2)


def report(rank: int, peak_bytes: int | None, status: str = "ok", **extra):
    base = {"rank": rank, "hostname": "node0", "status": status, "phase": "done", "params": 116480,
            "torch": "2.11.0", "deepspeed": "0.19.8", "gpu_name": "NVIDIA H200",
            "after_init_allocated_bytes": 1 * GiB, "max_reserved_bytes": peak_bytes and peak_bytes + GiB,
            "device_used_bytes": peak_bytes and peak_bytes + 2 * GiB,
            "host_maxrss_bytes": 3 * GiB, "steps_run": [1, 2, 3], "losses": [5.0, 4.9, 4.8],
            "step_s": [2.0, 0.5, 0.7], "peak_allocated_bytes": [peak_bytes] * 3, "init_s": 10.0}
    base.update(extra)
    return base


@pytest.fixture
def inp():
    return tiny_input(gpus=2)


def predicted_peak(inp) -> int:
    return predicted_figures(inp, LAYOUT)["gpu_peak_allocated_bytes"]


def test_within_tolerance_is_validated(inp):
    peak = int(predicted_peak(inp) * 1.05)
    result = build_result(inp, LAYOUT, [report(0, peak), report(1, peak - 1000)], cpu=False,
                          returncode=0, output_tail=[], expected_ranks=2)
    assert result["status"] == "validated"
    assert result["cause"] is None
    assert result["measured"]["gpu_peak_allocated_bytes"] == peak  # the worst rank
    assert result["errors_pct"]["gpu_peak_allocated_bytes"] == pytest.approx(100 * (1 / 1.05 - 1), abs=0.01)
    for key in ("status", "measured", "predicted", "errors_pct", "restart_drill", "environment",
                "layout", "inputs"):
        assert key in result
    assert result["environment"]["gpus"] == ["NVIDIA H200", "NVIDIA H200"]
    json.dumps(result)  # serialisable as is


def test_beyond_tolerance_is_a_mismatch_with_the_numbers(inp):
    peak = int(predicted_peak(inp) / (1 - 2 * TOLERANCE_FRACTION))
    result = build_result(inp, LAYOUT, [report(0, peak), report(1, peak)], cpu=False,
                          returncode=0, output_tail=[], expected_ranks=2)
    assert result["status"] == "mismatch"
    assert "tolerance" in result["cause"] and "GiB" in result["cause"]


def test_an_out_of_memory_rank_means_does_not_fit(inp):
    oom = report(1, None, status="oom", phase="train", steps_run=[], losses=[], step_s=[],
                 peak_allocated_bytes=[], error="OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
                 max_allocated_bytes_at_failure=139 * GiB)
    result = build_result(inp, LAYOUT, [report(0, 10 * GiB), oom], cpu=False, returncode=1,
                          output_tail=["..."], expected_ranks=2)
    assert result["status"] == "does-not-fit"
    assert "rank 1" in result["cause"] and "out of memory" in result["cause"]


def test_a_crash_is_failed_with_the_last_output_lines(inp):
    tail = [f"line {i}" for i in range(50)] + ["torch.distributed.elastic: SIGKILL"]
    result = build_result(inp, LAYOUT, [report(0, 10 * GiB)], cpu=False, returncode=-9,
                          output_tail=tail, expected_ranks=2)
    assert result["status"] == "failed"
    assert "1 of 2 ranks" in result["cause"] and "SIGKILL" in result["cause"]
    assert result["output_tail"][-1] == tail[-1]


@pytest.mark.parametrize("cpu", [False, True])
def test_a_rank_the_kernel_killed_names_the_host_memory_the_plan_expects_there(inp, cpu):
    """torchrun's SIGKILL of a rank is the OOM killer's: the cause quotes the plan's host peak. In
    CPU mode the ranks' device memory is host memory too (as preflight's host check adds it): the
    GPU-mode figure alone read as if a 17 GiB CPU run had been planned at 3 GiB."""
    predicted = predicted_figures(inp, LAYOUT)
    tail = ["Root Cause (first observed failure):", "traceback : Signal 9 (SIGKILL) received by PID 28079"]
    result = build_result(inp, LAYOUT, [], cpu=cpu, returncode=1, output_tail=tail, expected_ranks=2)
    host = predicted["host_peak_bytes"] + (2 * predicted["gpu_peak_allocated_bytes"] if cpu else 0)
    assert result["status"] == "failed"
    assert f"the plan's host peak: {host / GiB:.1f} GiB on this node" in result["cause"]
    assert ("the ranks' device memory included" in result["cause"]) == cpu


def test_a_rank_error_is_failed_with_its_message(inp):
    broken = report(0, None, status="error", phase="initialize", error="ValueError: bad config")
    result = build_result(inp, LAYOUT, [broken], cpu=False, returncode=1, output_tail=[],
                          expected_ranks=1)
    assert result["status"] == "failed"
    assert "initialize" in result["cause"] and "bad config" in result["cause"]


def test_cpu_mode_is_not_a_memory_validation(inp):
    reports = [report(r, None, peak_allocated_bytes=[None] * 3, max_reserved_bytes=None,
                      device_used_bytes=None, after_init_allocated_bytes=None) for r in (0, 1)]
    result = build_result(inp, LAYOUT, reports, cpu=True, returncode=0, output_tail=[],
                          expected_ranks=2)
    assert result["status"] == "cpu-ok"
    assert result["measured"]["gpu_peak_allocated_bytes"] is None
    assert result["measured"]["host_peak_bytes"] == 6 * GiB  # two ranks on one node


def test_step_time_is_the_steady_step_of_the_slowest_rank(inp):
    # Step 1 pays one-time costs, step 2 still warms up: the median of steps 3 and on.
    reports = [report(0, GiB, step_s=[9.0, 5.0, 3.0, 1.0, 2.0], peak_allocated_bytes=[GiB] * 5),
               report(1, GiB, step_s=[9.0, 2.0, 1.0, 4.0, 1.0], peak_allocated_bytes=[GiB] * 5)]
    m = measured_figures(inp, reports)
    assert m["step_times_s"] == [9.0, 5.0, 3.0, 4.0, 2.0]
    assert m["step_time_s"] == pytest.approx(3.0)
    tokens = 32 * 2 * 2
    assert m["tokens_per_s"] == pytest.approx(tokens / 3.0)


def test_the_steady_steps_spread_is_reported_with_the_prediction_inside_or_outside_it(inp):
    # The slowest rank's steps: 9, 5 | 3, 4, 2 -> steady 2-4 s around a median of 3 s.
    reports = [report(0, GiB, step_s=[9.0, 5.0, 3.0, 1.0, 2.0], peak_allocated_bytes=[GiB] * 5),
               report(1, GiB, step_s=[9.0, 2.0, 1.0, 4.0, 1.0], peak_allocated_bytes=[GiB] * 5)]
    m = measured_figures(inp, reports)
    assert m["step_time_range_s"] == [2.0, 4.0]
    result = build_result(inp, LAYOUT, reports, cpu=False, returncode=0, output_tail=[], expected_ranks=2)
    result["predicted"]["step_time_s"] = 2.5
    text = format_result(result)
    assert "steady steps (3): 2.000-4.000 s, -33%/+33% around the median; the prediction lies inside" in text
    assert "--steps 10" in text  # 67% apart over 3 steps: more steps asked for
    result["predicted"]["step_time_s"] = 1.5
    assert "lies outside that range" in format_result(result)


def test_a_host_bound_prediction_says_one_run_is_not_the_layout(inp):
    # batch 9's transformers ZeRO-3 layout: 0.197 s in one process, 0.214-0.359 s in five others
    reports = [report(0, GiB, step_s=[9.0, 5.0, 3.0, 1.0, 2.0], peak_allocated_bytes=[GiB] * 5)]
    result = build_result(inp, LAYOUT, reports, cpu=False, returncode=0, output_tail=[], expected_ranks=1)
    assert "host_overhead_s" in result["predicted"]
    result["predicted"].update(step_time_s=2.5, host_overhead_s=1.1)
    assert "host-bound (the host's Python sets 44% of the predicted step)" in format_result(result)
    result["predicted"]["host_overhead_s"] = 0.2  # 8%: the kernels' step
    assert "host-bound" not in format_result(result)


def test_an_offload_bound_prediction_says_one_run_is_not_the_layout(inp):
    # Mixtral-8x7B-L2 ZeRO-3 opt->cpu: 4.05 s in verify's process, 3.19 s in a profile's
    reports = [report(0, GiB, step_s=[9.0, 5.0, 4.0, 4.1, 4.0], peak_allocated_bytes=[GiB] * 5)]
    result = build_result(inp, LAYOUT, reports, cpu=False, returncode=0, output_tail=[], expected_ranks=1)
    assert "offload_s" in result["predicted"]
    result["predicted"].update(step_time_s=2.9, host_overhead_s=0.0, offload_s=2.8)
    assert "offload-bound (the CPU optimizer and host copies set 97% of the predicted step)" in format_result(result)
    assert "zlayout calibrate" in format_result(result)  # 4.0 s measured against 2.9 planned: the host's rate
    result["predicted"].update(step_time_s=4.0, offload_s=3.9)
    assert "offload-bound" in format_result(result) and "zlayout calibrate" not in format_result(result)
    result["predicted"].update(step_time_s=2.9, offload_s=0.5)  # 17%: the GPU's step
    assert "offload-bound" not in format_result(result)


def test_no_spread_line_for_a_cpu_run(inp):
    # a CPU run's steps against the GPU's predicted step time would read as a miss of the plan
    reports = [report(0, GiB, step_s=[9.0, 5.0, 3.0, 1.0, 2.0], peak_allocated_bytes=[GiB] * 5)]
    result = build_result(inp, LAYOUT, reports, cpu=True, returncode=0, output_tail=[], expected_ranks=1)
    assert result["measured"]["step_time_range_s"] == [1.0, 3.0]
    assert "steady steps" not in format_result(result)


def test_no_spread_from_three_steps_or_fewer(inp):
    m = measured_figures(inp, [report(0, GiB, step_s=[9.0, 2.0, 3.0], peak_allocated_bytes=[GiB] * 3)])
    assert m["step_time_range_s"] is None
    result = build_result(inp, LAYOUT, [report(0, GiB)], cpu=False, returncode=0, output_tail=[],
                          expected_ranks=1)
    assert "steady steps" not in format_result(result)


def test_step_time_of_two_steps_is_the_second(inp):
    m = measured_figures(inp, [report(0, GiB, step_s=[9.0, 2.0], peak_allocated_bytes=[GiB] * 2)])
    assert m["step_time_s"] == pytest.approx(2.0)


def test_errors_are_signed_relative_to_the_measurement():
    errors = errors_pct({"gpu_peak_allocated_bytes": 100, "step_time_s": 2.0},
                        {"gpu_peak_allocated_bytes": 110, "step_time_s": 1.0})
    assert errors["gpu_peak_allocated_bytes"] == 10.0  # over-estimate
    assert errors["step_time_s"] == -50.0  # under-estimate
    assert errors["host_peak_bytes"] is None


def test_restart_drill_compares_the_overlapping_steps():
    first = [{"rank": r, "steps_run": [1, 2, 3, 4], "losses": [5.0, 4.0 + r, 3.0, 2.0], "save_s": 0.5}
             for r in (0, 1)]
    resumed = [{"rank": r, "step_resumed": 2, "resume_s": 0.25, "steps_run": [3, 4],
                "losses": [3.0, 2.0]} for r in (0, 1)]
    drill = restart_drill_result(first, resumed, save_at_step=2, resume_wall_s=12.0)
    assert drill["resumed_ok"] and drill["loss_exact"]
    assert (drill["step_before"], drill["step_after"]) == (2, 2)
    assert (drill["loss_expected"], drill["loss_resumed"]) == (3.0, 3.0)
    assert drill["losses_compared"] == 4 and drill["resume_s"] == 0.25


def test_restart_drill_fails_on_a_different_loss_or_step():
    first = [{"rank": 0, "steps_run": [1, 2, 3], "losses": [5.0, 4.0, 3.0]}]
    wrong_loss = [{"rank": 0, "step_resumed": 2, "steps_run": [3], "losses": [3.5]}]
    assert not restart_drill_result(first, wrong_loss, 2, None)["resumed_ok"]
    wrong_step = [{"rank": 0, "step_resumed": 0, "steps_run": [3], "losses": [3.0]}]
    assert not restart_drill_result(first, wrong_step, 2, None)["resumed_ok"]
    assert not restart_drill_result(first, [], 2, None)["resumed_ok"]


def test_reference_row_has_the_fields_of_the_reference_measurements(inp):
    peak = predicted_peak(inp)
    result = build_result(inp, LAYOUT, [report(0, peak), report(1, peak)], cpu=False,
                          returncode=0, output_tail=[], expected_ranks=2)
    row = reference_row(result)
    reference = Path(__file__).resolve().parents[2] / "benchmarks/measurements/h200-2026-11-29.jsonl"
    wanted = {"stage", "offload_opt", "offload_param", "world", "layers", "hidden", "vocab", "seq",
              "mbs", "ckpt", "params", "after_init_gib", "peak_gib", "reserved_gib",
              "device_used_gib", "host_maxrss_gib", "step_s", "heads", "kv_heads", "ffn", "mlp",
              "norm", "bias"}
    wanted |= set(json.loads(reference.read_text().splitlines()[0])) - {"init_s", "loss"}
    assert wanted <= set(row)
    assert row["offload_opt"] == "none" and row["world"] == 2
    assert row["peak_gib"] == [round(peak / GiB, 4)] * 3


# PyTorch 2.x's CUDA OOM message (c10/cuda/CUDACachingAllocator.cpp), as a rank reports it.
TORCH_OOM = ("OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total "
             "capacity of 139.81 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this "
             "process has 138.74 GiB memory in use. Of the allocated memory 130.12 GiB is allocated "
             "by PyTorch, and 7.30 GiB is reserved by PyTorch but unallocated. If reserved but "
             "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")


def test_oom_need_is_read_from_pytorchs_message():
    assert oom_need_bytes(TORCH_OOM) == (int(130.12 * GiB), 2 * GiB)
    small = TORCH_OOM.replace("Tried to allocate 2.00 GiB", "Tried to allocate 512.00 MiB")
    assert oom_need_bytes(small)[1] == 512 * 2**20
    assert oom_need_bytes("RuntimeError: DefaultCPUAllocator: can't allocate memory") is None


def test_an_out_of_memory_names_what_it_needed_against_the_prediction(inp):
    oom = report(1, None, status="oom", phase="train", steps_run=[], losses=[], step_s=[],
                 peak_allocated_bytes=[], error=TORCH_OOM, max_allocated_bytes_at_failure=131 * GiB)
    result = build_result(inp, LAYOUT, [report(0, 10 * GiB, status="running"), oom], cpu=False,
                          returncode=1, output_tail=[], expected_ranks=2)
    assert result["status"] == "does-not-fit"
    predicted = result["predicted"]["gpu_peak_allocated_bytes"] / GiB
    assert ("rank 1 ran out of memory during train: needs at least 130.12 + 2.00 = 132.12 GiB"
            in result["cause"])
    assert f"predicted peak allocated {predicted:.2f} GiB" in result["cause"]


def test_a_failed_run_is_partial_with_no_error_percentages(inp):
    # What the issue saw: a crash after 5.38 GiB shown as a +1001% error of the plan.
    crashed = report(0, None, status="error", phase="train", error="RuntimeError: NCCL error",
                     steps_run=[], losses=[], step_s=[], peak_allocated_bytes=[],
                     max_allocated_bytes_at_failure=int(5.38 * GiB))
    result = build_result(inp, LAYOUT, [crashed], cpu=False, returncode=1, output_tail=[],
                          expected_ranks=1)
    assert result["status"] == "failed" and result["measured_partial"] is True
    assert result["measured"]["gpu_peak_allocated_bytes"] == int(5.38 * GiB)  # kept, labelled
    assert result["errors_pct"] == {}
    text = format_result(result)
    assert "partial" in text and "%" not in text.split("figure", 1)[1]


def test_a_complete_run_is_not_partial(inp):
    peak = predicted_peak(inp)
    result = build_result(inp, LAYOUT, [report(0, peak), report(1, peak)], cpu=False,
                          returncode=0, output_tail=[], expected_ranks=2)
    assert result["measured_partial"] is False and result["errors_pct"]["gpu_peak_allocated_bytes"] == 0


def test_a_failed_drill_fails_a_cpu_run_too(inp):
    reports = [report(r, None, peak_allocated_bytes=[None] * 3) for r in (0, 1)]
    drill = {"resumed_ok": False, "step_before": 2, "step_after": 2, "loss_expected": 4.9,
             "loss_resumed": 4.9, "cause": "[rank 0] terminate called without an active exception"}
    result = build_result(inp, LAYOUT, reports, cpu=True, returncode=0, output_tail=[],
                          expected_ranks=2, restart_drill=drill)
    assert result["status"] == "failed"
    assert "restart drill" in result["cause"] and "terminate called" in result["cause"]


def test_step_phases_take_the_slowest_rank_per_step(inp):
    reports = [report(0, GiB, forward_s=[5.0, 0.1, 0.3], backward_s=[1.0, 0.2, 0.2],
                      optimizer_s=[1.0, 0.05, 0.05]),
               report(1, GiB, forward_s=[5.0, 0.2, 0.1], backward_s=[1.0, 0.4, 0.2],
                      optimizer_s=[1.0, 0.05, 0.15])]
    m = measured_figures(inp, reports)
    assert m["forward_times_s"] == [5.0, 0.2, 0.3]
    # The steady step, as for the step time: here step 3 (1 and 2 warm up).
    assert m["forward_s"] == pytest.approx(0.3)
    assert m["backward_s"] == pytest.approx(0.2) and m["optimizer_s"] == pytest.approx(0.15)


def test_device_used_is_read_at_the_peak_not_after_the_allocator_gave_memory_back():
    # ZeRO-2 L18 h4096 on one H200 (benchmarks/measurements/h200-2026-12-01, call 3): the
    # allocator hit the card's limit 7 times, freed its cached segments and retried; after the
    # run the card held 129.75 GiB, 128.45 of it PyTorch's cache, while the cache had peaked at
    # 136.41. The run's device use at its peak is 137.71 GiB; verify compared 129.75 with the
    # plan's 140.40 and called the plan 8% high.
    from zlayout.verify.worker import device_used_at_peak

    used_end, cache_end, cache_peak = int(129.75 * GiB), int(128.45 * GiB), int(136.41 * GiB)
    assert device_used_at_peak(used_end, cache_end, cache_peak) == used_end - cache_end + cache_peak
    assert abs(device_used_at_peak(used_end, cache_end, cache_peak) - 137.71 * GiB) < 0.01 * GiB
    # without retries the cache never shrinks: the figure read at the end is the peak
    assert device_used_at_peak(used_end, cache_peak, cache_peak) == used_end


def test_an_emulated_run_compares_gpu_memory_only_without_nccls_buffers():
    # rank 0 of 8 on one GPU (--emulate): its allocator's figures are the full run's, its device
    # use has no NCCL communicator (no peers), and its step has no communication: the step time,
    # throughput and host memory are not compared, and the result says it was emulated
    from zlayout.core.memory import NCCL_BUFFER_BYTES, NCCL_ONE_RANK_BYTES

    eight = tiny_input(gpus=8)
    planned = predicted_figures(eight, LAYOUT)
    peak = planned["gpu_peak_allocated_bytes"]
    result = build_result(eight, LAYOUT, [report(0, peak, world=8)], cpu=False, returncode=0,
                          output_tail=[], expected_ranks=1, emulated=True)
    assert result["status"] == "validated" and result["emulated_world"] == 8
    assert result["measured"]["world"] == 8 and result["measured"]["emulated"] is True
    assert result["predicted"]["gpu_device_used_bytes"] == (planned["gpu_device_used_bytes"] - NCCL_BUFFER_BYTES
                                                            - NCCL_ONE_RANK_BYTES)
    assert result["predicted"]["gpu_peak_reserved_bytes"] == planned["gpu_peak_reserved_bytes"]
    e = result["errors_pct"]
    assert e["gpu_peak_allocated_bytes"] == 0.0 and e["gpu_device_used_bytes"] is not None
    assert e["step_time_s"] is None and e["host_peak_bytes"] is None and e["tokens_per_s"] is None
    assert result["measured"]["step_time_s"] is None and result["measured"]["step_times_s"] == [2.0, 0.5, 0.7]
    text = format_result(result)
    assert "emulated: rank 0 of 8 GPUs on one GPU" in text
    step_line, = [line for line in text.splitlines() if line.strip().startswith("step time")]
    assert step_line.split()[-3:] == ["-", "-", "-"]
