"""aiocop's durations come from real clocks, whatever a test freezes or mocks (issue 30).

freezegun, time-machine and `unittest.mock.patch("time.perf_counter")` change
what the application's clocks say; a step's or a stall's duration must still
be what it really was: never negative, never the distance to a frozen 2030.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from typing import TYPE_CHECKING
from unittest import mock

import freezegun
import pytest
import time_machine

import aiocop
from aiocop._common import clock as _clock
from tests.conftest import Collector, run_on

if TYPE_CHECKING:
    from collections.abc import Callable

# Spins measure with a clock captured here, as a default argument: freezegun
# rewrites every module attribute that is a real clock, and a spin timed by a
# frozen clock would never end.
STEP_S = 0.1  # well past the 30 ms threshold: the step's or stall's duration is at least this
ABSURD_MS = 60_000.0  # no step of these tests takes a minute; a frozen 2030 gives about 1.9e12 ms


def spin(seconds: float, clock: Callable[[], float] = time.perf_counter) -> None:
    end = clock() + seconds
    while clock() < end:
        pass


async def blocking_step() -> None:
    os.stat(__file__)
    spin(STEP_S)


def io_event(detector: Collector) -> aiocop.SlowTaskEvent:
    events = [e for e in detector.settle(1) if e.reason == "io_blocking"]
    assert len(events) == 1, detector.events
    assert events[0].blocking_events[-1]["name"] == "os.stat"
    return events[0]


def assert_real(elapsed_ms: float) -> None:
    assert STEP_S * 1000.0 <= elapsed_ms < ABSURD_MS, elapsed_ms


def test_aiocop_holds_no_clock_a_time_freezer_would_rewrite() -> None:
    # freezegun replaces, in every loaded module, each attribute that *is* a
    # real clock; aiocop's modules must hold none (they import aiocop._common.clock's).
    real = {id(getattr(time, name)) for name in ("time", "monotonic", "perf_counter", "thread_time")}
    held = [
        f"{name}.{attr}"
        for name, module in list(sys.modules.items())
        if name == "aiocop" or name.startswith("aiocop.")
        for attr, value in list(vars(module).items())
        if id(value) in real
    ]
    assert held == []
    assert _clock.perf_counter is not time.perf_counter
    assert _clock.monotonic is not time.monotonic
    assert abs(_clock.perf_counter() - time.perf_counter()) < 1.0  # the same clock, not a copy of its value


def test_a_step_timed_under_freeze_time_reports_its_real_duration(detector: Collector, loop_name: str) -> None:
    async def main() -> None:
        with freezegun.freeze_time("2030-01-01"):
            await blocking_step()

    run_on(loop_name, main())
    assert_real(io_event(detector).elapsed_ms)


def test_a_freeze_that_begins_in_one_step_and_ends_in_another(detector: Collector) -> None:
    # The step's first call is timed frozen, its end after the freeze: with
    # the application's clock this was 1.9e12 ms (or negative the other way).
    async def main() -> None:
        freezer = freezegun.freeze_time("2030-01-01")
        freezer.start()
        try:
            await blocking_step()
        finally:
            freezer.stop()
        await asyncio.sleep(0.05)

    asyncio.run(main())
    event = io_event(detector)
    assert_real(event.elapsed_ms)
    assert event.impact in ("medium", "high")  # its real length against the 30 ms threshold, no more


def test_a_ticking_freeze_around_the_whole_loop(detector: Collector) -> None:
    with freezegun.freeze_time("2030-01-01", tick=True):
        asyncio.run(blocking_step())
    assert_real(io_event(detector).elapsed_ms)


@pytest.mark.parametrize("name", ["perf_counter", "monotonic"])
def test_the_time_module_patched_by_mock(detector: Collector, name: str) -> None:
    values = iter(range(10**9, 0, -1000))  # absurd and running backwards
    with mock.patch(f"time.{name}", side_effect=lambda: float(next(values))):
        asyncio.run(blocking_step())
    assert_real(io_event(detector).elapsed_ms)


def test_time_machine_travel(detector: Collector) -> None:
    with time_machine.travel("2030-01-01", tick=False):
        asyncio.run(blocking_step())
    event = io_event(detector)
    assert_real(event.elapsed_ms)


def test_a_stall_under_freeze_time_is_timed_by_the_watchdog_for_real(detector: Collector, loop_name: str) -> None:
    aiocop.detect_slow_tasks(threshold_ms=30)

    async def main() -> None:
        with freezegun.freeze_time("2030-01-01"):
            spin(STEP_S)  # no blocking call: only the watchdog sees it
        await asyncio.sleep(0)

    run_on(loop_name, main())
    cpu = [e for e in detector.settle(1) if e.reason == "cpu_blocking"]
    assert len(cpu) == 1, detector.events
    # The watchdog may see the step begin a little late (it looks at an idle
    # loop only now and then): bounded below by the threshold, above by the absurd.
    assert 30.0 <= cpu[0].elapsed_ms < ABSURD_MS, cpu[0].elapsed_ms


def test_elapsed_is_never_negative() -> None:
    assert _clock.elapsed(2.0, 1.0) == 0.0
    assert _clock.elapsed(1.0, 2.5) == 1.5


def test_thread_cpu_clock_reads_a_threads_cpu_time_or_says_none() -> None:
    # One function for the loops' and the discovered threads' CPU clocks (issue 40).
    clock = _clock.thread_cpu_clock(threading.get_ident())
    if not hasattr(time, "pthread_getcpuclockid"):
        assert clock is None
        return
    assert clock is not None
    assert time.clock_gettime(clock) >= 0.0
    with mock.patch.object(time, "pthread_getcpuclockid", side_effect=OSError):
        assert _clock.thread_cpu_clock(threading.get_ident()) is None
