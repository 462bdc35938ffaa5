"""The app's looks at 80x24 and 160x48 (pytest-textual-snapshot). The numbers come from the
stub planner in tui_fakes, so these change only when the app's looks do. After a deliberate
change of looks: pytest tests/tui --snapshot-update, and review the SVGs in the diff."""

from __future__ import annotations

import pytest
from textual.widgets import Input

from tui_fakes import settle, snapshot_app

SIZES = [pytest.param((80, 24), id="80x24"), pytest.param((160, 48), id="160x48")]


@pytest.mark.parametrize("size", SIZES)
def test_main_screen(snap_compare, size):
    assert snap_compare(snapshot_app(), terminal_size=size, run_before=settle)


@pytest.mark.parametrize("size", SIZES)
def test_inputs_with_an_invalid_field(snap_compare, size):
    async def run_before(pilot):
        await settle(pilot)
        if not pilot.app.show_inputs:
            await pilot.press("ctrl+b")
        field = pilot.app.query_one("#hidden", Input)
        field.focus()
        field.value = "4096x"
        await settle(pilot)

    assert snap_compare(snapshot_app(), terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES)
def test_layout_detail(snap_compare, size):
    async def run_before(pilot):
        await settle(pilot)
        await pilot.press("down", "enter")

    assert snap_compare(snapshot_app(), terminal_size=size, run_before=run_before)


def test_what_if_compare(snap_compare):
    async def run_before(pilot):
        await settle(pilot)
        await pilot.press("ctrl+t")
        pilot.app.query_one("#seq", Input).value = "8192"
        await settle(pilot)
        pilot.app.clear_notifications()
        await pilot.pause()

    assert snap_compare(snapshot_app(), terminal_size=(160, 48), run_before=run_before)


def pressing(*keys):
    async def run_before(pilot):
        await settle(pilot)
        await pilot.press(*keys)
        await pilot.pause()
    return run_before


def test_help(snap_compare):
    assert snap_compare(snapshot_app(), terminal_size=(80, 24), run_before=pressing("f1"))


def test_export_dialog(snap_compare):
    assert snap_compare(snapshot_app(), terminal_size=(80, 24), run_before=pressing("ctrl+s"))


def test_verify_options_of_a_multi_node_plan(snap_compare, monkeypatch):
    # the dialog offers at most the usable cores: the snapshot is of an 8-core machine
    monkeypatch.setattr("zlayout.verify.options.usable_cores", lambda: 8)

    async def run_before(pilot):
        await settle(pilot)
        pilot.app.query_one("#nodes", Input).value = "2"
        await settle(pilot)
        await pilot.press("ctrl+r")
        await pilot.pause()
    assert snap_compare(snapshot_app(), terminal_size=(100, 30), run_before=run_before)
