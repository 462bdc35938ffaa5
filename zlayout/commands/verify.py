"""`zlayout verify [PROFILE | plan flags]`: run the layout for real, measure, compare.

Preflight, then a few DeepSpeed training steps on this node's GPUs (or on CPU with --cpu),
a live log on stderr (rank lines prefixed `[rank N]`), and measured against predicted at the
end. With --json the last line of stdout is the result object (status, measured, predicted,
errors_pct, restart_drill, environment, layout, inputs). Exit code 0 when the run is
`validated` (or `cpu-ok` in CPU mode), 1 otherwise. --slurm writes a batch script for
several nodes instead of running here; --hostfile prints the `deepspeed --hostfile` command.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zlayout.cli import UsageError, add_plan_arguments, layout_from_args, plan_input_from_args
from zlayout.spec import GiB, Layout, PlanInput

if TYPE_CHECKING:  # the launcher is imported only when a verification runs
    from zlayout.verify.launcher import VerifyOptions

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
                     help="step the restart drill saves at (default steps/2)")
    run.add_argument("--cpu", action="store_true",
                     help="run on CPU with gloo (login nodes, CI): checks the configuration end "
                          "to end; GPU memory is not measured")
    run.add_argument("--processes", type=int, default=None,
                     help="processes (GPUs) to run; default the plan's GPUs per node, 1 with --cpu "
                          "(with --slurm/--hostfile: per node, default the plan's GPUs per node)")
    run.add_argument("--out", type=Path, default=None,
                     help="directory for the spec, logs, checkpoint and result.json "
                          "(default ~/.cache/zlayout/verify/<time>-<layout>)")
    run.add_argument("--checkpoint-dir", type=Path, default=None,
                     help="where the restart drill saves (default OUT/checkpoint)")
    run.add_argument("--nvme-path", default=None, help="NVMe offload directory (NVMe layouts)")
    run.add_argument("--python", default=sys.executable,
                     help="Python that has torch and deepspeed (default this one)")
    run.add_argument("--timeout", type=float, default=None, help="kill the run after this many seconds")
    run.add_argument("--no-preflight", action="store_true", help="skip the preflight checks")
    run.add_argument("--preflight-only", action="store_true", help="run the checks and stop")
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
        return profile.inputs, profile.layout, profile, path
    layout = layout_from_args(args)
    if layout is None:
        raise UsageError("verify runs one layout: add --stage 0|1|2|3 (and --offload-optimizer/"
                         "--offload-param), or give a PROFILE")
    return plan_input_from_args(args), layout, None, None


def _options(args: argparse.Namespace, profile: Any) -> "VerifyOptions":
    from zlayout.verify.launcher import VerifyOptions

    if args.steps < 1:
        raise UsageError("--steps must be at least 1")
    if args.processes is not None and args.processes < 1:
        raise UsageError("--processes must be at least 1")
    kwargs: dict[str, Any] = dict(
        steps=args.steps, restart_drill=args.restart_drill, save_at_step=args.save_at,
        cpu=args.cpu, processes=args.processes, out_dir=args.out,
        checkpoint_dir=args.checkpoint_dir, python=args.python, timeout_s=args.timeout,
        run_preflight=not args.no_preflight)
    if args.nvme_path:
        kwargs["nvme_path"] = args.nvme_path
    elif profile is not None:
        kwargs["nvme_path"] = profile.run.nvme_path
    if profile is not None:
        kwargs["ds_config"] = profile.ds_config()
    options = VerifyOptions(**kwargs)
    if options.restart_drill and options.drill_step() >= options.steps:
        raise UsageError(f"the restart drill saves at step {options.drill_step()}: "
                         f"use --steps {options.drill_step() + 1} or more (or a smaller --save-at)")
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
            return (f"{who} step {e['step']}/{self.steps}: loss {e['loss']:.4f}, "
                    f"{e['step_s']:.3f} s{peak_text}")
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
    lines = [f"verify {result['layout']['label']}: {result['status'].upper()}"]
    if result.get("cause"):
        lines.append(f"  {result['cause']}")
    if result.get("slurm"):
        job = result["slurm"]
        lines.append(f"  SLURM job {job['job_id']}: {job['state']}, exit code {job['exit_code'] or '-'}"
                     + (f", nodes {job['nodes']}" if job.get("nodes") else ""))
    lines.append(f"  {'figure':<20} {'predicted':>12} {'measured':>12} {'error':>8}")
    for label, key, fmt in rows:
        err = e.get(key)
        lines.append(f"  {label:<20} {fmt(p.get(key)):>12} {fmt(m.get(key)):>12} "
                     f"{'-' if err is None else f'{err:+.1f}%':>8}")
    if m.get("tokens_per_s"):
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
        return _run_batch(args)
    inp, layout, profile, profile_path = _inputs(args)
    options = _options(args, profile)
    if args.submit and not args.slurm:
        raise UsageError("--submit needs --slurm SCRIPT")
    if args.slurm or args.hostfile:
        return _multi_node(args, inp, layout, options)
    if inp.hardware.nodes > 1 and not options.cpu and options.processes is None:
        raise UsageError(f"the plan spans {inp.hardware.nodes} nodes: write a SLURM script with "
                         "--slurm verify.sbatch (add --submit to run it), or verify one node "
                         f"with --processes {inp.hardware.gpus_per_node}")
    if args.preflight_only:
        return _preflight_only(inp, layout, options, args.json)
    if args.update_profile and profile is None:
        raise UsageError("--update-profile needs a PROFILE")

    from zlayout.verify.launcher import LaunchError, run_verification

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
    from zlayout.verify import preflight
    from zlayout.verify.launcher import input_for_run, world_for

    processes = world_for(inp, options)
    checks = preflight.run_checks(input_for_run(inp, processes), layout, options, processes)
    blocking = [c for c in checks if not c.ok and c.blocking]
    if as_json:
        print(json.dumps({"ok": not blocking, "checks": [c.as_dict() for c in checks]}))
    else:
        for check in checks:
            print(check.line())
    return 1 if blocking else 0


def _update_profile(profile: Any, path: Path | None, result: dict[str, Any]) -> None:
    from zlayout.profile.build import attach_verification
    from zlayout.profile.store import save_profile

    record = dict(result)
    record["message"] = result.get("cause")
    record["environment"] = {**result.get("environment", {}),
                             "gpu_count": result.get("measured", {}).get("world")}
    updated = attach_verification(profile, record)
    written = save_profile(updated, path if path is not None else Path("profile.toml"))
    print(f"zlayout: verification written to {written}", file=sys.stderr)


def _multi_node(args: argparse.Namespace, inp: PlanInput, layout: Layout, options: Any) -> int:
    from zlayout.verify import slurm

    if options.cpu and args.hostfile:
        raise UsageError("--hostfile runs on GPU nodes: drop --cpu (CPU mode works with --slurm)")
    job = slurm.prepare_job(inp, layout, options)
    if args.hostfile:
        print(slurm.deepspeed_hostfile_command(job, args.hostfile))
        if not args.slurm:
            return 0
    script = slurm.batch_script(job, partition=args.partition, account=args.account,
                                time_limit=args.time_limit)
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
                                         cancel=cancel)
    except slurm.SubmitError as exc:
        raise UsageError(str(exc)) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print(json.dumps(result, default=str) if args.json else format_result(result))
    return 0 if result["status"] in OK_STATUSES else 1


def _run_batch(args: argparse.Namespace) -> int:
    """Several verifications in one go (a GPU node's time is scarce): one line of flags each."""
    import shlex
    import time

    from zlayout.verify.launcher import run_verification
    from zlayout.verify.result import reference_row

    assert _VERIFY_PARSER is not None
    try:
        lines = [line.split("#", 1)[0].strip() for line in args.batch.read_text().splitlines()]
    except OSError as exc:
        raise UsageError(f"cannot read --batch {args.batch}: {exc.strerror}") from None
    runs = [shlex.split(line) for line in lines if line]
    from zlayout.verify.launcher import default_out_dir

    base = (args.out or default_out_dir(Layout(stage=0)).with_name(
        f"batch-{time.strftime('%Y%m%d-%H%M%S')}")).resolve()
    base.mkdir(parents=True, exist_ok=True)
    started = time.time()
    worst = 0
    cancel = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: cancel.set())
    for index, flags in enumerate(runs):
        if cancel.is_set():
            print(f"zlayout: batch cancelled; skipped: {' '.join(flags)}", file=sys.stderr)
            worst = 1
            continue
        if args.deadline is not None and time.time() - started > args.deadline:
            print(f"zlayout: batch deadline reached; skipped: {' '.join(flags)}", file=sys.stderr)
            worst = 1
            continue
        try:
            one = _VERIFY_PARSER.parse_args(flags)
            if one.batch or one.slurm or one.profile:
                raise UsageError("a --batch line runs one layout on this node (no --batch/--slurm/PROFILE)")
            inp, layout, _, _ = _inputs(one)
            one.no_preflight = one.no_preflight or (args.no_preflight or index > 0)
            one.python = args.python if one.python == sys.executable else one.python
            options = _options(one, None)
        except (UsageError, SystemExit) as exc:
            print(f"zlayout: batch line {index + 1} skipped: {exc}", file=sys.stderr)
            worst = 1
            continue
        from dataclasses import replace

        world = options.processes or (1 if options.cpu else inp.hardware.gpus_per_node)
        options = replace(options, out_dir=base / f"{index:02d}-{layout.key}-w{world}")
        result = run_verification(inp, layout, options, on_line=ProgressPrinter(options.steps),
                                  cancel=cancel)
        print(format_result(result), file=sys.stderr)
        slim = {k: v for k, v in result.items() if k != "output_tail" or v}
        with (base / "results.jsonl").open("a") as f:
            f.write(json.dumps(slim, default=str) + "\n")
        row = reference_row(result)
        row["predicted_peak_gib"] = (round(result["predicted"]["gpu_peak_allocated_bytes"] / GiB, 4)
                                     if result["predicted"].get("gpu_peak_allocated_bytes") else None)
        row["predicted_step_s"] = result["predicted"].get("step_time_s")
        with (base / "reference.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")
        if result["status"] not in OK_STATUSES:
            worst = 1
    return worst
