"""How fast the app is: time to first frame, and the time one keystroke costs.

    python benchmarks/tui_startup.py [--runs 5] [--keys 20]

1. Start-up: a fresh `python` process imports zlayout's app and runs it headless at --size;
   the time from process start to Textual's Ready event (the first frame has been displayed:
   the form's Model tab with its values, the status line saying "planning…"), and to the
   first plan on screen (the planner imported and run in a worker after the first frame;
   the Hardware and Training tabs are mounted after that), median of --runs. Target: under
   1 s on a 2-core login node. It also prints whether torch or deepspeed got imported (they
   must not be: only the verification worker imports them).
2. Per keystroke, in one process at --size (inputs shown), typing into the sequence-length field:
   - keystroke to frame: the key posted as the driver posts it, handled (the field shows it,
     the inputs validated) and the
     whole screen drawn once; planning is not on this path. Target: p95 under 50 ms;
   - keystroke to its plan's figures: plus the debounce (20 ms), the plan without break-even
     in a thread worker (every layout's memory and time, the recommendation) and its frame;
   - keystroke to its whole plan: break-even's sizes and crossovers too.
Figures on a shared machine vary with its load: medians, with the load average printed.
Prints figures; asserts nothing (speed is never a test).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time

CHILD = r"""
import sys, time, json
launched = float(sys.argv[1])  # time.time() in the parent, just before it started this process
started = time.time()
from zlayout.tui.app import ZLayoutApp
imported = time.time()

class Timed(ZLayoutApp):
    first_frame_s = None

    def on_ready(self) -> None:
        self.first_frame_s = time.time() - launched

    def watch_plan(self, plan) -> None:
        super().watch_plan(plan)
        if plan is not None:
            self.call_after_refresh(self._done)

    def _done(self) -> None:
        self.exit(json.dumps({
            "interpreter_s": started - launched,
            "import_s": imported - started,
            "first_frame_s": self.first_frame_s or time.time() - launched,
            "first_plan_s": time.time() - launched,
            "torch_imported": "torch" in sys.modules,
            "deepspeed_imported": "deepspeed" in sys.modules,
        }))

print(Timed().run(headless=True, size=(int(sys.argv[2]), int(sys.argv[3]))))
"""


def start_up(runs: int, size: tuple[int, int]) -> None:
    results = []
    for _ in range(runs):
        launched = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", CHILD, repr(time.time()), str(size[0]), str(size[1])],
                             capture_output=True,
                             text=True, check=True)
        wall_s = time.perf_counter() - launched
        record = json.loads(out.stdout.strip().splitlines()[-1])
        record["process_wall_s"] = wall_s
        results.append(record)
    first = statistics.median(r["first_frame_s"] for r in results)
    imports = statistics.median(r["import_s"] for r in results)
    wall = statistics.median(r["process_wall_s"] for r in results)
    print(f"start-up ({runs} fresh processes, {size[0]}x{size[1]}, headless):")
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        # zlayout's own modules are then compiled again by every process (an editable install
        # has no .pyc otherwise): ~0.15-0.2 s more than a user's machine, where Python caches them
        print("  PYTHONDONTWRITEBYTECODE is set: no bytecode cache for zlayout's modules "
              "(unset it for a user's figure)")
    interpreter = statistics.median(r["interpreter_s"] for r in results)
    print(f"  python interpreter start      {interpreter * 1000:7.0f} ms (median)")
    print(f"  import zlayout.tui.app        {imports * 1000:7.0f} ms (median)")
    print(f"  first frame (Ready event)     {first * 1000:7.0f} ms (median, from process launch; target < 1000 ms)"
          f"   [min {min(r['first_frame_s'] for r in results) * 1000:.0f},"
          f" max {max(r['first_frame_s'] for r in results) * 1000:.0f}]")
    plan = statistics.median(r["first_plan_s"] for r in results)
    print(f"  first plan on screen          {plan * 1000:7.0f} ms (median, from process launch; planned in a worker)")
    print(f"  whole process incl. interpreter and exit {wall * 1000:7.0f} ms (median)")
    torch = any(r["torch_imported"] for r in results)
    deepspeed = any(r["deepspeed_imported"] for r in results)
    print(f"  torch imported: {torch}   deepspeed imported: {deepspeed}   (both must be False)")


async def keystrokes(count: int, size: tuple[int, int]) -> None:
    from textual import events

    from zlayout.core.breakeven import crossovers
    from zlayout.core.plan import make_plan
    from zlayout.tui.app import ZLayoutApp

    app = ZLayoutApp(cursor_blink=False)
    echo_s: list[float] = []
    plan_s: list[float] = []
    figures_s: list[float] = []
    recompute_s: list[float] = []
    async with app.run_test(size=size) as pilot:
        while app.plan is None or app.plan_pending:
            await pilot.pause(0.01)
        if not app.show_inputs:
            app.action_toggle_inputs()  # the field typed into is on screen, as a user has it
            await pilot.pause()
        compositor = app.screen._compositor  # private: the benchmark times exactly one frame
        field = app.query_one("#seq")
        field.focus()
        await pilot.press("end")
        await pilot.pause()
        for i in range(count):
            # alternate typing a digit and deleting it: every key makes a new input to plan
            key = "0123456789"[i % 10] if i % 2 == 0 else "backspace"
            if i % 2 == 0:
                field.value = str(1024 + 7 * i)
                while app.plan_pending:
                    await pilot.pause(0.01)
            shown = field.value
            plan_before = app.plan
            before = time.perf_counter()
            # the key as the driver delivers it (Pilot.press adds its own idle waits, ~75 ms)
            app.post_message(events.Key(key, "\x7f" if key == "backspace" else key))
            while field.value == shown:
                await asyncio.sleep(0)
            compositor.render_update(full=True)  # the frame that shows it
            echo_s.append(time.perf_counter() - before)
            # polled with plain sleeps: Pilot.pause waits for every widget to drain a message it
            # posts to each (hundreds here), work that competes with the planning thread for
            # the interpreter and that no terminal's app does
            while app.plan is plan_before:  # the new plan's figures (break-even may follow)
                await asyncio.sleep(0.005)
            compositor.render_update(full=True)
            figures_s.append(time.perf_counter() - before)
            while app.plan_pending:
                await asyncio.sleep(0.005)
            compositor.render_update(full=True)
            plan_s.append(time.perf_counter() - before)
            recompute_s.append(app.recompute_s)
        inp = app.plan.input
    plain = []
    for seq in range(3000, 3000 + count):
        varied = inp.model_copy(update={"training": inp.training.model_copy(update={"seq": seq})})
        before = time.perf_counter()
        make_plan(varied)
        crossovers(varied)
        plain.append(time.perf_counter() - before)

    def pct(values: list[float], q: float) -> float:
        return sorted(values)[min(len(values) - 1, int(round(q * (len(values) - 1))))] * 1000

    def line(name: str, values: list[float], note: str = "") -> None:
        print(f"  {name:<34}median {statistics.median(values) * 1000:6.1f} ms   "
              f"p95 {pct(values, 0.95):6.1f} ms   max {max(values) * 1000:6.1f} ms{note}")

    print(f"per keystroke ({count} keys into the sequence field, {size[0]}x{size[1]}):")
    line("keystroke to frame", echo_s, "   (key handled + the frame showing it; target p95 < 50 ms)")
    line("keystroke to its plan's figures", figures_s,
         "   (debounce + the plan without break-even + frame; target p95 < 150 ms)")
    line("keystroke to its whole plan", plan_s,
         "   (break-even's searches too: the panel says 'computing' meanwhile)")
    line("planning in the worker", recompute_s, "   (make_plan + crossovers, off the input path)")
    line("make_plan + crossovers alone", plain)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="fresh processes for the start-up figure")
    parser.add_argument("--keys", type=int, default=20, help="keystrokes to time (0: start-up only)")
    parser.add_argument("--size", default="80x24", help="terminal size, COLUMNSxROWS (80x24: a login node's default)")
    args = parser.parse_args()
    size = tuple(int(n) for n in args.size.lower().split("x"))
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    start_up(args.runs, size)
    if args.keys > 0:  # no keystrokes, no figures (statistics has no median of nothing)
        asyncio.run(keystrokes(args.keys, size))


if __name__ == "__main__":
    main()
