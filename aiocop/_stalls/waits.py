"""When an idle loop written in C wakes for its next timer, from the system call its thread waits in (Linux; issue 29).

On Python 3.12+ a loop written in C or Rust (uvloop, the stand-in of the
tests, rloop, Leviathan) cannot be armed (`tripwire`): nothing in Python
runs as it wakes. The watchdog looks at it every half threshold while it
idles, so that a wait of 1.5x the threshold is first seen within half the
threshold of its start; but a wait is timed from that first sight, and a
look that came a millisecond late (a busy machine, the thread's own
wake-up) missed it: 45 ms waits after a quiet half second were missed 2 to
4 times in 36 on uvloop and the stand-in.

The loop's thread waits in one system call, which Linux shows in
`/proc/self/task/<tid>/syscall`: `epoll_wait` (or `epoll_pwait`) on the
loop's epoll, with the timeout of its next timer in milliseconds. The call
began after the last look that saw the thread run and no later than the
first one that saw it still (`LoopState.last_ran`), so the loop wakes for
that timer between those two plus the timeout (`plan`). The watchdog looks
every few milliseconds over that span, and a step then begun is timed from
the middle of what is left of it (`woke_at`): to about 2 ms, whatever the
idle looks' rate.

A wake-up for I/O is not told in advance, nor reliably as it happens: an
epoll of the watchdog's own, watching the loop's (nested), is woken with
the loop, but Linux checks again whether the loop's epoll is still ready
before it reports it, and the loop has often taken the event by then (1 run
in 4 to 5 of the tests' cross-thread request). The threshold-bound looks
remain for those.

Nothing of the loop's is touched; the file is read only after the thread's
CPU clock says it is waiting, and again before it is trusted. Where the call
is not known (not Linux, `/proc` unreadable, another system call: io_uring,
`epoll_pwait2`, whose timeout is behind a pointer, a machine not listed in
`EPOLL_WAITS`), `plan` says so and nothing changes.

May import: aiocop._common, aiocop._interception.loops (types only), and aiocop._stalls.state.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import TYPE_CHECKING

from aiocop._stalls.state import state_of

if TYPE_CHECKING:
    from aiocop._interception.loops import LoopWatch

logger = logging.getLogger("aiocop")

# The system calls a loop waits for I/O and timers in, by machine: those
# whose first argument is the epoll and fourth the timeout (ms, -1: none).
# As data: on a machine not listed, no loop is planned for.
EPOLL_WAITS: dict[str, frozenset[int]] = {
    "x86_64": frozenset({232, 281}),  # epoll_wait, epoll_pwait
    "aarch64": frozenset({22}),  # epoll_pwait (it has no epoll_wait)
    "riscv64": frozenset({22}),  # epoll_pwait
}
# How an epoll's file reads in /proc/self/fd.
_EPOLL_LINK = "anon_inode:[eventpoll]"
# After its timer's latest possible end, how long the loop's thread is
# looked at often, waiting for it to run (on a busy machine it can wait for
# a CPU that long), before the looks go back to the threshold-bound rate.
LATE_S = 0.5
# A step is timed from its loop's timer only if a look saw it this soon
# after the timer's latest end. Seen later, the loop's thread may have been
# kept from running that long (a busy machine, a process paused or
# throttled): dated from the timer, a 5 ms step came out a 60 to 240 ms stall.
ON_TIME_S = 0.004
_WAITS = EPOLL_WAITS.get(os.uname().machine, frozenset()) if hasattr(os, "uname") else frozenset()
# Off on other systems, and for good once /proc cannot be read (a process
# that dropped its privileges, an audit hook that refuses the open).
_AVAILABLE = sys.platform == "linux" and bool(_WAITS)


class Wait:
    """When an idle loop's timer can end (perf_counter; inf: no timer; None: not known), and its thread's CPU clock."""

    __slots__ = ("cpu", "earliest", "latest")

    def __init__(self, cpu: float, earliest: float | None, latest: float | None) -> None:
        self.cpu = cpu  # the same call while the clock stays so: read once
        self.earliest = earliest
        self.latest = latest


def parse(text: str, waits: frozenset[int] = _WAITS) -> int | None:
    """The timeout (ms; -1: none) of a `/proc/.../syscall` line if it is an epoll wait, else None.

    What the kernel writes is trusted no further than its form: a line that
    is not one of `waits`, or is malformed, is None.
    """
    fields = text.split()
    if len(fields) < 5 or not fields[0].isdigit() or int(fields[0]) not in waits:
        return None
    try:
        fd, timeout = int(fields[1], 16), int(fields[4], 16)
    except ValueError:
        return None
    timeout &= 0xFFFFFFFF  # a C int in a 64-bit register, sign-extended or not
    if timeout >= 1 << 31:
        timeout -= 1 << 32
    if not 0 <= fd < 1 << 31 or timeout < -1 or not _is_epoll(fd):
        return None
    return timeout


def _is_epoll(fd: int) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == _EPOLL_LINK
    except OSError:
        return False


def plan(watch: LoopWatch) -> float | None:
    """The earliest moment `watch`'s idle loop can wake for its next timer (inf: it has none; None: not known).

    Called by the watchdog thread, for a loop the last looks saw idle. The
    file is read once per wait (again only after the thread has run).
    """
    if not _AVAILABLE:
        return None
    cpu = watch.cpu_time()
    state = state_of(watch)
    ran = state.last_ran
    if cpu is None or cpu != state.idle_cpu or ran is None or ran[1] >= state.idle_t:
        # Ran since the last look, or never seen to (when its wait began is
        # not known), or no look has seen it still since (a busy loop, idle
        # only at this look: the file is not read at every look).
        return None
    wait = state.wait
    if wait is None or wait.cpu != cpu:
        # Read once per wait, known or not (a loop waiting in io_uring is
        # not read again at every look while it idles).
        state.wait = wait = _read(watch, ran, cpu)
    return wait.earliest if wait is not None and wait.latest is not None and wait.cpu == cpu else None


def _read(watch: LoopWatch, ran: tuple[float, float], cpu: float) -> Wait | None:
    global _AVAILABLE
    native = native_id(watch.thread_id)
    if native is None:
        return Wait(cpu, None, None)
    try:
        with open(f"/proc/self/task/{native}/syscall", encoding="ascii") as file:
            text = file.read(512)
    except (FileNotFoundError, ProcessLookupError):
        return None  # (the thread ended: next look)
    except Exception:
        # Unreadable (EACCES once a process drops its privileges, an audit
        # hook that refuses the open, /proc not what it is on Linux): off for good.
        _AVAILABLE = False
        logger.debug("aiocop: %s unreadable; loops written in C are looked at every half threshold", "/proc")
        return None
    timeout = parse(text)
    if watch.cpu_time() != cpu:
        return None  # it woke meanwhile: that line may be of another call
    if timeout is None or timeout == 0:
        return Wait(cpu, None, None)  # not waiting in an epoll (io_uring, a lock), or not waiting
    if timeout < 0:
        return Wait(cpu, float("inf"), float("inf"))
    after, settled = ran
    return Wait(cpu, after + timeout / 1000.0, settled + timeout / 1000.0)


def native_id(thread_id: int) -> int | None:
    """The kernel's id of the thread `threading` knows as `thread_id` (None: not one threading knows)."""
    thread = threading._active.get(thread_id)  # type: ignore[attr-defined]  # (a dict read: no lock, no enumerate())
    found = getattr(thread, "native_id", None) if thread is not None else None
    return found if type(found) is int else None


def woke_at(watch: LoopWatch, idle_since: float, now: float) -> float:
    """When the loop, idle at `idle_since` and seen in a step at `now`, woke for its timer (0: not known).

    The middle of the span it can have woken in: after its timer's
    earliest end and the last look that saw it idle, before its latest
    end and this look. Not within that span: woken by something else (I/O).
    Not when this look came more than ON_TIME_S after the span: the thread
    may have run that much later than its timer.
    """
    state = state_of(watch)
    wait = state.wait
    if wait is None or wait.cpu != state.idle_cpu or wait.earliest is None or wait.latest is None:
        return 0.0
    if now > wait.latest + ON_TIME_S:
        return 0.0
    low, high = max(wait.earliest, idle_since), min(wait.latest, now)
    if not low <= high:
        return 0.0
    return (low + high) / 2.0
