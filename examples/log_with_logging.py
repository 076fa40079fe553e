"""Blocking calls as log entries, with the standard `logging` module only.

Run it: `python examples/log_with_logging.py`. The handler reads a file on
every request; the first occurrence is logged in full, the rest are counted.
"""

import asyncio
import logging
import time
from pathlib import Path

import aiocop

logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")

# --8<-- [start:setup]
aiocop.start_blocking_io_detection()
aiocop.detect_slow_tasks(threshold_ms=50)
aiocop.log_events(repeat_interval_s=0.2)  # one line: logger "aiocop.events", level WARNING
# --8<-- [end:setup]


async def handle(request_id: int) -> int:
    data = Path(__file__).read_bytes()  # blocking file read, on every request
    await asyncio.sleep(0.01)
    return len(data) + request_id


async def main() -> None:
    for batch in range(3):
        await asyncio.gather(*(handle(i) for i in range(10)))
        if batch == 1:
            time.sleep(0.25)  # let the repeat interval pass (a blocking sleep: caught too)


asyncio.run(main())
