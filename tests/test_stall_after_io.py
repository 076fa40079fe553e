"""Stalls around other events: right after an io step, and reported as their loop stops."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time

import pytest

import aiocop._delivery
from aiocop import _delivery
from tests import stalls
from tests.conftest import Collector, loop_factory, quiet_rloop, run_on
from tests.test_watchdog import stall_lines, watchdog  # noqa: F401 - fixture


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
            aiocop._delivery.drain()
            # asyncio runs it in no later iteration: the worker delivers it. (uvloop
            # and winloop still run it before stopping.)
            assert len(delivered) == 1, "delivered without another run of the loop"
            loop.run_until_complete(asyncio.sleep(0))
            assert len(delivered) == 1, "and not again by the loop"
        finally:
            loop.close()
