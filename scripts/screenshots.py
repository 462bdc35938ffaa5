"""Write SVG screenshots of the app into screenshots/ (the README shows one).

    python scripts/screenshots.py [--out screenshots]

Runs the real app (real planner and presets: Llama 3 8B on one node of 8 H200s, the app's
default) headless at 80x24, 100x30 and 160x48, and saves each scene with `App.save_screenshot`.
Re-run it after changing the app's looks or the memory model, and commit the SVGs:
tests/tui/test_screenshots_current.py fails while they differ from what the app draws.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Awaitable, Callable

from textual.pilot import Pilot
from textual.widgets import Input

from zlayout.tui.app import ZLayoutApp

Scene = Callable[[Pilot], Awaitable[None]]


async def settle(pilot: Pilot) -> None:
    """Until the plan of the fields is on screen (the app plans in a worker)."""
    while pilot.app.plan is None or pilot.app.plan_pending:
        await pilot.pause(0.02)
    await pilot.pause()


async def main_view(pilot: Pilot) -> None:
    await pilot.pause()


async def with_inputs(pilot: Pilot) -> None:
    if not pilot.app.show_inputs:
        await pilot.press("ctrl+b")
    await pilot.pause()


async def invalid_input(pilot: Pilot) -> None:
    await with_inputs(pilot)
    field = pilot.app.query_one("#heads", Input)
    field.focus()
    field.value = "33"
    await settle(pilot)


async def detail(pilot: Pilot) -> None:
    await pilot.press("enter")
    await pilot.pause()


async def what_if(pilot: Pilot) -> None:
    await pilot.press("ctrl+t")
    pilot.app.query_one("#seq", Input).value = "8192"
    await settle(pilot)
    pilot.app.clear_notifications()
    await pilot.pause()


async def lower_panels(pilot: Pilot) -> None:
    """Below 120 columns, tab to the chart, break-even and what-if: they take the table's place."""
    pilot.app.query_one("#views").focus()
    await pilot.pause()
    pilot.app.query_one("#views").scroll_to_widget(pilot.app.query_one("#breakeven"), animate=False, top=True)
    await pilot.pause()


async def help_keys(pilot: Pilot) -> None:
    await pilot.press("f1")
    await pilot.pause()


SCENES: dict[str, tuple[Scene, tuple[tuple[int, int], ...]]] = {
    "zlayout": (main_view, ((80, 24), (100, 30), (160, 48))),
    "zlayout-breakeven": (lower_panels, ((80, 24),)),
    "zlayout-inputs": (with_inputs, ((80, 24),)),
    "zlayout-invalid-input": (invalid_input, ((160, 48),)),
    "zlayout-detail": (detail, ((80, 24), (160, 48))),
    "zlayout-what-if": (what_if, ((160, 48),)),
    "zlayout-help": (help_keys, ((80, 24),)),
}


async def shoot(out: Path) -> list[Path]:
    written = []
    for name, (scene, sizes) in SCENES.items():
        for width, height in sizes:
            app = ZLayoutApp(cursor_blink=False)
            async with app.run_test(size=(width, height)) as pilot:
                await settle(pilot)
                await scene(pilot)
                await pilot.wait_for_scheduled_animations()
                filename = f"{name}-{width}x{height}.svg"
                app.save_screenshot(filename, path=str(out))
                written.append(out / filename)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "screenshots")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for path in asyncio.run(shoot(args.out)):
        print(path)


if __name__ == "__main__":
    main()
