"""No blind window after a quiet spell: an idle loop wakes the watchdog as it wakes (issue 29).

The watchdog's idle looks are made a minute apart here: a stall after the
quiet spell is seen only because the loop, armed as the watchdog went to
that sleep, woke it (its selector's select wrapped on Python 3.12+, a
profile function on its thread before), or, for a loop that cannot be armed
(written in C, on 3.12+), because the watchdog kept looking at it at a rate
bound by the threshold. The request arrives from another thread once the
watchdog has gone quiet and the loop is back in its selector; a 100 ms
stall at a 30 ms threshold.

Arming never instruments another thread's code, nor a forked child's, and a
failure inside a tripwire never reaches the application.
"""

from __future__ import annotations

import asyncio
import dis
import logging
import os
import sys
import threading
import time
import warnings
from typing import TYPE_CHECKING, Any

import pytest

import aiocop
from aiocop._interception import frames as _frames
from aiocop._interception import loops as _loops
from aiocop._interception.frames import Kind
from aiocop._stalls import settings as _settings
from aiocop._stalls import tripwire as _tripwire
from aiocop._stalls.state import state_of
from aiocop._stalls.watchdog import watchdog
from tests.conftest import Collector, run_on
from tests.stalls.test_watchdog import stall_lines
from tests.support import stalls

try:  # imported now, before any test sets aiocop up: it binds the start signals as they are
    from tests.support import bound_loop
except ImportError:  # no uvloop for this Python
    bound_loop = None  # type: ignore[assignment]

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


def armable(loop: asyncio.AbstractEventLoop) -> bool:
    # Up to 3.11 every loop (a profile function on its thread); from 3.12 the
    # loops whose iteration is Python code (asyncio's: its selector's select).
    return _tripwire.PROFILE or isinstance(loop, asyncio.BaseEventLoop)


def gone_quiet(loop: asyncio.AbstractEventLoop) -> bool:
    # The watchdog has gone to its quiet looks, with the loop armed if it can be.
    watch = watch_of(loop)
    if watch is None or not watchdog._sleeping_long:
        return False
    return state_of(watch).tripwire is not None if armable(loop) else True


async def stall_after_quiet(stall_s: float = STALL_S) -> tuple[bool, bool, bool]:
    """A stall (100 ms unless told), the first step after the watchdog went quiet: (quiet, armed then, armable)."""
    loop = asyncio.get_running_loop()
    seen: list[tuple[bool, bool]] = []
    done = loop.create_future()

    def request() -> None:
        stalls.spin(stall_s)
        done.set_result(None)

    def arrive() -> None:
        # Once the watchdog is quiet (the loop armed), and the loop back in its selector.
        quiet = when(lambda: gone_quiet(loop))
        watch = watch_of(loop)
        seen.append((quiet, watch is not None and state_of(watch).armed))
        time.sleep(0.2)
        loop.call_soon_threadsafe(request)

    threading.Thread(target=arrive).start()
    far = idle_timer(loop)
    await done
    far.cancel()
    await asyncio.sleep(0.05)
    (result,) = seen
    return (*result, armable(loop))


def test_a_stall_after_a_quiet_spell_is_reported(quiet_watchdog: Collector, loop_name: str) -> None:
    quiet, armed, expected = run_on(loop_name, stall_after_quiet())
    assert quiet, "the watchdog never went quiet"
    assert armed == expected, "armed where it cannot be, or not armed where it can"
    (event,) = quiet_watchdog.settle(1)
    assert event.reason == "cpu_blocking"
    assert event.call_site.endswith(tuple(f"tests/support/{line}" for line in stall_lines(stalls.spin))), (
        event.call_site
    )


def test_cheap_idle_looks_still_see_a_cpu_bound_stall_longer_than_their_interval(
    detector: Collector, loop_name: str
) -> None:
    # Production's default (start_cpu_sampling's precise_idle=False): an idle
    # loop that cannot be armed is looked at every idle_interval_ms (100 ms),
    # not every half threshold. A CPU-bound stall woken by I/O after a quiet
    # spell is seen by the look that lands in it (and timed from its start by
    # the loop thread's CPU clock); one of 0.4 s has three or four.
    aiocop.start_cpu_sampling(precise_idle=False)
    aiocop.detect_slow_tasks(threshold_ms=30)
    quiet, armed, expected = run_on(loop_name, stall_after_quiet(0.4))
    assert quiet, "the watchdog never went quiet"
    assert armed == expected, "armed where it cannot be, or not armed where it can"
    (event,) = detector.settle(1)
    assert event.reason == "cpu_blocking"
    assert event.call_site.endswith(tuple(f"tests/support/{line}" for line in stall_lines(stalls.spin))), (
        event.call_site
    )


def test_a_step_that_starts_as_the_loop_is_armed_is_seen(
    quiet_watchdog: Collector, loop_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The loop runs the arming callback, then, without going back to its
    # selector, a step that waits where nothing sees it: the tripwire, which
    # trips only after the thread has slept, stays quiet until the wait is
    # over. The watchdog begins its long sleep only once a look has seen the
    # loop idle after the arming, and so looks at this step while it waits.
    if not _tripwire.PROFILE and loop_name not in ("asyncio",):
        # On 3.12+ a loop written in C is never armed (no profile function:
        # it would instrument every thread); it is looked at every half
        # threshold instead, which test_a_stall_after_a_quiet_spell_is_reported covers.
        pytest.skip(f"{loop_name} is not armed on Python 3.12+ (looked at every half threshold instead)")
    install = _tripwire._install
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

    monkeypatch.setattr(_tripwire, "_install", install_then_step)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        done.append(loop.create_future())
        far = idle_timer(loop)
        await asyncio.wait_for(done[0], WAIT_S)  # never armed: fails, never hangs
        far.cancel()
        await asyncio.sleep(0.05)

    done: list[asyncio.Future[None]] = []
    run_on(loop_name, main())
    assert installed == [True], "the loop was never armed"
    events = quiet_watchdog.settle(1)
    assert len(events) == 1, [(e.reason, e.call_site, round(e.elapsed_ms)) for e in events]
    (event,) = events
    assert event.call_site.endswith(tuple(f"tests/support/{line}" for line in stall_lines(stalls.wait_unseen))), (
        event.reason,
        event.call_site,
    )


@pytest.mark.skipif(bound_loop is None, reason="the stand-in is built on uvloop, not installable here")
def test_a_stall_after_a_quiet_spell_is_reported_on_a_loop_found_on_its_stack(quiet_watchdog: Collector) -> None:
    # The stand-in for Leviathan: no start is told; found by a look, then quiet.
    loop = bound_loop.BoundLoop()
    try:
        quiet, armed, _ = loop.run_until_complete(stall_after_quiet())
    finally:
        loop.close()
    assert quiet, "the loop was never found, or the watchdog never went quiet"
    assert armed == _tripwire.PROFILE
    (event,) = quiet_watchdog.settle(1)
    assert event.reason == "cpu_blocking"


def instrumented(function: Callable[..., object]) -> list[str]:
    # On 3.12+ sys.setprofile / sys.monitoring rewrite a code object's
    # instructions into INSTRUMENTED_* ones as it next runs (none before 3.12).
    if sys.version_info < (3, 12):
        return []  # (3.10 has no adaptive=; no version before 3.12 has INSTRUMENTED_* instructions)
    return [i.opname for i in dis.get_instructions(function, adaptive=True) if i.opname.startswith("INSTRUMENTED")]


def plain(x: int) -> int:
    return x + 1


def test_arming_leaves_other_threads_and_a_forked_child_uninstrumented(quiet_watchdog: Collector) -> None:
    # Python 3.12+'s sys.setprofile instruments the whole interpreter: while a
    # loop was armed so, every other thread ran 2-4x slower, and a child
    # forked then for life. Compared with the same function before arming
    # (a coverage tool may instrument everything, before and after alike).
    plain(1)
    before = instrumented(plain)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    try:
        assert when(lambda: gone_quiet(loop)), "the loop was never armed"
        assert watch_of(loop).watchdog.armed  # type: ignore[union-attr]
        plain(1)
        assert instrumented(plain) == before
        assert sys.getprofile() is None
        read, write = os.pipe()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork() of a multi-threaded process
            pid = os.fork()
        if pid == 0:  # the child: report, and leave at once
            try:
                plain(1)
                clean = instrumented(plain) == before and sys.getprofile() is None
                os.write(write, b"clean" if clean else f"instrumented {instrumented(plain)}".encode())
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            told = pipe.read().decode()
        os.waitpid(pid, 0)
        assert told == "clean"
        assert watch_of(loop).watchdog.armed  # type: ignore[union-attr]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_failing_tripwire_never_reaches_the_application(
    quiet_watchdog: Collector, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Whatever fails inside the tripwire is caught there: the loop's step runs
    # as it would, the loop is left unarmed (looked at often instead), and the
    # failure is logged once.
    class Broken:
        def __contains__(self, item: object) -> bool:
            raise RuntimeError("broken classification")

        def __call__(self, *args: object) -> bool:
            raise RuntimeError("broken classification")

    # Where each kind of tripwire classifies what the loop runs.
    monkeypatch.setattr(_tripwire, "_LOOPS_OWN" if _tripwire.PROFILE else "_only_own", Broken())
    monkeypatch.setattr(_tripwire, "_failure_logged", False)
    records = Records()
    logging.getLogger("aiocop").addHandler(records)
    namespace: dict[str, Any] = {}
    exec("def handler(out):\n    out.append(1)\n", namespace)  # a step of the application's
    errors: list[object] = []
    ran: list[int] = []
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    try:
        assert when(lambda: gone_quiet(loop)), "the loop was never armed"
        time.sleep(0.2)
        loop.call_soon_threadsafe(namespace["handler"], ran)
        assert when(lambda: getattr(getattr(watch_of(loop), "watchdog", None), "unarmable", False)), (
            "the failure was not caught"
        )
        assert when(lambda: ran == [1])
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
        logging.getLogger("aiocop").removeHandler(records)
    assert errors == []
    assert [r.getMessage() for r in records.records if "tripwire" in r.getMessage()] == [
        "aiocop: the watchdog's tripwire failed; this loop is looked at more often instead (logged once)"
    ]


def test_a_step_whose_module_name_is_no_string_trips_the_tripwire(quiet_watchdog: Collector) -> None:
    # Code exec()'d with a namespace whose __name__ is a list, the first step
    # after a quiet spell: classifying its frame raised TypeError into the
    # application's callback (the tripwire ran inside it).
    namespace: dict[str, Any] = {"__name__": ["plugin"]}
    exec("def handler(out):\n    out.append(1)\n", namespace)  # the case itself
    errors: list[object] = []
    ran: list[int] = []
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    try:
        assert when(lambda: gone_quiet(loop)), "the loop was never armed"
        watch = watch_of(loop)
        assert watch is not None
        time.sleep(0.2)
        loop.call_soon_threadsafe(namespace["handler"], ran)
        assert when(lambda: ran == [1])
        # (Tripped: noted when; armed again a look or two later, the loop being quiet.)
        assert when(lambda: state_of(watch).tripped > 0.0), "the tripwire did not trip"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
    assert errors == []
    assert not state_of(watch).unarmable, "the tripwire failed on it"


def test_frame_kind_takes_any_module_name() -> None:
    for name in (["plugin"], None, 3):
        namespace: dict[str, Any] = {"__name__": name}
        exec("import sys\ndef frame():\n    return sys._getframe()\n", namespace)  # the case itself
        assert _frames.frame_kind(namespace["frame"]()) is Kind.USER


def test_a_tripwire_removed_behind_its_back_is_set_again(detector: Collector) -> None:
    # A profiler that replaced the tripwire and went (or anything that took
    # it away) left the loop marked armed for good, and never armed again:
    # the blind window back, silently. The next step the watchdog sees on a
    # loop still marked armed disarms it, and the next quiet spell arms it afresh.
    aiocop.detect_slow_tasks(threshold_ms=30)
    namespace: dict[str, Any] = {"__name__": "aiocop._stalls.probe"}  # passes the tripwire as aiocop's own
    exec(  # a callback the tripwire lets pass, which takes it away
        "import sys\n"
        "def remove(loop, profile):\n"
        "    if profile:\n"
        "        sys.setprofile(None)\n"
        "    else:\n"
        "        del loop._selector.select\n",
        namespace,
    )
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    try:
        assert when(lambda: gone_quiet(loop)), "the loop was never armed"
        watch = watch_of(loop)
        assert watch is not None
        first = state_of(watch).tripwire
        time.sleep(0.2)
        loop.call_soon_threadsafe(namespace["remove"], loop, _tripwire.PROFILE)
        time.sleep(0.2)
        assert not state_of(watch).tripped, "the removal tripped the tripwire: the test shows nothing"
        loop.call_soon_threadsafe(stalls.spin, 0.3)  # a step, seen by the watchdog's next look
        assert when(lambda: state_of(watch).tripwire is not first and state_of(watch).armed), "never armed again"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


def test_a_loop_whose_thread_has_a_profile_function_keeps_it(quiet_watchdog: Collector) -> None:
    # A profiler's (or debugger's) function is never replaced. Up to 3.11 the
    # tripwire is a profile function: that loop is not armed (checked on the
    # loop's thread, by aiocop's callback), and looked at often instead. From
    # 3.12 the tripwire is no profile function: the loop is armed all the same.
    calls: list[str] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            calls.append(frame.f_code.co_name)

    def asked(loop: asyncio.AbstractEventLoop) -> bool:
        watch = watch_of(loop)
        if _tripwire.PROFILE:
            return watch is not None and state_of(watch).unarmable
        return watch is not None and state_of(watch).tripwire is not None

    async def main() -> tuple[bool, object]:
        loop = asyncio.get_running_loop()
        far = idle_timer(loop)
        sys.setprofile(profile)
        try:
            found = await loop.run_in_executor(None, when, lambda: asked(loop))
            return found, sys.getprofile()
        finally:
            sys.setprofile(None)
            far.cancel()

    found, kept = run_on("asyncio", main())
    assert found, "the watchdog never asked to arm the loop"
    assert kept is profile
    assert calls


def test_a_loop_whose_thread_has_a_trace_function_is_armed(quiet_watchdog: Collector) -> None:
    # A debugger's or coverage's trace function has its own slot: the loop
    # is armed all the same, and the tracer sees every event of the step.
    lines: list[str] = []

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        if frame.f_code.co_name == "handler":
            lines.append(event)
        return tracer

    def handler() -> None:
        lines.append("ran")

    loop = asyncio.new_event_loop()

    def run() -> None:
        sys.settrace(tracer)
        try:
            loop.run_forever()
        finally:
            sys.settrace(None)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert when(lambda: gone_quiet(loop)), "the loop was never armed"
        watch = watch_of(loop)
        assert watch is not None
        assert state_of(watch).armed
        time.sleep(0.2)
        loop.call_soon_threadsafe(handler)
        assert when(lambda: "return" in lines)
        assert when(lambda: state_of(watch).tripped > 0.0)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
    assert lines[:2] == ["call", "line"]
    assert "ran" in lines
