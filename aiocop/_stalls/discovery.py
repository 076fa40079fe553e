"""Loops aiocop was not told about, found stepping on the stacks of the other threads (issue 29).

A loop written in C that bound its start signals before aiocop wrapped them
(Leviathan looks up `sys.set_asyncgen_hooks` and `asyncio._set_running_loop`
once, at import) starts unseen; so does a loop started in another thread
before aiocop was set up. At every look of the watchdog, each thread with no
known loop whose CPU clock moved since its stack was last walked is walked
whole: a coroutine or generator frame executing there is a task's step, and
the frames below the step's outermost one are the loop's (for a loop written
in C, that frame is the one that called into it: the edge of its steps, as
the start signal would have given). The loop, held by that frame (a local,
or `asyncio.Runner`'s), is registered there and then, with that edge, and
the step is timed from the last moment the thread was known not to be in it
(its previous look): a stall in the loop's very first step, or a hang, is
reported like any other.

A thread whose CPU clock has not moved is where its last walk left it, and
is not walked again: an idle process pays one clock read per thread per
look.

Once a second (`discover`), the idle ones too: a loop written in Python
found by its dispatch frame, and one written in C by the running loop its
thread's innermost frame holds, which is sent a probe (`_probe`) that
registers it from its own thread, with its own edge.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import sys
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from aiocop._common.clock import perf_counter
from aiocop._interception import frames as _frames
from aiocop._interception import loops as _loops

if TYPE_CHECKING:
    from types import CodeType, FrameType

    from aiocop._interception.loops import LoopWatch

# inspect.CO_GENERATOR | CO_COROUTINE | CO_ITERABLE_COROUTINE | CO_ASYNC_GENERATOR
# (fixed values; inspect is not imported for them).
_CO_STEP = 0x20 | 0x80 | 0x100 | 0x200
_MAX_WALK = 256
# Frames below a step's outermost one that may hold its loop: the caller of
# run_until_complete, asyncio.Runner.run (its `_loop`), a loop class's own
# run_forever written in Python.
_HOLDERS = 3


class _Thread:
    """What the watchdog last knew of a thread running no known loop."""

    __slots__ = ("clock", "cpu", "no_loop", "t")

    def __init__(self, thread_id: int, now: float) -> None:
        self.clock = _cpu_clock(thread_id)
        self.cpu: float | None = None  # its CPU clock when its stack was last walked (None: never)
        self.t = now  # the last moment it was known not to be in a step of an unknown loop
        # The frame (id and code) a step was last found on that holds no
        # running loop (sync code iterating a generator): not looked at again.
        self.no_loop: tuple[int, CodeType] | None = None


def _cpu_clock(thread_id: int) -> int | None:
    try:
        return time.pthread_getcpuclockid(thread_id)
    except (AttributeError, OSError):  # not on this platform
        return None


def _read(clock: int | None) -> float | None:
    if clock is None:
        return None
    try:
        return time.clock_gettime(clock)
    except OSError:  # the thread has gone
        return None


class Finder:
    """The watchdog's view of the threads running no known loop. Used by the watchdog thread only."""

    def __init__(self) -> None:
        self.threads: dict[int, _Thread] = {}
        # The loop registry (replaced, never changed in place, at each change)
        # and the count of Python threads as of the last read: which threads
        # `threads` can hold. A thread whose loop stopped since (it may start
        # a loop aiocop is not told of, as its very next work), or one new
        # since, is in neither `threads` nor the registry.
        self._watches: dict[int, LoopWatch] | None = None
        self._thread_count = 0

    def quiet(self, watches: dict[int, LoopWatch]) -> bool:
        """Whether no such thread used any CPU since its last walk (the watchdog's cheap look).

        Not while a thread may have joined them since the last read (a known
        loop stopped, a thread started): the look that reads them is due.
        """
        if watches is not self._watches or len(threading._active) != self._thread_count:  # type: ignore[attr-defined]
            return False
        return all(thread.cpu is not None and _read(thread.clock) == thread.cpu for thread in self.threads.values())

    def read(self, frames: dict[int, FrameType], watches: dict[int, LoopWatch], now: float) -> dict[int, float | None]:
        """The CPU clocks, now, of the threads in `frames` that run no known loop (aiocop's own left out)."""
        self._watches = watches
        # (One started between the frames' snapshot and this read is left to the once-a-second scan.)
        self._thread_count = len(threading._active)  # type: ignore[attr-defined]
        threads = self.threads
        for gone in [tid for tid in threads if tid not in frames or tid in watches]:
            del threads[gone]
        readings: dict[int, float | None] = {}
        for thread_id in frames:
            if thread_id in watches:
                continue
            thread = threads.get(thread_id)
            if thread is None:
                if _is_aiocops(thread_id):
                    continue
                thread = threads[thread_id] = _Thread(thread_id, now)
            readings[thread_id] = _read(thread.clock)
        return readings

    def adopt(self, thread_id: int, seen: float, cpu: float | None) -> None:
        """`thread_id`'s loop stopped, last seen at `seen` (its CPU clock `cpu` then): a thread with no known loop."""
        thread = self.threads[thread_id] = _Thread(thread_id, seen)
        thread.cpu = cpu

    def look(self, frames: dict[int, FrameType], readings: dict[int, float | None], now: float) -> list[LoopWatch]:
        """Register the loops found stepping; returns their watches.

        `readings`: the threads' CPU clocks at the snapshot `frames` (and `now`).
        """
        found: list[LoopWatch] = []
        for thread_id, cpu in readings.items():
            thread = self.threads.get(thread_id)
            frame = frames.get(thread_id)
            if thread is None or frame is None:
                continue
            if cpu is not None and cpu == thread.cpu:
                thread.t = now  # no CPU since its last walk: where that walk left it
                continue
            watch = self._walk(thread_id, thread, frame, cpu)
            if watch is None:
                thread.t, thread.cpu = now, cpu
            else:
                del self.threads[thread_id]
                found.append(watch)
        return found

    def _walk(self, thread_id: int, thread: _Thread, frame: FrameType, cpu: float | None) -> LoopWatch | None:
        step = _step_edge(frame)
        if step is None:
            return None
        base = step
        key = (id(base), base.f_code)
        if key == thread.no_loop:
            return None
        loop, python_loop = _loop_below(base)
        if loop is None or not _may_run_on(loop, thread_id):
            thread.no_loop = key
            return None
        watch = _loops.register(loop, None if python_loop else base, thread_id)
        watch.discovered = True
        # The step is timed from the last moment this thread was known not to be in it.
        watch.idle_t, watch.idle_cpu = thread.t, thread.cpu
        return watch


def _step_edge(frame: FrameType) -> FrameType | None:
    """The frame below the outermost frame of the task step running on this stack, if one runs.

    From the innermost frame out: the first coroutine or generator frame, and
    those it was awaited from, are the step's; the frame below them called
    into the loop (a loop written in C), or is the loop's own dispatch (one
    written in Python).
    """
    f: FrameType | None = frame
    walked = 0
    in_step = False
    while f is not None and walked < _MAX_WALK:
        walked += 1
        if f.f_code.co_flags & _CO_STEP:
            in_step = True
        elif in_step:
            return f
        f = f.f_back
    return None


def _loop_below(base: FrameType) -> tuple[asyncio.AbstractEventLoop | None, bool]:
    """The running loop `base` or a frame below it holds, and whether it is written in Python."""
    f: FrameType | None = base
    for _ in range(_HOLDERS):
        if f is None:
            break
        # A local of the frame, or a Runner's loop. For a loop written in
        # Python, the step's frame below is its dispatch (asyncio's
        # Handle._run holds a handle; _run_once, below it, the loop).
        loop = running_loop_held_by(f)
        if loop is not None:
            return loop, type(loop).__module__.partition(".")[0] in _loops.PYTHON_LOOP_PACKAGES
        f = f.f_back
    return None, False


def _may_run_on(loop: asyncio.AbstractEventLoop, thread_id: int) -> bool:
    # A frame can hold a loop that runs on another thread (a main thread that
    # started one in a thread, then iterates a generator): a loop registered
    # elsewhere, or one that says which thread runs it, is not this one's.
    if any(watch.loop is loop for watch in _loops.watches.values()):
        return False
    owner = getattr(loop, "_thread_id", None)  # asyncio's (uvloop keeps its own out of reach)
    return not isinstance(owner, int) or owner in (0, thread_id)


def running_loop_held_by(frame: FrameType) -> asyncio.AbstractEventLoop | None:
    """A running loop held by a local of `frame` (`loop.run_forever()`), or by a Runner's `_loop` (asyncio.run)."""
    for value in frame.f_locals.values():
        for candidate in (value, getattr(value, "_loop", None) if isinstance(value, _RUNNER) else None):
            if isinstance(candidate, asyncio.AbstractEventLoop) and candidate.is_running():
                return candidate
    return None


_RUNNER: Any = getattr(asyncio, "Runner", ())  # 3.11+; asyncio.run() of 3.10 holds its loop in a local


def _is_aiocops(thread_id: int) -> bool:
    # aiocop's own threads (delivery, hang reports) run no loop.
    thread = threading._active.get(thread_id)  # type: ignore[attr-defined]  # (a dict lookup, no enumerate())
    return thread is not None and thread.name.startswith("aiocop-")


def discover(frames: dict[int, FrameType], watches: dict[int, LoopWatch]) -> None:
    """Find running loops whose start aiocop did not see, on the stacks of the other threads.

    Two kinds: loops written in Python that set no asyncgen hooks and have
    made no blocking call yet (veloxloop), by their dispatch frame; and loops
    written in C that bound the start signals before aiocop wrapped them
    (Leviathan looks up `sys.set_asyncgen_hooks` and
    `asyncio._set_running_loop` once, at import), by the running loop the
    thread's innermost frame holds: idle, such a loop runs no Python code,
    and that frame is the one that called into it.
    """
    known = {id(watch.loop) for watch in watches.values()}
    for thread_id, frame in frames.items():
        if thread_id in watches or thread_id == threading.get_ident():
            continue
        f: FrameType | None = frame
        depth = 0
        while f is not None and depth < _MAX_WALK:
            depth += 1
            name = f.f_globals.get("__name__")
            roles = _frames.LOOP_ROLES.get(name) if isinstance(name, str) else None
            if roles is not None and roles.get(f.f_code.co_name) == "dispatch" and name != "asyncio.events":
                loop = f.f_locals.get("self")
                if loop is not None:
                    _register_foreign(loop, thread_id)
                break
            f = f.f_back
        else:
            loop = running_loop_held_by(frame)
            if loop is not None and id(loop) not in known:
                _probe(loop)


def still_running(watch: LoopWatch) -> bool:
    loop = watch.loop
    return loop is not None and loop.is_running()


def _register_foreign(loop: Any, thread_id: int) -> None:
    if isinstance(loop, asyncio.AbstractEventLoop):
        _loops.register(loop, None, thread_id)


# Loops sent a probe, and when: one probe per loop while it has not answered.
_probed: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, float] = weakref.WeakKeyDictionary()
_PROBE_AGAIN_S = 5.0


def _probe(loop: asyncio.AbstractEventLoop) -> None:
    """Ask `loop` to run a callback that registers it, on its own thread and with its own edge.

    Which thread runs a loop cannot be told from outside (the frame that
    holds it may be another thread's); a callback the loop runs can, and the
    frame below it is the one that called into a loop written in C: the edge
    of its steps, as the start signal would have given.
    """
    now = perf_counter()
    if now - _probed.get(loop, -_PROBE_AGAIN_S) < _PROBE_AGAIN_S:
        return
    _probed[loop] = now

    def found() -> None:
        if threading.get_ident() in _loops.watches:
            return
        python_loop = type(loop).__module__.partition(".")[0] in _loops.PYTHON_LOOP_PACKAGES
        watch = _loops.register(loop, None if python_loop else sys._getframe(1))
        watch.discovered = True

    with contextlib.suppress(RuntimeError):  # closed meanwhile
        loop.call_soon_threadsafe(found, context=contextvars.Context())
