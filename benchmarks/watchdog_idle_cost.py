"""CPU cost of the stall watchdog, and of the OpenTelemetry instrumentor's loop-delay probe, in an idle process.

Each run is a separate process with an event loop waiting for I/O for
`--seconds`; the baseline never imports aiocop, `aiocop` runs detection and
the watchdog, `aiocop+otel` adds `AiocopInstrumentor` (its probe: a timer
every 500 ms on the loop, each lateness recorded). Runs alternate
(A B C A B C ...) and the script prints each one's CPU time as a share of one
core; the probe's own cost is `aiocop+otel` minus `aiocop`. `--loop uvloop`
runs the same on uvloop; `--precise` adds a run with
`start_cpu_sampling(precise_idle=True)`, the looks the pytest plugin and
`python -m aiocop run` take at an idle loop that cannot be armed (uvloop on
3.12+). `--ticker-ms N` adds a run with no aiocop but a
thread that does nothing except wake every N ms: the floor under any
watchdog that looks that often (each wake-up of a thread is the cost, on a
VM most of all).

An idle loop is armed to wake the watchdog as it wakes (issue 29: one
callback on the loop as the watchdog slows its looks), which this measures
too.

    python benchmarks/watchdog_idle_cost.py [--seconds 10] [--rounds 3] [--loop asyncio|uvloop] [--ticker-ms 15]
        [--precise]
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys

CHILD = r"""
import asyncio, resource, sys, time
mode, seconds, loop_name = sys.argv[1], float(sys.argv[2]), sys.argv[3]
if mode.startswith("ticker"):
    import threading, _thread
    def tick(interval=float(sys.argv[4]) / 1000):
        lock = _thread.allocate_lock()
        lock.acquire()
        while True:
            lock.acquire(True, interval)  # (never released: a timed wait, as the watchdog's)
    threading.Thread(target=tick, daemon=True).start()
elif mode != "baseline":
    import aiocop
    aiocop.start_blocking_io_detection()
    if mode.startswith("aiocop precise"):
        aiocop.start_cpu_sampling(precise_idle=True)
    aiocop.detect_slow_tasks(threshold_ms=30)
if mode == "aiocop+otel":
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from aiocop.opentelemetry import AiocopInstrumentor
    AiocopInstrumentor().instrument(meter_provider=MeterProvider(metric_readers=[InMemoryMetricReader()]))
async def main():
    # Start-up done: a loop's start keeps the watchdog looking every 4 ms for
    # half a second (loop starts in quick succession do not wake it, issue
    # 31), once per loop; what a server that has been up a while pays is after.
    await asyncio.sleep(0.6)
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    await asyncio.sleep(seconds)
    r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    print(cpu / (t1 - t0) * 100)
if loop_name == "uvloop":
    import uvloop
    uvloop.run(main())
else:
    asyncio.run(main())
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument("--ticker-ms", type=float, default=None, help="also a bare thread waking every N ms")
    parser.add_argument(
        "--precise", action="store_true", help="also aiocop with start_cpu_sampling(precise_idle=True), as under pytest"
    )
    args = parser.parse_args()
    if args.ticker_ms is not None and not (args.ticker_ms > 0 and math.isfinite(args.ticker_ms)):
        parser.error("--ticker-ms: a positive number of milliseconds")
    results: dict[str, list[float]] = {"baseline": [], "aiocop": [], "aiocop+otel": []}
    if args.precise:
        results["aiocop precise"] = []
    if args.ticker_ms is not None:
        results[f"ticker {args.ticker_ms:g} ms"] = []
    for _ in range(args.rounds):
        for mode, values in results.items():
            out = subprocess.run(
                [sys.executable, "-c", CHILD, mode, str(args.seconds), args.loop, str(args.ticker_ms)],
                capture_output=True,
                text=True,
                check=True,
            )
            values.append(float(out.stdout))
    for mode, values in results.items():
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        median = statistics.median(values)
        print(f"{args.loop} {mode:14} idle CPU: median {median:.3f} % of a core (± {spread:.3f}), runs {values}")


if __name__ == "__main__":
    main()
