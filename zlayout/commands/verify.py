"""`zlayout verify [PROFILE | plan flags]`: run the layout for real, measure, compare.

Preflight, then a few DeepSpeed training steps on this node's GPUs (or on CPU with --cpu),
a live log on stderr (rank lines prefixed `[rank N]`), and measured against predicted at the
end. With --json the last line of stdout is the result object (status, measured, predicted,
errors_pct, restart_drill, environment, layout, inputs, phase_s, warnings). Exit code 0
when the run is `validated` (or `cpu-ok` in CPU mode), 1 otherwise (a failed restart drill
included), 2 for a request that cannot run. --slurm writes a batch script for several nodes
instead of running here; --hostfile prints the `deepspeed --hostfile` command. The run itself
is `zlayout.verify.runner`; this module parses flags and prints.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zlayout.cli import UsageError, add_plan_arguments, layout_from_args, plan_input_from_args
from zlayout.smallfile import NotARegularFile, TooLarge, read_small_file
from zlayout.spec import GiB, Layout, PlanInput

MAX_BATCH_BYTES = 1 << 20  # a batch is a few hundred flag lines

if TYPE_CHECKING:  # the verification modules are imported only when one runs
    from zlayout.verify.options import VerifyOptions

OK_STATUSES = ("validated", "cpu-ok")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "verify", help="run a layout for a few real DeepSpeed steps and compare with the plan",
        description="Preflight the node, train the planned layout for a few steps on random "
                    "tokens (one process per GPU, or --cpu), measure peak GPU memory, host "
                    "memory and step time, and hold them against the prediction. PROFILE is a "
                    "profile.toml or its directory; without it, give the plan flags and --stage.")
    parser.add_argument("profile", nargs="?", metavar="PROFILE",
                        help="profile to verify (instead of the plan flags)")
    add_plan_arguments(parser, with_layout=True)
    run = parser.add_argument_group("verification")
    run.add_argument("--steps", type=int, default=5, help="training steps (default 5)")
    run.add_argument("--restart-drill", action="store_true",
                     help="save a checkpoint half-way, stop every rank, resume, compare losses")
    run.add_argument("--save-at", type=int, default=None,
                     help="step the restart drill saves at, 1 to steps-1 (default steps/2)")
    run.add_argument("--cpu", action="store_true",
                     help="run on CPU with gloo (login nodes, CI): checks the configuration end "
                          "to end; GPU memory is not measured")
    run.add_argument("--emulate", action="store_true",
                     help="run rank 0 of the plan's whole world (nodes x GPUs per node) on one GPU: "
                          "DeepSpeed shards as on all of them and the collectives move nothing, so "
                          "the per-GPU memory of a 64-GPU layout is measured here; step time and "
                          "host memory are not compared")
    run.add_argument("--processes", type=int, default=None,
                     help="processes (GPUs) to run, at most the GPUs here (or the cores with "
                          "--cpu); default the plan's GPUs per node, 1 with --cpu (with "
                          "--slurm/--hostfile: per node, default the plan's GPUs per node)")
    run.add_argument("--out", type=Path, default=None,
                     help="directory for the spec, logs, checkpoint and result.json "
                          "(default ~/.cache/zlayout/verify/<time>-<layout>)")
    run.add_argument("--checkpoint-dir", type=Path, default=None,
                     help="where the restart drill saves (default OUT/checkpoint)")
    run.add_argument("--nvme-path", default=None, help="NVMe offload directory (NVMe layouts)")
    run.add_argument("--python", default=sys.executable,
                     help="Python that has torch and deepspeed (default this one)")
    run.add_argument("--timeout", type=float, default=None,
                     help="end the run after this many seconds (default 3600; with --submit it "
                          "covers the whole SLURM job, pending included, and cancels it)")
    run.add_argument("--no-preflight", action="store_true", help="skip the preflight checks")
    run.add_argument("--preflight-only", action="store_true",
                     help="run the checks (and build the DeepSpeed ops) and stop; writes nothing")
    run.add_argument("--update-profile", action="store_true",
                     help="write the result into PROFILE's [verification] section")
    run.add_argument("--batch", type=Path, metavar="FILE",
                     help="verify several layouts one after another: each line of FILE holds the "
                          "plan and verification flags of one run; results go to "
                          "OUT/results.jsonl and OUT/reference.jsonl")
    run.add_argument("--deadline", type=float, default=None,
                     help="with --batch: start no new run after this many seconds")
    multi = parser.add_argument_group("beyond one node")
    multi.add_argument("--slurm", type=Path, metavar="SCRIPT",
                       help="write a SLURM batch script running this verification on the plan's "
                            "nodes (srun + torchrun) instead of running here; with --cpu it asks "
                            "for no GPUs and runs on gloo")
    multi.add_argument("--submit", action="store_true",
                       help="with --slurm: sbatch the script, follow the job (`scontrol show job`) "
                            "and its output, print the result; ctrl+c runs scancel")
    multi.add_argument("--partition", default=None, help="SLURM partition")
    multi.add_argument("--account", default=None, help="SLURM account")
    multi.add_argument("--time-limit", default="00:30:00", help="SLURM time limit (default 00:30:00)")
    multi.add_argument("--cpus-per-task", type=int, default=None, metavar="N",
                       help="with --slurm: ask for N CPUs on each node instead of the whole node "
                            "(the default, #SBATCH --exclusive: step time and the CPU optimizer "
                            "measured as the run will see them)")
    multi.add_argument("--mem", default=None, metavar="SIZE",
                       help="with --slurm: host memory per node, e.g. 256G (default: the plan's "
                            "host peak per node plus 20%%)")
    multi.add_argument("--hostfile", type=Path, default=None,
                       help="print the `deepspeed --hostfile` command for clusters without SLURM")
    parser.set_defaults(func=run_command)
    global _VERIFY_PARSER
    _VERIFY_PARSER = parser


_VERIFY_PARSER: argparse.ArgumentParser | None = None


def _inputs(args: argparse.Namespace) -> tuple[PlanInput, Layout, Any, Path | None]:
    """The plan input and layout from PROFILE or from the plan flags."""
    if args.profile:
        try:
            from zlayout.commands.show import open_profile
        except ImportError:
            raise UsageError("reading profiles needs zlayout.profile (not available in this "
                             "build): give the plan flags and --stage instead") from None
        profile, path = open_profile(args.profile)
        return _runnable(args, profile.inputs, profile.layout), profile.layout, profile, path
    layout = layout_from_args(args)
    if layout is None:
        raise UsageError("verify runs one layout: add --stage 0|1|2|3 (and --offload-optimizer/"
                         "--offload-param), or give a PROFILE")
    return _runnable(args, plan_input_from_args(args), layout), layout, None, None


def _runnable(args: argparse.Namespace, inp: PlanInput, layout: Layout) -> PlanInput:
    """The input, unless the layout cannot run on a GPU whatever its memory (verify.options.
    check_runnable): refused before anything launches, a --batch line and a --slurm script too."""
    from zlayout.verify.options import LaunchError, check_runnable

    try:
        check_runnable(inp, layout, getattr(args, "cpu", False))
    except LaunchError as exc:
        raise UsageError(str(exc)) from None
    return inp


def _user_hf_config(inp: PlanInput, profile: Any) -> dict[str, Any] | None:
    """The config.json the model was planned from, for the worker to build (a profile carries
    its copy; otherwise the file --hf-config named, read again here)."""
    if inp.training.impl != "hf" or not inp.model.hf_config:
        return None
    if profile is not None and getattr(profile, "hf_config_json", None):
        return json.loads(profile.hf_config_json)
    from zlayout.hfconfig import HfConfigError, read_config

    try:
        config, _ = read_config(inp.model.hf_config)
    except HfConfigError as exc:
        raise UsageError(f"{exc}; verify builds the model from it") from None
    return config if isinstance(config, dict) else None


def _options(args: argparse.Namespace, profile: Any, inp: PlanInput) -> "VerifyOptions":
    from zlayout.verify.options import LaunchError, VerifyOptions, check_request

    kwargs: dict[str, Any] = dict(
        steps=args.steps, restart_drill=args.restart_drill, save_at_step=args.save_at,
        cpu=args.cpu, processes=args.processes, out_dir=args.out,
        checkpoint_dir=args.checkpoint_dir, python=args.python,
        run_preflight=not args.no_preflight, emulate=args.emulate)
    if args.timeout is not None:
        kwargs["timeout_s"] = args.timeout
    if args.nvme_path:
        kwargs["nvme_path"] = args.nvme_path
    elif profile is not None:
        kwargs["nvme_path"] = profile.run.nvme_path
    if profile is not None:
        kwargs["ds_config"] = profile.ds_config()
    kwargs["hf_config"] = _user_hf_config(inp, profile)
    options = VerifyOptions(**kwargs)
    # With --slurm/--hostfile the processes run on the job's nodes, not here: this machine's
    # cores and GPUs say nothing about them (the job's own preflight checks them).
    on_this_node = not (getattr(args, "slurm", None) or getattr(args, "hostfile", None))
    gpus_visible = None
    if not options.cpu and options.processes is not None and on_this_node:
        from zlayout.verify.preflight import query_gpus

        gpus_visible = len(query_gpus()) or None  # none visible: preflight says what to do
    try:
        check_request(inp, options, gpus_visible, on_this_node=on_this_node)
    except LaunchError as exc:
        raise UsageError(str(exc)) from None
    return options


class ProgressPrinter:
    """The live log on stderr: step events as readable lines, everything else as it comes."""

    def __init__(self, steps: int, stream=sys.stderr):
        self.steps = steps
        self.stream = stream

    def __call__(self, line: str) -> None:
        from zlayout.verify.launcher import parse_event

        event = parse_event(line)
        text = line if event is None else self.describe(event)
        if text:
            print(text, file=self.stream, flush=True)

    def describe(self, e: dict[str, Any]) -> str:
        who = f"[rank {e.get('rank')}]"
        kind = e["event"]
        if kind == "step":
            peak = e.get("peak_allocated_bytes")
            peak_text = f", peak {peak / GiB:.2f} GiB" if peak else ""
            phases = ""
            if e.get("forward_s") is not None:
                phases = (f" (forward {e['forward_s']:.3f}, backward {e['backward_s']:.3f}, "
                          f"optimizer {e['optimizer_s']:.3f})")
            return (f"{who} step {e['step']}/{self.steps}: loss {e['loss']:.4f}, "
                    f"{e['step_s']:.3f} s{phases}{peak_text}")
        if kind == "init":
            after = e.get("after_init_allocated_bytes")
            return (f"{who} engine ready in {e['init_s']:.1f} s, {e['params']:,} parameters"
                    + (f", {after / GiB:.2f} GiB allocated" if after else ""))
        if kind == "oom":
            return f"{who} OUT OF MEMORY during {e.get('phase')}: {e.get('message', '')}"
        if kind == "error":
            return f"{who} ERROR during {e.get('phase')}: {e.get('message', '')}"
        if kind == "resumed":
            return f"{who} resumed at step {e['step']} in {e['resume_s']:.2f} s"
        if kind == "checkpoint":
            return f"{who} checkpoint saved at step {e['step']} in {e['save_s']:.2f} s"
        if kind == "done":
            return f"{who} done"
        if kind == "shutdown":
            return f"{who} WARNING at shutdown: {e.get('message', '')}"
        return json.dumps(e)


def _gib(x: float | None) -> str:
    return "-" if x is None else f"{x / GiB:.2f} GiB"


def _seconds(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f} s"


def format_result(result: dict[str, Any]) -> str:
    """Measured against predicted, one figure a line, and the verdict."""
    m, p, e = result.get("measured", {}), result.get("predicted", {}), result.get("errors_pct", {})
    rows = [("GPU peak allocated", "gpu_peak_allocated_bytes", _gib),
            ("GPU peak reserved", "gpu_peak_reserved_bytes", _gib),
            ("GPU device used", "gpu_device_used_bytes", _gib),
            ("host peak (node)", "host_peak_bytes", _gib),
            ("step time", "step_time_s", _seconds)]
    partial = result.get("measured_partial")
    lines = [f"verify {result['layout']['label']}: {result['status'].upper()}"]
    if result.get("cause"):
        lines.append(f"  {result['cause']}")
    if result.get("emulated_world") and result.get("mode") == "cpu":
        lines.append(f"  emulated: rank 0 of {result['emulated_world']} on one CPU process: DeepSpeed's "
                     "configuration at the full run's sharding, end to end")
    elif result.get("emulated_world"):
        lines.append(f"  emulated: rank 0 of {result['emulated_world']} GPUs on one GPU; GPU memory "
                     "as on the full run, less NCCL's buffers (left out of the prediction too); step "
                     "time and host memory not compared")
    if result.get("slurm"):
        job = result["slurm"]
        lines.append(f"  SLURM job {job['job_id']}: {job['state']}, exit code {job['exit_code'] or '-'}"
                     + (f", nodes {job['nodes']}" if job.get("nodes") else ""))
    for warning in result.get("warnings") or []:
        lines.append(f"  WARNING: {warning}")
    measured_head = "partial" if partial else "measured"
    lines.append(f"  {'figure':<20} {'predicted':>12} {measured_head:>12} {'error':>8}")
    for label, key, fmt in rows:
        err = e.get(key)
        lines.append(f"  {label:<20} {fmt(p.get(key)):>12} {fmt(m.get(key)):>12} "
                     f"{'-' if err is None else f'{err:+.1f}%':>8}")
    if partial:
        lines.append("  partial: measured until the run stopped; not an error of the plan")
    else:
        from zlayout.verify.result import step_time_spread_line

        spread = step_time_spread_line(result)
        if spread:
            lines.append(f"  {spread}")
    if m.get("forward_s") is not None:
        lines.append(f"  step phases: forward {_seconds(m['forward_s'])}, backward "
                     f"{_seconds(m['backward_s'])}, optimizer {_seconds(m['optimizer_s'])}")
    if m.get("tokens_per_s") and not partial:
        lines.append(f"  throughput: {m['tokens_per_s']:,.0f} tokens/s, "
                     f"{m.get('tflops_per_gpu') or 0:.1f} TFLOP/s per GPU (6·params·tokens)")
    drill = result.get("restart_drill")
    if drill:
        lines.append(f"  restart drill: {'resumed OK' if drill.get('resumed_ok') else 'FAILED'}; "
                     f"step {drill.get('step_before')} -> {drill.get('step_after')}, "
                     f"loss {drill.get('loss_expected')} vs {drill.get('loss_resumed')}, "
                     f"load {_seconds(drill.get('resume_s'))}")
    if result.get("result_path"):
        lines.append(f"  result: {result['result_path']}")
    return "\n".join(lines)


def run_command(args: argparse.Namespace) -> int:
    if args.batch:
        if args.preflight_only:  # the batch would run every line: GPU time the user did not ask for
            raise UsageError("--preflight-only checks one run: give one line's flags without --batch")
        return _run_batch(args)
    inp, layout, profile, profile_path = _inputs(args)
    options = _options(args, profile, inp)
    if args.submit and not args.slurm:
        raise UsageError("--submit needs --slurm SCRIPT")
    for flag, value in (("--cpus-per-task", args.cpus_per_task), ("--mem", args.mem),
                        ("--partition", args.partition), ("--account", args.account)):
        if value is not None and not args.slurm:
            raise UsageError(f"{flag} is what a SLURM job asks for: add --slurm FILE, or leave "
                             f"out {flag}")
    if options.emulate and (args.slurm or args.hostfile):
        raise UsageError("--emulate runs here, as one process on one GPU: leave out "
                         f"--{'slurm' if args.slurm else 'hostfile'}")
    if args.slurm or args.hostfile:
        if args.preflight_only:
            raise UsageError("--preflight-only checks this node; a --slurm job runs the same "
                             "preflight on every node as its first step: drop --preflight-only "
                             "(or run it on a compute node without --slurm)")
        if args.update_profile and profile is None:
            raise UsageError("--update-profile needs a PROFILE")
        if args.update_profile and not (args.slurm and args.submit):
            raise UsageError("--update-profile writes the job's result into PROFILE: add --slurm "
                             "FILE --submit, so that zlayout follows the job to its result")
        if args.update_profile:
            _check_profile_writable(profile_path)  # before the job, not after
        return _multi_node(args, inp, layout, options, profile, profile_path)
    if inp.hardware.nodes > 1 and not options.cpu and options.processes is None and not options.emulate:
        raise UsageError(f"the plan spans {inp.hardware.nodes} nodes: write a SLURM script with "
                         "--slurm verify.sbatch (add --submit to run it), verify one node "
                         f"with --processes {inp.hardware.gpus_per_node}, or measure one GPU's "
                         "memory of the whole run with --emulate")
    if args.preflight_only:
        return _preflight_only(inp, layout, options, args.json)
    if args.update_profile and profile is None:
        raise UsageError("--update-profile needs a PROFILE")
    if args.update_profile:
        _check_profile_writable(profile_path)  # before the GPU time, not after

    from zlayout.verify.options import LaunchError
    from zlayout.verify.runner import run_verification

    cancel = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: cancel.set())
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        result = run_verification(inp, layout, options, on_line=ProgressPrinter(options.steps),
                                  cancel=cancel)
    except LaunchError as exc:
        raise UsageError(str(exc)) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if args.update_profile:
        _update_profile(profile, profile_path, result)
    if args.json:
        print(json.dumps(result, default=str))
    else:
        print(format_result(result))
    return 0 if result["status"] in OK_STATUSES else 1


def _preflight_only(inp: PlanInput, layout: Layout, options: Any, as_json: bool) -> int:
    """The checks a run would make, and nothing written (not even the output directory)."""
    from dataclasses import replace

    from zlayout.verify import preflight
    from zlayout.verify.options import input_for_run, resolved_dirs, world_for

    from zlayout.verify.options import LaunchError
    from zlayout.verify.runner import claim_dirs

    processes = world_for(inp, options)
    out_dir, checkpoint_dir, _ = resolved_dirs(layout, options)
    try:  # refused as a run would refuse them, and nothing written
        claim_dirs(out_dir, checkpoint_dir, options.restart_drill, write=False)
    except LaunchError as exc:
        raise UsageError(str(exc)) from None
    options = replace(options, out_dir=out_dir, checkpoint_dir=checkpoint_dir)
    progress = None if as_json else (lambda line: print(line, file=sys.stderr, flush=True))
    checks = preflight.run_checks(input_for_run(inp, processes, options.emulate), layout, options, processes,
                                  on_line=progress)
    blocking = [c for c in checks if not c.ok and c.blocking]
    if as_json:
        print(json.dumps({"ok": not blocking, "checks": [c.as_dict() for c in checks]}))
    else:
        for check in checks:
            print(check.line())
    return 1 if blocking else 0


def _check_profile_writable(path: Path | None) -> None:
    directory = (path if path is not None else Path("profile.toml")).parent
    if not os.access(directory, os.W_OK | os.X_OK):
        raise UsageError(f"--update-profile: cannot write into {directory} (permission denied): make it "
                         "writable, or verify a copy of the profile (cp -r)")


def _update_profile(profile: Any, path: Path | None, result: dict[str, Any]) -> None:
    from zlayout.profile.build import attach_verification, never_started
    from zlayout.profile.store import ProfileError, save_profile

    record = dict(result)
    record["message"] = result.get("cause")
    record["environment"] = {**result.get("environment", {}),
                             "gpu_count": result.get("measured", {}).get("world")}
    where = f" (the run's result is in {result['result_path']})" if result.get("result_path") else ""
    try:
        updated = attach_verification(profile, record)
        written = save_profile(updated, path if path is not None else Path("profile.toml"))
    except (ProfileError, ValueError) as exc:
        raise UsageError(f"--update-profile: {' '.join(str(exc).split())}{where}") from None
    if never_started(record):
        print(f"zlayout: the run never started: {written} keeps its last verification "
              f"({profile.verification.status}); the attempt is in its change log", file=sys.stderr)
    else:
        print(f"zlayout: verification written to {written}", file=sys.stderr)


def _multi_node(args: argparse.Namespace, inp: PlanInput, layout: Layout, options: Any,
                profile: Any = None, profile_path: Path | None = None) -> int:
    from zlayout.verify import guard, slurm
    from zlayout.verify.options import LaunchError

    if options.cpu and args.hostfile:
        raise UsageError("--hostfile runs on GPU nodes: drop --cpu (CPU mode works with --slurm)")
    # Everything that reaches the script is checked before anything is written.
    try:
        if args.slurm:
            guard.check_script_path(args.slurm)
        processes = options.processes or inp.hardware.gpus_per_node
        resources = slurm.Resources(args.partition, args.account, args.time_limit,
                                    args.cpus_per_task, args.mem).checked(options.cpu, processes)
        job = slurm.prepare_job(inp, layout, options)
        command = slurm.deepspeed_hostfile_command(job, args.hostfile) if args.hostfile else None
        script = slurm.batch_script(job, resources=resources) if args.slurm else None
    except LaunchError as exc:
        raise UsageError(str(exc)) from None
    if command is not None:
        print(command)
    if script is None:
        return 0
    try:
        args.slurm.write_text(script)
        args.slurm.chmod(0o755)
    except OSError as exc:
        raise UsageError(f"cannot write --slurm {args.slurm}: {exc.strerror}; "
                         "give a path in a writable directory") from None
    unit = "CPU processes" if options.cpu else "GPUs"
    print(f"zlayout: wrote {args.slurm} ({job.nodes} node(s) x {job.processes_per_node} {unit}); "
          f"submit it with: sbatch {args.slurm}", file=sys.stderr)
    if not args.submit:
        return 0
    cancel = threading.Event()
    # ctrl+c (or a hangup) cancels the SLURM job too: submit_and_follow runs scancel.
    previous = {sig: signal.signal(sig, lambda *_: cancel.set())
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        result = slurm.submit_and_follow(job, args.slurm, on_line=ProgressPrinter(options.steps),
                                         cancel=cancel, timeout_s=options.timeout_s)
    except slurm.SubmitError as exc:
        raise UsageError(str(exc)) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if args.update_profile:
        _update_profile(profile, profile_path, result)
    print(json.dumps(result, default=str) if args.json else format_result(result))
    return 0 if result["status"] in OK_STATUSES else 1


def _run_batch(args: argparse.Namespace) -> int:
    """Several verifications in one go (zlayout.verify.runner.run_batch): one line of flags each."""
    import shlex
    import time

    from zlayout.verify.options import default_out_dir
    from zlayout.verify.runner import BatchRun, run_batch

    assert _VERIFY_PARSER is not None
    try:
        text = read_small_file(args.batch, MAX_BATCH_BYTES).decode("utf-8", errors="replace")
        lines = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    except NotARegularFile:
        raise UsageError(f"--batch {args.batch}: not a file; give a text file of verify flag lines") from None
    except TooLarge:
        raise UsageError(f"--batch {args.batch}: over {MAX_BATCH_BYTES:,} bytes, not a batch of flag lines") from None
    except OSError as exc:
        raise UsageError(f"cannot read --batch {args.batch}: {exc.strerror}") from None
    runs = []
    for flags in (shlex.split(line) for line in lines if line):
        try:
            one = _VERIFY_PARSER.parse_args(flags)
            if one.batch or one.slurm or one.profile:
                raise UsageError("a --batch line runs one layout on this node (no --batch/--slurm/PROFILE)")
            inp, layout, _, _ = _inputs(one)
            one.no_preflight = one.no_preflight or args.no_preflight
            one.python = args.python if one.python == sys.executable else one.python
            runs.append(BatchRun(flags, inp, layout, _options(one, None, inp)))
        except (UsageError, SystemExit) as exc:
            runs.append(BatchRun(flags, error=str(exc)))
    from zlayout.verify.guard import claim_dir
    from zlayout.verify.options import LaunchError

    base = (args.out or default_out_dir(Layout(stage=0)).with_name(
        f"batch-{time.strftime('%Y%m%d-%H%M%S')}")).resolve()
    try:  # the runs' directories go inside; results.jsonl and reference.jsonl are appended to
        base = claim_dir("--out", base, names=("results.jsonl", "reference.jsonl"))
    except LaunchError as exc:
        raise UsageError(str(exc)) from None
    cancel = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: cancel.set())
    printer = ProgressPrinter(0)

    def on_start(run: BatchRun) -> None:
        printer.steps = run.options.steps if run.options else 0

    return run_batch(runs, base, args.deadline, printer,
                     lambda result: print(format_result(result), file=sys.stderr), cancel,
                     on_start=on_start)
