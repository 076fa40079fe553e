"""Waking the watchdog as an idle loop wakes: no blind window after a quiet spell (issue 29).

After half a second of quiet the watchdog looks only every
`idle_interval_ms` (each wake-up of its thread is its main cost). A stall
that began and ended between two such looks went unseen: a 45 ms stall at
a 30 ms threshold after a quiet second was missed about half the time. A
faster rate bound by the threshold costs several times the idle budget, so
where it can, the loop tells the watchdog instead, as it wakes.

As the watchdog goes to its long sleep it arms each idle loop: one callback
(`call_soon_threadsafe`, the only call every loop takes from another thread)
sets the tripwire up on the loop's own thread. How depends on the Python:

- Up to 3.11, a profile function (`sys.setprofile`), which is the loop
  thread's alone. The loop then waits in its selector and runs no Python
  code: the function costs nothing while the loop is idle. An event after
  the thread has been off its CPU (it slept in its selector, whatever the
  loop is written in) marks the moment the loop woke; at the first event
  after that in a frame that is not the loop's own (asyncio's, the
  selector's) nor aiocop's, the application's work has begun: the function
  removes itself and wakes the watchdog, which looks at the loop while that
  step runs, at the rate of a busy loop, and times it from the moment the
  loop woke. aiocop's own callbacks (the loop-delay probe's tick) pass
  through; a loop that runs `_MAX_EVENTS` events without sleeping trips it
  too. A thread that already has a profile function (a profiler) is not
  armed; one with a trace function (a debugger, coverage) is: the two are
  separate slots, and the tracer sees every event it saw before.
- From 3.12, no profile function: `sys.setprofile` is built on
  `sys.monitoring` there and instruments the code of the whole interpreter,
  so while one loop was armed every other thread's Python code (executor
  threads, other loops) ran two to four times slower, and a child forked
  then stayed so for life. A loop whose iteration is Python code (asyncio's
  `BaseEventLoop._run_once`, which waits in `self._selector.select()`) gets
  its selector's `select` wrapped instead, as an attribute of that one
  selector object: when a select returns with something of the
  application's to run (an I/O event, a callback, a due timer that is not
  aiocop's own), the wrapper removes itself, notes the moment and wakes the
  watchdog. Loops written in C or Rust (uvloop, winloop, rloop, veloxloop,
  Leviathan) run nothing in Python as they wake that could be hooked at no
  cost to other threads: they are not armed (`arm` says so), and the
  watchdog keeps looking at them at a rate bound by the threshold, and as
  their next timer ends (`waits`, on Linux).

A trio run (issue 41) is armed on every Python through trio's own instrument
API: the arming callback (trio's entry queue, `run_sync_soon`) adds an
instrument whose `after_io_wait` runs as the run comes back from its wait
for I/O and timers, before any task's step: it removes itself, notes the
moment and wakes the watchdog. Nothing runs while the run waits, and nothing
on its steps: an instrument with `after_io_wait` only is not called for them.

A tripwire never raises into the loop: a failure inside it removes it,
leaves that loop unarmed (looked at at the threshold-bound rate) and is
logged once.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
import weakref
from asyncio import BaseEventLoop
from asyncio.selector_events import BaseSelectorEventLoop
from types import FunctionType, MethodType
from typing import TYPE_CHECKING, Any

from aiocop._common.clock import perf_counter, thread_time
from aiocop._interception import frames as _frames
from aiocop._interception import trio_runs as _trio_runs
from aiocop._interception.frames import Kind
from aiocop._stalls.state import LoopState, state_of

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType

    from aiocop._interception.loops import LoopWatch

logger = logging.getLogger("aiocop")

# Up to 3.11 a profile function is its thread's alone; from 3.12 setting one
# instruments every thread's code (sys.monitoring): never done there.
PROFILE = sys.version_info < (3, 12)
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
# The callback runs in an empty context: none of the application's
# variables. A new one each time: a context is entered by one thread at a
# time, and loops in several threads arm at once (see _probe._empty).
_empty = contextvars.Context
# Modules whose callbacks on an armed loop are aiocop's own (the probe's
# tick, this module's arming): a select that returns for them only is no wake-up.
_OWN_MODULES = frozenset({"aiocop._stalls.probe", __name__})
# Whether this process ever set a profile function (see after_fork_in_child),
# and whether a tripwire's failure was logged (once per process).
_profile_set = False
_failure_logged = False


def arm(watch: LoopWatch, wake: Callable[[], None]) -> bool:
    """Have `watch`'s loop wake the watchdog (`wake()`, from the loop's thread) as it next wakes.

    Called by the watchdog thread as it goes to its long sleep, for a loop it
    saw idle. Idempotent while armed. Returns False for a loop that cannot be
    armed (written in C on 3.12+, its thread's profile slot taken, a
    tripwire that failed): the watchdog must keep looking at it often.
    """
    if not can_arm(watch):
        return False
    loop = watch.loop
    if loop is None:
        return True  # gone: nothing to watch
    state = state_of(watch)
    if state.armed:
        return True
    # Only a running loop: some loops (rloop 0.5) replace their wake-up pipe
    # on every run, and a call sent between runs could reach a reused fd.
    if not loop.is_running():
        return True
    state.armed = True
    state.tripwire_set = 0.0
    try:
        loop.call_soon_threadsafe(_install, watch, wake, context=_empty())
    except Exception:  # closed meanwhile, or a loop that takes no context
        state.armed = False
    return True


def can_arm(watch: LoopWatch) -> bool:
    """Whether `arm` can arm `watch`'s loop (not one written in C on 3.12+, nor one left unarmable)."""
    if state_of(watch).unarmable:
        return False
    loop = watch.loop
    # (type(), not isinstance(): no `__class__` of the application's is read here.)
    return loop is None or PROFILE or issubclass(type(loop), BaseEventLoop) or _trio_runs.is_run(loop)


def step_seen(watch: LoopWatch) -> None:
    """A look saw `watch`'s loop begin a step: a tripwire still armed did not trip on it.

    It was taken away (a profiler replaced it, then went) or the step began
    before it was in place. Disarmed, so that the next quiet spell arms the
    loop afresh rather than trusting it (it stayed marked armed for good,
    and the loop was never armed again). aiocop's own callback (the probe's
    tick) is no step of the loop's.
    """
    state = state_of(watch)
    if state.armed and not state.own:
        state.armed = False


def _install(watch: LoopWatch, wake: Callable[[], None]) -> None:
    # On the loop's thread, as one of its callbacks. Never raises into the loop.
    started = thread_time()
    state = state_of(watch)
    if not state.armed:
        return  # disarmed meanwhile
    # aiocop's own callback, as the probe's tick is: a look that lands in it
    # sees no step of the loop's (which would disarm it: step_seen).
    state.own = True
    try:
        if _trio_runs.is_run(watch.loop):
            placed = _add_instrument(watch, state, wake)
        else:
            placed = _set_profile(state, wake, started) if PROFILE else _wrap_select(watch, state, wake)
    except Exception:
        _failed(state, "could not arm")
        placed = False
    finally:
        state.own = False
    if placed:
        state.tripwire_set = perf_counter()  # (in_place: a look must see the loop idle after this)
    else:
        # Left unarmed for good: the watchdog looks at it at the threshold-bound
        # rate, which it learns now rather than after its long sleep.
        state.armed = False
        state.unarmable = True
        _wake(wake)
    state.probe_cpu += thread_time() - started + _ARM_SHARE_S


def _wake(wake: Callable[[], None]) -> None:
    try:
        wake()
    except Exception:
        logger.exception("aiocop: could not wake the watchdog (ignored)")


def _failed(state: LoopState, what: str) -> None:
    # A fault inside a tripwire: that loop is never armed again (its looks
    # come at the threshold-bound rate), and the application never sees it.
    global _failure_logged
    state.armed = False
    state.unarmable = True
    if not _failure_logged:
        _failure_logged = True
        logger.exception(
            "aiocop: the watchdog's tripwire %s; this loop is looked at more often instead (logged once)", what
        )


# Python 3.12+: the selector's select, wrapped on that one object.


def _wrap_select(watch: LoopWatch, state: LoopState, wake: Callable[[], None]) -> bool:
    loop = watch.loop
    selector = getattr(loop, "_selector", None)
    attrs = getattr(selector, "__dict__", None)
    if loop is None or attrs is None or not callable(getattr(type(selector), "select", None)):
        return False  # no selector object to wrap (a proactor without one, slots): not armable
    current = attrs.get("select")
    if current is not None and current is state.tripwire:
        return True  # still in place since the last arming (disarmed, not yet woken): armed again as it is
    state.tripwire = _select_wrapper(watch, state, wake, weakref.ref(selector), current)
    attrs["select"] = state.tripwire
    return True


def _select_wrapper(
    watch: LoopWatch,
    state: LoopState,
    wake: Callable[[], None],
    selector_ref: weakref.ref[Any],
    previous: Callable[..., Any] | None,
) -> Callable[..., Any]:
    # Holds no strong reference to the loop or the selector (the watch's is
    # weak too): the selector's attribute pointing back at it would make a
    # cycle, and an unclosed loop would then be freed only by a collection.

    def select(timeout: float | None = None) -> Any:
        selector: Any = selector_ref()  # (alive: it is the object this is an attribute of)
        # The selector's own outcome, errors included, is the loop's, as it was.
        events = previous(timeout) if previous is not None else type(selector).select(selector, timeout)
        woke = perf_counter()
        try:
            loop = watch.loop
            if state.armed and _only_own(loop, events):
                return events  # aiocop's own callback (the probe's tick): no wake-up of the application's
            _unwrap(selector, select, previous)
            if state.armed:
                state.armed = False
                state.tripped = woke
                _wake(wake)
        except Exception:
            _failed(state, "failed")
            with contextlib.suppress(Exception):
                _unwrap(selector, select, previous)
        return events

    return select


def _unwrap(selector: Any, wrapper: Callable[..., Any], previous: Callable[..., Any] | None) -> None:
    attrs = selector.__dict__
    if attrs.get("select") is wrapper:
        if previous is not None:
            attrs["select"] = previous
        else:
            del attrs["select"]


def _own(callback: object) -> bool:
    # (type() checks only: nothing of the application's runs here.)
    function = callback.__func__ if type(callback) is MethodType else callback
    if type(function) is not FunctionType:
        return False
    module = function.__module__  # (its globals' __name__ when made: anything, exec() lets it be a list)
    return type(module) is str and module in _OWN_MODULES


def _only_own(loop: Any, events: Any) -> bool:
    """Whether all that `loop` will run after this select is aiocop's own (read on its thread, before it runs it)."""
    if events:
        # Only the loop's self-pipe (the wake-up of call_soon_threadsafe): its
        # callbacks are in _ready already, looked at below. A proactor's
        # events (Windows) are not told apart: a wake-up.
        if not issubclass(type(loop), BaseSelectorEventLoop):
            return False
        ssock = loop._ssock
        if ssock is None:
            return False
        own_fd = ssock.fileno()
        for key, _mask in events:
            if getattr(key, "fd", None) != own_fd:
                return False
    for handle in loop._ready:
        if not handle._cancelled and not _own(handle._callback):
            return False
    # The timers due now (the heap's due entries form a subtree at its root).
    scheduled = loop._scheduled
    end = loop.time() + loop._clock_resolution
    count = len(scheduled)
    todo = [0] if count else []
    while todo:
        i = todo.pop()
        timer = scheduled[i]
        if timer._when >= end:
            continue
        if not timer._cancelled and not _own(timer._callback):
            return False
        todo.extend(j for j in (2 * i + 1, 2 * i + 2) if j < count)
    return True


# A trio run: an instrument of its own (any Python).


class _TrioTripwire:
    """The `trio.abc.Instrument` a trio run is armed with: `after_io_wait` trips it (see the module's docstring)."""

    __slots__ = ("state", "wake")

    def __init__(self, state: LoopState, wake: Callable[[], None]) -> None:
        self.state = state
        self.wake = wake

    def __dir__(self) -> list[str]:
        # trio's add_instrument looks for hooks in dir(instrument): this one's only (see TrioRun.__dir__).
        return ["after_io_wait"]

    def __call__(self, timeout: float) -> None:
        self.after_io_wait(timeout)

    def after_io_wait(self, timeout: float) -> None:
        """Run by trio on the run's thread as it comes back from waiting: the run woke."""
        woke = perf_counter()
        state = self.state
        try:
            sys.modules["trio"].lowlevel.remove_instrument(self)
            if state.armed:
                state.armed = False
                state.tripped = woke
                _wake(self.wake)
        except Exception:
            _failed(state, "failed")


def _add_instrument(watch: LoopWatch, state: LoopState, wake: Callable[[], None]) -> bool:
    # On the run's thread, in its entry queue's task: inside the run, where trio's add_instrument works.
    tripwire = state.tripwire
    if type(tripwire) is not _TrioTripwire:
        tripwire = state.tripwire = _TrioTripwire(state, wake)
    sys.modules["trio"].lowlevel.add_instrument(tripwire)  # (still in place since the last arming: no change)
    return True


# Up to Python 3.11: a profile function on the loop's thread.


def _set_profile(state: LoopState, wake: Callable[[], None], started: float) -> bool:
    global _profile_set
    current = sys.getprofile()
    if current is not None and current is not state.tripwire:
        # The thread's profile function is someone else's (a profiler): left alone.
        return False
    # [wall clock at the last event, thread CPU clock at the last one read];
    # when the loop woke (0: not since arming) and the events since it last
    # slept. A CPU clock read a while back only makes the thread seem to
    # have slept less: never a sleep seen that was not.
    last = [perf_counter(), started]
    woke = [0.0]
    events = [0]

    def tripwire(frame: FrameType, event: str, arg: Any) -> None:
        try:
            if state.own:  # aiocop's own callback (the probe's tick): not the loop's work
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
            if state.armed and events[0] < _MAX_EVENTS:
                if not woke[0] or _frames.frame_kind(frame) in _LOOPS_OWN:
                    return
                name = frame.f_globals.get("__name__")
                if type(name) is str and name == "selectors":  # (asyncio's wait, in the stdlib)
                    return
            sys.setprofile(None)
            if state.armed:
                state.armed = False
                state.tripped = woke[0] or now
                _wake(wake)
        except Exception:
            # Raised from here, it would surface in the application's code.
            sys.setprofile(None)
            _failed(state, "failed")

    state.tripwire = tripwire
    sys.setprofile(tripwire)
    _profile_set = True
    return True


def after_fork_in_child() -> None:
    """In a forked child: no profile function of aiocop's survives the fork.

    The child's only thread is the one that forked. Its tripwire, if it had
    one, is removed; and if it has no profile function, profiling is turned
    off once more, which on 3.12+ also undoes the interpreter-wide
    instrumentation that threads the fork dropped may have left on
    (a child forked while a loop was armed ran its Python code ~4x slower for
    life). Nothing to do in a process that never set one.
    """
    if not _profile_set:
        return
    current = sys.getprofile()
    if current is None or (type(current) is FunctionType and current.__qualname__ == "_set_profile.<locals>.tripwire"):
        sys.setprofile(None)


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
    state = state_of(watch)
    if not state.armed:
        return True
    done = state.tripwire_set
    return bool(done) and done < state.idle_t


def guards(watch: LoopWatch) -> bool:
    """Whether `watch`'s loop is armed, its tripwire in place since a look saw it idle.

    Until it trips, the loop has run nothing of the application's: what its
    thread did meanwhile was aiocop's own callbacks (the probe's ticks, the
    arming) and the loop's own work around them (the watchdog still counts
    CPU well past what the ticks told as activity: a tripwire can be taken
    away without tripping).
    """
    return state_of(watch).armed and in_place(watch)
