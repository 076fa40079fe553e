"""The catalogue of issue 37: one C call as one step of a task, on every loop, seen as one stall at its line.

C code that holds the GIL for the whole call (tests/support/gil_holds.py: json.dumps
of a big structure, a backtracking regular expression, sum(range(...)),
sorted of millions of ints, pydantic-core validating a big list) keeps the
watchdog's thread out until it returns; C code that lets go of it (sha256
and zlib of a big buffer, time.sleep) is looked at while it runs. Either way
the step is reported as one stall, of the task that made it, at the
application's line, timed from when the call began.

What is asserted is what aiocop guarantees, on a quiet or a busy machine:
each call is sized to HOLD_S of its thread's CPU clock (at least that long
in wall time, whatever the load, ten times the threshold), and the reported
length is the call's own within 10 %, or 5 ms, plus what Linux says the
loop's and the watchdog's threads waited for a CPU meanwhile.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from typing import TYPE_CHECKING

import pytest

import aiocop
from tests.conftest import run_on
from tests.support.gil_holds import (
    HOLDS,
    RELEASES,
    THRESHOLD_MS,
    not_veloxloop,
    queued,
    site_of,
    timed,
    watchdog_native_id,
    within,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.conftest import Collector


def _one_stall_at_its_line(
    detector: Collector, loop_name: str, call: Callable[[], None], *, short_on_312: bool = False
) -> None:
    call()  # (sized now, before the loop runs: the first call measures)
    aiocop.detect_slow_tasks(threshold_ms=THRESHOLD_MS)
    took: list[float] = []
    starved: list[float] = []

    async def holder() -> None:
        loop_q, dog_q = await queued(threading.get_native_id()), await queued(watchdog_native_id())
        await asyncio.sleep(0.05)  # the watchdog sees the loop idle first
        loop_q.mark()
        dog_q.mark()
        took.append(timed(call))
        await asyncio.sleep(0.05)  # (the looks that end the step)
        starved.append(loop_q.waited_ms() + dog_q.waited_ms())

    async def main() -> None:
        await asyncio.create_task(holder(), name="gil-holder")

    run_on(loop_name, main())
    everything = detector.settle(1)
    # A call aiocop intercepts (time.sleep) is one io event, which takes its step's stall over. The
    # harness's own first step, starting the executor's thread (`queued`), can wait hundreds of
    # milliseconds for it on a busy machine: a real stall, but not the case's.
    events = [
        e
        for e in everything
        if (e.reason != "io_blocking" or e.call_site.startswith("tests/support/gil_holds.py:"))
        and not (e.call_site.startswith("tests/support/gil_holds.py:") and e.call_site.endswith(":queued"))
    ]
    assert len(events) == 1, [(e.reason, e.elapsed_ms, e.call_site) for e in everything]
    [event] = events
    true_ms = took[0] * 1000.0
    assert event.reason in ("cpu_blocking", "io_blocking")
    assert event.call_site.startswith(site_of(call)), (event.call_site, site_of(call))
    assert event.task_name == "gil-holder"
    assert not event.ongoing and event.hang_reports == 0
    if short_on_312 and sys.version_info >= (3, 12) and not within(event.elapsed_ms, true_ms, starved[0]):
        # Issue 37's open gap, measured with benchmarks/gil_stall_accuracy.py (and the same at
        # 90a8294): on 3.12+ pydantic-core's validation is timed 15-24 % short, about 50 ms of a
        # 300 ms call, half of it the garbage collection its objects set off (with gc disabled,
        # 5-8 % short). Everything else about the stall is checked above.
        pytest.xfail(f"pydantic's stall timed short on 3.12+ (issue 37): {event.elapsed_ms:.0f} of {true_ms:.0f} ms")
    assert within(event.elapsed_ms, true_ms, starved[0]), (event.elapsed_ms, true_ms, starved[0])


@pytest.mark.parametrize("kind", sorted(HOLDS))
def test_a_step_holding_the_gil_is_one_stall_at_its_line(detector: Collector, loop_name: str, kind: str) -> None:
    not_veloxloop(loop_name)
    _one_stall_at_its_line(detector, loop_name, HOLDS[kind], short_on_312=kind == "pydantic")


@pytest.mark.parametrize("kind", sorted(RELEASES))
def test_a_step_releasing_the_gil_is_one_stall_at_its_line(detector: Collector, loop_name: str, kind: str) -> None:
    _one_stall_at_its_line(detector, loop_name, RELEASES[kind])
