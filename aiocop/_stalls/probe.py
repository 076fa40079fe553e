"""A cheap periodic probe of how late each event loop runs its timers.

Stalls are what the watchdog reports: steps that held a loop past the
threshold. A healthy loop's delay (a fraction of a millisecond, a few
milliseconds under load) is below anything it reports, yet it is what a
loop-delay histogram is mostly made of. The probe measures it the way
Node's `monitorEventLoopDelay` does: a timer on each loop, due every
`interval` seconds; how late its callback runs is the loop's delay.

Each loop gets its probe when it is first seen running (`_loops` tells of
every loop start, in any thread) and loses it when the loop stops: a timer
left behind would wake a stopped loop's next run for nothing, and would be a
second probe once the loop started again. Between runs nothing of aiocop is
scheduled on the loop.
"""

from __future__ import annotations

import contextvars
import logging
import os
import weakref
from collections import deque
from threading import get_ident
from typing import TYPE_CHECKING

from aiocop._common import forksafe as _forksafe
from aiocop._common.clock import perf_counter, thread_time
from aiocop._interception import loops as _loops
from aiocop._stalls.state import state_of

if TYPE_CHECKING:
    from asyncio import AbstractEventLoop
    from collections.abc import Callable

    from aiocop._interception.loops import LoopWatch

logger = logging.getLogger("aiocop")
# aiocop's own lock is taken with the lock type's C methods: `with lock:` would
# pass through aiocop's Python wrapper of `__enter__` on a loop's thread (issue 26).
_acquire, _release = _forksafe.acquire, _forksafe.release
# weakref.ref(loop) without a callback: the loop's one shared reference, made once.
_ref = weakref.ref

# What a loop's thread spends around each tick besides the probe's own
# callback (woken from its selector, the timer popped, the handle run, the
# next wait set up): 100-140 us of CPU clock after an idle second (caches
# gone cold), measured on asyncio; counted generously. A real step of less
# than this, in the same look as a tick, does not hurry the watchdog.
_LOOP_SHARE_S = 0.0005

# The probe's timers run in an empty context: none of the application's
# context variables (a request id, the current span) is theirs. A new one
# each time: a context is entered by one thread at a time, and one shared by
# every loop made each other loop's tick fail (never to be armed again)
# while one loop's `record` waited on its SDK's lock (review, 2026-11-26).
_empty = contextvars.Context

# Set by the watchdog: (watch, (start, CPU clock) of the tick, its `record`)
# -> None, told of each tick's end on the loop's thread, while it still runs:
# a tick that held the loop and that no look saw is reported from there.
tick_ending: Callable[[LoopWatch, tuple[float, float], Callable[[float], None]], None] | None = None


class DelayProbe:
    """Times a timer due every `interval` seconds on each running loop; `record(delay_s)` each lateness.

    `record` runs on the loop's thread, from the probe's own callback, so it
    must be quick (a histogram's `record`). A stall is recorded whole, once,
    by whoever reports stalls, who tells the probe (`stalled`): the part of a
    tick's lateness a stall explains is taken out of it, so that the stall is
    not counted again, in part, while lateness no stall explains (a loop
    overloaded with many short steps) is recorded in full. Each tick's
    lateness is recorded at the next tick (or as its loop stops), when the
    watchdog has reported any stall in its window.
    """

    def __init__(self, interval: float, record: Callable[[float], None]) -> None:
        self.interval = interval
        self._record = record
        # Keyed by a weak reference to the loop (it hashes and compares as
        # the loop while the loop lives, and keeps it from nothing), not by
        # id(loop): id() is an audited builtin, each call of it a round
        # through every audit hook, and a tick looks its loop up several times.
        # loop -> (the loop, weakly; the token its pending timer carries).
        # A timer whose token is no longer its loop's entry stops there: the
        # loop stopped (and may run again, with a new probe), or the probe
        # was stopped.
        self._ticking: dict[weakref.ref[AbstractEventLoop], tuple[weakref.ref[AbstractEventLoop], object]] = {}
        # loop -> the last tick's lateness, not recorded yet: (its window's start and end, its thread).
        self._unsettled: dict[weakref.ref[AbstractEventLoop], tuple[float, float, int]] = {}
        # Recent stalls: (thread, start, end), perf_counter() times.
        self._stalls: deque[tuple[int, float, float]] = deque(maxlen=256)
        self._lock = _forksafe.lock()
        self._running = False
        self._record_failed = False
        _probes.add(self)

    def stalled(self, thread_id: int, start: float, end: float) -> None:
        """A stall of the loop of `thread_id` held it from `start` to `end` (perf_counter()), recorded whole."""
        self._stalls.append((thread_id, start, end))

    def _settle(self, key: weakref.ref[AbstractEventLoop]) -> None:
        unsettled = self._unsettled.pop(key, None)
        if unsettled is None:
            return
        start, end, thread_id = unsettled
        explained = sum(
            max(0.0, min(end, s_end) - max(start, s_start))
            for s_thread, s_start, s_end in list(self._stalls)
            if s_thread == thread_id
        )
        self._record(max(end - start - explained, 0.0))

    def start(self) -> None:
        """Probe every loop running now and every loop that starts from now on."""
        _acquire(self._lock)
        try:
            self._running = True
        finally:
            _release(self._lock)
        _loops.add_listener(self)
        for watch in list(_loops.watches.values()):
            loop = watch.loop
            if loop is not None and loop.is_running():
                self.loop_started(loop)

    def stop(self) -> None:
        """Stop probing: each loop's pending timer, when it runs, schedules no other."""
        _loops.remove_listener(self)
        _acquire(self._lock)
        try:
            self._running = False
            self._ticking.clear()
            self._unsettled.clear()
        finally:
            _release(self._lock)

    def probing(self, loop: AbstractEventLoop) -> bool:
        entry = self._ticking.get(_ref(loop))
        return entry is not None and entry[0]() is loop

    # _loops.LoopListener

    def loop_started(self, loop: AbstractEventLoop) -> None:
        token = object()
        _acquire(self._lock)
        try:
            if not self._running or self.probing(loop):
                return
            # Loops gone without a stop aiocop saw (found running, then collected) leave entries: dropped here.
            for key in [k for k, (ref, _) in self._ticking.items() if ref() is None]:
                del self._ticking[key]
            key = _ref(loop)
            self._ticking[key] = (key, token)
        finally:
            _release(self._lock)
        # From any thread (a loop found running by the watchdog, or the one
        # that called instrument()): the only call a loop takes from anywhere.
        try:
            loop.call_soon_threadsafe(self._arm, loop, token, context=_empty())
        except Exception:  # closed meanwhile, or a loop that takes no context
            self._forget(loop, token)

    def loop_stopped(self, loop: AbstractEventLoop) -> None:
        _acquire(self._lock)
        try:
            entry = self._ticking.get(_ref(loop))
            if entry is not None and entry[0]() is loop:
                del self._ticking[_ref(loop)]
        finally:
            _release(self._lock)
        self._settle(_ref(loop))

    # On the loop's thread

    def _current(self, loop: AbstractEventLoop, token: object) -> bool:
        entry = self._ticking.get(_ref(loop))
        return entry is not None and entry[1] is token

    def _forget(self, loop: AbstractEventLoop, token: object) -> None:
        _acquire(self._lock)
        try:
            if self._current(loop, token):
                del self._ticking[_ref(loop)]
        finally:
            _release(self._lock)

    def _arm(self, loop: AbstractEventLoop, token: object) -> None:
        if not self._current(loop, token):
            return
        due = loop.time() + self.interval
        try:
            loop.call_at(due, self._tick, loop, token, due, perf_counter(), context=_empty())
        except Exception:
            logger.debug("aiocop: no loop-delay probe on %r (it refused a timer)", loop, exc_info=True)
            self._forget(loop, token)

    def _tick(self, loop: AbstractEventLoop, token: object, due: float, armed: float) -> None:
        started = thread_time()
        if not self._current(loop, token):
            return
        watch = _loops.watches.get(get_ident())
        if watch is not None and watch.loop is not loop:
            watch = None
        state = state_of(watch) if watch is not None else None
        try:
            if state is not None:
                # The watchdog's tripwire (_tripwire), if armed on this thread,
                # lets the tick pass: it is not the loop waking up to work. A
                # look that lands in it sees no step, unless it has held the
                # loop a while (a `record` waiting on its SDK's lock): then it
                # is one, begun here.
                state.probe_started = (perf_counter(), started)
                state.own = True
            self._tick_on(loop, token, due, armed)
        finally:
            if watch is not None and state is not None:
                began = state.probe_started
                if began is not None and tick_ending is not None:
                    tick_ending(watch, began, self._record)
                state.own = False
                state.probe_started = None
                # Told to the watchdog, which would otherwise take each tick for the
                # loop waking up to work, and look at it often for a while (its cost
                # in an idle process went from 0.13 % of a core to 0.78 %).
                state.probe_cpu += thread_time() - started + _LOOP_SHARE_S

    def _tick_on(self, loop: AbstractEventLoop, token: object, due: float, armed: float) -> None:
        # A loop runs a timer a hair early when its clock's resolution says
        # it is due: that is no delay.
        late = max(loop.time() - due, 0.0)
        now = perf_counter()
        # loop.time() is the loop's clock, which a test can freeze or move
        # (freezegun's fake monotonic): never later than aiocop's own clock
        # says the timer has been waiting.
        late = min(late, max(now - armed - self.interval, 0.0))
        try:
            self._settle(_ref(loop))
        except Exception:  # the `record` given: the probe goes on (it stopped for good on that loop)
            if not self._record_failed:  # (once: it would fail at every tick of every loop)
                self._record_failed = True
                logger.exception("aiocop: the loop-delay probe's record failed (ignored from now on)")
        self._unsettled[_ref(loop)] = (now - late, now, get_ident())
        self._arm(loop, token)


# In a forked child the parent's loops are not running (the forking thread's
# may be, but its timer was the parent's): every loop is probed afresh.
_probes: weakref.WeakSet[DelayProbe] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for probe in list(_probes):
        probe._ticking.clear()
        probe._unsettled.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
