"""How right are the durations the stall watchdog reports?

Runs stalls of several kinds and lengths on each loop and compares each
reported `elapsed_ms` with the step's own measured length. Prints, per loop
and kind, the median and worst error and the share within the SPEC tolerance
(10 % or 2 ms, whichever is larger).

    python benchmarks/watchdog_accuracy.py [--repeat 5] [--loops asyncio uvloop]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib
import math
import select
import statistics
import sys
import threading
import time
from time import sleep as bound_sleep
from typing import TYPE_CHECKING

import aiocop

if TYPE_CHECKING:
    from collections.abc import Callable

_HELD = threading.Lock()
_HELD.acquire()
_BUFFER = bytes(range(256)) * (1 << 14)


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def c_extension(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        hashlib.sha256(_BUFFER).digest()


KINDS: dict[str, Callable[[float], object]] = {
    "python": spin,
    "c-ext": c_extension,
    "bound-sleep": bound_sleep,
    "select": lambda s: select.select([], [], [], s),
    "held-lock": lambda s: _HELD.acquire(timeout=s),
}
DURATIONS_MS = (40, 60, 100, 250)


def within(reported: float, true: float) -> bool:
    return abs(reported - true) <= max(0.1 * true, 2.0)


def run_loop(name: str, repeat: int, events: list[aiocop.SlowTaskEvent]) -> dict[str, list[tuple[float, float]]]:
    pairs: dict[str, list[tuple[float, float]]] = {kind: [] for kind in KINDS}

    async def main() -> None:
        for _ in range(repeat):
            for kind, func in KINDS.items():
                for ms in DURATIONS_MS:
                    await asyncio.sleep(0.02)
                    before = len(events)
                    t0 = time.perf_counter()
                    func(ms / 1000)
                    true_ms = (time.perf_counter() - t0) * 1000
                    await asyncio.sleep(0.03)
                    new = events[before:]
                    reported = new[0].elapsed_ms if len(new) == 1 else float("nan")
                    pairs[kind].append((reported, true_ms))

    factory = asyncio.new_event_loop if name == "asyncio" else importlib.import_module(name).new_event_loop
    loop = factory()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    return pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--loops", nargs="*", default=["asyncio", "uvloop", "rloop", "veloxloop"])
    args = parser.parse_args()
    events: list[aiocop.SlowTaskEvent] = []
    aiocop.start_blocking_io_detection()
    aiocop.detect_slow_tasks(threshold_ms=30, on_slow_task=events.append)
    print(f"Python {sys.version.split()[0]}; stalls of {DURATIONS_MS} ms, {args.repeat} each; threshold 30 ms")
    print(f"{'loop':10} {'kind':12} {'n':>3} {'median err ms':>14} {'worst err ms':>13} {'within tol.':>12}")
    for name in args.loops:
        try:
            importlib.import_module(name) if name != "asyncio" else None
        except ImportError:
            print(f"{name:10} not installed")
            continue
        for kind, pairs in run_loop(name, args.repeat, events).items():
            errors = [abs(r - t) for r, t in pairs if not math.isnan(r)]
            missed = sum(1 for r, _ in pairs if math.isnan(r))
            ok = sum(1 for r, t in pairs if not math.isnan(r) and within(r, t))
            worst = max(errors) if errors else float("nan")
            med = statistics.median(errors) if errors else float("nan")
            extra = f" ({missed} missed)" if missed else ""
            print(f"{name:10} {kind:12} {len(pairs):3} {med:14.2f} {worst:13.2f} {ok:>6}/{len(pairs):<5}{extra}")
    aiocop.stop()


if __name__ == "__main__":
    main()
