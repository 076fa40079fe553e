"""Recall of stalls made by the loop-delay probe's own tick: a `record` that holds the loop.

The probe (`aiocop._stalls.probe.DelayProbe`, behind the OpenTelemetry and
Prometheus integrations) runs a timer on each loop and hands each delay to a
`record` callable, a histogram's. One that waits on its SDK's lock, held by an
exporter, holds the loop: a stall of aiocop's making, which the watchdog must
report like any other. Here every Nth tick's `record` waits (or works, with
`--work`) for `--hold-ms`; the loop does nothing else, so each held tick
comes after an idle spell of `--apart-s`: past half a second the watchdog
has slowed its looks and armed the loop's tripwire, which a tick does not
trip. A held tick counts as reported when one stall event names its line;
its error is the reported `elapsed_ms` against the hold measured in `record`.

Each case runs in a process of its own (aiocop set up afresh):

    python benchmarks/stuck_tick_recall.py [--loops asyncio uvloop] [--hold-ms 45 100] [--apart-s 0.5 2] [--count 10]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import queue
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
THRESHOLD_MS = 30
PROBE_INTERVAL_S = 0.1


def hold(seconds: float, work: bool) -> None:
    if work:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:  # HOLDS
            pass
    else:
        with contextlib.suppress(queue.Empty):
            queue.SimpleQueue().get(timeout=seconds)  # HOLDS


def one_case(loop_name: str, hold_ms: float, apart_s: float, count: int, work: bool) -> dict[str, object]:
    import aiocop
    from aiocop._stalls.probe import DelayProbe

    events: list[aiocop.SlowTaskEvent] = []
    aiocop.start_blocking_io_detection()
    aiocop.register_slow_task_callback(events.append)
    aiocop.detect_slow_tasks(threshold_ms=THRESHOLD_MS)
    held: list[float] = []
    every = max(1, round(apart_s / PROBE_INTERVAL_S))
    ticks = [0]

    finished: list[asyncio.Event] = []

    def record(delay_s: float) -> None:
        ticks[0] += 1
        if ticks[0] % every == 0 and len(held) < count:
            t0 = time.perf_counter()
            hold(hold_ms / 1000.0, work)
            held.append((time.perf_counter() - t0) * 1000.0)
            if len(held) == count:
                finished[0].set()  # (on the loop's thread: the tick is its callback)

    async def main() -> None:
        # Nothing of the application's runs until the last hold: the ticks alone.
        finished.append(asyncio.Event())
        await finished[0].wait()
        await asyncio.sleep(0.2)

    probe = DelayProbe(PROBE_INTERVAL_S, record)
    probe.start()
    factory = asyncio.new_event_loop if loop_name == "asyncio" else importlib.import_module(loop_name).new_event_loop
    loop = factory()
    try:
        loop.run_until_complete(main())
    finally:
        probe.stop()
        loop.close()
    time.sleep(0.5)  # the last stall's report comes from the watchdog's thread
    ours = [e for e in list(events) if e.reason != "hang" and "stuck_tick_recall.py" in e.call_site]
    return {"held": held, "reported": [e.elapsed_ms for e in ours]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loops", nargs="+", default=["asyncio", "uvloop"])
    parser.add_argument("--hold-ms", nargs="+", type=float, default=[45.0, 100.0])
    parser.add_argument("--apart-s", nargs="+", type=float, default=[0.5, 2.0])
    parser.add_argument("--count", type=int, default=10)
    parser.add_argument("--work", action="store_true", help="record works (spins) instead of waiting")
    parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)  # loop hold_ms apart_s: run one case, print JSON
    args = parser.parse_args()
    if args.count < 1:
        parser.error("--count must be 1 or more")
    if any(h <= 0 for h in args.hold_ms) or any(a <= 0 for a in args.apart_s):
        parser.error("--hold-ms and --apart-s must be positive")
    if args.one:
        loop_name, hold_ms, apart_s = args.one
        print(json.dumps(one_case(loop_name, float(hold_ms), float(apart_s), args.count, args.work)))
        return
    print(
        f"Python {sys.version.split()[0]}, threshold {THRESHOLD_MS} ms, {'working' if args.work else 'waiting'} record"
    )
    print(f"{'loop':10} {'held ms':>8} {'apart s':>8} {'reported':>9} {'median ms':>10} {'worst error':>12}")
    print("(worst error: of a reported length, against the median hold measured in record)")
    for loop_name in args.loops:
        for hold_ms in args.hold_ms:
            for apart_s in args.apart_s:
                command = [sys.executable, __file__, "--one", loop_name, str(hold_ms), str(apart_s)]
                command += ["--count", str(args.count)] + (["--work"] if args.work else [])
                done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False, timeout=600)
                if done.returncode != 0:
                    print(f"{loop_name:10} {hold_ms:8.0f} {apart_s:8.1f}  failed: {done.stderr.strip()[-300:]}")
                    continue
                result = json.loads(done.stdout.strip().splitlines()[-1])
                held, reported = result["held"], result["reported"]
                worst = max((abs(r - statistics.median(held)) for r in reported), default=float("nan"))
                median = statistics.median(reported) if reported else float("nan")
                print(
                    f"{loop_name:10} {hold_ms:8.0f} {apart_s:8.1f} {len(reported):>4}/{len(held):<4} "
                    f"{median:10.1f} {worst:10.1f} ms"
                )


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
