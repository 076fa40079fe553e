"""The stand-in loop imported before aiocop is set up, as Leviathan often is (issue 29).

Run by tests/stalls/test_discovery.py in a process of its own (`python -m
tests.support.unknown_loops_app RUNS [leviathan]`; the last runs the same cases on
Leviathan, imported first, see docs/how-to/loops.md): the stand-in binds its start signals at import,
before aiocop wraps them, so no start of it is ever seen. Prints one JSON
line: every event reported, and what each case did.

- `first`: RUNS loops, one after the other, each spinning 200 ms as its very
  first work (a task's first step), with idle gaps of 0, 0.1 and 0.55 s between them
  (the watchdog slows its looks after half a second of quiet).
- `after`: AFTER_RUNS loops, each started right after an asyncio loop (one
  aiocop is told of) ran and stopped on the same thread, spinning 200 ms as
  its very first work.
- `hang-spin`: a loop that idles 0.2 s, then spins until its hang has been
  reported (the loop, idle and unseen, is found as it hangs).
- `hang-lock`: a loop whose first work waits for a held lock until its hang
  has been reported.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

if sys.argv[2:] == ["leviathan"]:
    import leviathan  # type: ignore[import-not-found]  # (built by hand) binds its start signals now

    new_loop: Any = leviathan.Loop
else:
    from tests.support import bound_loop  # the same

    new_loop = bound_loop.BoundLoop

import aiocop

if TYPE_CHECKING:
    from collections.abc import Coroutine

THRESHOLD_MS = 30
HANG_AFTER_MS = 300
# 6.7x the threshold, and a third under hang_after: at 3.3x (100 ms) a loop's
# thread a busy machine let run a third of the time went unseen once in 20
# (load 10).
STALL_S = 0.2
WAIT_S = 30.0  # for a hang report: a busy machine's worst day
GAPS_S = (0.0, 0.1, 0.55)
AFTER_RUNS = 5


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:  # FIRST
        pass


async def first_work() -> None:
    spin(STALL_S)
    await asyncio.sleep(0)


def run(coro_name: str, coro: Coroutine[Any, Any, None]) -> None:
    loop = new_loop()
    try:
        task = loop.create_task(coro, name=coro_name)
        loop.run_until_complete(task)
    finally:
        loop.close()


def main() -> None:
    runs = int(sys.argv[1])
    events: list[aiocop.SlowTaskEvent] = []
    hung = threading.Event()

    def collect(event: aiocop.SlowTaskEvent) -> None:
        events.append(event)
        if event.reason == "hang":
            hung.set()

    aiocop.start_blocking_io_detection()
    aiocop.detect_slow_tasks(threshold_ms=THRESHOLD_MS, hang_after_ms=HANG_AFTER_MS, on_slow_task=collect)
    for i in range(runs):
        time.sleep(GAPS_S[i % len(GAPS_S)])
        run(f"first-{i}", first_work())

    for i in range(AFTER_RUNS):
        asyncio.run(asyncio.sleep(0.05))  # a loop aiocop is told of, started and stopped on this thread
        run(f"after-{i}", first_work())

    released: dict[str, bool] = {}

    async def hang_spin() -> None:
        await asyncio.sleep(0.2)
        deadline = time.monotonic() + WAIT_S
        while not hung.is_set() and time.monotonic() < deadline:  # HANG-SPIN
            pass

    async def hang_lock(lock: threading.Lock) -> None:
        lock.acquire()  # HANG-LOCK
        lock.release()

    hung.clear()
    run("hang-spin", hang_spin())
    released["hang-spin"] = hung.is_set()

    hung.clear()
    lock = threading.Lock()
    lock.acquire()

    def release_after_report() -> None:
        released["hang-lock"] = hung.wait(WAIT_S)
        lock.release()

    releaser = threading.Thread(target=release_after_report)
    releaser.start()
    run("hang-lock", hang_lock(lock))
    releaser.join()
    time.sleep(0.2)  # the step events of the hangs, reported as each ended
    aiocop.stop()
    print(
        json.dumps(
            {
                "released": released,
                "events": [
                    {
                        "reason": e.reason,
                        "task": e.task_name,
                        "call_site": e.call_site,
                        "elapsed_ms": e.elapsed_ms,
                        "ongoing": e.ongoing,
                    }
                    for e in events
                ],
            }
        )
    )


if __name__ == "__main__":
    main()
