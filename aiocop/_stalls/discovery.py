"""Loops aiocop was not told about, found on the stacks of the other threads (issue 29).

A loop written in C that bound its start signals before aiocop wrapped them
(Leviathan looks up `sys.set_asyncgen_hooks` and `asyncio._set_running_loop`
once, at import) starts unseen; so does a loop started in another thread
before aiocop was set up. The watchdog finds them on the threads' stacks, and
registers a loop on a thread only once that thread is proven to run it:

- a task's step, at any look: asyncio's registry of the task each loop is
  stepping now (`_current_tasks`, written by every loop that runs asyncio's
  Task; `current_task(loop)` on 3.14+, where the tasks keep it) names the
  loop whose current task's coroutine frame is on this thread's stack; or
  the frame below the step is the loop's own run method, or
  `asyncio.Runner.run` running it. The loop is registered there and then,
  with that edge (the frame that called into a loop written in C), and the
  step is timed from the last moment the thread was known not to be in it:
  a stall in the loop's very first step, or a hang, is reported like any
  other. A loop only held nearby (a local of a frame below the step, which
  may be another thread's loop: a main thread that started one in a thread,
  then iterates a generator) is sent a probe instead (`_probe`), which
  registers it from its own thread, after the step.
- an idle loop, once a second (`Finder.scan`): a loop written in Python by
  its dispatch frame (the loop's own method, running on that thread), one
  written in C by the loop the thread's innermost frame holds, sent a probe.

Nothing here runs the application's code: a candidate is tested by its
`type()` (never `isinstance`, which reads `__class__`), and only instances of
known loop classes (every class of its MRO from a loop package aiocop knows,
`_known_loop_type`) are asked anything; a loop of another class is
registered only when its current task proves it steps on that thread (a
real loop, then watched as if its start had been seen). On Python 3.10-3.12 reading a
frame's `f_locals` copies its locals into a dict kept on the frame (keeping
alive what the application deletes), so there only frames whose locals are
a loop's own are read (`_locals_of`).

Cost: per look, one CPU-clock read per thread that may start a step (`hot`:
new, used CPU in the last second, or ran a loop); the rest (parked threads)
are read once a second, at the scan.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import sys
import threading
import time
import weakref
from types import CoroutineType, GeneratorType
from typing import TYPE_CHECKING, Any

from aiocop._common.clock import perf_counter, thread_cpu_clock
from aiocop._interception import frames as _frames
from aiocop._interception import loops as _loops
from aiocop._interception.frames import MAX_WALK
from aiocop._interception.internals import KNOWN_LOOP_PACKAGES, PYTHON_LOOP_PACKAGES
from aiocop._stalls.state import state_of

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import CodeType, FrameType

    from aiocop._interception.loops import LoopWatch

logger = logging.getLogger("aiocop")

# inspect.CO_GENERATOR | CO_COROUTINE | CO_ITERABLE_COROUTINE | CO_ASYNC_GENERATOR
# (fixed values; inspect is not imported for them).
_CO_STEP = 0x20 | 0x80 | 0x100 | 0x200
_CO_OPTIMIZED = 0x1  # a function's frame: its locals are fast locals, not a dict
# Frames below a step's outermost one that may hold its loop: the caller of
# run_until_complete, asyncio.Runner.run (its `_loop`), a loop class's own
# run_forever written in Python.
_HOLDERS = 3
# 3.13+ (PEP 667): `frame.f_locals` is a view; before, a copy stored on the frame.
_LOCALS_VIEW = sys.version_info >= (3, 13)

# The task each loop is stepping now, as asyncio's Task records it (3.10-3.13);
# 3.14+ keeps it on the thread state, read through `current_task(loop)`.
try:
    import _asyncio

    _CURRENT: dict[Any, Any] | None = getattr(_asyncio, "_current_tasks", None)
except ImportError:  # pragma: no cover  (a Python without the C accelerator)
    _CURRENT = getattr(asyncio.tasks, "_current_tasks", None)
_CTask: Any = getattr(asyncio.tasks, "_CTask", None)
_RUNNER: Any = getattr(asyncio, "Runner", None)  # 3.11+; asyncio.run() of 3.10 holds its loop in a local

# Read through type's own descriptors: a metaclass of the application's is never run.
_mro_of: Callable[[type], tuple[type, ...]] = type.__dict__["__mro__"].__get__
_module_of: Callable[[type], object] = type.__dict__["__module__"].__get__
_known_types: dict[type, bool] = {}
_MAX_KNOWN_TYPES = 256


def _derives(cls: type, base: type) -> bool:
    # By identity: `in` would compare with ==, which a metaclass may define.
    return any(c is base for c in _mro_of(cls))


def _known_module(name: object) -> bool:
    if type(name) is not str:
        return False
    top = name.partition(".")[0]
    return top in KNOWN_LOOP_PACKAGES or name in _loops.UNANNOUNCED_LOOP_MODULES or name == "builtins"


def _known_class(cls: type) -> bool:
    """Whether every class of `cls`'s MRO comes from a loop package aiocop knows (cached): its code is theirs."""
    # Cached by class only for classes of `type` itself: a dict look-up hashes
    # its key, and a metaclass of the application's may define __hash__.
    plain = type(cls) is type
    known = _known_types.get(cls) if plain else None
    if known is None:
        try:
            known = all(_known_module(_module_of(c)) for c in _mro_of(cls))
        except Exception:  # not a class as type() knows them
            known = False
        if plain:
            if len(_known_types) >= _MAX_KNOWN_TYPES:
                _known_types.clear()
            _known_types[cls] = known
    return known


def _known_loop_type(cls: type) -> bool:
    """Whether instances of `cls` are event loops whose every method is a known loop package's.

    Decided from the class alone: an asyncio.AbstractEventLoop subclass by
    its MRO, each class of which comes from a loop package aiocop knows (or
    a module named in `UNANNOUNCED_LOOP_MODULES`). A subclass of the
    application's (a facade, a fake, a loop that overrides a method) may run
    any code when asked anything, so it is never asked: the loops that
    announce their start (asyncio's, uvloop's and their subclasses) are
    registered by that start, not here.
    """
    return _known_class(cls) and _derives(cls, asyncio.AbstractEventLoop)


def _python_loop(loop: object) -> bool:
    # Written in Python: a class of its own MRO (AbstractEventLoop aside) from
    # a loop package written in Python (an application's subclass of asyncio's too).
    for cls in _mro_of(type(loop)):
        name = _module_of(cls)
        if (
            cls is not asyncio.AbstractEventLoop
            and type(name) is str
            and name.partition(".")[0] in PYTHON_LOOP_PACKAGES
        ):
            return True
    return False


def _is_running(loop: object) -> bool:
    # (A known loop type only: its own is_running.)
    return bool(loop.is_running())  # type: ignore[attr-defined]


def _task_frame(task: object) -> FrameType | None:
    """The frame of `task`'s coroutine, read without running any code of the task's class."""
    cls = type(task)
    if _CTask is not None and _derives(cls, _CTask):
        coro = _CTask.get_coro(task)  # the C slot, whatever a subclass overrides
    elif _known_class(cls):  # asyncio's Task in Python, a loop's own (Leviathan's)
        coro = task.get_coro()  # type: ignore[attr-defined]
    else:
        return None
    kind = type(coro)
    if kind is CoroutineType:
        return coro.cr_frame  # type: ignore[no-any-return]
    if kind is GeneratorType:
        return coro.gi_frame  # type: ignore[no-any-return]
    return None


def _running_steps() -> dict[FrameType, Any]:
    """The coroutine frame of each loop's current task, and that loop (3.10-3.13; empty on 3.14+)."""
    if _CURRENT is None:
        return {}
    steps: dict[FrameType, Any] = {}
    for loop, task in _CURRENT.copy().items():  # (a copy: C, atomic under the GIL)
        frame = _task_frame(task)
        if frame is not None:
            steps[frame] = loop
    return steps


def _task_frame_here(loop: object, frame: FrameType) -> FrameType | None:
    """The coroutine frame of `loop`'s current task if it runs on the stack of `frame` (3.14+: `current_task(loop)`)."""
    if _CURRENT is not None:
        return None  # (3.10-3.13: _running_steps already said)
    try:
        task = asyncio.current_task(loop)  # type: ignore[arg-type]  # (C: compares the threads' running loops)
    except Exception:
        return None
    if task is None:
        return None
    target = _task_frame(task)
    f: FrameType | None = frame
    walked = 0
    while f is not None and walked < MAX_WALK:
        if f is target:
            return f
        walked += 1
        f = f.f_back
    return None


def _entry(frame: FrameType) -> bool:
    """Whether `frame` is a loop's own run method, or asyncio's that runs one: its locals are the loop's."""
    name = frame.f_globals.get("__name__")
    if type(name) is not str:
        return False
    code = frame.f_code.co_name
    if name == "asyncio.runners":
        return code == "run"
    return _known_module(name) and name != "builtins" and code in ("run_forever", "run_until_complete", "run")


def _locals_of(frame: FrameType) -> list[Any] | None:
    """The values of `frame`'s locals, where reading them keeps nothing alive; None where it would.

    3.13+: a view. Before, a snapshot kept on the frame until it returns (a
    connection the application `del`s stays open): read only from frames with
    no fast locals (a module's, whose locals are its globals) and from a
    loop's own run methods, whose locals are the loop's.
    """
    if _LOCALS_VIEW or not frame.f_code.co_flags & _CO_OPTIMIZED or _entry(frame):
        return list(frame.f_locals.values())
    return None


def _loop_in(value: object) -> Any:
    # A running loop of a known class: the value itself, or asyncio.Runner's.
    cls = type(value)
    if cls is _RUNNER:  # (exactly asyncio's: its attributes are plain)
        value = value._loop  # type: ignore[attr-defined]
        cls = type(value)
    if _known_loop_type(cls) and _is_running(value):
        return value
    return None


def running_loop_held_by(frame: FrameType) -> asyncio.AbstractEventLoop | None:
    """A running loop of a known class held by a local of `frame` (`loop.run_forever()`), or by a Runner's `_loop`."""
    values = _locals_of(frame)
    if values is None:
        return None
    for value in values:
        loop = _loop_in(value)
        if loop is not None:
            return loop  # type: ignore[no-any-return]
    return None


class _Thread:
    """What the watchdog last knew of a thread running no known loop."""

    __slots__ = ("clock", "cpu", "no_loop", "scan_cpu", "scanned", "t")

    def __init__(self, thread_id: int, now: float) -> None:
        self.clock = thread_cpu_clock(thread_id)
        self.cpu: float | None = None  # its CPU clock when its stack was last walked (None: never)
        self.t = now  # the last moment it was known not to be in a step of an unknown loop
        # The step last found (outermost frame, its code, the frame below) with no loop proven to run it.
        self.no_loop: tuple[int, CodeType, int] | None = None
        self.scan_cpu: float | None = None  # its CPU clock at the last scan (None: not read yet)
        self.scanned: float | None = None  # its CPU clock when the scan last looked for an idle loop on it


def _read(clock: int | None) -> float | None:
    if clock is None:
        return None
    try:
        return time.clock_gettime(clock)
    except OSError:  # the thread has gone
        return None


_failed_once = False


def _failed(thread_id: int) -> None:
    # One thread's examination failed (an object no one foresaw): the look goes
    # on with the others; said once, not at every look.
    global _failed_once
    if not _failed_once:
        _failed_once = True
        logger.warning(
            "aiocop: looking for unannounced event loops on thread %s failed; skipped (said once)",
            thread_id,
            exc_info=True,
        )


class Finder:
    """The watchdog's view of the threads running no known loop. Used by the watchdog thread only.

    `hot`: the threads read at every look (new ones, ones that used CPU in the
    last second or ran a loop); the others, parked, are read at the scan
    only: a look costs the same with 10 or 1000 idle threads.
    """

    def __init__(self) -> None:
        self.threads: dict[int, _Thread] = {}
        self.hot: dict[int, _Thread] = {}
        # The loop registry (replaced, never changed in place, at each change)
        # and the count of Python threads as of the last read: which threads
        # `threads` can hold. A thread whose loop stopped since (it may start
        # a loop aiocop is not told of, as its very next work), or one new
        # since, is in neither `threads` nor the registry.
        self._watches: dict[int, LoopWatch] | None = None
        self._thread_count = -1

    def quiet(self, watches: dict[int, LoopWatch]) -> bool:
        """Whether no such thread that may start a step used any CPU since its last walk (the cheap look).

        Not while a thread may have joined them since the last read (a known
        loop stopped, a thread started): the look that reads them is due.
        """
        if watches is not self._watches or len(threading._active) != self._thread_count:  # type: ignore[attr-defined]
            return False
        return all(thread.cpu is not None and _read(thread.clock) == thread.cpu for thread in self.hot.values())

    def read(
        self, frames: dict[int, FrameType], watches: dict[int, LoopWatch], now: float, *, scan: bool = False
    ) -> dict[int, float | None]:
        """The CPU clocks, now, of the threads in `frames` that run no known loop and may start a step.

        `scan` (once a second): of all of them; a thread that used no CPU
        since the previous scan is read at scans only from then on.
        """
        threads, hot = self.threads, self.hot
        count = len(threading._active)  # type: ignore[attr-defined]  # (one started after the snapshot: next look)
        # A known loop stopped (the registry changed), or a thread started:
        # that thread may start an unknown loop as its very next work.
        changed = watches is not self._watches or count != self._thread_count
        self._watches = watches
        if scan or changed:
            self._thread_count = count
            self._enlist(frames, watches, now)
        else:
            for gone in [tid for tid in hot if tid not in frames or tid in watches]:
                del threads[gone]
                del hot[gone]
        readings: dict[int, float | None] = {}
        if scan:
            for thread_id, thread in threads.items():
                cpu = readings[thread_id] = _read(thread.clock)
                if cpu is None or cpu != thread.scan_cpu:
                    hot[thread_id] = thread
                else:  # no CPU for a whole scan interval: parked
                    hot.pop(thread_id, None)
                thread.scan_cpu = cpu
        else:
            for thread_id, thread in hot.items():
                readings[thread_id] = _read(thread.clock)
        return readings

    def _enlist(self, frames: dict[int, FrameType], watches: dict[int, LoopWatch], now: float) -> None:
        # All of them: those gone or now running a known loop out, new ones in (hot).
        threads, hot = self.threads, self.hot
        for gone in [tid for tid in threads if tid not in frames or tid in watches]:
            del threads[gone]
            hot.pop(gone, None)
        for thread_id in frames:
            if thread_id not in threads and thread_id not in watches and not _is_aiocops(thread_id):
                threads[thread_id] = hot[thread_id] = _Thread(thread_id, now)

    def adopt(self, thread_id: int, seen: float, cpu: float | None) -> None:
        """`thread_id`'s loop stopped, last seen at `seen` (its CPU clock `cpu` then): a thread with no known loop."""
        thread = self.threads[thread_id] = self.hot[thread_id] = _Thread(thread_id, seen)
        thread.cpu = cpu

    def look(self, frames: dict[int, FrameType], readings: dict[int, float | None], now: float) -> list[LoopWatch]:
        """Register the loops found stepping; returns their watches.

        `readings`: the threads' CPU clocks at the snapshot `frames` (and `now`).
        """
        found: list[LoopWatch] = []
        steps: dict[FrameType, Any] | None = None  # read once, at the first walk that needs it
        for thread_id, cpu in readings.items():
            thread = self.threads.get(thread_id)
            frame = frames.get(thread_id)
            if thread is None or frame is None:
                continue
            if cpu is not None and cpu == thread.cpu:
                thread.t = now  # no CPU since its last walk: where that walk left it
                continue
            try:
                edge = _step_edge(frame)
                watch = None
                if edge is not None:
                    if steps is None:
                        steps = _running_steps()
                    watch = self._walk(thread_id, thread, frame, edge, steps)
            except Exception:
                _failed(thread_id)
                watch = None
            if watch is None:
                thread.t, thread.cpu = now, cpu
            else:
                del self.threads[thread_id]
                self.hot.pop(thread_id, None)
                found.append(watch)
        return found

    def _walk(
        self,
        thread_id: int,
        thread: _Thread,
        frame: FrameType,
        edge: tuple[FrameType, FrameType],
        steps: dict[FrameType, Any],
    ) -> LoopWatch | None:
        # Proof 1: the current task of a loop runs on this stack.
        if steps:
            f: FrameType | None = frame
            walked = 0
            while f is not None and walked < MAX_WALK:
                loop = steps.get(f)
                if loop is not None:
                    return _register(loop, f.f_back, thread_id, thread, by_task=True)
                walked += 1
                f = f.f_back
        outer, base = edge
        key = (hash(outer), outer.f_code, hash(base))  # (hash: a frame's address, without id()'s audit event)
        if key == thread.no_loop:
            return None
        thread.no_loop = key
        # Proof 2: the frame below the step is the loop's own run method, or asyncio's running it.
        if _entry(base):
            loop = running_loop_held_by(base)
            if loop is not None:
                return _register(loop, base, thread_id, thread)
        return _held_nearby(base, frame, thread_id, thread)

    def scan(self, frames: dict[int, FrameType], watches: dict[int, LoopWatch]) -> None:
        """Find running loops whose start aiocop did not see, idle, on the stacks of the other threads.

        Two kinds: loops written in Python that set no asyncgen hooks and have
        made no blocking call yet (veloxloop), by their dispatch frame; and loops
        written in C that bound the start signals before aiocop wrapped them
        (Leviathan looks up `sys.set_asyncgen_hooks` and
        `asyncio._set_running_loop` once, at import), by the running loop the
        thread's innermost frame holds: idle, such a loop runs no Python code,
        and that frame is the one that called into it. A thread that used no
        CPU since it was last looked at here is where it was then.
        After `read(scan=True)`.
        """
        for thread_id, thread in self.threads.items():
            cpu = thread.scan_cpu
            if thread_id in watches or (cpu is not None and cpu == thread.scanned):
                continue
            thread.scanned = cpu
            frame = frames.get(thread_id)
            if frame is None:
                continue
            try:
                _scan_one(thread_id, frame)
            except Exception:
                _failed(thread_id)


def _held_nearby(base: FrameType, frame: FrameType, thread_id: int, thread: _Thread) -> LoopWatch | None:
    """A loop held by a frame at or below the step's edge `base`; registered if proven to run here."""
    # Held nearby: maybe another thread's loop. Proven by its current task
    # (3.14+), or, of a known class, asked to register itself from its own thread.
    f: FrameType | None = base
    for _ in range(_HOLDERS):
        if f is None:
            break
        if f.f_code.co_name != "<module>":  # (a module's globals: any thread's objects)
            for value in _locals_of(f) or ():
                loop = value._loop if type(value) is _RUNNER else value  # (exactly asyncio's: plain attributes)
                cls = type(loop)
                if not _derives(cls, asyncio.AbstractEventLoop):
                    continue
                task_frame = _task_frame_here(loop, frame)
                if task_frame is not None:
                    return _register(loop, task_frame.f_back, thread_id, thread, by_task=True)
                if _known_loop_type(cls) and not _registered(loop) and _is_running(loop):
                    _probe(loop)
                    return None
        f = f.f_back
    return None


def _scan_one(thread_id: int, frame: FrameType) -> None:
    f: FrameType | None = frame
    depth = 0
    while f is not None and depth < MAX_WALK:
        depth += 1
        name = f.f_globals.get("__name__")
        roles = _frames.LOOP_ROLES.get(name) if type(name) is str else None
        if roles is not None and roles.get(f.f_code.co_name) == "dispatch" and name != "asyncio.events":
            # The loop's own method, running on this thread: its locals are the loop's.
            loop = next((v for v in f.f_locals.values() if _known_loop_type(type(v))), None)
            if loop is not None and not _registered(loop):
                _loops.register(loop, None, thread_id, discovered=True)
            return
        f = f.f_back
    loop = running_loop_held_by(frame)
    if loop is not None and not _registered(loop):
        _probe(loop)


def _step_edge(frame: FrameType) -> tuple[FrameType, FrameType] | None:
    """The outermost frame of the task step running on this stack, and the frame below it, if one runs.

    From the innermost frame out: the first coroutine or generator frame, and
    those it was awaited from, are the step's; the frame below them called
    into the loop (a loop written in C), or is the loop's own dispatch (one
    written in Python).
    """
    f: FrameType | None = frame
    outer: FrameType | None = None
    walked = 0
    while f is not None and walked < MAX_WALK:
        walked += 1
        if f.f_code.co_flags & _CO_STEP:
            outer = f
        elif outer is not None:
            return outer, f
        f = f.f_back
    return None


def _registered(loop: object) -> bool:
    return any(watch.loop is loop for watch in _loops.watches.values())


def _register(
    loop: Any, base: FrameType | None, thread_id: int, thread: _Thread, *, by_task: bool = False
) -> LoopWatch | None:
    """Register `loop`, proven to run on `thread_id`, there; `base`: the frame that called into it.

    `by_task`: proven by its current task's coroutine running there, so a
    real loop stepping on that thread whatever its class: one of the
    application's (a subclass of asyncio's started before aiocop was set up)
    is then watched as if its start had been seen, as such a loop is when it
    is (its methods are asked then as now). Otherwise only known loop classes.
    """
    cls = type(loop)
    if not (_known_loop_type(cls) or (by_task and _derives(cls, asyncio.AbstractEventLoop))) or _registered(loop):
        return None
    if _known_loop_type(cls):  # (nothing of the application's is read)
        owner = getattr(loop, "_thread_id", None)  # asyncio's (uvloop keeps its own out of reach)
        if type(owner) is int and owner not in (0, thread_id):
            return None
    watch = _loops.register(loop, None if _python_loop(loop) else base, thread_id, discovered=True)
    # The step is timed from the last moment this thread was known not to be in it.
    state = state_of(watch)
    state.idle_t, state.idle_cpu = thread.t, thread.cpu
    return watch


def _is_aiocops(thread_id: int) -> bool:
    # aiocop's own threads (delivery, hang reports) run no loop.
    thread = threading._active.get(thread_id)  # type: ignore[attr-defined]  # (a dict lookup, no enumerate())
    return thread is not None and thread.name.startswith("aiocop-")


def still_running(watch: LoopWatch) -> bool:
    loop = watch.loop
    if loop is None:
        return False
    try:
        return _is_running(loop)  # (discovered loops are of known classes)
    except Exception:
        return False


# Loops sent a probe, and when: one probe per loop while it has not answered.
_probed: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, float] = weakref.WeakKeyDictionary()
_PROBE_AGAIN_S = 5.0


def _probe(loop: asyncio.AbstractEventLoop) -> None:
    """Ask `loop` (of a known class) to run a callback that registers it, on its own thread and with its own edge.

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
        if threading.get_ident() in _loops.watches or _registered(loop):
            return
        _loops.register(loop, None if _python_loop(loop) else sys._getframe(1), discovered=True)

    with contextlib.suppress(RuntimeError):  # closed meanwhile
        loop.call_soon_threadsafe(found, context=contextvars.Context())
