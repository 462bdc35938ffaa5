"""attach_verification: a verification run's result becomes [verification], [restart_drill],
measured alerts and a change-log entry, and survives the trip through the file."""

from __future__ import annotations

import json
import os

import pytest

from zlayout.profile import attach_verification, build_profile, load_profile, save_profile
from zlayout.profile.alerts import (GPU_MEMORY_MARGIN, HOST_BOUND_STEP_TIME_FACTOR, OFFLOAD_BOUND_STEP_TIME_FACTOR,
                                    STEP_TIME_FACTOR)
from zlayout.spec import Layout


def test_validated_result_fills_the_profile(profile_8b, make_verify_result, tmp_path, fixed_time):
    result = json.loads(json.dumps(make_verify_result(profile_8b)))  # as read back from result.json
    profile = attach_verification(profile_8b, result, now=fixed_time)
    v = profile.verification
    measured_peak = result["measured"]["gpu_peak_allocated_bytes"]
    assert v.status == "validated" and v.when == fixed_time
    assert v.gpus == "8x NVIDIA H100 80GB HBM3" and v.gpu_count == 8 and v.world == 8
    assert (v.driver, v.cuda, v.torch, v.deepspeed) == ("560.35.03", "12.6", "2.5.1", "0.19.8")
    assert v.steps == 3
    assert v.measured["gpu_peak_allocated_bytes"] == measured_peak
    assert isinstance(v.measured["gpu_peak_allocated_bytes"], int)
    assert "gpu_peak_allocated_bytes_per_step" not in v.measured  # lists are not figures
    assert v.error_fraction["gpu_peak_allocated_bytes"] == pytest.approx(1 / 1.04 - 1, abs=1e-4)
    assert profile.restart_drill.resumed_ok and profile.restart_drill.resume_s == 12.5
    assert profile.restart_drill.loss_exact is True

    gpu = profile.alerts.gpu_memory
    assert gpu.basis == "measured" and gpu.peak_allocated_bytes == measured_peak
    assert gpu.warn_allocated_above_bytes == int(measured_peak * (1 + GPU_MEMORY_MARGIN))
    assert profile.alerts.step_time.basis == "measured"
    # the offloaded 8B's step is the CPU optimizer's (offload-bound): its measured step's wider factor
    assert profile.alerts.step_time.warn_above_s == pytest.approx(0.5 * OFFLOAD_BOUND_STEP_TIME_FACTOR)
    assert profile.alerts.host_memory.peak_bytes == result["measured"]["host_peak_bytes"]

    entry = profile.changelog[-1]
    assert len(profile.changelog) == 2 and entry.basis == "measured"
    assert entry.why == "verification validated on 8x NVIDIA H100 80GB HBM3"
    assert entry.gpu_peak_bytes_before == profile_8b.prediction.gpu_peak_allocated_bytes
    assert entry.gpu_peak_bytes_after == measured_peak
    assert entry.step_time_s_after == 0.5

    path = save_profile(profile, tmp_path)
    assert load_profile(path).model_copy(update={"manifest": {}}) == profile  # plus the set's manifest
    assert profile_8b.verification.status == "unverified"  # the original is untouched


def test_failed_run_keeps_alerts_on_the_prediction(profile_8b, make_verify_result):
    profile = attach_verification(profile_8b, make_verify_result(profile_8b, status="failed"))
    assert profile.verification.status == "failed"
    assert profile.verification.message == "rank 0 failed during step: boom"
    assert profile.alerts == profile_8b.alerts
    assert profile.changelog[-1].why == "verification failed on 8x NVIDIA H100 80GB HBM3: rank 0 failed during step: boom"
    assert profile.changelog[-1].gpu_peak_bytes_after == profile_8b.prediction.gpu_peak_allocated_bytes


def test_mismatch_alerts_follow_the_measurement(profile_8b, make_verify_result):
    profile = attach_verification(profile_8b, make_verify_result(profile_8b, status="mismatch", scale=1.5))
    assert profile.alerts.gpu_memory.basis == "measured"
    assert profile.alerts.gpu_memory.peak_allocated_bytes == int(profile_8b.prediction.gpu_peak_allocated_bytes * 1.5)


def test_does_not_fit_is_recorded(profile_8b, make_verify_result):
    result = make_verify_result(profile_8b, status="does-not-fit")
    result["cause"] = "rank 3 ran out of memory during backward: CUDA out of memory"
    profile = attach_verification(profile_8b, result)
    assert profile.status == "does-not-fit"
    assert "ran out of memory" in profile.verification.message


def test_a_run_on_fewer_gpus_does_not_move_the_alerts(make_input, make_verify_result):
    profile = build_profile(make_input(model="llama3-70b", nodes=8), Layout(stage=3))
    result = make_verify_result(profile)
    one_node = profile.inputs.model_copy(update={"hardware": profile.inputs.hardware.model_copy(
        update={"nodes": 1, "inter_link": None})})
    result["inputs"] = one_node.model_dump(mode="json")
    result["measured"]["world"] = 8
    attached = attach_verification(profile, result)
    assert attached.verification.world == 8 and attached.world == 64
    assert "run on 8 of the profile's 64 GPUs" in attached.verification.message
    assert attached.alerts.gpu_memory.basis == "predicted"
    assert attached.changelog[-1].basis == "predicted"


def test_results_for_something_else_are_refused(profile_8b, make_verify_result):
    other_layout = make_verify_result(profile_8b)
    other_layout["layout"] = {"stage": 2, "offload_optimizer": "gpu", "offload_param": "gpu"}
    with pytest.raises(ValueError, match="is for ZeRO-2, this profile is ZeRO-3 opt→cpu"):
        attach_verification(profile_8b, other_layout)
    other_inputs = make_verify_result(profile_8b)
    other_inputs["inputs"]["training"]["seq"] = 99
    with pytest.raises(ValueError, match="training differ"):
        attach_verification(profile_8b, other_inputs)
    cancelled = make_verify_result(profile_8b, status="cancelled")
    with pytest.raises(ValueError, match="cancelled"):
        attach_verification(profile_8b, cancelled)
    bad_status = make_verify_result(profile_8b, status="splendid")
    with pytest.raises(ValueError, match="status"):
        attach_verification(profile_8b, bad_status)


def test_result_from_the_verification_module(make_input):
    """The dict zlayout.verify.result.build_result makes (from per-rank reports) attaches as is."""
    import zlayout.verify.result as result_module
    inp = make_input(gpus_per_node=2)
    layout = Layout(stage=2)
    profile = build_profile(inp, layout)
    peak = profile.prediction.gpu_peak_allocated_bytes
    reports = [{
        "rank": r, "status": "ok", "hostname": "gpu-node-1", "gpu_name": "NVIDIA H100 80GB HBM3",
        "torch": "2.5.1", "deepspeed": "0.19.8", "params": inp.model.params,
        "steps_run": [1, 2, 3], "step_s": [3.0, 1.0, 1.0], "losses": [10.0, 9.9, 9.8],
        "peak_allocated_bytes": [int(peak * 0.9), int(peak * 1.02), int(peak * 1.02)],
        "after_init_allocated_bytes": int(peak * 0.5), "max_reserved_bytes": int(peak * 1.1),
        "device_used_bytes": int(peak * 1.15), "host_maxrss_bytes": 20 * 2**30, "init_s": 40.0,
    } for r in range(2)]
    result = result_module.build_result(inp, layout, reports, cpu=False, returncode=0, output_tail=[],
                                        expected_ranks=2, environment={"driver": "560.35.03"})
    result = json.loads(json.dumps(result, default=str))
    attached = attach_verification(profile, result)
    v = attached.verification
    assert v.status == result["status"] == "validated"
    assert v.measured["gpu_peak_allocated_bytes"] == int(peak * 1.02)
    assert v.measured["host_peak_bytes"] == 40 * 2**30  # two ranks on one node
    assert v.gpus == "2x NVIDIA H100 80GB HBM3" and v.driver == "560.35.03" and v.world == 2
    assert attached.alerts.gpu_memory.basis == "measured"


def test_a_host_bound_step_gets_a_wider_step_time_alert(make_input, tiny_model, profile_8b, make_verify_result,
                                                       tmp_path, fixed_time):
    """A step the host's Python sets varies from process to process (0.197-0.359 s over six runs of
    one layout): 1.25x its plan would page on a healthy restart."""
    from zlayout.profile import build_profile

    tiny = build_profile(make_input(tiny_model, gpus_per_node=1, seq=128), Layout(stage=3), now=fixed_time)
    pred = tiny.prediction
    assert pred.host_overhead_s is not None and pred.host_overhead_s > 0.25 * pred.step_time_s
    alert = tiny.alerts.step_time
    assert alert.factor == HOST_BOUND_STEP_TIME_FACTOR
    assert alert.warn_above_s == pytest.approx(pred.step_time_s * HOST_BOUND_STEP_TIME_FACTOR, rel=1e-5)
    assert "host-bound" in alert.why
    # the prediction's host side survives the file, and a measured basis keeps the wide factor
    assert load_profile(save_profile(tiny, tmp_path / "tiny")).prediction.host_overhead_s == pred.host_overhead_s
    measured = attach_verification(tiny, json.loads(json.dumps(make_verify_result(tiny))), now=fixed_time)
    assert measured.alerts.step_time.basis == "measured"
    assert measured.alerts.step_time.factor == HOST_BOUND_STEP_TIME_FACTOR
    # an offloaded 8B on 8 GPUs is the CPU optimizer's, not the host's Python: offload-bound, and
    # such steps varied 27% from process to process (h200-2026-12-04): 1.5x, not 2x or 1.25x
    big = profile_8b.prediction
    assert big.host_overhead_s is not None and big.host_overhead_s < 0.25 * big.step_time_s
    assert big.offload_s >= 0.5 * big.step_time_s
    assert profile_8b.alerts.step_time.factor == OFFLOAD_BOUND_STEP_TIME_FACTOR
    assert "host-bound" not in profile_8b.alerts.step_time.why
    assert "offload-bound" in profile_8b.alerts.step_time.why
    # the GPU's own step keeps the usual factor (two sequences of 4096: the host sets well under a quarter)
    gpu = build_profile(make_input(seq=4096, micro_batch=2), Layout(stage=3), now=fixed_time)
    assert gpu.prediction.host_overhead_s < 0.2 * gpu.prediction.step_time_s
    assert gpu.alerts.step_time.factor == STEP_TIME_FACTOR, gpu.alerts.step_time.why


# ---------------------------------------------------------------- verify --update-profile

def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    from zlayout.cli import main

    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


TINY_EXPORT = ["export", "--layers", "2", "--hidden", "128", "--heads", "4", "--vocab", "1000", "--seq", "64",
               "--gpus-per-node", "2", "--gpu", "h200", "--stage", "2"]


def test_a_run_that_never_started_keeps_the_last_real_result(tmp_path, capsys, make_verify_result):
    from zlayout.profile import load_profile, save_profile_dir

    out = tmp_path / "p"
    assert _cli(capsys, *TINY_EXPORT, "--out", str(out))[0] == 0
    profile = load_profile(out)
    validated = attach_verification(profile, make_verify_result(profile))
    save_profile_dir(validated, out)
    # a preflight that fails (no torch under /bin/false): no rank ever starts. A process of its
    # own: verify's progress printer keeps the stderr it started with
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "zlayout", "verify", str(out), "--cpu", "--processes", "1",
                           "--python", "/bin/false", "--update-profile", "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "the run never started" in done.stderr, done.stderr
    kept = load_profile(out)
    assert kept.verification == validated.verification
    assert kept.verification.status == "validated" and kept.verification.measured
    assert kept.changelog[-1].why.startswith("verification did not start (preflight:")
    assert _cli(capsys, "show", str(out))[1].splitlines()[2].startswith("Status: VALIDATED")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory")
def test_an_unwritable_profile_directory_is_one_line_before_the_run(tmp_path, capsys):
    out = tmp_path / "p"
    assert _cli(capsys, *TINY_EXPORT, "--out", str(out))[0] == 0
    out.chmod(0o555)
    try:
        code, _, err = _cli(capsys, "verify", str(out), "--cpu", "--processes", "1", "--update-profile",
                            "--out", str(tmp_path / "run"))
    finally:
        out.chmod(0o755)
    assert code == 2 and err.count("\n") == 1 and "cannot write into" in err
    assert not (tmp_path / "run").exists()  # refused before any run


def test_device_used_alert_is_wider_on_a_prediction_than_on_a_measurement(profile_8b, make_verify_result):
    """A prediction's device use has been under a held-out run by up to 11.7%: its "above plan"
    alert sits 15% over it (a healthy first run must not page); a verified layout's repeats its
    measured device use, and the alert sits 5% over that."""
    from zlayout.core.fit import ABOVE_PLAN_FRACTION, ABOVE_PREDICTION_FRACTION

    predicted = profile_8b.alerts.gpu_memory
    assert predicted.basis == "predicted"
    assert predicted.warn_device_used_above_bytes == int(
        profile_8b.prediction.gpu_device_used_bytes * (1 + ABOVE_PREDICTION_FRACTION))
    result = make_verify_result(profile_8b)
    profile = attach_verification(profile_8b, result)
    measured = profile.alerts.gpu_memory
    assert measured.basis == "measured"
    assert measured.warn_device_used_above_bytes == int(
        result["measured"]["gpu_device_used_bytes"] * (1 + ABOVE_PLAN_FRACTION))
