"""Stalls around other events: right after an io step, and reported as their loop stops."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time

import pytest

import aiocop._reporting.delivery
from aiocop._interception import hook as _hook
from aiocop._interception import loops as _loops
from aiocop._reporting import delivery as _delivery
from aiocop._stalls import attribution as _attribution
from tests.conftest import Collector, loop_factory, quiet_rloop, run_on
from tests.stalls.test_watchdog import stall_lines, watchdog  # noqa: F401 - fixture
from tests.support import stalls


@pytest.mark.parametrize("blocking", ["sleep", "read"])
def test_stall_in_the_step_after_an_io_step(
    watchdog: Collector,  # noqa: F811 - the fixture
    loop_name: str,
    blocking: str,
) -> None:
    async def main() -> None:
        await asyncio.sleep(0.02)
        if blocking == "sleep":
            time.sleep(0.04)  # a step that blocks, and is reported as io
        else:
            with open(__file__, "rb") as f:
                f.read()
        await asyncio.sleep(0)  # the very next iteration:
        stalls.spin(0.1)  # a stall of its own
        await asyncio.sleep(0.02)

    run_on(loop_name, main())
    events = watchdog.settle(2)
    reasons = [(e.reason, e.blocking_events[0]["name"] if e.blocking_events else None) for e in events]
    expected_io = "time.sleep" if blocking == "sleep" else "open"
    assert reasons == [("io_blocking", expected_io), ("cpu_blocking", None)], [
        (e.reason, round(e.elapsed_ms), e.call_site) for e in watchdog.events
    ]
    assert watchdog.events[1].call_site.endswith(stall_lines(stalls.spin)), watchdog.events[1].call_site


def test_a_report_queued_on_a_loop_as_it_stops_is_delivered_off_it(
    watchdog: Collector,  # noqa: F811 - the fixture (the loop-stop signal needs the watchdog's wrappers)
    loop_name: str,
) -> None:
    # The watchdog reports a stall just after it ends; if that is after the
    # loop's last iteration, the callback queued on the loop would wait for
    # its next run. Queue one in the last iteration, as the watchdog can.
    delivered: list[str] = []
    context = contextvars.copy_context()

    def last_callback(loop: asyncio.AbstractEventLoop) -> None:
        _delivery._hand_to_loop(loop, lambda: delivered.append(threading.current_thread().name), context)
        loop.stop()  # what is queued now runs in the next run, if any

    with quiet_rloop(loop_name):
        loop = loop_factory(loop_name)()
        try:
            loop.call_soon(last_callback, loop)
            loop.run_forever()
            aiocop._reporting.delivery.drain()
            # asyncio runs it in no later iteration: the worker delivers it. (uvloop
            # and winloop still run it before stopping.)
            assert len(delivered) == 1, "delivered without another run of the loop"
            loop.run_until_complete(asyncio.sleep(0))
            assert len(delivered) == 1, "and not again by the loop"
        finally:
            loop.close()


def _stall(start: float, end: float, seen_until: float) -> _attribution.Stall:
    watch = _loops.LoopWatch.__new__(_loops.LoopWatch)
    watch.thread_id = -1
    return _attribution.Stall(watch, start, end, [], False, None, ident=object(), seen_until=seen_until)


def _group(t_first: float) -> _hook.StepGroup:
    group = _hook.StepGroup()
    group.thread_id, group.ident, group.t_first = -1, object(), t_first
    return group


@pytest.mark.parametrize(
    ("t_first", "group_end", "stall_end"),
    [
        # A call just before the stall began, while the stall's start is an
        # estimate that falls before it: the call's step had ended.
        (0.101, 0.101, 0.250),
        # A call after the last look that saw the stalled step: that step had
        # ended by then, and its end was overestimated (a look long after,
        # with the CPU time of the steps between counted in). Found running
        # aiocop 1.x's FastAPI recipe: the next request's 100 ms sleep was an
        # event of 0 ms, over no threshold.
        (0.180, 0.0, 0.180),
    ],
)
def test_a_stall_and_another_steps_call_in_its_span(t_first: float, group_end: float, stall_end: float) -> None:
    stall = _stall(start=0.100, end=0.250, seen_until=0.150)  # the watchdog saw the step stalled until 0.150
    group = _group(t_first)
    _hook.unclaimed[group] = group
    try:
        assert not _delivery.attach_to_io(stall.watch, stall)
    finally:
        _hook.unclaimed.pop(group, None)
    assert (group.t_end, stall.end) == (group_end, stall_end)
