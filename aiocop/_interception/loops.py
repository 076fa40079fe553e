"""Which threads are running an event loop right now, for the stall watchdog.

Every loop that supports async generators calls `sys.set_asyncgen_hooks()`
on its own thread when it starts (with its own methods as hooks) and again
when it stops (restoring the previous hooks); loops written in Python also
call `asyncio.events._set_running_loop()`. Thin wrappers around those two
functions learn each loop, its thread and the frame that called into it,
whatever the loop is written in. A loop that makes neither call is registered
by the audit hook at its first blocking call, or found by the watchdog on the
stack of a thread.
"""

from __future__ import annotations

import asyncio.events
import contextlib
import contextvars
import logging
import os
import sys
import threading
import time
import weakref
from asyncio import AbstractEventLoop, _get_running_loop
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

from aiocop._common import forksafe as _forksafe
from aiocop._common.clock import perf_counter, thread_cpu_clock
from aiocop._interception import trio_runs as _trio_runs
from aiocop._interception.internals import PYTHON_LOOP_PACKAGES, UNANNOUNCED_LOOP_PACKAGES
from aiocop._interception.trio_runs import TRIO_PACKAGE_PREFIX

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType

    from aiocop._interception.sink import Sink
    from aiocop._interception.trio_runs import TrioRun

logger = logging.getLogger("aiocop")


class WatchdogState(Protocol):
    """The watchdog's state of one loop (`_stalls.state.LoopState`), as the tracking tells it of the loop's life.

    The watch holds it (`LoopWatch.watchdog`); what it holds is the watchdog's, which this package may not import.
    """

    def loop_started(self, now: float, cpu: float | None) -> None:
        """The loop starts, idle at `now` (its thread's CPU clock at `cpu`): called by its own thread."""

    def loop_gone(self, on_its_thread: bool) -> None:
        """The loop stopped (told by its own thread if `on_its_thread`), or another loop replaced it on its thread."""

    def after_fork(self) -> None:
        """In a forked child, where the loop runs on in the thread that forked."""


class _Unwatched:
    """The state of a loop registered before any watchdog's factory was installed (`use_watchdog_state`).

    Keeps the one thing the tracking tells before the loop's first step, its start (`started`): the
    watchdog's state, made at its first use (`_stalls.state.state_of`), begins from it.
    """

    __slots__ = ("started",)

    def __init__(self) -> None:
        self.started: tuple[float, float | None] | None = None

    def loop_started(self, now: float, cpu: float | None) -> None:
        self.started = (now, cpu)

    def loop_gone(self, on_its_thread: bool) -> None:
        pass

    def after_fork(self) -> None:
        pass


class LoopWatch:
    """A running loop as the tracking knows it: the loop, its thread, the frame that called into it.

    What the watchdog notes of the loop as it watches it is its own, in `watchdog` (`_stalls.state`).

    A trio run is watched as a loop: its `TrioRun` stands for it (`trio_runs`), answering what the
    watchdog asks of a loop (`is_running`, `call_soon_threadsafe`); its steps are bounded by trio's
    dispatch frame as an asyncio loop's written in Python are by theirs.
    """

    __slots__ = (
        "base_frame",
        "cpu_clock",
        "discovered",
        "loop_name",
        "loop_ref",
        "thread_id",
        "thread_name",
        "watchdog",
    )

    def __init__(
        self, loop: AbstractEventLoop | TrioRun, base_frame: FrameType | None, thread_id: int | None = None
    ) -> None:
        if thread_id is None:
            thread = threading.current_thread()
            self.thread_id = thread.ident or 0
            self.thread_name = thread.name
        else:  # a loop found on another thread's stack
            self.thread_id = thread_id
            self.thread_name = next((t.name for t in threading.enumerate() if t.ident == thread_id), "")
        self.loop_ref: weakref.ref[Any] = weakref.ref(loop)
        if _trio_runs.is_run(loop):
            self.loop_name = loop.name  # its Runner's, as the run's blocking calls are named
        else:
            cls = type(loop)
            # object.__repr__ gives the address without id() (an audited call).
            address = object.__repr__(loop).rpartition(" at ")[2].rstrip(">")
            self.loop_name = f"{cls.__module__}.{cls.__qualname__}@{address}"
        self.base_frame = base_frame
        self.cpu_clock = thread_cpu_clock(self.thread_id)
        # Found by the watchdog, not told by the loop's start: its stop is not
        # told either, and is noticed when the watchdog sees it not running.
        self.discovered = False
        # The watchdog's state of this loop (_stalls/state.py), made by the factory it installed.
        self.watchdog: WatchdogState = _new_state()

    @property
    def loop(self) -> AbstractEventLoop | None:
        # (A trio run's `TrioRun` answers the calls the watchdog makes of a loop; see the class.)
        return self.loop_ref()

    def cpu_time(self) -> float | None:
        if self.cpu_clock is None:
            return None
        try:
            return time.clock_gettime(self.cpu_clock)
        except OSError:  # the thread has gone
            return None


# thread id -> the loop running on it. Written by loop threads (start/stop),
# read by the watchdog; replaced whole on every change so readers never see
# a dict being resized.
watches: dict[int, LoopWatch] = {}
_watch_lock = _forksafe.lock()
# The installed sink's callables (install_sink). _on_change: called when a loop
# is registered (the watchdog wakes up). _on_stop: called by a loop's thread
# as the loop stops, after its last step, with the loop's watch, the time and
# the thread's CPU time.
_on_change: Callable[[], None] | None = None
_on_stop: Callable[[LoopWatch, float, float | None], None] | None = None


def install_sink(sink: Sink) -> None:
    """Tell `sink` of every loop registered and every loop that stops, from now on (`_api`, as detection starts)."""
    global _on_change, _on_stop
    _on_change, _on_stop = sink.loop_started, sink.loop_stopped


# Makes the watchdog's state of each loop registered (use_watchdog_state).
_new_state: Callable[[], WatchdogState] = _Unwatched


def use_watchdog_state(factory: Callable[[], WatchdogState]) -> None:
    """Give each loop registered from now on a watchdog's state made by `factory` (the watchdog's install_sink)."""
    global _new_state
    _new_state = factory


# Loops that stopped since the watchdog last looked, with when they stopped and
# their thread's CPU time then. The watchdog finishes the step each one was
# in: without this a stall in a loop's very last step (a test body that never
# awaits after a CPU-bound call) went unreported, its watch gone before the
# watchdog saw the step end. Only the watchdog thread takes entries; bounded
# in case it is slow to look.
retired: deque[tuple[LoopWatch, float, float | None]] = deque(maxlen=64)


class LoopListener(Protocol):
    """Told when a loop is first seen running and when it stops (the loop-delay probe)."""

    def loop_started(self, loop: AbstractEventLoop) -> None:
        """`loop` runs, or was found running: called from any thread, maybe before its first step."""

    def loop_stopped(self, loop: AbstractEventLoop) -> None:
        """`loop` stopped, after its last step: called from its own thread."""


# Replaced, never mutated (read without a lock by the loops' threads).
listeners: tuple[LoopListener, ...] = ()


def add_listener(listener: LoopListener) -> None:
    """Tell `listener` of loops starting and stopping from now on (the loop-delay probe, as it starts)."""
    global listeners
    listeners = (*listeners, listener)


def remove_listener(listener: LoopListener) -> None:
    """Tell `listener` of loops no more (the loop-delay probe, as it stops)."""
    global listeners
    listeners = tuple(known for known in listeners if known is not listener)


def _tell(method: str, loop: AbstractEventLoop | None) -> None:
    if _trio_runs.is_run(loop):
        return  # (the loop-delay probe times asyncio's loops: a trio run takes no call_later)
    for listener in listeners:
        try:
            if loop is not None:
                getattr(listener, method)(loop)
        except Exception:  # a listener never breaks a loop's start or stop
            logger.exception("aiocop: a loop listener failed (ignored)")


def register(
    loop: AbstractEventLoop | TrioRun,
    base_frame: FrameType | None,
    thread_id: int | None = None,
    *,
    starting: bool = False,
    discovered: bool = False,
) -> LoopWatch:
    """Record that `loop` runs on the current thread (or the given one).

    `starting`: called by the loop's own thread as it starts, before its first step. `discovered`: found
    running by the watchdog or attach, not told by its start (LoopWatch.discovered); marked before the
    watch is published, so that no look sees it unmarked.
    """
    global watches
    current = watches.get(threading.get_ident() if thread_id is None else thread_id)
    if current is not None and current.loop is loop:
        if base_frame is not None:
            current.base_frame = base_frame
        if discovered:
            current.discovered = True
        return current  # the same start, seen through a second signal
    if current is not None:
        # Another loop on this thread, whose stop aiocop was not told of (one
        # found running): it stopped by now. The watchdog finishes the step
        # it was in (a stall in its last step), as for a loop that stopped.
        current.base_frame = None
        current.watchdog.loop_gone(False)
        retired.append((current, perf_counter(), current.cpu_time()))
    watch = LoopWatch(loop, base_frame, thread_id)
    watch.discovered = discovered
    if starting:
        watch.watchdog.loop_started(perf_counter(), watch.cpu_time())  # (idle at this moment)
    with _watch_lock:
        watches = {**watches, watch.thread_id: watch}
    if _on_change is not None:
        _on_change()
    if listeners:
        _tell("loop_started", watch.loop)
    return watch


def unregister(thread_id: int, *, stopping: bool = False) -> None:
    """Forget the loop of a thread; `stopping`: called by that thread as its loop stops."""
    global watches
    with _watch_lock:
        watch = watches.get(thread_id)
        if watch is None:
            return
        watches = {k: v for k, v in watches.items() if k != thread_id}
    watch.base_frame = None  # the loop no longer runs: keep no frame (and its locals) alive
    run = watch.loop_ref()
    if _trio_runs.is_run(run):
        run.running = False  # (nothing more is queued on it: its entry queue is closed)
    watch.watchdog.loop_gone(stopping)
    if stopping:
        stopped, cpu = perf_counter(), watch.cpu_time()
        retired.append((watch, stopped, cpu))  # in case the watchdog's look, already under way, sees it after
        if _on_stop is not None:
            _on_stop(watch, stopped, cpu)
        if listeners:
            _tell("loop_stopped", watch.loop)


def ensure_registered(loop: AbstractEventLoop | TrioRun, base_frame: FrameType | None = None) -> None:
    """Register the loop running on this thread if no start was seen (e.g. veloxloop).

    `base_frame`: the frame that called into the loop, as the audit hook saw
    it start (a loop written in C that bound the start signals before aiocop
    wrapped them, Leviathan, still raises the native audit event): the edge
    of its steps. Loops written in Python are bounded by their own frames.
    """
    watch = watches.get(threading.get_ident())
    if _trio_runs.is_run(loop):
        if watch is None or watch.loop_ref() is not loop:
            _trio_running(loop)  # a run already going when detection started, in another thread
        return
    if watch is None or watch.loop is not loop:
        python_loop = type(loop).__module__.partition(".")[0] in PYTHON_LOOP_PACKAGES
        if python_loop or base_frame is not None:
            register(loop, None if python_loop else base_frame)
            return
        # A loop written in C, in the middle of a step, whose start aiocop did
        # not see (set up by the application's import, inside a uvicorn
        # worker's running uvloop): the frame that called into the loop, the
        # edge of its steps, is below the callbacks it runs, not below this
        # step's frames. Registered without it, the watchdog could tell none
        # of its steps, and so none of its stalls: it registers itself from
        # its next callback instead.
        with contextlib.suppress(RuntimeError):  # closing
            loop.call_soon(_register_from_callback, loop, context=contextvars.Context())


# Modules of loops that bind both start signals when imported (Leviathan):
# imported before aiocop is set up, they start and stop unseen, and only a
# look at the threads' stacks finds them. With one imported, the watchdog's
# thread runs while detection is on, a loop known to run or not. A set the
# tests add their own such loop to; it starts as the table's (KnownLoop.announces).
UNANNOUNCED_LOOP_MODULES: set[str] = set(UNANNOUNCED_LOOP_PACKAGES)


def unannounced_loops_possible() -> bool:
    """Whether a loop that announces nothing may start (its module is imported): the watchdog must look for it."""
    modules = sys.modules
    return any(name in modules for name in UNANNOUNCED_LOOP_MODULES)


_MISSING = object()
# The two calls wrapped below, as they were before aiocop wrapped them. Kept
# once set, never reset: anyone who bound a wrapper while aiocop was installed
# (rloop does `from asyncio.events import _set_running_loop`) still calls it
# after stop(), and it must then pass through to the original.
_original_set_hooks: Callable[..., Any] = sys.set_asyncgen_hooks
_original_set_running: Callable[[AbstractEventLoop | None], None] = asyncio.events._set_running_loop
_tracking = False  # between install() and uninstall(): the wrappers record starts and stops
# The process that records them. In a forked child, other fork handlers run
# before aiocop's (asyncio's resets the running loop through the wrapper below,
# while aiocop's locks may still be held by a thread the fork left behind): the
# child records nothing until aiocop's own handler has reset them and this.
_tracking_pid = 0
_install_lock = _forksafe.lock()


def _set_asyncgen_hooks(*args: Any, **kwargs: Any) -> Any:
    if not _tracking or _tracking_pid != os.getpid():
        return _original_set_hooks(*args, **kwargs)
    firstiter = kwargs.get("firstiter", args[0] if args else _MISSING)
    owner = getattr(firstiter, "__self__", None)
    try:
        if owner is None and firstiter is not _MISSING and _trio_runs.is_trio_hook(firstiter):
            _trio_starts(sys._getframe(1))
        elif isinstance(owner, AbstractEventLoop):
            # A loop starts. For a loop written in C, the frame that called it
            # bounds its steps; a loop written in Python is bounded by its own
            # dispatch frames (_internals.LOOP_FRAMES), so nothing is kept for
            # it (holding a frame keeps its locals alive).
            python_loop = type(owner).__module__.partition(".")[0] in PYTHON_LOOP_PACKAGES
            register(owner, None if python_loop else sys._getframe(1), starting=True)
        elif firstiter is not _MISSING:
            unregister(threading.get_ident(), stopping=True)  # hooks restored: the loop stopped
    except Exception:  # never let bookkeeping break a loop's start
        logger.exception("aiocop: could not track an event loop start/stop (ignored)")
    return _original_set_hooks(*args, **kwargs)


def _set_running_loop(loop: AbstractEventLoop | None) -> None:
    # The other start/stop signal, for loops written in Python that set no
    # asyncgen hooks (veloxloop): they call asyncio.events._set_running_loop.
    if not _tracking or _tracking_pid != os.getpid():
        _original_set_running(loop)
        return
    try:
        if isinstance(loop, AbstractEventLoop):
            python_loop = type(loop).__module__.partition(".")[0] in PYTHON_LOOP_PACKAGES
            register(loop, None if python_loop else sys._getframe(1), starting=True)
        elif loop is None:
            unregister(threading.get_ident(), stopping=True)
    except Exception:
        logger.exception("aiocop: could not track an event loop start/stop (ignored)")
    _original_set_running(loop)


def _trio_starts(caller: FrameType) -> None:
    # A trio run's asyncgen hooks are set on this thread: its Runner installs
    # them (`AsyncGenerators.install_hooks(runner)`, this frame) as it starts,
    # before its first step; its stop restores the previous ones (None:
    # unregistered, as a loop's). Or an asyncio loop run inside a trio run
    # (a guest run's host thread between ticks, a synchronous test) stopped,
    # restoring them: the trio run is this thread's loop again.
    if _get_running_loop() is not None:
        # A guest run on this thread's asyncio loop (start_guest_run): its
        # steps run inside that loop's callbacks, watched as that loop's.
        return
    f: FrameType | None = caller
    for _ in range(3):  # (install_hooks, setup_runner: both hold it)
        if f is None:
            break
        name = f.f_globals.get("__name__")
        runner = f.f_locals.get("runner") if type(name) is str and name.startswith(TRIO_PACKAGE_PREFIX) else None
        if runner is not None:
            _trio_running(_trio_runs.run_of(runner), starting=True)
            return
        f = f.f_back
    runner = _trio_runs.current_runner()  # (set by the run's start, after its hooks: the restore's case)
    if runner is not None:
        _trio_running(_trio_runs.run_of(runner), starting=True)


def _trio_running(run: TrioRun, *, starting: bool = False) -> None:
    run.running = True
    register(run, None, starting=starting)


def install() -> None:
    """Wrap the two calls every loop makes when it starts and stops (idempotent),
    and register a loop already running here."""
    global _original_set_hooks, _original_set_running, _tracking, _tracking_pid
    with _install_lock:  # from several threads at once: wrapped once, never a wrapper of the wrapper
        if sys.set_asyncgen_hooks is not _set_asyncgen_hooks:
            _original_set_hooks = sys.set_asyncgen_hooks
            sys.set_asyncgen_hooks = _set_asyncgen_hooks
        if asyncio.events._set_running_loop is not _set_running_loop:
            _original_set_running = asyncio.events._set_running_loop
            asyncio.events._set_running_loop = _set_running_loop
        _tracking, _tracking_pid = True, os.getpid()
    running = _get_running_loop()
    if running is not None:
        ensure_registered(running)
        return
    runner = _trio_runs.current_runner()
    if runner is not None:
        _trio_running(_trio_runs.run_of(runner))  # set up inside a trio run


def _register_from_callback(loop: AbstractEventLoop) -> None:
    # Run by `loop` itself: the frame below is the one that called into it,
    # if any (a loop run from C or Rust, with no Python frame under it, has
    # none: registered without, as before). Never raises into the loop.
    if not _tracking:
        return
    try:
        caller: FrameType | None = sys._getframe(1)
    except ValueError:
        caller = None
    try:
        register(loop, caller)
    except Exception:
        logger.exception("aiocop: could not track an event loop (ignored)")


def uninstall() -> None:
    global watches, _tracking
    with _install_lock:
        _tracking = False
        if sys.set_asyncgen_hooks is _set_asyncgen_hooks:
            sys.set_asyncgen_hooks = _original_set_hooks
        if asyncio.events._set_running_loop is _set_running_loop:
            asyncio.events._set_running_loop = _original_set_running
    with _watch_lock:
        watches = {}
    retired.clear()


def reinit_after_fork() -> None:
    global watches, _tracking_pid  # (_watch_lock is reset by _forksafe)
    # Only the forking thread survives; its loop (if any) keeps running there,
    # unless asyncio's own fork handler (3.12+) has just reset it.
    ident = threading.get_ident()
    keep = _get_running_loop() is not None
    watches = {k: v for k, v in watches.items() if k == ident and keep}
    _tracking_pid = os.getpid()
    retired.clear()
    for watch in watches.values():
        watch.thread_id = ident
        watch.cpu_clock = thread_cpu_clock(ident)
        watch.watchdog.after_fork()
