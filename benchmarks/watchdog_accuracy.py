"""Stall recall and duration error of the watchdog, after idle gaps and under concurrency.

Each stall is a step that holds its loop for a multiple of the threshold
(1.2x, 1.5x, 2x, 3x), after the loop has idled for a gap: 0 to 1.55 s, with
several either side of the moment the watchdog slows its looks (half a
second of quiet) and some not a multiple of its idle interval (a server's
first request after a quiet second is the case a slowed watchdog gets
wrong). Kinds:
pure-Python work, a C extension (hashlib), and a wait aiocop cannot
intercept (`time.sleep` bound before aiocop patched it). In the concurrent
case, the stall is a second task's step, run in the same loop iteration
right after another task's `os.stat()`: it must be reported on its own task,
not merged into the first task's event.

A stall counts as recalled when exactly one event names its task (each
stall's task has a name of its own: a report that comes late, from a
watchdog the machine starved of CPU, is still counted, and told apart); its error
is the reported `elapsed_ms` against the step's own measured length (the
SPEC's tolerance: 10 % or 2 ms, whichever is larger). `--busy N` runs N
CPU-bound processes alongside (a shared machine whose cores are busy).
Each gap ends as the loop's own timer ends (`asyncio.sleep`), or with
`--wake io` as another thread's call wakes it (a request after a quiet
spell: nothing tells the watchdog in advance); `--idle-looks` chooses
`start_cpu_sampling(precise_idle=...)` for the loops that cannot be armed.

Loops: `asyncio`, `uvloop`, and `bound`, the stand-in for Leviathan
(tests/support/bound_loop.py: a loop written in C that binds its start signals at
import, imported here before aiocop is set up, so that aiocop is never told
it started and finds it on its thread's stack); `leviathan` when built by
hand (docs/how-to/loops.md), imported before set-up too.

    python benchmarks/watchdog_accuracy.py [--repeat 3] [--loops asyncio uvloop bound] [--busy 2] [--gaps 0 0.5 1.2]
        [--idle-looks cheap|precise] [--wake timer|io]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from time import sleep as bound_sleep  # bound before aiocop patches time.sleep
from typing import TYPE_CHECKING

import aiocop
from aiocop._stalls.watchdog import watchdog as _watchdog  # (its count of looks: what a miss had)

if TYPE_CHECKING:
    from collections.abc import Callable

THRESHOLD_MS = 30.0
MULTIPLES = (1.2, 1.5, 2.0, 3.0)
GAPS_S = (0.0, 0.05, 0.3, 0.45, 0.5, 0.52, 0.55, 0.6, 0.73, 1.2, 1.55)
ROOT = Path(__file__).resolve().parent.parent
_BUFFER = bytes(range(256)) * (1 << 14)


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def c_extension(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        hashlib.sha256(_BUFFER).digest()


KINDS: dict[str, Callable[[float], object]] = {"python": spin, "c-ext": c_extension, "bound-sleep": bound_sleep}


def within(reported: float, true: float) -> bool:
    return abs(reported - true) <= max(0.1 * true, 2.0)


@dataclass
class Cell:
    """The stalls of one (loop, case, gap, multiple): reported durations against true ones."""

    pairs: list[tuple[float, float]] = field(default_factory=list)  # (reported or NaN, true)
    split: int = 0  # stalls reported as more than one event (the rest of the misses: none)
    late: int = 0  # reported, but more than 50 ms after the stall ended (counted as recalled)
    missed: list[tuple[float, float, int]] = field(default_factory=list)  # (ms, loop thread's CPU share, looks)

    def recall(self) -> tuple[int, int]:
        return sum(1 for r, _ in self.pairs if not math.isnan(r)), len(self.pairs)

    def within(self) -> int:
        return sum(1 for r, t in self.pairs if not math.isnan(r) and within(r, t))

    def median_error(self) -> float:
        errors = [abs(r - t) for r, t in self.pairs if not math.isnan(r)]
        return statistics.median(errors) if errors else math.nan


async def idle_for(gap: float, wake: str) -> None:
    if wake == "timer":
        await asyncio.sleep(gap)
        return
    # Woken by another thread (the loop's self-pipe: I/O), as a server's
    # first request after a quiet spell wakes it: no timer of the loop's
    # ends, and a loop written in C tells no one.
    loop = asyncio.get_running_loop()
    woken = loop.create_future()
    threading.Timer(gap, loop.call_soon_threadsafe, (woken.set_result, None)).start()
    await woken


def run_loop(
    name: str, repeat: int, gaps: tuple[float, ...], events: list[aiocop.SlowTaskEvent], wake: str = "timer"
) -> dict[tuple[str, float, float], Cell]:
    cells: dict[tuple[str, float, float], Cell] = {}

    async def stall(func: Callable[[float], object], seconds: float, lengths: list[float]) -> None:
        polls, cpu, t0 = _watchdog.polls, time.thread_time(), time.perf_counter()
        func(seconds)
        t1 = time.perf_counter()
        lengths.append((t1 - t0) * 1000)
        # What the machine left of it: the loop thread's share of a CPU, and
        # the watchdog's looks completed while it ran (a miss's likely cause).
        shares.append(((time.thread_time() - cpu) / (t1 - t0), _watchdog.polls - polls))
        await asyncio.sleep(0)

    async def io_step() -> None:
        os.stat("/")
        await asyncio.sleep(0)

    async def one(case: str, gap: float, multiple: float, func: Callable[[float], object]) -> None:
        await idle_for(gap, wake)
        before = len(events)
        lengths: list[float] = []
        seconds = multiple * THRESHOLD_MS / 1000
        if case == "concurrent":
            io = asyncio.ensure_future(io_step())
            io.set_name("io")
        name = f"stall-{len(stalls)}"  # its own name: a report that comes late is still its own
        task = asyncio.ensure_future(stall(func, seconds, lengths))
        task.set_name(name)
        await task
        if case == "concurrent":
            await io
        await asyncio.sleep(0.05)  # the watchdog reports a stall just after it ends
        on_time = sum(1 for e in events[before:] if e.task_name == name)
        stalls.append(((case, gap, multiple), name, lengths[0], on_time))

    stalls: list[tuple[tuple[str, float, float], str, float, int]] = []
    shares: list[tuple[float, int]] = []
    first = len(events)

    async def main() -> None:
        for _ in range(repeat):
            for gap in gaps:
                for multiple in MULTIPLES:
                    for kind, func in KINDS.items():
                        await one(kind, gap, multiple, func)
                    await one("concurrent", gap, multiple, spin)

    loop = new_loop(name)
    try:
        loop.run_until_complete(main())
        loop.run_until_complete(asyncio.sleep(0.5))  # reports still on their way (a starved watchdog's)
    finally:
        loop.close()
    for (key, task_name, length, on_time), (share, looks) in zip(stalls, shares, strict=True):
        mine = [e for e in events[first:] if e.task_name == task_name]
        cell = cells.setdefault(key, Cell())
        cell.pairs.append((mine[0].elapsed_ms if len(mine) == 1 else math.nan, length))
        cell.split += len(mine) > 1
        cell.late += len(mine) == 1 and not on_time
        if len(mine) != 1:
            cell.missed.append((length, share, looks))
    return cells


def new_loop(name: str) -> asyncio.AbstractEventLoop:
    if name == "asyncio":
        return asyncio.new_event_loop()
    if name == "bound":
        return sys.modules["tests.support.bound_loop"].BoundLoop()  # type: ignore[no-any-return]
    if name == "leviathan":  # built by hand: docs/how-to/loops.md
        return sys.modules["leviathan"].Loop()  # type: ignore[no-any-return]
    return importlib.import_module(name).new_event_loop()  # type: ignore[no-any-return]


def import_loop(name: str) -> None:
    """Import the loop's module (before aiocop is set up: the stand-in binds its start signals then)."""
    if name == "bound":
        sys.path.insert(0, str(ROOT))
        importlib.import_module("tests.support.bound_loop")
    elif name != "asyncio":
        importlib.import_module(name)


def hogs(count: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--loops", nargs="*", default=["asyncio", "uvloop", "bound"])
    parser.add_argument("--gaps", nargs="*", type=float, default=list(GAPS_S), help="idle gaps before a stall (s)")
    parser.add_argument("--busy", type=int, default=0, help="CPU-bound processes to run alongside")
    parser.add_argument(
        "--idle-looks",
        choices=("cheap", "precise"),
        default="precise",
        help="how an idle loop that cannot be armed is looked at: start_cpu_sampling(precise_idle=...)",
    )
    parser.add_argument(
        "--wake",
        choices=("timer", "io"),
        default="timer",
        help="what ends each idle gap: the loop's own timer (asyncio.sleep), or another thread's call (I/O)",
    )
    args = parser.parse_args()
    gaps = tuple(args.gaps)
    if not gaps or any(not math.isfinite(g) or g < 0 for g in gaps):
        parser.error("--gaps: idle gaps in seconds, finite and not negative")
    events: list[aiocop.SlowTaskEvent] = []
    installed = []
    for name in args.loops:
        try:
            import_loop(name)
        except ImportError:
            print(f"{name}: not installed")
            continue
        installed.append(name)
    aiocop.start_blocking_io_detection()
    aiocop.start_cpu_sampling(precise_idle=args.idle_looks == "precise")
    aiocop.detect_slow_tasks(threshold_ms=THRESHOLD_MS, on_slow_task=events.append)
    print(
        f"Python {sys.version.split()[0]}, {os.cpu_count()} cores, {args.busy} CPU-bound processes alongside; "
        f"threshold {THRESHOLD_MS:g} ms; {args.repeat} stalls per cell; {args.idle_looks} idle looks; "
        f"gaps ended by {args.wake}"
    )
    busy = hogs(args.busy)
    try:
        for name in installed:
            report(name, gaps, run_loop(name, args.repeat, gaps, events, args.wake))
    finally:
        for hog in busy:
            hog.kill()
    aiocop.stop()


def report(name: str, gaps: tuple[float, ...], cells: dict[tuple[str, float, float], Cell]) -> None:
    print(f"\n{name}: recalled / stalls (within 10 % or 2 ms), per idle gap before the stall")
    header = f"| case | stall | {' | '.join(f'{g:g} s' for g in gaps)} | median error |"
    print(header)
    print("|" + " --- |" * (header.count("|") - 1))
    for case in (*KINDS, "concurrent"):
        for multiple in MULTIPLES:
            row = [cells[(case, gap, multiple)] for gap in gaps]
            shown = []
            for cell in row:
                got, total = cell.recall()
                shown.append(f"{got}/{total} ({cell.within()})")
            errors = [e for cell in row for e in [cell.median_error()] if not math.isnan(e)]
            median = f"{statistics.median(errors):.1f} ms" if errors else "-"
            print(f"| {case} | {multiple:g}x | {' | '.join(shown)} | {median} |")
    by_gap = []
    for gap in gaps:
        same_gap = [c for (_, g, m), c in cells.items() if g == gap and m >= 1.5]
        by_gap.append(f"{sum(c.recall()[0] for c in same_gap)}/{sum(c.recall()[1] for c in same_gap)}")
    print(f"\n{name}, stalls of 1.5x and above, per gap: | {' | '.join(by_gap)} |")
    print(
        f"\n{name}, each stall missed at 1.5x and above: its length, the loop thread's CPU share, the watchdog's looks"
    )
    for (case, gap, multiple), cell in sorted(cells.items()):
        for length, share, looks in cell.missed if multiple >= 1.5 else ():
            print(f"- {case} {multiple:g}x after {gap:g} s: {length:.1f} ms, CPU share {share:.2f}, {looks} looks")
    every = list(cells.values())
    at_or_above = [c for (_, _, m), c in cells.items() if m >= 1.5]
    for label, group in (("all", every), ("1.5x and above", at_or_above)):
        got = sum(c.recall()[0] for c in group)
        count = sum(c.recall()[1] for c in group)
        ok = sum(c.within() for c in group)
        split = sum(c.split for c in group)
        late = sum(c.late for c in group)
        print(
            f"{name} {label}: recall {got}/{count} ({100 * got / count:.1f} %), within tolerance {ok}/{count}"
            f" (of the misses, {split} reported as two events or more, {count - got - split} not at all;"
            f" {late} recalled reported more than 50 ms after the stall ended)"
        )


if __name__ == "__main__":
    main()
