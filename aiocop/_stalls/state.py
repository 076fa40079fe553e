"""The watchdog's view of one loop: what its looks, the tripwire and the probe's ticks note of it.

The loops' tracking (`_interception.loops.LoopWatch`) knows a loop as its start and stop tell it: the
loop, its thread, the frame that called into it. All the watchdog notes of the loop as it watches is
here, in a `LoopState` the watch holds (`LoopWatch.watchdog`): made for each loop registered once the
watchdog's sink is installed (`watchdog.install_sink` hands this class to the tracking as its factory).
The tracking below may not import this module; it tells the state of a loop's start, stop and fork
through `loops.WatchdogState`, the three methods it calls.

Written by the watchdog's thread, except where a field says the loop's thread writes it (the probe's
tick, the tripwire) or the delivery (`delivered`, under the watchdog's merge_lock).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from aiocop._common import forksafe as _forksafe

if TYPE_CHECKING:
    from collections.abc import Callable

    from aiocop._interception.loops import LoopWatch
    from aiocop._stalls.timing import Step
    from aiocop._stalls.waits import Wait


class LoopState:
    """What the watchdog notes of one loop (see the module's docstring)."""

    __slots__ = (
        "armed",
        "beat_done",
        "beat_posted",
        "idle_cpu",
        "idle_t",
        "last_io",
        "last_io_ident",
        "last_ran",
        "own",
        "probe_cpu",
        "probe_seen",
        "probe_started",
        "step",
        "tripped",
        "tripwire",
        "tripwire_set",
        "unarmable",
        "wait",
    )

    def __init__(self) -> None:
        self.step: Step | None = None  # the step the last look saw the loop in (None: idle)
        self.beat_posted = 0.0  # perf_counter() of the heartbeat in flight, or 0
        self.beat_done = 0.0  # when the last heartbeat ran on the loop
        self.last_io: tuple[float, float] = (0.0, 0.0)  # window of the last io event delivered
        # and the hash() of its step (`_stacks.step_of`, a frame, whose hash
        # is its address, as id() would give without id()'s audit event): not
        # the frame itself, which would keep its locals (the task) alive. An
        # address can be reused once the frame has gone, but only by a step
        # that began after that delivery, which the window tells apart.
        self.last_io_ident = 0
        self.idle_t = 0.0  # last poll that saw the loop idle, and its CPU clock then
        self.idle_cpu: float | None = None
        # Between which two looks its thread last used CPU (None: not seen
        # yet): an idle loop's wait began then (_stalls/waits.py), and the
        # system call it waits in, read by the watchdog.
        self.last_ran: tuple[float, float] | None = None
        self.wait: Wait | None = None
        # CPU time this thread spent in the loop-delay probe's ticks (with an
        # allowance for the loop's own work around each), added by the loop's
        # thread: the watchdog does not take it for the loop waking up.
        self.probe_cpu = 0.0
        self.probe_seen = 0.0  # probe_cpu at the watchdog's last look (owned by the watchdog)
        # The tripwire (_stalls/tripwire.py): armed while the watchdog sleeps long,
        # and when it last fired (perf_counter(), written by the loop's thread
        # as the loop woke), and the profile function it installed.
        self.armed = False
        self.tripped = 0.0
        self.tripwire: Callable[..., object] | None = None
        self.tripwire_set = 0.0  # when its thread installed it, since the last arming (0: not yet)
        self.unarmable = False  # its thread had a profile function of its own: never armed again
        self.own = False  # the loop runs aiocop's own callback (the probe's tick): the tripwire lets it pass
        # When the probe's tick under way began (perf_counter()) and its
        # thread's CPU clock then (None: no tick under way), one attribute
        # read at once: a tick that holds the loop past `arm_after` (or the
        # threshold) is a step like any other, timed from here (_stalls/stacks.py).
        self.probe_started: tuple[float, float] | None = None

    # What the loops' tracking tells (loops.WatchdogState).

    def loop_started(self, now: float, cpu: float | None) -> None:
        """The loop starts, idle at `now` (its thread's CPU clock at `cpu`), before its first step.

        Without a look at it idle, the watchdog would time a step it first sees already running from a
        guess half an idle interval back, and report a short first step (a test body right after its loop
        started) as a stall.
        """
        self.idle_t = now
        self.idle_cpu = cpu

    def loop_gone(self, on_its_thread: bool) -> None:
        """The loop stopped (told by its thread if `on_its_thread`) or was replaced by another on its thread."""
        self.armed = False  # a tripwire still installed on its thread removes itself at its next event
        if on_its_thread and self.tripwire is not None and sys.getprofile() is self.tripwire:
            sys.setprofile(None)  # (this thread's own: the application's code after the loop runs unprofiled)

    def after_fork(self) -> None:
        """In a forked child whose forking thread runs the loop on: the step under way is the parent's."""
        self.step = None

    def delivered(self, ident: object, start: float, end: float) -> None:
        """An io event of step `ident`, lasting from `start` to `end`, has been delivered (under merge_lock).

        A stall of that step the watchdog finishes later (its look was taken
        before the delivery) is not reported again.
        """
        self.last_io = (start, end)
        self.last_io_ident = hash(ident)  # not id(): an audit event (issue 26)


def state_of(watch: LoopWatch) -> LoopState:
    """The watchdog's state of `watch`'s loop (the watchdog, the tripwire, the probe, delivery, hang reports).

    Made with the watch once the watchdog's sink is installed; a watch registered before that (none is,
    as `_api` installs the sink before the tracking starts) gets its state here, at first use, once
    whichever thread asks first, beginning from the loop's start if the tracking told it.
    """
    state = watch.watchdog
    if type(state) is LoopState:
        return state
    return _made_for(watch)


# Makes one LoopState for a watch registered before the factory (state_of): the watchdog's thread and the
# loop's (the probe's tick, the tripwire) may both be first, and each must get the same one.
_making = _forksafe.lock()


def _made_for(watch: LoopWatch) -> LoopState:
    _forksafe.acquire(_making)  # (the C method: `with` would pass through aiocop's wrapper on a loop's thread)
    try:
        state = watch.watchdog
        if type(state) is LoopState:
            return state
        made = LoopState()
        started = getattr(state, "started", None)  # (the loop's start, kept by loops._Unwatched)
        if started is not None:
            made.loop_started(*started)
        watch.watchdog = made
        return made
    finally:
        _forksafe.release(_making)
