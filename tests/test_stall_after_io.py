"""A stall right after a step with a blocking call is its own event, not taken for that step."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests import stalls
from tests.conftest import Collector, run_on
from tests.test_watchdog import watchdog  # noqa: F401 - fixture


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
        stalls.spin(0.08)  # a stall of its own
        await asyncio.sleep(0.02)

    run_on(loop_name, main())
    time.sleep(0.05)
    reasons = [(e.reason, e.blocking_events[0]["name"] if e.blocking_events else None) for e in watchdog.events]
    expected_io = "time.sleep" if blocking == "sleep" else "open"
    assert reasons == [("io_blocking", expected_io), ("cpu_blocking", None)], [
        (e.reason, round(e.elapsed_ms), e.call_site) for e in watchdog.events
    ]
    assert watchdog.events[1].call_site == "tests/stalls.py:14:spin"
