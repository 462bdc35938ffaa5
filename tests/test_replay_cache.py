"""`zlayout plan` keeps the allocator replay's answers in the user's cache folder: a second plan
with the same inputs replays nothing and prints the same; a file that is not the cache's own
is neither trusted nor replaced; other planner code starts an empty cache."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from zlayout.cli import main
from zlayout.core import allocator_sim
from zlayout.replaycache import cache_file

PLAN = ["plan", "--preset", "llama3-8b", "--gpu", "h200", "--gpus-per-node", "8", "--json"]


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for memo in IN_PROCESS_MEMOS:  # no answer from an earlier test in this process
        monkeypatch.setattr(allocator_sim, memo, {})


IN_PROCESS_MEMOS = ("_CACHE", "_CAPACITY_CACHE")  # allocator_sim's own, for the process's life


def plan_output() -> dict:
    """A new process's `zlayout plan`: nothing memoised but what the cache file holds."""
    for memo in IN_PROCESS_MEMOS:
        getattr(allocator_sim, memo).clear()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(PLAN) == 0
    return json.loads(out.getvalue())


def replays_forbidden(monkeypatch):
    def no_replay(*args, **kwargs):
        raise AssertionError("the allocator was replayed")

    monkeypatch.setattr(allocator_sim, "allocation_sequence", no_replay)


def reserved_of(kept_value) -> int:
    """The peak reserved bytes in a kept answer: a byte count, or a replay record's fields
    (out_of_memory, peak_reserved, ...)."""
    return kept_value[1] if isinstance(kept_value, list) else kept_value


def bumped(kept_value, by: int):
    if isinstance(kept_value, list):
        return [kept_value[0], kept_value[1] + by, *kept_value[2:]]
    return kept_value + by


def test_a_second_plan_takes_every_replay_from_the_cache(monkeypatch):
    first = plan_output()
    kept = json.loads(cache_file().read_text())
    replayed = [v for v in kept["entries"].values() if v is not None]  # None: a layout not replayed
    assert kept["format"] == 1 and len(replayed) >= 6 and all(reserved_of(v) > 2**30 for v in replayed)
    replays_forbidden(monkeypatch)
    assert plan_output() == first
    assert allocator_sim.lasting_memo is None  # lent for the command only


def test_the_cache_answers_what_it_holds(monkeypatch):
    # Proof that the figures come from the file: an answer edited in it reaches the plan.
    first = plan_output()
    kept = json.loads(cache_file().read_text())
    kept["entries"] = {key: value and bumped(value, 2**30) for key, value in kept["entries"].items()}
    cache_file().write_text(json.dumps(kept))
    replays_forbidden(monkeypatch)
    edited = plan_output()
    grown = [after["gpu_peak_reserved_bytes"] - before["gpu_peak_reserved_bytes"]
             for before, after in zip(first["layouts"], edited["layouts"])]
    assert 2**30 in grown  # a layout that fits reserves what the edited replay said


def test_answers_kept_by_other_planner_code_are_dropped():
    first = plan_output()
    kept = json.loads(cache_file().read_text())
    stale = {**kept, "code": "0" * 64,
             "entries": {key: value and bumped(value, 2**40) for key, value in kept["entries"].items()}}
    cache_file().write_text(json.dumps(stale))
    assert plan_output() == first
    assert json.loads(cache_file().read_text())["code"] == kept["code"]


@pytest.mark.parametrize("text", ["not json", "[]", '{"format": 1, "code": "x", "entries": {"k": 1}}',
                                  '{"format": 1, "code": "x", "entries": {"' + "a" * 64 + '": -5}}',
                                  '{"format": 1, "code": "x", "entries": {"' + "a" * 64 + '": "5"}}',
                                  '{"format": 2, "code": "x", "entries": {}}'])
def test_a_file_that_is_not_the_caches_own_is_neither_used_nor_replaced(text):
    expected = plan_output()
    cache_file().write_text(text)
    assert plan_output() == expected
    assert cache_file().read_text() == text


def test_a_symbolic_link_in_its_place_is_left_alone(tmp_path):
    target = tmp_path / "elsewhere.json"
    target.write_text("{}")
    cache_file().parent.mkdir(parents=True)
    cache_file().symlink_to(target)
    plan_output()
    assert cache_file().is_symlink() and target.read_text() == "{}"


def test_an_unwritable_cache_folder_does_not_fail_the_plan(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # its zlayout/ cannot be made
    assert plan_output()["layouts"]
    assert blocker.read_text() == ""


def test_a_kept_record_that_does_not_make_a_replay_record_is_replayed_again():
    expected = plan_output()
    kept = json.loads(cache_file().read_text())
    kept["entries"] = {key: value and [1, 2] for key, value in kept["entries"].items()}  # too few fields
    cache_file().write_text(json.dumps(kept))
    assert plan_output() == expected


def test_a_card_filling_replays_record_is_kept():
    # its fields end with the phase it ran out in: a record refused for that text was replayed
    # again by the parent after a forked child had replayed it, and made the whole file unreadable
    from dataclasses import astuple

    from zlayout.replaycache import _well_formed

    record = allocator_sim.CapacityReplay(True, 2**36, 2**37, 4, 0, 0, "step 4's backward", 4)
    assert _well_formed(list(astuple(record)))
    assert _well_formed(list(astuple(allocator_sim.CapacityReplay(False, 2**36, 0, 0, 0, 0))))
    assert not _well_formed("step 4's backward") and not _well_formed([1, "x" * 1000])
PARALLEL_CHECK = r"""
import json, sys
from functools import partial
from zlayout import cli
from zlayout.core import allocator_sim
from zlayout.core.memory import estimate_memory
from zlayout.core.plan import make_plan
from zlayout.commands.plan import plan_json
from zlayout.replaycache import open_memo, warm_in_parallel
from zlayout.spec import all_layouts

args = cli.build_parser(only="plan").parse_args(sys.argv[1:])
inp = cli.plan_input_from_args(args)
serial = plan_json(make_plan(inp, with_breakeven=False))  # no memo: every replay in this process
for memo in ("_CACHE", "_CAPACITY_CACHE"):
    getattr(allocator_sim, memo).clear()
memo = allocator_sim.lasting_memo = open_memo()
kept = warm_in_parallel(memo, [partial(estimate_memory, inp, each) for each in all_layouts()], workers=2)

def no_replay(*args, **kwargs):
    raise AssertionError("replayed in the parent")

allocator_sim.allocation_sequence = no_replay
print(json.dumps({"kept": kept, "same": plan_json(make_plan(inp, with_breakeven=False)) == serial}))
"""


def test_replays_run_in_forked_children_answer_as_the_serial_plan(tmp_path):
    """`zlayout plan` on a deep model splits its layouts' replays over child processes: the
    parent then replays nothing, and plans exactly what one process replaying each in turn does."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", PARALLEL_CHECK, "plan", "--preset", "llama3-70b", "--gpu", "h100",
                          "--gpus-per-node", "8", "--nodes", "8", "--checkpointing", "full"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    assert answer["kept"] >= 4 and answer["same"] is True


PLANNED_CHECK = r"""
import json, sys
from zlayout import cli
from zlayout.core import allocator_sim
from zlayout.core.plan import make_plan
from zlayout.commands.plan import plan_json, replay_jobs
from zlayout.replaycache import open_memo, warm_in_parallel

args = cli.build_parser(only="plan").parse_args(sys.argv[1:])
inp = cli.plan_input_from_args(args)
serial = plan_json(make_plan(inp, with_breakeven=False))
for memo in ("_CACHE", "_CAPACITY_CACHE"):
    getattr(allocator_sim, memo).clear()
memo = allocator_sim.lasting_memo = open_memo()
results = {}
jobs = replay_jobs(inp)
warm_in_parallel(memo, jobs, workers=2, results=results)
done = {lp.layout: lp for plans in results.values() for lp in plans}

def no_plan(*args, **kwargs):
    raise AssertionError("planned again in the parent")

import zlayout.core.plan as core_plan
core_plan.plan_layout = no_plan
print(json.dumps({"jobs": len(jobs), "returned": sorted(results), "planned": len(done),
                  "same": plan_json(make_plan(inp, with_breakeven=False, planned=done)) == serial}))
"""


def test_the_forked_jobs_plans_come_back_and_answer_as_the_serial_plan(tmp_path):
    """Each job plans its layouts whole; what a child planned comes back with its replays' answers,
    and the plan made of them is the one a single process makes."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", PLANNED_CHECK, "plan", "--preset", "llama3-8b", "--gpu", "h200",
                          "--gpus-per-node", "8"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    assert answer["returned"] == list(range(answer["jobs"])) and answer["planned"] == 13 and answer["same"] is True
def test_no_children_where_a_fork_is_not_safe(monkeypatch):
    """Another thread running (the app's workers; a fork copies only the caller), or no memo to
    carry the answers back: nothing is forked and the caller replays as before."""
    import threading

    from zlayout.replaycache import LastingMemo, warm_in_parallel

    def never():
        raise AssertionError("ran")

    memo = LastingMemo(cache_file(), "code", {})
    assert warm_in_parallel(None, [never, never], workers=2) == 0
    monkeypatch.setattr(threading, "active_count", lambda: 2)
    assert warm_in_parallel(memo, [never, never], workers=2) == 0
    assert memo.entries == {} and memo.added == 0
