"""After: the same tests with aiocop's pytest plugin (see docs/migration-blockbuster.md).

Run it: `pytest --aiocop examples/migration/test_with_aiocop.py`, or set
`aiocop = true` in the pytest configuration. No fixture to write.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

import pytest

import aiocop

if TYPE_CHECKING:
    from aiocop.pytest_plugin import EventLog


# --8<-- [start:after]
def read_mtime() -> float:
    return os.stat(__file__).st_mtime


@pytest.mark.asyncio
async def test_time_sleep(aiocop_events: EventLog) -> None:
    time.sleep(0.001)  # reported, not raised: the test asserts on what was reported
    assert aiocop_events.names() == ["time.sleep"]


@pytest.mark.asyncio
async def test_time_sleep_raises(aiocop_events: EventLog) -> None:
    with aiocop.raise_on_violations(), pytest.raises(aiocop.HighSeverityBlockingIoException, match=r"time\.sleep"):
        time.sleep(0.05)  # raised at the call, as blockbuster does (a sleep under the threshold is only reported)


@pytest.mark.asyncio
@pytest.mark.aiocop_allow("os.stat", call_site="test_with_aiocop.py:read_mtime")
async def test_read_mtime_is_allowed() -> None:
    assert read_mtime() > 0


# --8<-- [end:after]
