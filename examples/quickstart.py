"""The quick start: switch aiocop on, then let a handler block.

Run it: `python examples/quickstart.py`.
"""

import asyncio
import time
from pathlib import Path

import aiocop


# --8<-- [start:setup]
def report(event: aiocop.SlowTaskEvent) -> None:
    for call in event.blocking_events:
        print(f"{event.severity_level}: {call['event']} at {call['entry_point']}")
    if event.reason == "cpu_blocking":
        print(f"stall of {event.elapsed_ms:.0f} ms at {event.call_site}: {event.culprit}")


aiocop.start_blocking_io_detection()  # once, at start-up: before any loop exists is fine
aiocop.detect_slow_tasks(threshold_ms=30, on_slow_task=report)
# --8<-- [end:setup]


def crunch(seconds: float) -> int:
    """Pure-Python work for `seconds`: sized in time, it stalls the loop on any machine."""
    deadline = time.perf_counter() + seconds
    rounds = 0
    while time.perf_counter() < deadline:
        for _ in range(1000):
            rounds += 1
    return rounds


async def handler() -> int:
    config = Path(__file__).read_text()  # blocking file read
    time.sleep(0.05)  # blocking sleep: every other task waits too
    await asyncio.sleep(0)
    rounds = crunch(0.1)  # CPU-bound: no call to intercept, the watchdog sees it
    await asyncio.sleep(0.01)
    return len(config) + rounds


asyncio.run(handler())
time.sleep(0.05)  # the watchdog reports a stall just after it ends
