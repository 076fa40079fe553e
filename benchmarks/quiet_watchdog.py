"""The stall watchdog kept out of a counted region, for the benchmarks that count per task (instructions, system calls).

Each look of the watchdog takes the GIL from the loop's thread, and on an
idle loop arms it (a callback on the loop's thread): work at moments set
by the clock, which valgrind's or strace's slowdown and the machine's load
move. A look that fell in one counted region and not the other moved the
figures: from one run of the instruction table to the next by up to 12 %,
and, with CI's own jobs beside the table, by -10 % to +14 %, though the
code was the same. Which state the look left the loop in mattered too:
a look that saw the loop in a step leaves the step watched, and every
detected call then goes through the hand-over of the watchdog's stalls
(+2 k instructions per `os.stat` on asyncio), one that did not leaves it
unwatched.

So, in a counting child: `watch_slowly` after `detect_slow_tasks` spaces
the looks an hour apart; `counted`, called in a step of the running loop
after the warm-up, has the watchdog look from inside that step (the
regions then always run watched, as a busy loop looked at every few
milliseconds does), lets its thread finish that look (`quiesce`: 50 ms
with the GIL free, a pending wake-up taken back), runs the marked
regions, and runs them again if a look still fell inside them, up to
ATTEMPTS times (seen once under eight `yes` before `quiesce` let the
look finish and took back the wake-up, not since); it prints which
markers the kept attempt began at, and `kept` reads that back in the
parent. The loop thread's own
work for the watchdog, at each step and each detected call, stays in every
figure; what the looks cost per second is benchmarks/watchdog_busy_cost.py's.
The regions of one scenario run in one run of the loop: a loop's start can
wake the watchdog from its sleep.
"""

from __future__ import annotations

import _thread
import gc
import os
import re
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

# How far apart the looks are: longer than any counting child runs under valgrind.
LOOK_S = 3600.0
# How long the step that asked for the look lets go of the GIL after it, for the watchdog to go to sleep.
SETTLE_S = 0.05
# Attempts at a scenario's regions before the run fails.
ATTEMPTS = 3
# The line a child prints for each scenario: "<KEPT> <scenario> <marker>", the kept attempt's first marker (from 1).
KEPT = "regions kept from marker"


def watch_slowly() -> None:
    """Space the watchdog's looks LOOK_S apart, busy or idle (after `detect_slow_tasks`)."""
    from aiocop._stalls import settings as _settings
    from aiocop._stalls import watchdog as _watchdog

    _settings.sampling.busy_poll_ms = LOOK_S * 1000.0
    _settings.sampling.idle_interval_ms = LOOK_S * 1000.0
    _watchdog._FAST_IDLE_S = LOOK_S


class Markers:
    """The `os.getppid()` markers a counting child makes (callgrind dumps at each, strace lists each), numbered."""

    def __init__(self) -> None:
        self.made = 0

    def mark(self) -> None:
        os.getppid()
        self.made += 1


def quiesce() -> int:
    """Have the watchdog look now, while this step waits; return its count of looks.

    Called in a step of the running loop: the step waits for the look (a
    stall far under any threshold the benchmarks set), so the look finds
    the loop busy, arms nothing, leaves the step watched and sleeps the busy
    interval, LOOK_S. `sync` returns as the look is counted, before the
    watchdog's thread has finished it (its next sleep is chosen after, with
    a read that lets go of the GIL): the step then lets go of the GIL for
    SETTLE_S, in which that thread takes it back and goes to sleep, rather
    than at the first call of the first region. A wake-up still pending
    then (`sync` asks for looks until one is made) is taken back, or it
    would cut that sleep short. (Should the thread not be scheduled within
    SETTLE_S on a loaded machine, the rest of its look, some thousands of
    instructions and a few system calls, lands in the first region: it can
    only lower a figure, by about ten instructions per task.)
    """
    from aiocop._stalls import watchdog as _watchdog

    watchdog = _watchdog.watchdog
    if not watchdog.sync(timeout=120.0):
        sys.exit("the watchdog did not look within 120 s of being asked to (is detect_slow_tasks on?)")
    # A timed wait on a held lock, with the lock's C method: time.sleep here
    # would be a blocking call aiocop reports, in every scenario.
    pause = _thread.allocate_lock()
    pause.acquire()
    _watchdog._acquire(pause, True, SETTLE_S)
    watchdog._waker.acquire(False)  # (taken if it was released: the watchdog's sleep is then not cut short)
    return watchdog.polls


def looks_since(polls: int) -> int:
    from aiocop._stalls import watchdog as _watchdog

    return _watchdog.watchdog.polls - polls


async def counted(
    key: str,
    where: str,
    watched: bool,
    markers: Markers,
    regions: Callable[[], Awaitable[None]],
    reset: Callable[[], None],
) -> None:
    """Run `regions` (which marks its regions with `markers`), again if the watchdog looked inside; print the kept one.

    `key`: the scenario's name in the KEPT line; `where`: the scenario, for
    messages; `watched`: whether the watchdog runs (else one attempt, no
    look to wait for); `reset`: called before each attempt (the counts of
    events it checks).
    """
    for attempt in range(1, ATTEMPTS + 1):
        reset()
        polls = quiesce() if watched else 0
        # A full collection traverses every object of the process: one that
        # falls in one region and not the other would add a lump of millions
        # of instructions. Frozen, the start-up's objects are never traversed
        # again; what the tasks allocate is still collected as usual.
        gc.collect()
        gc.freeze()
        first = markers.made + 1
        await regions()
        looks = looks_since(polls) if watched else 0
        if not looks:
            print(f"{KEPT} {key} {first}", flush=True)
            return
        print(f"{where}: the watchdog looked {looks} time(s) inside the regions of attempt {attempt}", file=sys.stderr)
    sys.exit(
        f"{where}: the watchdog looked inside the counted regions in each of {ATTEMPTS} attempts,"
        " whose counts would then follow the clock, not the code"
    )


def kept(stdout: str, keys: list[str]) -> dict[str, int]:
    """Each key's kept first marker, from a child's output; exits naming a key the child did not report."""
    found = {m.group(1): int(m.group(2)) for m in re.finditer(rf"^{KEPT} (\S+) (\d+)$", stdout, re.MULTILINE)}
    missing = [key for key in keys if key not in found]
    if missing:
        sys.exit(f"the counting child reported no kept regions for {', '.join(missing)}")
    return found
