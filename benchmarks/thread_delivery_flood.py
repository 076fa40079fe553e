"""`delivery="thread"` flooded: memory, drops, and how long `stop()` takes.

    python benchmarks/thread_delivery_flood.py [--steps 200000] [--callback-ms 1] [--exit]

A loop makes one detected blocking call (`os.stat`) per step, far faster than
a callback that takes `--callback-ms` per event (a network exporter) can take
them. Printed: the process's resident memory every tenth of the run, how many
events were delivered and how many dropped (the bounded queue's), how long
`stop()` took, and how many callbacks started after `stop()` returned (in the
two seconds after). What to expect: memory flat once the queue is full, every
step either delivered or counted as dropped, `stop()` back within about a
second plus the callback running then, and no callback after it.

`--exit` measures instead how long a program that floods and then simply
ends (no `stop()`: the exit delivers what it can) takes from its last line to
its exit.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import threading
import time

import aiocop
from aiocop._reporting import delivery as _delivery
from aiocop._reporting.worker import MAX_PENDING


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--callback-ms", type=float, default=1.0)
    parser.add_argument("--exit", action="store_true", help="time the exit of a flooded program instead")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.exit:
        time_the_exit(args.steps, args.callback_ms)
        return

    delivered = 0
    stopped_at: list[float] = []
    after_stop = 0
    lock = threading.Lock()

    def exporter(event: aiocop.SlowTaskEvent) -> None:
        nonlocal delivered, after_stop
        with lock:
            delivered += 1
            if stopped_at:
                after_stop += 1
        time.sleep(args.callback_ms / 1000)

    aiocop.start_blocking_io_detection(delivery="thread")
    aiocop.register_slow_task_callback(exporter)
    dropped_before = _delivery._worker.dropped
    samples: list[tuple[int, float]] = [(0, rss_mib())]

    async def flood() -> None:
        every = max(1, args.steps // 10)
        for step in range(1, args.steps + 1):
            os.stat(".")
            await asyncio.sleep(0)
            if step % every == 0:
                samples.append((step, rss_mib()))

    started = time.perf_counter()
    asyncio.run(flood())
    ran = time.perf_counter() - started
    if args.child:  # --exit: end here, as a program does, and let the exit deliver
        print(f"END {time.time()}", flush=True)
        return
    before_stop = time.perf_counter()
    aiocop.stop()
    stop_took = time.perf_counter() - before_stop
    stopped_at.append(time.perf_counter())
    time.sleep(2.0)
    dropped = _delivery._worker.dropped - dropped_before

    print(f"{args.steps} steps in {ran:.1f} s, callback {args.callback_ms} ms, queue capacity {MAX_PENDING}")
    print("resident memory (MiB) by step: " + ", ".join(f"{step}: {mib:.0f}" for step, mib in samples))
    print(f"delivered {delivered}, dropped {dropped}, delivered + dropped = {delivered + dropped}")
    print(f"stop() took {stop_took:.2f} s; callbacks started after stop() returned: {after_stop}")


def time_the_exit(steps: int, callback_ms: float) -> None:
    child = subprocess.Popen(
        [sys.executable, __file__, "--child", "--steps", str(steps), "--callback-ms", str(callback_ms)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert child.stdout is not None
    ended = float(child.stdout.readline().split()[1])
    child.wait()
    print(f"{steps} steps, callback {callback_ms} ms: exit {time.time() - ended:.2f} s after the program's last line")


if __name__ == "__main__":
    main()
