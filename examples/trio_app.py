"""A blocking call in a trio task, reported at its line (issue 41).

Run it: `python examples/trio_app.py` (needs trio: `pip install './aiocop[trio]'`). Detection is
started before trio is imported, as at an application's start-up; the handler's `time.sleep` is
reported with its line and its trio task's name, the same sleep run in trio's worker thread is not.
"""

from __future__ import annotations

import time

import aiocop

# --8<-- [start:app]
aiocop.start_blocking_io_detection()  # once, at start-up: every trio run started later is covered
aiocop.register_slow_task_callback(
    lambda event: print(event.task_name, event.call_site, [call["name"] for call in event.blocking_events])
)

import trio  # noqa: E402 - imported after detection started, as an application's modules are


async def handler() -> None:
    time.sleep(0.01)  # blocks trio's run loop: reported
    await trio.to_thread.run_sync(time.sleep, 0.01)  # in a worker thread, off the run loop: not reported


async def main() -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(handler, name="handler")


trio.run(main)
# --8<-- [end:app]
