"""A stall as reported: its length, its samples, its task and what the loop was doing.

What the watchdog saw of a step (`timing.Step`) becomes a `Stall` when the
step ends (`timing.stall_of`); the task whose step it was is found while it runs (`StalledTask`,
read from another thread), and the culprit is named from the most frequent
sample (`describe`, which reads source lines: off the hot path).

May import: aiocop._model, aiocop._interception.loops (types only), aiocop._interception.trio_runs,
aiocop._stalls.culprit.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiocop._interception.trio_runs import TrioRun, is_run
from aiocop._model import state as _state
from aiocop._stalls import culprit as _culprit

if TYPE_CHECKING:
    from types import CodeType, FrameType

    from aiocop._interception.loops import LoopWatch


# One stack a step's samples found, how often, and the loop time (s) they stand for (`stacks.sample`).
Sampled = tuple[tuple[tuple["CodeType", int], ...], int, float]


@dataclass
class Stall:
    """A finished stall, ready to report or to merge into an io event."""

    watch: LoopWatch
    start: float
    end: float
    # Each stack sampled, most common first: how often, and the loop time (s) its samples stand for.
    samples: list[Sampled]
    waiting: bool  # the loop thread used (almost) no CPU: it was waiting, not working
    root: FrameType | None
    waiting_top: bool = False  # the most frequent stack was sampled while waiting
    task: StalledTask | None = None  # whose step it was, as seen while it stalled
    ident: object = None  # the step's identity (`step_of`): an io event of the same step takes the stall
    # The last look that saw the step still running: its real end lies between
    # this and the next look (`end` is an estimate within that gap).
    seen_until: float = 0.0
    hang_reports: int = 0  # reported as a hang this many times while it ran
    hung_s: float = 0.0  # how long it had run at its latest hang report

    def release(self) -> None:
        """Drop the stalled frame and task: once its event exists, it says which task it was."""
        self.root = None
        self.task = None
        self.ident = None

    def culprit(self) -> str:
        """What the loop was doing (reads source lines: call it off the hot path)."""
        return describe(self.samples, self.waiting_top)

    def middle(self) -> float:
        """Its midpoint: an io event that lasted past it was the same step.

        Its edges are estimates good to a millisecond or two, while a stall
        lasts at least the threshold: an io event of the same step ends near
        the stall's end, one of the step before near the stall's start.
        """
        return (self.start + self.end) / 2.0


@dataclass(frozen=True)
class StalledTask:
    """The task whose step stalled, its context and whether it is watched, at one moment."""

    task: Any  # None for a plain callback
    context: contextvars.Context  # a copy of the task's context (empty before 3.12)
    monitored: bool

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop | None, root: FrameType | None, seen: Any = None) -> StalledTask:
        """The task of `loop` whose coroutine runs in `root`, as it is now.

        `seen`: the task `running_task` found the step in, as the look walked
        it; it may be done by now (see there).
        """
        if is_run(loop):
            return cls._of_trio(loop, root)
        task = seen if seen is not None else _find_task(loop, root)
        context = _context_of(task)
        if task is None:
            return cls(None, context, True)  # a plain callback: always watched
        # The task's own monitored() scope if it entered one (known on every
        # version and loop), else the one it inherited (3.12+ only).
        own = _state.task_monitored.get(task)
        return cls(task, context, context.get(_state.monitored, True) if own is None else own)

    @classmethod
    def _of_trio(cls, run: TrioRun, root: FrameType | None) -> StalledTask:
        # A trio task runs every step in its own context (`task.context`), where its
        # monitored() scopes are, whichever task entered them.
        task = run.task_of(root)
        held = getattr(task, "context", None)
        if not isinstance(held, contextvars.Context):
            return cls(task, contextvars.Context(), True)
        context = held.copy()
        return cls(task, context, context.get(_state.monitored, True))


def _context_of(task: Any) -> contextvars.Context:
    """A copy of the context `task` runs its steps in (its request's keys), read from another thread."""
    if task is None:
        return contextvars.Context()
    get_context = getattr(task, "get_context", None)  # Task.get_context() is 3.12+
    if get_context is not None:
        return get_context().copy()  # type: ignore[no-any-return]
    held = getattr(task, "_context", None)  # asyncio's Task written in Python, and its likes
    if isinstance(held, contextvars.Context):
        return held.copy()
    # The C Task of 3.10 and 3.11 has no accessor, but reports what it holds
    # to the garbage collector, its own context first (before the contexts of
    # its done-callbacks): the one place that context can be read from.
    for referent in gc.get_referents(task):
        if type(referent) is contextvars.Context:
            return referent.copy()
    return contextvars.Context()


def running_task(loop: object, root: FrameType) -> Any:
    """The asyncio task stepping in `root` on `loop` at this moment, or None.

    Read as a look walks the step, before anything lets the GIL go: a look
    that waited on a C call's hold (json.dumps, a regex) reads the loop
    thread's scheduling (os.pread) after the walk, and the thread, handed
    the GIL back, can finish its step and its task meanwhile. A finished task
    is in no task list any more (`_find_task`), and the stall was reported
    with no task, one time in three on a busy machine. One dict look-up
    (the loop's current task), checked against the step's frame: a task
    that has since moved on to another step, or a plain callback, is not it.
    """
    if loop is None or is_run(loop):
        return None
    try:
        task = asyncio.current_task(loop)  # type: ignore[arg-type]
    except Exception:  # a loop asyncio does not know how to ask
        return None
    if task is None or getattr(task.get_coro(), "cr_frame", None) is not root:
        return None
    return task


def _find_task(loop: asyncio.AbstractEventLoop | None, root: FrameType | None) -> Any:
    if loop is None or root is None:
        return None
    try:
        for task in asyncio.all_tasks(loop):
            if getattr(task.get_coro(), "cr_frame", None) is root:
                return task
    except RuntimeError:  # the task set changed under us (read from another thread)
        return None
    return None


def describe(samples: list[Sampled], waiting: bool) -> str:
    if not samples or not samples[0][0]:
        return ""
    code, lasti = samples[0][0][0]  # innermost frame of the most frequent stack
    return _culprit.describe(code, lasti, _line(code, lasti), waiting)


def _line(code: CodeType, lasti: int) -> int:
    for start, end, line in code.co_lines():
        if start <= lasti < end and line is not None:
            return int(line)
    return int(code.co_firstlineno)
