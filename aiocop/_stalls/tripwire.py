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
loop is idle. An event after the thread has been off its CPU (it slept in
its selector, whatever the loop is written in) marks the moment the loop
woke; at the first event after that in a frame that is not the loop's own
(asyncio's, the selector's) nor aiocop's, the application's work has begun:
the function removes itself, and wakes the watchdog, which looks at the loop
while that step runs, at the rate of a busy loop, and times it from the
moment the loop woke. aiocop's own callbacks on the loop (the loop-delay
probe's tick, every half second) pass through without tripping it: taking
the function off and putting it back for each tick cost more than the tick
(each `sys.setprofile` makes Python 3.12+ re-instrument the code that runs
next). A loop that runs `_MAX_EVENTS` events without sleeping trips it too:
the function is never left on a busy loop's thread.

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

from aiocop._common.clock import perf_counter, thread_time
from aiocop._interception import frames as _frames
from aiocop._interception.frames import Kind

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType

    from aiocop._interception.loops import LoopWatch

logger = logging.getLogger("aiocop")

# Off its CPU this long between two events, the thread slept (in its
# selector, or waiting for the GIL as it woke): a loop iterating runs events
# microseconds apart on its CPU.
_OFF_CPU_S = 0.00005
# Events with no sleep in between: the loop is busy, not idle; trip anyway.
_MAX_EVENTS = 256
# Frames whose events are the loop's own work or aiocop's, not a step's.
_LOOPS_OWN = (Kind.LOOP, Kind.AIOCOP)
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
    if watch.armed or watch.unarmable:
        return
    loop = watch.loop
    # Only a running loop: some loops (rloop 0.5) replace their wake-up pipe
    # on every run, and a call sent between runs could reach a reused fd.
    if loop is None or not loop.is_running():
        return
    watch.armed = True
    watch.tripwire_set = 0.0
    try:
        loop.call_soon_threadsafe(_install, watch, wake, context=_EMPTY)
    except Exception:  # closed meanwhile, or a loop that takes no context
        watch.armed = False


def _install(watch: LoopWatch, wake: Callable[[], None]) -> None:
    # On the loop's thread, as one of its callbacks. Never raises into the loop.
    started = thread_time()
    if not watch.armed:
        return  # disarmed meanwhile
    if sys.getprofile() is not None:
        # The thread's profile function is someone else's (a profiler, a
        # debugger): left alone, and not asked again (each ask wakes the loop).
        watch.armed = False
        watch.unarmable = True
        watch.probe_cpu += thread_time() - started + _ARM_SHARE_S
        return
    # [wall clock at the last event, thread CPU clock at the last one read];
    # when the loop woke (0: not since arming) and the events since it last
    # slept. A CPU clock read a while back only makes the thread seem to
    # have slept less: never a sleep seen that was not.
    last = [perf_counter(), started]
    woke = [0.0]
    events = [0]

    def tripwire(frame: FrameType, event: str, arg: Any) -> None:
        if watch.own:  # aiocop's own callback (the probe's tick): not the loop's work
            return
        now = perf_counter()
        if now - last[0] >= _OFF_CPU_S:  # (the thread's CPU clock is a system call: read only then)
            cpu = thread_time()
            if (now - last[0]) - (cpu - last[1]) >= _OFF_CPU_S:
                woke[0] = now
                events[0] = 0
            last[1] = cpu
        last[0] = now
        events[0] += 1
        if watch.armed and events[0] < _MAX_EVENTS:
            if not woke[0] or _frames.frame_kind(frame) in _LOOPS_OWN:
                return
            if frame.f_globals.get("__name__") == "selectors":  # (asyncio's wait, in the stdlib)
                return
        sys.setprofile(None)
        if watch.armed:
            watch.armed = False
            watch.tripped = woke[0] or now
            try:
                wake()
            except Exception:
                logger.exception("aiocop: could not wake the watchdog (ignored)")

    watch.tripwire = tripwire
    sys.setprofile(tripwire)
    watch.tripwire_set = perf_counter()
    watch.probe_cpu += thread_time() - started + _ARM_SHARE_S


def in_place(watch: LoopWatch) -> bool:
    """Whether `watch`'s loop, if armed, is sure to wake the watchdog at its next step.

    Arming is a callback the loop runs later: until then, and until a look
    has seen the loop idle since (back in its selector: the function trips
    only after the thread has slept), a step that starts is seen by no
    tripwire, and, with the watchdog in its long sleep, by no look either. A
    loop that announced its step then slept 100 ms went unseen (the
    benchmark's stalls right as the watchdog slowed down, 8 of 21 missed
    stalls with both cores busy). A loop not armed (not running, never
    armable, or already tripped) has nothing to wait for.
    """
    if not watch.armed:
        return True
    done = watch.tripwire_set
    return bool(done) and done < watch.idle_t
