"""Programs for tests/test_attach.py to attach to: `python tests/attach_targets.py KIND`.

None of them imports aiocop unless its kind says so. Each prints `ready` once
its loop runs; each line marked `# ATTACH-...` is one the report must name.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time


async def handler(n: int) -> None:
    os.stat("/")  # ATTACH-STAT
    if n % 5 == 0:
        spin(0.1)  # ATTACH-STALL-CALLER


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:  # ATTACH-STALL
        pass


async def serve(seconds: float | None) -> None:
    print("awake" if sys.argv[1] == "asleep" else "ready", flush=True)
    started = time.monotonic()
    n = 0
    tasks = set()
    while seconds is None or time.monotonic() - started < seconds:
        n += 1
        task = asyncio.get_running_loop().create_task(handler(n))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        await asyncio.sleep(0.05)


def main() -> None:
    kind = sys.argv[1]
    seen: list[object] = []
    sys.modules["__main__"].seen = seen  # type: ignore[attr-defined]
    if kind in ("with-aiocop", "imported-aiocop", "watchdog-only", "interception-only"):
        import aiocop

        if kind == "with-aiocop":  # aiocop running, with its own callback
            aiocop.start_blocking_io_detection()
            aiocop.detect_slow_tasks(threshold_ms=40, on_slow_task=seen.append)
        elif kind == "watchdog-only":  # stalls only, without samples
            aiocop.detect_slow_tasks(threshold_ms=50, on_slow_task=seen.append, cpu_sampling=False)
        elif kind == "interception-only":
            aiocop.start_blocking_io_detection(trace_depth=7)
            aiocop.register_slow_task_callback(seen.append)
    if kind == "asleep":  # the main thread in a long C call before its loop runs: no safe point
        print("ready", flush=True)
        time.sleep(float(sys.argv[2]))
    asyncio.run(serve(float(sys.argv[2]) if kind == "exits" else None))


if __name__ == "__main__":
    main()
