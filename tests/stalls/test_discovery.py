"""Loops aiocop was not told about are watched from their first step (issue 29).

The stand-in for Leviathan (tests/support/bound_loop.py: a loop written in C that
binds its start signals at import) is imported before aiocop is set up, in
a process of its own (tests/support/unknown_loops_app.py), so that no start of it
is ever seen: each of its loops is found on its thread's stack by the
watchdog, at the look that first sees a step running. Stalls of 100 ms at a
30 ms threshold, hangs held until reported: nothing depends on the
machine's speed.
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import per_attempt
from tests.support import unknown_loops_app

pytest.importorskip("uvloop", reason="the stand-in is built on uvloop, not installable here")

RUNS = 20
ROOT = Path(__file__).resolve().parents[2]


def line_of(marker: str) -> int:
    lines, _ = inspect.getsourcelines(unknown_loops_app)
    return 1 + next(i for i, text in enumerate(lines) if f"# {marker}" in text)


@pytest.fixture(scope="module")
def app_runs() -> dict[int, dict[str, object]]:
    return {}


@pytest.fixture
def app_run(request: pytest.FixtureRequest, app_runs: dict[int, dict[str, object]]) -> dict[str, object]:
    return per_attempt(request, app_runs, _run_app)  # a re-run of a failed test runs the app anew


def _run_app() -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-m", "tests.support.unknown_loops_app", str(RUNS)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, object] = json.loads(out.stdout.splitlines()[-1])
    return result


def events_of(run: dict[str, object], task: str) -> list[dict[str, object]]:
    events = run["events"]
    assert isinstance(events, list)
    return [e for e in events if e["task"] == task]


def test_a_stall_as_an_unknown_loops_very_first_work_is_reported_every_time(app_run: dict[str, object]) -> None:
    # Twenty loops, after idle gaps either side of the watchdog's slow-down:
    # each one's first step, a 200 ms spin, is one event at its line, on its task.
    # The spinning loop's line, or its body's: where a sample finds the frame varies across versions (3.15).
    site = f"tests/support/unknown_loops_app.py:{line_of('FIRST')}:spin"
    body = f"tests/support/unknown_loops_app.py:{line_of('FIRST') + 1}:spin"
    reported = {}
    for i in range(RUNS):
        events = events_of(app_run, f"first-{i}")
        reported[i] = [(e["reason"], site if e["call_site"] == body else e["call_site"]) for e in events]
    assert reported == {i: [("cpu_blocking", site)] for i in range(RUNS)}


def test_a_stall_as_the_first_work_of_an_unknown_loop_right_after_a_known_one_stopped(
    app_run: dict[str, object],
) -> None:
    # The thread of a loop that stopped joins the threads walked for unknown
    # loops at the next look, not at the once-a-second scan: the cheap look
    # (no thread's CPU clock moved) did not count it, and the next loop's
    # first step went unseen until that scan.
    site = f"tests/support/unknown_loops_app.py:{line_of('FIRST')}:spin"
    body = f"tests/support/unknown_loops_app.py:{line_of('FIRST') + 1}:spin"
    reported = {}
    for i in range(unknown_loops_app.AFTER_RUNS):
        events = events_of(app_run, f"after-{i}")
        reported[i] = [(e["reason"], site if e["call_site"] == body else e["call_site"]) for e in events]
    assert reported == {i: [("cpu_blocking", site)] for i in range(unknown_loops_app.AFTER_RUNS)}


def test_a_hang_of_an_unknown_loop_is_reported_while_it_hangs(app_run: dict[str, object]) -> None:
    # One idles 0.2 s (unseen), then spins until its hang report has arrived;
    # the other's first work waits for a lock held until its report.
    assert app_run["released"] == {"hang-spin": True, "hang-lock": True}
    for task, marker in (("hang-spin", "HANG-SPIN"), ("hang-lock", "HANG-LOCK")):
        # A spin's line, or its body's (3.15 samples the body); a wait's own line.
        lines = (0, 1) if task == "hang-spin" else (0,)
        sites = [f"tests/support/unknown_loops_app.py:{line_of(marker) + n}:{task.replace('-', '_')}" for n in lines]
        hangs = [e for e in events_of(app_run, task) if e["reason"] == "hang"]
        assert hangs, f"{task}: no hang reported"
        assert hangs[0]["ongoing"] is True
        assert hangs[0]["call_site"] in sites, (task, hangs[0]["call_site"])
        ended = [e["reason"] for e in events_of(app_run, task) if e["reason"] != "hang"]
        assert ended == ["cpu_blocking" if task == "hang-spin" else "io_blocking"], (task, ended)


# What discovery must never do (review of issue 29, findings 3-6): each case
# parks threads where it needs them and takes the watchdog's looks itself
# (tests/support/discovery_cases.py, a process of its own with aiocop not set up).


@pytest.fixture(scope="module")
def case_runs() -> dict[int, dict[str, dict[str, object]]]:
    return {}


@pytest.fixture
def cases(
    request: pytest.FixtureRequest, case_runs: dict[int, dict[str, dict[str, object]]]
) -> dict[str, dict[str, object]]:
    return per_attempt(request, case_runs, _run_cases)


def _run_cases() -> dict[str, dict[str, object]]:
    out = subprocess.run(
        [sys.executable, "-m", "tests.support.discovery_cases"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, dict[str, object]] = json.loads(out.stdout.splitlines()[-1])
    return result


def test_a_loop_is_registered_only_on_a_thread_proven_to_run_it(cases: dict[str, dict[str, object]]) -> None:
    # Sync code iterating a generator, with another thread's uvloop loop (no
    # `_thread_id` to tell its thread) in its locals or its module's globals:
    # never that thread's loop; the loop registers itself from its own thread.
    assert cases["wrong_thread"] == {"registered_on_wrong_threads": [], "registered_on_its_own_thread": True}
    # A loop stepping (a hang in its task's first step) is still registered at
    # the look that sees it, on its own thread, with the edge of its steps
    # (uvloop, written in C); so is one of the application's own class, a
    # subclass of asyncio's (written in Python: no edge), proven by its task.
    assert cases["stepping"] == {"found": [["own-class", False], ["stepping", True]]}


def test_discovery_runs_no_application_code(cases: dict[str, dict[str, object]]) -> None:
    # A lazy proxy (its `__class__` evaluates the factory) and a loop facade
    # (an AbstractEventLoop subclass whose methods raise) in the frames looked at.
    assert cases["application_objects"] == {"lazy_evaluated_on": [], "proxy_asked_on": [], "look_failed": None}


def test_one_thread_that_cannot_be_examined_fails_neither_the_look_nor_floods_the_log(
    cases: dict[str, dict[str, object]],
) -> None:
    # Its examination raises at each of three looks: the loop stepping on
    # another thread is found all the same, and the failure is logged once.
    assert cases["one_bad_thread"] == {"look_failed": None, "found": [True], "logged": 1}


def test_discovery_keeps_no_object_of_the_application_alive(cases: dict[str, dict[str, object]]) -> None:
    # A connection `del`eted right after the watchdog looked at the frame
    # holding it (idle in a C call, or below a step) is freed there and then.
    # (On 3.10-3.12 reading a frame's f_locals kept a copy on the frame.)
    assert cases["keep_alive"] == {"freed_at_del": {"idle": True, "stepping": True}}


def test_a_look_reads_no_clock_of_parked_threads(cases: dict[str, dict[str, object]]) -> None:
    # 50 threads parked for a whole scan interval: a look (and the cheap
    # check before it) reads none of their clocks; the once-a-second scan all.
    assert cases["parked_threads"] == {"clock_reads_per_look": 0, "clock_reads_per_scan": 50}
