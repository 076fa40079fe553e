"""System calls per task, counted by strace: what a detected call asks of the kernel, against blockbuster.

    python benchmarks/syscalls.py [--loops asyncio uvloop] [--tasks 2000] [--json]

Each mode runs in its own process under `strace -f`, its tasks each making
one `os.stat` on the loop:

- `baseline`: neither aiocop nor blockbuster imported;
- `aiocop`: detection and the stall watchdog on, as users run them, every
  event delivered to a callback that reads its `blocking_events` (formatted
  for it); the watchdog's own looks kept out of the counted regions
  (benchmarks/quiet_watchdog.py);
- `blockbuster`: `BlockBuster().activate()`; its error, raised at the call
  before the call runs, is caught (the check: one per task).

A figure is the system calls of each name made between two markers
(`os.getppid()`, which nothing else here calls) around 2N tasks, minus those
around N tasks, divided by N: start-up, warm-up and each region's fixed cost
cancel. Calls made by the loop's thread and by every other thread (the
watchdog's, the delivery worker's) are counted apart: a `futex` is a thread
waking or waiting for another, a GIL hand-off or a lock's wake-up, and the
other threads' share says which thread did the work.

System calls, unlike time, do not move with the machine's load: the watchdog
looks at the loop at moments set by the clock (every 2 ms while a loop is
busy), each look a GIL hand-off or two, so under strace, which makes every
system call of the program tens of times slower, the looks per task would
follow strace's slowdown, not aiocop's work. Here none falls in a region;
what the watchdog's looks cost per second is benchmarks/watchdog_busy_cost.py's.
tests/test_syscall_guard.py holds aiocop to blockbuster's counts (the CI guard).
Needs strace (`apt-get install strace`); Linux only.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Any

# benchmarks/quiet_watchdog.py, beside this file: run as a script, its directory is first on sys.path; the tests
# load it with tests/support/scripts.py, which puts that directory last.
import quiet_watchdog

MODES = ("baseline", "aiocop", "blockbuster")
LOOPS = ("asyncio", "uvloop")
BATCH = 200
# A strace line: "<tid> <name>(...", "<tid> <... name resumed>..." (the end of a call another thread's interrupted).
_LINE = re.compile(r"(\d+)\s+(<\.\.\. )?(\w+)")
MARKER = "getppid"

# What a blockbuster child catches; `except ():` elsewhere catches nothing and costs nothing.
CAUGHT: type[BaseException] | tuple[type[BaseException], ...] = ()
_caught = [0]


async def _stat() -> None:
    try:
        os.stat(".")
    except CAUGHT:
        _caught[0] += 1
    await asyncio.sleep(0)


def child(mode: str, loop_name: str, tasks: int) -> None:
    """Run the marked regions in this process (under strace, started by `count`)."""
    global CAUGHT
    calls = [0]
    if mode == "blockbuster":
        from blockbuster import BlockBuster, BlockingError

        CAUGHT = BlockingError
        BlockBuster().activate()  # no scanned modules: every blocking call in a loop raises
    elif mode == "aiocop":
        import aiocop

        def read(event: Any) -> None:
            if event.reason == "io_blocking":
                calls[0] += len(event.blocking_events)

        aiocop.start_blocking_io_detection(trace_depth=5)
        aiocop.register_slow_task_callback(read)
        aiocop.detect_slow_tasks(threshold_ms=30)
        quiet_watchdog.watch_slowly()
    elif mode != "baseline":
        sys.exit(f"unknown mode {mode!r}")

    async def run(count: int) -> None:
        for _ in range(0, count, BATCH):
            await asyncio.gather(*(_stat() for _ in range(BATCH)))
        await asyncio.sleep(0)  # the last batch's delivery

    markers = quiet_watchdog.Markers()

    async def regions() -> None:
        markers.mark()  # strace lists each marker
        await run(tasks)
        markers.mark()
        await run(2 * tasks)
        markers.mark()

    def reset() -> None:
        calls[0] = _caught[0] = 0

    async def scenario_run() -> None:
        # One run of the loop: its start can wake the watchdog, whose look
        # must fall outside the regions (see quiet_watchdog).
        await run(2 * BATCH)  # warm-up: caches, lazy imports, the watchdog's thread
        await quiet_watchdog.counted("stat", f"{mode} on {loop_name}", mode == "aiocop", markers, regions, reset)

    loop = asyncio.new_event_loop() if loop_name == "asyncio" else __import__(loop_name).new_event_loop()
    loop.run_until_complete(scenario_run())
    loop.close()
    seen = {"aiocop": calls[0], "blockbuster": _caught[0]}.get(mode, 3 * tasks)
    if seen != 3 * tasks:
        sys.exit(f"{mode} on {loop_name}: {seen} blocking calls seen, expected {3 * tasks}")


def parse(trace: str) -> list[collections.Counter[str]]:
    """Per region between markers, the system calls by name ("name": the marking thread; "name, other threads")."""
    regions: list[collections.Counter[str]] = []
    marking: str | None = None
    for line in trace.splitlines():
        match = _LINE.match(line)
        if match is None or match.group(2):  # a call's resumption: counted at its start
            continue
        tid, name = match.group(1), match.group(3)
        if name == MARKER:
            marking = marking or tid
            regions.append(collections.Counter())
            continue
        if regions:
            regions[-1][name if tid == marking else f"{name}, other threads"] += 1
    return regions[:-1]  # after the last marker: the loop's close, the exit


def kept_regions(
    regions: list[collections.Counter[str]], first: int, where: str
) -> tuple[collections.Counter[str], collections.Counter[str]]:
    """The kept attempt's N-task and 2N-task regions, `first` its first marker (from 1)."""
    # regions[k - 1] ran between markers k and k + 1.
    if first < 1 or len(regions) < first + 1:
        sys.exit(f"{where}: {len(regions)} marked regions in the trace, the kept ones from marker {first}")
    return regions[first - 1], regions[first]


def count(mode: str, loop_name: str, tasks: int) -> dict[str, float]:
    """System calls per task of each name: (region of 2N tasks - region of N tasks) / N."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "trace")
        command = ["strace", "-f", "-qq", "-o", out, sys.executable, __file__, "--child", mode, loop_name, str(tasks)]
        done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=600)
        if done.returncode != 0:
            sys.exit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
        with open(out, encoding="utf-8", errors="replace") as f:
            regions = parse(f.read())
    one, two = kept_regions(regions, quiet_watchdog.kept(done.stdout, ["stat"])["stat"], f"{mode} on {loop_name}")
    return {name: (two[name] - one[name]) / tasks for name in sorted(set(one) | set(two))}


def measure(loops: list[str], tasks: int) -> dict[str, dict[str, dict[str, float]]]:
    """figures[loop][mode][system call] -> calls per task."""
    return {loop: {mode: count(mode, loop, tasks) for mode in MODES} for loop in loops}


def markdown(figures: dict[str, dict[str, dict[str, float]]]) -> str:
    lines = ["| loop | system call | " + " | ".join(MODES) + " |", "| --- | --- |" + " --- |" * len(MODES)]
    for loop, by_mode in figures.items():
        names = sorted({name for counts in by_mode.values() for name in counts})
        for name in names:
            cells = [by_mode[mode].get(name, 0.0) for mode in MODES]
            if all(abs(c) < 0.005 for c in cells):
                continue  # (a call of a batch or a region, not of a task)
            lines.append(f"| {loop} | {name} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
    return "\n".join(lines)


def over_blockbuster(by_mode: dict[str, dict[str, float]], slack: float) -> list[str]:
    """The system calls aiocop makes more of per task than both blockbuster and an untouched loop, plus `slack`.

    Of each name, and of all together (the sum of each name's larger figure).
    """
    # Of each name, the call's own (an untouched loop's) or the detector's (blockbuster raises before the call).
    ours = by_mode["aiocop"]
    names = set(ours) | set(by_mode["baseline"]) | set(by_mode["blockbuster"])
    allowed = {name: max(by_mode["baseline"].get(name, 0.0), by_mode["blockbuster"].get(name, 0.0)) for name in names}
    problems = []
    for name, figure in ours.items():
        bound = allowed[name] + slack
        if figure > bound:
            problems.append(f"{name}: {figure:.3f} per task, over {bound:.3f}")
    total = sum(ours.values())
    bound = sum(allowed.values()) + slack
    if total > bound:
        problems.append(f"all system calls: {total:.3f} per task, over {bound:.3f}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loops", nargs="+", default=list(LOOPS))
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--child", nargs=3, metavar=("MODE", "LOOP", "TASKS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        mode, loop_name, tasks = args.child
        child(mode, loop_name, int(tasks))
        return 0
    if shutil.which("strace") is None:
        sys.exit("strace is not installed (Debian: apt-get install strace)")
    figures = measure(args.loops, args.tasks)
    print(json.dumps(figures, indent=1) if args.json else markdown(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
