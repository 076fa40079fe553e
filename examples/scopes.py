"""Scopes follow the code, not the thread: tasks created inside a scope inherit it.

Run it: `python examples/scopes.py`. Three tasks run at once on one loop, each
making the same blocking call; what happens to each depends only on the scope
it was created in.
"""

from __future__ import annotations

import asyncio
import time

import aiocop


def report(event: aiocop.SlowTaskEvent) -> None:
    for call in event.blocking_events:
        print(f"reported: {call['name']} in task {event.task_name}")


aiocop.start_blocking_io_detection()
aiocop.register_slow_task_callback(report)


async def pause() -> None:
    await asyncio.sleep(0)
    time.sleep(0.05)  # a blocking sleep over the 30 ms threshold: severity high on its own


async def main() -> None:
    # --8<-- [start:scopes]
    with aiocop.monitored(enabled=False):  # not watched at all
        quiet = asyncio.create_task(pause(), name="quiet")
    with aiocop.raise_on_violations():  # fails at the call, inside this task only
        strict = asyncio.create_task(pause(), name="strict")
    watched = asyncio.create_task(pause(), name="watched")  # outside any scope: reported
    # --8<-- [end:scopes]
    results = await asyncio.gather(quiet, strict, watched, return_exceptions=True)
    for task, result in zip((quiet, strict, watched), results, strict=True):
        outcome = type(result).__name__ if isinstance(result, BaseException) else "finished"
        print(f"task {task.get_name()}: {outcome}")


asyncio.run(main())
