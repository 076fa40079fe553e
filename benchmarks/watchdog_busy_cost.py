"""What the stall watchdog costs a loop that is always busy, paired in one process.

    python benchmarks/watchdog_busy_cost.py [--loop uvloop] [--rounds 25] [--tasks 3000]

Detection is on throughout, every task makes one `os.stat` and its event is
delivered. Each round runs the same batch of tasks three times, back to
back: with the watchdog stopped, with it polling the busy loop every 2 ms
(the default), and every 10 ms. Comparing runs a few milliseconds apart, in
one process, takes out most of what other jobs on a shared machine do to
separate processes (the full suite's method); the medians of the paired
differences are printed.

The watchdog looks at a busy loop every `busy_poll_ms`, taking the GIL from
it each time: this shows whether those looks, or their frequency, cost the
loop anything measurable.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import statistics
import time

import aiocop
from aiocop._stalls import settings as _settings
from aiocop._stalls import watchdog as _watchdog

BATCH = 1000


async def _stat() -> None:
    os.stat(".")
    await asyncio.sleep(0)


async def _run(tasks: int) -> float:
    started = time.perf_counter()
    for _ in range(0, tasks, BATCH):
        await asyncio.gather(*(_stat() for _ in range(BATCH)))
    return (time.perf_counter() - started) / tasks * 1e6


OWN_CODE = {(os.path.abspath(__file__), "_run"), (os.path.abspath(__file__), "_stat")}


def _one_stat(calls: list[aiocop.BlockingEventInfo]) -> bool:
    return len(calls) == 1 and calls[0].get("name") == "os.stat"


def _site(site: str) -> tuple[str, str]:
    # "path:line:function", the path relative to the working directory when under it
    path, _, function = site.rpartition(":")
    return os.path.abspath(path.rpartition(":")[0]), function


def _explained(event: aiocop.SlowTaskEvent) -> bool:
    """An event other than a task's os.stat that a starved machine explains.

    On a machine whose cores are all busy, a step of the benchmark's own
    coroutines (a batch's gather, a task's step) can wait for the CPU longer
    than the 30 ms threshold: the watchdog then rightly reports it as a stall
    with no blocking call ("cpu_blocking"), or, held long enough, as a hang
    while it runs ("hang", its final event following). Those are extra events,
    not wrong ones, provided the stall was at a line of this file; anything
    else (a stall elsewhere, an event with calls other than the one os.stat)
    is not explained and fails the run.
    """
    stall = event.reason == "cpu_blocking" and not event.blocking_events
    hang_report = event.reason == "hang" and event.ongoing
    if not (stall or hang_report):
        return False
    sites = [event.call_site] + [sample.get("app_site", "") for sample in event.cpu_stack_samples]
    return any(_site(site) in OWN_CODE for site in sites if site)


def _describe(event: aiocop.SlowTaskEvent) -> str:
    calls = [call.get("name", call["event"]) for call in event.blocking_events]
    return f"{event.reason} {event.elapsed_ms:.0f} ms at {event.call_site or '?'} ({event.culprit}), calls {calls}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loop", default="uvloop", choices=["asyncio", "uvloop"])
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--tasks", type=int, default=3000)
    args = parser.parse_args()
    delivered = [0]
    others: list[aiocop.SlowTaskEvent] = []

    def count(event: aiocop.SlowTaskEvent) -> None:
        # Every task's os.stat, each in an event of its own. Anything else is
        # kept and explained (or not) once the runs are over.
        if event.reason == "io_blocking" and not event.ongoing and _one_stat(event.blocking_events):
            delivered[0] += 1
        else:
            others.append(event)

    aiocop.start_blocking_io_detection(trace_depth=5)
    aiocop.register_slow_task_callback(count)
    aiocop.detect_slow_tasks(threshold_ms=30)
    loop = asyncio.new_event_loop() if args.loop == "asyncio" else importlib.import_module("uvloop").new_event_loop()
    for _ in range(3):
        loop.run_until_complete(_run(args.tasks))  # warm-up
    times: dict[str, list[float]] = {"stopped": [], "2 ms": [], "10 ms": []}
    for _ in range(args.rounds):
        _watchdog.watchdog.stop()
        times["stopped"].append(loop.run_until_complete(_run(args.tasks)))
        aiocop.detect_slow_tasks(threshold_ms=30)
        for label, poll_ms in (("2 ms", 2.0), ("10 ms", 10.0)):
            _settings.sampling.busy_poll_ms = poll_ms
            times[label].append(loop.run_until_complete(_run(args.tasks)))
        _settings.sampling.busy_poll_ms = 2.0
    loop.run_until_complete(asyncio.sleep(0.01))
    loop.close()
    aiocop.stop()
    expected = (3 + 3 * args.rounds) * args.tasks
    if delivered[0] != expected:
        raise SystemExit(f"{delivered[0]} events with one blocking call delivered, expected {expected}")
    unexplained = [event for event in others if not _explained(event)]
    if unexplained:
        raise SystemExit(f"{len(unexplained)} unexplained event(s): {[_describe(e) for e in unexplained[:5]]}")
    print(f"{args.loop}, {args.rounds} rounds of {args.tasks} tasks (one os.stat each, event delivered)")
    if others:
        print(f"  also {len(others)} stall(s) of the benchmark's own steps (a starved machine)")
    base = times["stopped"]
    print(f"  watchdog stopped       {statistics.median(base):6.2f} µs/task")
    for label in ("2 ms", "10 ms"):
        extra = [t - b for t, b in zip(times[label], base, strict=True)]
        print(
            f"  polling every {label:6}  {statistics.median(times[label]):6.2f} µs/task,"
            f" extra {statistics.median(extra):+.2f} µs (quartiles {statistics.quantiles(extra, n=4)[0]:+.2f}"
            f" to {statistics.quantiles(extra, n=4)[2]:+.2f})"
        )


if __name__ == "__main__":
    main()
