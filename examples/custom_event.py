"""Detect a blocking call of your own: raise an audit event, and register it.

Run it: `python examples/custom_event.py`. `query()` stands for a blocking
database driver call, which raises no audit event aiocop knows of.
"""

from __future__ import annotations

import asyncio
import sys

import aiocop


# --8<-- [start:event]
def query(sql: str) -> list[tuple[str, ...]]:
    sys.audit("mydb.query", sql)  # one line in the blocking function (a no-op without audit hooks)
    return [("row",)]  # ... the driver's blocking work


aiocop.register_blocking_event("mydb.query", weight=aiocop.WEIGHT_HEAVY)
# --8<-- [end:event]


def report(event: aiocop.SlowTaskEvent) -> None:
    for call in event.blocking_events:
        print(f"{event.severity_level}: {call['event']} at {call['entry_point']}")


aiocop.start_blocking_io_detection()
aiocop.register_slow_task_callback(report)


async def handler() -> int:
    rows = query("SELECT 1")  # blocks the loop: now reported
    await asyncio.sleep(0)
    return len(rows)


asyncio.run(handler())
