"""Loops aiocop was not told about are watched from their first step (issue 29).

The stand-in for Leviathan (tests/bound_loop.py: a loop written in C that
binds its start signals at import) is imported before aiocop is set up, in
a process of its own (tests/unknown_loops_app.py), so that no start of it
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

from tests import unknown_loops_app

pytest.importorskip("uvloop", reason="the stand-in is built on uvloop, not installable here")

RUNS = 20
ROOT = Path(__file__).resolve().parent.parent


def line_of(marker: str) -> int:
    lines, _ = inspect.getsourcelines(unknown_loops_app)
    return 1 + next(i for i, text in enumerate(lines) if f"# {marker}" in text)


@pytest.fixture(scope="module")
def app_run() -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-m", "tests.unknown_loops_app", str(RUNS)],
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
    # each one's first step, a 100 ms spin, is one event at its line, on its task.
    # The spinning loop's line, or its body's: where a sample finds the frame varies across versions (3.15).
    site = f"tests/unknown_loops_app.py:{line_of('FIRST')}:spin"
    body = f"tests/unknown_loops_app.py:{line_of('FIRST') + 1}:spin"
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
    site = f"tests/unknown_loops_app.py:{line_of('FIRST')}:spin"
    body = f"tests/unknown_loops_app.py:{line_of('FIRST') + 1}:spin"
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
        sites = [f"tests/unknown_loops_app.py:{line_of(marker) + n}:{task.replace('-', '_')}" for n in lines]
        hangs = [e for e in events_of(app_run, task) if e["reason"] == "hang"]
        assert hangs, f"{task}: no hang reported"
        assert hangs[0]["ongoing"] is True
        assert hangs[0]["call_site"] in sites, (task, hangs[0]["call_site"])
        ended = [e["reason"] for e in events_of(app_run, task) if e["reason"] != "hang"]
        assert ended == ["cpu_blocking" if task == "hang-spin" else "io_blocking"], (task, ended)
