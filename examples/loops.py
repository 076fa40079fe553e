"""The same blocking handler on every event loop installed here.

Run it: `python examples/loops.py`. For each of asyncio, uvloop, winloop,
rloop and veloxloop, it runs a handler that reads a file on the loop, from
a loop created *after* detection was started, and prints what aiocop
reported (or that the loop is not installed).
"""

from __future__ import annotations

import asyncio
import importlib
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import aiocop

if TYPE_CHECKING:
    from collections.abc import Callable

reported: list[aiocop.SlowTaskEvent] = []
aiocop.start_blocking_io_detection()  # once, before any loop exists
aiocop.register_slow_task_callback(reported.append)


async def handler() -> int:
    data = Path(__file__).read_bytes()  # blocking file read
    await asyncio.sleep(0)
    return len(data)


# --8<-- [start:factories]
def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """`asyncio.new_event_loop`, or the `new_event_loop` of uvloop, winloop, rloop, veloxloop."""
    if name == "asyncio":
        return asyncio.new_event_loop
    module = importlib.import_module(name)  # ImportError if it is not installed
    factory: Callable[[], asyncio.AbstractEventLoop] = module.new_event_loop
    return factory


def run(name: str) -> None:
    loop = loop_factory(name)()
    try:
        loop.run_until_complete(handler())
    finally:
        loop.close()


# --8<-- [end:factories]


for name in ("asyncio", "uvloop", "winloop", "rloop", "veloxloop"):
    try:
        factory = loop_factory(name)
    except ImportError:
        print(f"{name}: not installed")
        continue
    reported.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # rloop 0.5 leaves its self-pipe to the collector
        run(name)
    calls = [(call["name"], call["entry_point"]) for event in reported for call in event.blocking_events]
    print(f"{name}: {calls}")
