"""One process of the per-task benchmark: every scenario, on one loop, in one mode.

    python pertask_child.py MODE LOOP REPS SCENARIO=TASKS [SCENARIO=TASKS ...]

Prints one JSON line: per scenario, the time per task of each repetition
(µs), the events delivered and the result of checking them. The scenarios
are those of the aiocop 1.x benchmark.

In the `blockbuster` mode (`--pertask-modes ... blockbuster`), blockbuster
raises its error at each blocking call, before the call runs; the bodies catch
it and count it (the check: one per call). Its figure so leaves out the call's
own work, which the other modes' include: for `os.stat`, baseline `stat` minus
baseline `pure`.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sys
import time
from typing import TYPE_CHECKING, Any

import _mode

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

BATCH = 1000  # tasks alive at once, as in stat_overhead.py
SITE = os.path.basename(__file__) + ":"


async def pure() -> None:
    await asyncio.sleep(0)


# What a blockbuster child catches (its BlockingError); `except ():` elsewhere
# catches nothing and costs nothing. Each catch is counted: the check that
# blockbuster saw every call.
CAUGHT: type[BaseException] | tuple[type[BaseException], ...] = ()
caught = [0]


async def getcwd() -> None:
    try:
        os.getcwd()
    except CAUGHT:
        caught[0] += 1
    await asyncio.sleep(0)


async def stat() -> None:
    try:
        os.stat(".")
    except CAUGHT:
        caught[0] += 1
    await asyncio.sleep(0)


async def file_read() -> None:
    try:
        with open(__file__, encoding="utf-8") as f:
            f.read(100)
    except CAUGHT:
        caught[0] += 1
    await asyncio.sleep(0)


async def handler() -> None:
    # 1.x's "realistic HTTP handler": async work around two light blocking
    # calls, each caught on its own (blockbuster raises at the first).
    await asyncio.sleep(0.001)
    try:
        os.path.exists(".")
    except CAUGHT:
        caught[0] += 1
    try:
        os.getcwd()
    except CAUGHT:
        caught[0] += 1
    await asyncio.sleep(0.001)


# name -> (coroutine function, the blocking calls of its one event; () = no event).
SCENARIOS: dict[str, tuple[Callable[[], Coroutine[Any, Any, None]], tuple[str, ...]]] = {
    "pure": (pure, ()),
    "getcwd": (getcwd, ("os.getcwd",)),
    "stat": (stat, ("os.stat",)),
    "file_read": (file_read, ("open",)),
    "handler": (handler, ("os.stat", "os.getcwd")),
}


async def run_batches(body: Callable[[], Coroutine[Any, Any, None]], tasks: int) -> float:
    t0 = time.perf_counter()
    for _ in range(0, tasks, BATCH):
        await asyncio.gather(*(body() for _ in range(BATCH)))
    return time.perf_counter() - t0


async def measure(name: str, tasks: int, reps: int, probe: _mode.Probe | None, blockbuster: bool) -> dict[str, Any]:
    body, calls = SCENARIOS[name]
    await run_batches(body, BATCH)  # warm-up: caches, first-time imports
    await asyncio.sleep(0.01)
    us_per_task: list[float] = []
    delivered: list[int] = []
    stalls: list[int] = []
    problems: list[str] = []
    for _ in range(reps):
        gc.collect()
        if probe is not None:
            probe.reset()
        caught[0] = 0
        elapsed = await run_batches(body, tasks)
        us_per_task.append(elapsed / tasks * 1e6)
        await asyncio.sleep(0.01)  # deliveries of the last steps, if any are left
        if probe is not None:
            delivered.append(probe.count)
            stalls.append(probe.stalls)
            problems += [p for p in (_mode.check_event(e, calls, SITE) for e in probe.kept) if p]
        elif blockbuster:
            delivered.append(caught[0] // max(len(calls), 1))  # a task whose every call raised: its "event"
            if caught[0] != tasks * len(calls):
                problems.append(f"blockbuster raised {caught[0]} times, expected {tasks * len(calls)}")
    expected = tasks if calls else 0
    result: dict[str, Any] = {"us_per_task": us_per_task, "expected_events": expected}
    if probe is not None:
        result["delivered"] = delivered
        result["stalls"] = stalls  # a busy machine's, not the workload's: see _mode.Probe
        result["checked_events"] = reps * len(range(0, expected, probe.keep_every))
        result["problems"] = sorted(set(problems))[:5]
        result["ok"] = all(d == expected for d in delivered) and not problems
    elif blockbuster:
        result["delivered"] = delivered
        result["stalls"] = [0] * reps
        result["checked_events"] = 0
        result["problems"] = sorted(set(problems))[:5]
        result["ok"] = not problems
    return result


def main() -> None:
    mode, loop_name, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    sizes = {name: int(tasks) for name, _, tasks in (arg.partition("=") for arg in sys.argv[4:])}
    global CAUGHT
    blockbuster = mode == _mode.BLOCKBUSTER
    if blockbuster:
        from blockbuster import BlockBuster, BlockingError

        CAUGHT = BlockingError
        BlockBuster().activate()  # no scanned modules: every blocking call in a loop raises
        probe = None
    else:
        probe = _mode.setup(mode)
    loop = _mode.loop_factory(loop_name)()
    results = {}
    try:
        for name, tasks in sizes.items():
            results[name] = loop.run_until_complete(measure(name, tasks, reps, probe, blockbuster))
    finally:
        loop.close()
    print(json.dumps({"scenarios": results, "aiocop_imported": _mode.aiocop_imported()}))


if __name__ == "__main__":
    main()
