"""How fast the app is: time to first frame, and the time one keystroke costs.

    python benchmarks/tui_startup.py [--runs 5] [--keys 20]

1. Start-up: a fresh `python` process imports zlayout's app and runs it headless at 160x48;
   the time from process start to Textual's Ready event (the first frame has been displayed),
   median of --runs. Target: under 1 s on a 2-core login node. It also prints whether torch
   or deepspeed got imported (they must not be: only the verification worker imports them).
2. Per keystroke, in one process at 160x48, typing into the sequence-length field:
   - recompute: inputs -> validated PlanInput -> make_plan (every layout, break-even sizes)
     -> crossovers; the budget is 20 ms;
   - frame after a new plan: handing a new plan to the widgets and drawing the whole 160x48
     screen once (what a terminal gets on the next refresh); recompute + frame is the lag;
   - keystroke to idle: Pilot.press plus a wait until the app is idle (this adds Pilot's own
     overhead: a key that changes nothing costs ~75 ms here, printed as the baseline).
Prints figures; asserts nothing (speed is never a test).
"""

from __future__ import annotations

import argparse
import asyncio
import json
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
    def on_ready(self) -> None:
        self.exit(json.dumps({
            "interpreter_s": started - launched,
            "import_s": imported - started,
            "first_frame_s": time.time() - launched,
            "torch_imported": "torch" in sys.modules,
            "deepspeed_imported": "deepspeed" in sys.modules,
        }))

print(Timed().run(headless=True, size=(160, 48)))
"""


def start_up(runs: int) -> None:
    results = []
    for _ in range(runs):
        launched = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", CHILD, repr(time.time())], capture_output=True,
                             text=True, check=True)
        wall_s = time.perf_counter() - launched
        record = json.loads(out.stdout.strip().splitlines()[-1])
        record["process_wall_s"] = wall_s
        results.append(record)
    first = statistics.median(r["first_frame_s"] for r in results)
    imports = statistics.median(r["import_s"] for r in results)
    wall = statistics.median(r["process_wall_s"] for r in results)
    print(f"start-up ({runs} fresh processes, 160x48, headless):")
    interpreter = statistics.median(r["interpreter_s"] for r in results)
    print(f"  python interpreter start      {interpreter * 1000:7.0f} ms (median)")
    print(f"  import zlayout.tui.app        {imports * 1000:7.0f} ms (median)")
    print(f"  first frame (Ready event)     {first * 1000:7.0f} ms (median, from process launch; target < 1000 ms)"
          f"   [min {min(r['first_frame_s'] for r in results) * 1000:.0f},"
          f" max {max(r['first_frame_s'] for r in results) * 1000:.0f}]")
    print(f"  whole process incl. interpreter and exit {wall * 1000:7.0f} ms (median)")
    torch = any(r["torch_imported"] for r in results)
    deepspeed = any(r["deepspeed_imported"] for r in results)
    print(f"  torch imported: {torch}   deepspeed imported: {deepspeed}   (both must be False)")


async def keystrokes(count: int) -> None:
    from zlayout.core.breakeven import crossovers
    from zlayout.core.plan import make_plan
    from zlayout.tui.app import ZLayoutApp

    app = ZLayoutApp(cursor_blink=False)
    recompute_s: list[float] = []
    keystroke_s: list[float] = []
    async with app.run_test(size=(160, 48)) as pilot:
        field = app.query_one("#seq")
        field.focus()
        await pilot.press("end")
        await pilot.pause()
        digits = "0123456789"
        for i in range(count):
            # alternate typing a digit and deleting it: every key makes a new (uncached) input
            key = digits[i % 10] if i % 2 == 0 else "backspace"
            if i % 2 == 0:
                app.query_one("#seq").value = str(1024 + 7 * i)  # a fresh seq each round
                await pilot.pause()
            before = time.perf_counter()
            await pilot.press(key)
            await pilot.pause()
            keystroke_s.append(time.perf_counter() - before)
            recompute_s.append(app.recompute_s)
        baseline_s = []
        for _ in range(count // 2):
            before = time.perf_counter()
            await pilot.press("right")  # at the end of the field: changes nothing
            await pilot.pause()
            baseline_s.append(time.perf_counter() - before)
        inp = app.plan.input
        frame_s = []
        compositor = app.screen._compositor  # private: the benchmark times exactly one frame
        for seq in range(5000, 5000 + count):
            plan = make_plan(inp.model_copy(update={"training": inp.training.model_copy(update={"seq": seq})}))
            before = time.perf_counter()
            app.plan = plan
            compositor.render_update(full=True)
            frame_s.append(time.perf_counter() - before)
    plain = []
    for seq in range(3000, 3000 + count):
        varied = inp.model_copy(update={"training": inp.training.model_copy(update={"seq": seq})})
        before = time.perf_counter()
        make_plan(varied)
        crossovers(varied)
        plain.append(time.perf_counter() - before)

    def line(name: str, values: list[float], note: str = "") -> None:
        print(f"  {name:<32}median {statistics.median(values) * 1000:6.1f} ms   "
              f"p90 {sorted(values)[int(0.9 * (len(values) - 1))] * 1000:6.1f} ms   "
              f"max {max(values) * 1000:6.1f} ms{note}")

    print(f"per keystroke ({count} keys into the sequence field, 160x48):")
    line("make_plan + crossovers alone", plain, "   (budget 20 ms)")
    line("recompute in the app", recompute_s, "   (inputs -> plan, no drawing)")
    line("frame after a new plan", frame_s, "   (widgets + drawing 160x48)")
    print(f"  => lag per keystroke ~ recompute + frame = "
          f"{(statistics.median(recompute_s) + statistics.median(frame_s)) * 1000:.0f} ms (median)")
    line("keystroke to idle (Pilot)", keystroke_s, "   (incl. Pilot's overhead)")
    line("baseline: a key that changes nothing", baseline_s, "   (Pilot's overhead)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="fresh processes for the start-up figure")
    parser.add_argument("--keys", type=int, default=20, help="keystrokes to time")
    args = parser.parse_args()
    start_up(args.runs)
    asyncio.run(keystrokes(args.keys))


if __name__ == "__main__":
    main()
