"""Waking the watchdog as an idle loop wakes: no blind window after a quiet spell (issue 29).

After half a second of quiet the watchdog looks only every
`idle_interval_ms` (each wake-up of its thread is its main cost). A stall
that began and ended between two such looks went unseen: a 45 ms stall at
a 30 ms threshold after a quiet second was missed about half the time. A
faster rate bound by the threshold would cost several times the idle
budget, so the loop tells the watchdog instead, as it wakes.

As the watchdog goes to its long sleep it arms each idle loop: one callback
(`call_soon_threadsafe`, the only call every loop takes from another thread)
installs a profile function on the loop's own thread. The loop then waits in
its selector and runs no Python code: the function costs nothing while the
loop is idle. At the first event after the thread has been off its CPU (it
slept in the selector, whatever the loop is written in) the function removes
itself, notes the moment (the loop woke then: the step that follows began no
earlier) and wakes the watchdog, which looks at the loop while its first step
runs, at the rate of a busy loop. A loop that does not sleep within
`_MAX_EVENTS` events after arming trips it too: the function is never left
on a busy loop's thread.

A thread that already has a profile function (a profiler, a debugger) is
not armed: such a loop keeps the idle looks and their window
(docs/concepts/watchdog.md). `sys.setprofile` raises the `sys.setprofile`
audit event on each arming and trip.
"""

from __future__ import annotations

import contextvars
import logging
import sys
from typing import TYPE_CHECKING, Any

from aiocop._clock import perf_counter, thread_time

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType

    from aiocop._loops import LoopWatch

logger = logging.getLogger("aiocop")

# Off its CPU this long between two events, the thread slept (in its
# selector, or waiting for the GIL as it woke): a loop iterating runs events
# microseconds apart on its CPU.
_OFF_CPU_S = 0.00005
# Events after arming with no sleep: the loop is busy, not idle; trip anyway.
_MAX_EVENTS = 256
# What arming costs the loop's thread besides the callback itself (woken
# from its selector, the handle run, the next wait set up), counted as the
# loop-delay probe's ticks are (_probe._LOOP_SHARE_S): the watchdog does not
# take it for the loop waking up to work.
_ARM_SHARE_S = 0.0005
# The callback runs in an empty context: none of the application's variables.
_EMPTY = contextvars.Context()


def arm(watch: LoopWatch, wake: Callable[[], None]) -> None:
    """Have `watch`'s loop wake the watchdog (`wake()`, from the loop's thread) as it next wakes.

    Called by the watchdog thread as it goes to its long sleep, for a loop it
    saw idle. Idempotent while armed.
    """
    if watch.armed:
        return
    loop = watch.loop
    # Only a running loop: some loops (rloop 0.5) replace their wake-up pipe
    # on every run, and a call sent between runs could reach a reused fd.
    if loop is None or not loop.is_running():
        return
    watch.armed = True
    try:
        loop.call_soon_threadsafe(_install, watch, wake, context=_EMPTY)
    except Exception:  # closed meanwhile, or a loop that takes no context
        watch.armed = False


def _install(watch: LoopWatch, wake: Callable[[], None]) -> None:
    # On the loop's thread, as one of its callbacks. Never raises into the loop.
    started = thread_time()
    if not watch.armed or sys.getprofile() is not None:
        watch.armed = False  # disarmed meanwhile, or the thread's profile is someone else's
        return
    # [wall clock, thread CPU clock] at the last event, and events seen.
    last = [perf_counter(), started]
    events = [0]

    def tripwire(frame: FrameType, event: str, arg: Any) -> None:
        now, cpu = perf_counter(), thread_time()
        if watch.armed and (now - last[0]) - (cpu - last[1]) < _OFF_CPU_S and events[0] < _MAX_EVENTS:
            last[0], last[1] = now, cpu
            events[0] += 1
            return
        sys.setprofile(None)
        if watch.armed:
            watch.armed = False
            watch.tripped = now
            try:
                wake()
            except Exception:
                logger.exception("aiocop: could not wake the watchdog (ignored)")

    watch.tripwire = tripwire
    sys.setprofile(tripwire)
    watch.probe_cpu += thread_time() - started + _ARM_SHARE_S
