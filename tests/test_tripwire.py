"""No blind window after a quiet spell: an idle loop wakes the watchdog as it wakes (issue 29).

The watchdog's idle looks are made a minute apart here: a stall after the
quiet spell is seen only because the loop, armed as the watchdog went to
that sleep, woke it. The request arrives from another thread once the loop
is armed and back in its selector; a 100 ms stall at a 30 ms threshold.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest

import aiocop
from aiocop._interception import loops as _loops
from aiocop._stalls import settings as _settings
from aiocop._stalls import tripwire
from tests import stalls
from tests.conftest import Collector, run_on
from tests.test_watchdog import stall_lines

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType

STALL_S = 0.1
WAIT_S = 30.0  # for the watchdog to go to its long sleep: a busy machine's worst day


@pytest.fixture
def quiet_watchdog(detector: Collector, monkeypatch: pytest.MonkeyPatch) -> Collector:
    monkeypatch.setattr(_settings.sampling, "idle_interval_ms", 60_000.0)
    aiocop.detect_slow_tasks(threshold_ms=30)
    return detector


def watch_of(loop: asyncio.AbstractEventLoop) -> _loops.LoopWatch | None:
    return next((w for w in _loops.watches.values() if w.loop is loop), None)


def idle_timer(loop: asyncio.AbstractEventLoop) -> asyncio.TimerHandle:
    # veloxloop 0.2, with no timer due, wakes every few milliseconds (never
    # quiet: the watchdog keeps its fast looks, and arms nothing): a far timer
    # lets it sleep in its selector, as the other loops do anyway.
    return loop.call_later(3600, lambda: None)


def when(condition: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_stall_after_a_quiet_spell_wakes_the_watchdog(quiet_watchdog: Collector, loop_name: str) -> None:
    armed: list[bool] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def request() -> None:
            stalls.spin(STALL_S)
            done.set_result(None)

        def arrive() -> None:
            # Once the loop is armed (its tripwire installed), and back in its selector.
            armed.append(when(lambda: getattr(watch_of(loop), "tripwire", None) is not None))
            time.sleep(0.2)
            loop.call_soon_threadsafe(request)

        threading.Thread(target=arrive).start()
        far = idle_timer(loop)
        await done
        far.cancel()
        await asyncio.sleep(0.05)

    run_on(loop_name, main())
    assert armed == [True], "the loop was never armed"
    (event,) = quiet_watchdog.settle(1)
    assert event.reason == "cpu_blocking"
    assert event.call_site.endswith(tuple(f"tests/{line}" for line in stall_lines(stalls.spin))), event.call_site


def test_a_step_that_starts_as_the_loop_is_armed_is_seen(
    quiet_watchdog: Collector, loop_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The loop runs the arming callback, then, without going back to its
    # selector, a step that waits where nothing sees it: the tripwire, which
    # trips only after the thread has slept, stays quiet until the wait is
    # over. The watchdog begins its long sleep only once a look has seen the
    # loop idle after the arming, and so looks at this step while it waits.
    install = tripwire._install
    installed: list[bool] = []

    def install_then_step(watch: _loops.LoopWatch, wake: Callable[[], None]) -> None:
        install(watch, wake)
        loop = watch.loop
        if not installed and loop is not None:
            installed.append(True)
            loop.call_soon(request)  # the next iteration, with no sleep in between

    def request() -> None:
        stalls.wait_unseen(STALL_S)
        done[0].set_result(None)

    monkeypatch.setattr(tripwire, "_install", install_then_step)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        done.append(loop.create_future())
        far = idle_timer(loop)
        await done[0]
        far.cancel()
        await asyncio.sleep(0.05)

    done: list[asyncio.Future[None]] = []
    run_on(loop_name, main())
    assert installed == [True], "the loop was never armed"
    events = quiet_watchdog.settle(1)
    assert len(events) == 1, [(e.reason, e.call_site, round(e.elapsed_ms)) for e in events]
    (event,) = events
    assert event.call_site.endswith(tuple(f"tests/{line}" for line in stall_lines(stalls.wait_unseen))), (
        event.reason,
        event.call_site,
    )


def test_a_loop_whose_thread_has_a_profile_function_keeps_it(quiet_watchdog: Collector) -> None:
    # A profiler's (or debugger's) function is never replaced: that loop is
    # not armed (checked on the loop's thread, by aiocop's callback: the same
    # on every loop; veloxloop 0.2 polls an executor's future, never quiet).
    calls: list[str] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            calls.append(frame.f_code.co_name)

    async def main() -> tuple[bool, object]:
        loop = asyncio.get_running_loop()
        far = idle_timer(loop)
        sys.setprofile(profile)
        try:
            found = await loop.run_in_executor(None, when, lambda: getattr(watch_of(loop), "unarmable", False))
            return found, sys.getprofile()
        finally:
            sys.setprofile(None)
            far.cancel()

    found, kept = run_on("asyncio", main())
    assert found, "the watchdog never asked to arm the loop"
    assert kept is profile
    assert calls
