"""Recall and duration error of stalls whose step holds the GIL in one C call (issue 37).

Each round runs one call that never releases the GIL (json.dumps of a big
list, a backtracking regular expression, sum(range(...))), sized once to
about `--target-ms`, in a task of its own on the chosen loop, and compares the
reported stall with the call's own wall-clock length.

    python benchmarks/gil_stall_accuracy.py --loop uvloop --rounds 10
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import re
import statistics
import sys
import time
from typing import Any

import aiocop


def timed(call: Any) -> float:
    t0 = time.perf_counter()
    call()
    return time.perf_counter() - t0


def size(target: float) -> dict[str, Any]:
    n = 20_000
    while True:
        data = [{"a": i, "b": "x" * 10} for i in range(n)]
        took = timed(functools.partial(json.dumps, data))
        if took >= target:
            break
        n = int(n * min(8.0, max(1.2, 1.1 * target / max(took, 1e-3))))
    k = 16
    while timed(functools.partial(re.match, r"(a+)+$", "a" * k + "b")) < target:
        k += 1
    m = 1_000_000
    while (took := timed(functools.partial(sum, range(m)))) < target:
        m = int(m * min(8.0, max(1.2, 1.1 * target / max(took, 1e-3))))
    return {
        "json": functools.partial(json.dumps, data),
        "regex": functools.partial(re.match, r"(a+)+$", "a" * k + "b"),
        "sum": functools.partial(sum, range(m)),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--loop", default="asyncio", choices=["asyncio", "uvloop", "rloop", "veloxloop"])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--target-ms", type=float, default=300.0)
    parser.add_argument("--threshold-ms", type=float, default=30.0)
    args = parser.parse_args()
    calls = size(args.target_ms / 1000.0)
    events: list[aiocop.SlowTaskEvent] = []
    aiocop.start_blocking_io_detection()
    aiocop.detect_slow_tasks(threshold_ms=args.threshold_ms, on_slow_task=events.append)
    results: dict[str, list[tuple[float, float | None]]] = {kind: [] for kind in calls}

    async def one(kind: str) -> float:
        await asyncio.sleep(0.1)
        return timed(calls[kind])

    async def run() -> None:
        for _ in range(args.rounds):
            for kind in calls:
                events.clear()
                true_s = await asyncio.create_task(one(kind), name=kind)
                await asyncio.sleep(0.2)
                stalls = [e for e in events if e.reason == "cpu_blocking" and e.task_name == kind]
                results[kind].append((true_s * 1000.0, stalls[0].elapsed_ms if stalls else None))

    loop = asyncio.new_event_loop() if args.loop == "asyncio" else __import__(args.loop).new_event_loop()
    try:
        loop.run_until_complete(run())
    finally:
        loop.close()
    aiocop.stop()
    print(f"python {sys.version.split()[0]}, loop {args.loop}, {args.rounds} rounds, threshold {args.threshold_ms} ms")
    for kind, rows in results.items():
        seen = [(t, r) for t, r in rows if r is not None]
        errors = [100.0 * (r - t) / t for t, r in seen]
        line = f"  {kind:6s} recall {len(seen)}/{len(rows)}, true {statistics.median(t for t, _ in rows):.0f} ms"
        if errors:
            line += f", error median {statistics.median(errors):+.1f} %, worst {max(errors, key=abs):+.1f} %"
        print(line)


if __name__ == "__main__":
    main()
