"""One process of the scaling benchmark: one workload at one size, on one loop, in one mode.

    python scaling_child.py MODE LOOP WORKLOAD TASKS REPS

Every task of a workload is alive at once: each workload calls `alive()`
once all its tasks have been created and have run their first step. Prints
one JSON line: the time per task of each repetition (µs), as CPU time of the
process (the workloads never wait for I/O or timers, so on an idle machine
it is the wall time; on a shared one it leaves out the time the process
was not running) and as wall time; the memory per
task of the first repetition (RSS at `alive()` minus RSS just before, over
the number of tasks, in bytes); and the child's peak RSS. The workloads make
no blocking call: no event is expected, and none may come.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import resource
import sys
import time
from typing import TYPE_CHECKING, Any

import _mode

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

ROOM_SIZE = 100  # chat: members per room
MESSAGES = 3  # chat: messages each room broadcasts
STAGES = 3  # workflow: awaited steps per task
QUEUE_SIZE = 1024  # producer/consumer: producers beyond this wait for room


async def producer_consumer(n: int, alive: Callable[[], None]) -> None:
    """n/2 producers and n/2 consumers around one bounded `asyncio.Queue`."""
    queue: asyncio.Queue[int] = asyncio.Queue(maxsize=QUEUE_SIZE)

    async def producer(item: int) -> None:
        await queue.put(item)

    async def consumer() -> None:
        await queue.get()
        queue.task_done()

    producers = n // 2
    tasks = [asyncio.ensure_future(producer(i)) for i in range(producers)]
    tasks += [asyncio.ensure_future(consumer()) for _ in range(n - producers)]
    await asyncio.sleep(0)  # every task has run its first step
    alive()
    await asyncio.gather(*tasks)


async def task_workflow(n: int, alive: Callable[[], None]) -> None:
    """n tasks wait for a start signal, then each runs a few awaited stages."""
    gate = asyncio.Event()

    async def stage(i: int, number: int) -> int:
        await asyncio.sleep(0)
        return i * number

    async def workflow(i: int) -> int:
        await gate.wait()
        total = 0
        for number in range(STAGES):
            total += await stage(i, number)
        return total

    tasks = [asyncio.ensure_future(workflow(i)) for i in range(n)]
    await asyncio.sleep(0)
    alive()
    gate.set()
    await asyncio.gather(*tasks)


async def chat_fanout(n: int, alive: Callable[[], None]) -> None:
    """n members in rooms of ROOM_SIZE; each room's broadcaster publishes MESSAGES, every member wakes for each.

    A room is a broadcast channel, a chain of futures (each message carries
    the future of the next one), as broadcast libraries build it: memory per
    member is its task, and a publish wakes every member of the room.
    """
    loop = asyncio.get_running_loop()
    gate = asyncio.Event()

    async def member(channel: asyncio.Future[tuple[str, Any]]) -> None:
        for _ in range(MESSAGES):
            _message, channel = await channel

    async def broadcaster(channel: asyncio.Future[tuple[str, Any]]) -> None:
        await gate.wait()
        for number in range(MESSAGES):
            following: asyncio.Future[tuple[str, Any]] = loop.create_future()
            channel.set_result((f"message {number}", following))
            channel = following
            await asyncio.sleep(0)

    channels = [loop.create_future() for _ in range(0, n, ROOM_SIZE)]
    tasks = [asyncio.ensure_future(member(channels[i // ROOM_SIZE])) for i in range(n)]
    tasks += [asyncio.ensure_future(broadcaster(channel)) for channel in channels]
    await asyncio.sleep(0)
    alive()
    gate.set()
    await asyncio.gather(*tasks)


WORKLOADS: dict[str, Callable[[int, Callable[[], None]], Coroutine[Any, Any, None]]] = {
    "producer_consumer": producer_consumer,
    "task_workflow": task_workflow,
    "chat_fanout": chat_fanout,
}


def current_rss() -> int:
    # The current RSS, not the high-water mark (ru_maxrss), which would hide
    # the growth of a small workload behind the peak of start-up.
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux: the peak so far is the best estimate
        return peak_rss()


def peak_rss() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux


def main() -> None:
    mode, loop_name, workload, tasks, reps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    probe = _mode.setup(mode)
    body = WORKLOADS[workload]
    loop = _mode.loop_factory(loop_name)()
    us_per_task: list[float] = []
    wall_us_per_task: list[float] = []
    rss_alive: list[int] = []

    def alive() -> None:
        if not rss_alive:
            with _mode.unwatched():  # reading /proc is the benchmark's blocking call, not the workload's
                rss_alive.append(current_rss())

    try:
        gc.collect()
        before = current_rss()
        for _ in range(reps):
            t0, cpu0 = time.perf_counter(), time.process_time()
            loop.run_until_complete(body(tasks, alive))
            us_per_task.append((time.process_time() - cpu0) / tasks * 1e6)
            wall_us_per_task.append((time.perf_counter() - t0) / tasks * 1e6)
            gc.collect()
        loop.run_until_complete(asyncio.sleep(0.01))  # deliveries, if any (there should be none)
    finally:
        loop.close()
    result = {
        "us_per_task": us_per_task,
        "wall_us_per_task": wall_us_per_task,
        "bytes_per_task": (rss_alive[0] - before) / tasks,
        "rss_before": before,
        "rss_alive": rss_alive[0],
        "peak_rss": peak_rss(),
        "events": probe.count if probe is not None else 0,
        "aiocop_imported": _mode.aiocop_imported(),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
