"""Hung loops, reported while they hang: the watchdog's report of a step still running past `hang_after_ms`.

A step that never ends (a deadlock on a lock, a `recv()` from a silent
peer, an endless loop) never gets its usual event. The watchdog sees it go
on (`_stalls.watchdog.Watchdog._hang`) and hands it here through the sink
(`_reporting.sink`), on its own thread, at `hang_after_ms` and again at
doubling intervals: the loop thread's stack at
that moment, the task, and what the loop waits for is taken there and then
(the frames are live); the event is built and given to the callbacks on a
separate reporter thread, so that a callback that is slow, blocks or raises
never stops the watchdog from watching. That thread exists only while it has
reports to deliver.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import threading
from _thread import allocate_lock
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiocop._common.clock import perf_counter
from aiocop._interception import frames as _frames
from aiocop._interception import hook as _hook
from aiocop._interception import loops as _loops
from aiocop._interception import wrappers as _wrappers
from aiocop._interception.frames import Kind
from aiocop._model import callbacks as _callbacks
from aiocop._model import state as _state
from aiocop._model.events import SlowTaskEvent
from aiocop._reporting import building as _building
from aiocop._stalls import attribution as _attribution
from aiocop._stalls import culprit as _culprit
from aiocop._stalls import settings as _settings
from aiocop._stalls.state import state_of

if TYPE_CHECKING:
    from types import CodeType, FrameType

    from aiocop._interception.loops import LoopWatch
    from aiocop._stalls.attribution import Sampled, StalledTask
    from aiocop._stalls.timing import Step

logger = logging.getLogger("aiocop")

# Hang reports waiting for the reporter thread at most (the oldest are
# dropped first: a later report of the same hang has a fresher stack).
_MAX_QUEUED = 64
# A callback that has been running this long on the reporter thread is
# logged (once per run of it): hang reports wait behind it.
_STUCK_CALLBACK_S = 10.0
_MAX_BLOCKER_DEPTH = 40

Stack = tuple[tuple["CodeType", int], ...]


@dataclass
class Hang:
    """What the watchdog saw of a hung step, at one look: enough to build its event off the watchdog's thread."""

    watch: LoopWatch
    task: StalledTask
    stack: Stack
    waiting: bool  # the loop thread used (almost) no CPU: waiting, not working
    elapsed_s: float
    number: int  # 1 for the first report of the step
    provided: dict[str, Any] | None  # the context providers' dict at the step's first blocking call
    found_group: bool  # the step made a blocking call (its providers ran then, or none was registered)
    blocker: str
    blocker_trace: str
    wrapped: str  # the call an aiocop wrapper on top of the stack waits in ("threading.RLock.__enter__"), or ""


def _hang_of(watch: LoopWatch, step: Step, innermost: FrameType, now: float) -> Hang:
    """The step that holds `watch`'s loop at `now`, its thread's innermost frame `innermost`, as a hang report."""
    task = step.task if step.task is not None else _attribution.StalledTask.of(watch.loop, step.root)
    group = _group_of(watch, step)
    blocker, blocker_trace = _blocker(innermost)
    return Hang(
        watch,
        task,
        _stack(innermost, step.root),
        not step.cpu_bound(),
        now - step.start() - step.paused_s,  # (a stopped process is no part of a hang)
        step.hangs,
        group.provided if group is not None else None,
        group is not None,
        blocker,
        blocker_trace,
        _wrapped_call(innermost),
    )


def report(watch: LoopWatch, step: Step, innermost: FrameType, now: float) -> None:
    """Called by the watchdog (its thread) with a step still running past `hang_after_ms`."""
    if not _state.active:
        return  # deactivate() pauses every report
    # Reported even in a monitored(False) scope (an unsampled request): a
    # hung loop stops every request, and a report costs them nothing.
    hang = _hang_of(watch, step, innermost, now)
    reporter.submit(hang)


def _stack(innermost: FrameType, root: FrameType) -> Stack:
    # As the watchdog's samples are taken: aiocop's own frames (a wrapper
    # waiting in the lock it wraps) left out, up to the step's outermost frame.
    frames: list[tuple[CodeType, int]] = []
    f: FrameType | None = innermost
    depth = _settings.sampling.trace_depth
    while f is not None and len(frames) < depth:
        if _frames.frame_kind(f) != Kind.AIOCOP:
            frames.append((f.f_code, f.f_lasti))
        if f is root:
            break
        f = f.f_back
    return tuple(frames)


# Lock types as users know them (`threading.Lock()` makes a `_thread.lock`).
_KNOWN_AS = {"_thread.lock": "threading.Lock", "_thread.RLock": "threading.RLock"}
# The wrappers' module: a frame of it is a wrapper, waiting in the call it wraps.
_WRAPPERS_MODULE = _wrappers.__name__


def _wrapped_call(innermost: FrameType) -> str:
    # A loop stuck inside one of aiocop's wrappers (a `with lock:`, whose
    # line shows no call to name) waits in the call that wrapper wraps.
    if innermost.f_globals.get("__name__") != _WRAPPERS_MODULE:
        return ""
    try:
        local = innermost.f_locals
        original, held = local.get("original"), local.get("self")
    except Exception:  # a frame's locals, read from another thread: never let it break a report
        return ""
    name = getattr(original, "__name__", None)
    if not isinstance(name, str):
        return ""
    if held is not None:
        kind = type(held)
        owner = f"{kind.__module__}.{kind.__qualname__}"
        return f"{_KNOWN_AS.get(owner, owner)}.{name}"
    module = getattr(original, "__module__", None)
    return f"{module}.{name}" if isinstance(module, str) else name


def _group_of(watch: LoopWatch, step: Step) -> Any:
    # The step's io event in the making, if it made a blocking call: the
    # context providers ran at that call, inside the step.
    with contextlib.suppress(RuntimeError):  # the dict changed under us (another thread)
        for group in list(_hook.unclaimed):
            if group.thread_id == watch.thread_id and group.ident is step.ident and not group.t_end:
                return group
    return None


# --- who holds what the loop waits for -------------------------------------

_OWNER = re.compile(r"\bowner=(\d+)")
_RLOCK_TYPES: tuple[type, ...] = tuple(
    t for t in (getattr(threading, "_CRLock", None), getattr(threading, "_PyRLock", None)) if isinstance(t, type)
)


# Modules whose frames wait on a lock or a thread and hold it as `self`: the wrappers', threading's.
_WAITING_MODULES = (_WRAPPERS_MODULE, "threading")


def _blocker(innermost: FrameType) -> tuple[str, str]:
    """Who holds what the innermost frames wait on, and that thread's stack; `("", "")` if not known.

    Only what costs nothing to anyone else: an RLock records its owner (a
    Condition's lock is an RLock by default), and a thread being joined is
    the one to wait for. A plain `Lock` records no owner, and learning it
    would mean wrapping every acquisition in the process.
    """
    f: FrameType | None = innermost
    for _ in range(4):  # the waiting call is at most a few frames down (aiocop's wrapper, threading's)
        if f is None:
            break
        module = f.f_globals.get("__name__")
        if module in _WAITING_MODULES:
            try:
                held = f.f_locals.get("self")
            except Exception:  # a frame's locals, read from another thread: never let it break a report
                held = None
            found = _holder_of(held)
            if found is not None:
                return found
        f = f.f_back
    return "", ""


def _holder_of(held: object) -> tuple[str, str] | None:
    if isinstance(held, threading.Thread):
        if held.ident is None or not held.is_alive():
            return None
        return f"joining thread {held.name!r} (id {held.ident}), still running", _thread_trace(held.ident)
    if isinstance(held, threading.Condition):
        held = held._lock  # type: ignore[attr-defined]  # its lock: with cond: waits for that lock's owner
    owner: int | None = None
    if _RLOCK_TYPES and isinstance(held, _RLOCK_TYPES):
        owner = getattr(held, "_owner", None)  # the RLock written in Python keeps it as an attribute
        if owner is None:
            match = _OWNER.search(repr(held))  # the C RLock shows it only there
            owner = int(match.group(1)) if match else None
    if not owner:
        return None
    name = next((t.name for t in threading.enumerate() if t.ident == owner), "?")
    return f"thread {name!r} (id {owner}) owns the {type(held).__name__}", _thread_trace(owner)


def _thread_trace(ident: int) -> str:
    frame = sys._current_frames().get(ident)
    texts: list[str] = []
    while frame is not None and len(texts) < _MAX_BLOCKER_DEPTH:
        if _frames.frame_kind(frame) != Kind.AIOCOP:
            texts.append(_building.frame_of(frame.f_code, frame.f_lasti)[1])
        frame = frame.f_back
    return " <- ".join(texts)


# --- the event and its delivery ----------------------------------------------


def build_event(hang: Hang) -> SlowTaskEvent:
    """The `reason="hang"` event of a report (reads source lines: off the watchdog's thread)."""
    stack = [(hang.stack, 1, hang.elapsed_s)] if hang.stack else []
    samples = _building.format_samples(stack)
    elapsed_ms = hang.elapsed_s * 1000.0
    task = hang.task.task
    return SlowTaskEvent(
        elapsed_ms=elapsed_ms,
        threshold_ms=_state.config.threshold_ms,
        exceeded_threshold=True,
        severity_score=0,
        severity_level="low",
        reason="hang",
        blocking_events=[],  # the step's calls are in its final event
        context=_context(hang),
        cpu_stack_samples=samples,
        task_name=_hook.task_name(task) if task is not None else None,
        thread_name=hang.watch.thread_name,
        thread_id=hang.watch.thread_id,
        loop=hang.watch.loop_name,
        call_site=samples[0]["app_site"] if samples else "",
        culprit=_culprit_of(hang, stack),
        impact="high",
        ongoing=True,
        hang_reports=hang.number,
        hung_ms=elapsed_ms,
        blocker=hang.blocker,
        blocker_trace=hang.blocker_trace,
    )


def _culprit_of(hang: Hang, stack: list[Sampled]) -> str:
    described = _attribution.describe(stack, hang.waiting)
    if not (hang.wrapped and hang.waiting):
        return described
    method = hang.wrapped.rpartition(".")[2]
    called = described.removeprefix("waiting in ") if described.startswith("waiting in ") else ""
    if not called or _culprit.callee(called) != method:
        # The line shows no call to the method the wrapper waits in (`with
        # lock:`: no call before 3.14, a call of the lock itself from 3.14):
        # name that method.
        kind = "lock" if method == "__enter__" else _culprit.WAITS.get(method, "")  # (aiocop wraps locks' only)
        return f"waiting in {hang.wrapped}" + (f" ({kind})" if kind else "")
    return described


def _context(hang: Hang) -> dict[str, Any]:
    # What the providers returned at the step's first blocking call; for a
    # step that made none (an endless loop), they run now, on this thread,
    # inside a copy of the hung task's context: a provider that reads
    # context variables (a request id, the current span) sees the request's;
    # one that asks asyncio for the current task or loop finds none here.
    if hang.provided is not None:
        return dict(hang.provided)
    if hang.found_group or not _callbacks.providers:
        return {}
    return hang.task.context.copy().run(_callbacks.capture_context)


class _Reporter:
    """The thread that builds hang events and runs the callbacks with them, alive only while it has some.

    Not the delivery thread (`worker.Worker`), nor another instance of it: the two differ where it matters.
    A hang report must not wait behind a flood of io events for a slow callback (with `delivery="thread"`
    up to 10 000 steps), so it has a thread of its own. When full, this queue drops its oldest report (a
    later report of the same hang has a fresher stack), the worker its newest steps (events keep their
    order, and what was queued first is delivered). This thread ends as soon as it has nothing to do (most
    processes never report a hang); the worker's stays for the run, and its `drain` stops a batch step by
    step under a sequence-numbered gate, which whole reports, taken one at a time, do not need. What they
    share (a daemon thread started on demand, a lock and a queue) is a few lines; made one class, each
    difference would become an option of it.
    """

    def __init__(self) -> None:
        self._queue: deque[Hang] = deque()
        self._lock = allocate_lock()
        self._thread: threading.Thread | None = None
        self.dropped = 0
        self._busy_since = 0.0  # perf_counter() when the callbacks of the current report started, or 0
        self._stuck_logged = 0.0

    def submit(self, hang: Hang) -> None:
        with self._lock:
            if len(self._queue) >= _MAX_QUEUED:
                self._queue.popleft()
                self.dropped += 1
            self._queue.append(hang)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="aiocop-hang-report", daemon=True)
                self._thread.start()
        busy = self._busy_since
        if busy and perf_counter() - busy > _STUCK_CALLBACK_S and self._stuck_logged != busy:
            self._stuck_logged = busy
            logger.error(
                "aiocop: a slow-task callback has been running for %.0f s on the hang-report thread; "
                "hang reports wait behind it (%d queued)",
                perf_counter() - busy,
                len(self._queue),
            )

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._thread = None
                    return
                hang = self._queue.popleft()
            self._busy_since = perf_counter()
            try:
                _callbacks.invoke_callbacks(build_event(hang))
            except BaseException:  # this thread must outlive anything a callback raises
                logger.exception("aiocop: delivering a hang report failed (ignored)")
            finally:
                self._busy_since = 0.0

    def stop(self, timeout: float) -> None:
        """Deliver what is queued within `timeout` seconds, then drop (count, log) the rest: for `aiocop.stop()`.

        A callback still running then (one that blocks) is left to finish;
        no queued report starts after this returns.
        """
        if self.idle(timeout):
            return
        with self._lock:
            left = len(self._queue)
            self._queue.clear()
            self.dropped += left
        if left:
            logger.warning("aiocop: %d hang report(s) dropped at stop(): a slow-task callback did not return", left)

    def idle(self, timeout: float) -> bool:
        """Wait until every queued report has been delivered (tests, stop); False after `timeout` s."""
        deadline = perf_counter() + timeout
        pause = allocate_lock()
        pause.acquire()
        while True:
            with self._lock:
                if self._thread is None:
                    return True
            if perf_counter() >= deadline:
                return False
            pause.acquire(True, 0.005)


reporter = _Reporter()


def blocked_by_loop() -> dict[tuple[str, str], float]:
    """How long each running loop has been held by its current step, in seconds, if that step is a stall (else 0).

    Keyed by (the loop's class, its thread's name); where several loops share
    a key, the longest. Read at any moment, from any thread (an
    OpenTelemetry exporter's), from what the watchdog saw at its last look:
    a loop hung for a minute reads 60 while it hangs.
    """
    now = perf_counter()
    blocked: dict[tuple[str, str], float] = {}
    for watch in list(_loops.watches.values()):
        step = state_of(watch).step
        seconds = 0.0
        if step is not None and step.stalled and not step.merged:
            with contextlib.suppress(Exception):  # changing under us: 0 this time
                seconds = max(0.0, now - step.start())
        key = (watch.loop_name.rpartition("@")[0], watch.thread_name)
        blocked[key] = max(blocked.get(key, 0.0), seconds)
    return blocked


def ongoing() -> list[SlowTaskEvent]:
    """The steps still holding their loop now, past the stall threshold, as `reason="hang"` events (`ongoing`).

    For the end of a run (a SIGTERM, the program's exit): a step stuck for
    less than `hang_after_ms` has had no hang report, and its final event
    never comes, so without this look the run would end in an all-clear.
    Built here, on the caller's thread, with the loop thread's stack as it
    is now; `hang_reports` says how many hang reports the step had (0: none).
    """
    now = perf_counter()
    frames = sys._current_frames()
    found: list[SlowTaskEvent] = []
    for watch in list(_loops.watches.values()):
        step = state_of(watch).step
        innermost = frames.get(watch.thread_id)
        if step is None or not step.stalled or step.merged or innermost is None:
            continue
        if not _still_running(innermost, step.root):
            continue  # it ended since the watchdog's last look: its own event reports it
        try:
            found.append(build_event(_hang_of(watch, step, innermost, now)))
        except Exception:  # a look at another thread's live frames: never let it break the end of a run
            logger.exception("aiocop: could not describe a step still running at exit (ignored)")
    return found


def _still_running(innermost: FrameType, root: FrameType) -> bool:
    f: FrameType | None = innermost
    while f is not None:
        if f is root:
            return True
        f = f.f_back
    return False


def _after_fork_in_child() -> None:
    global reporter
    reporter = _Reporter()  # the parent's reports are the parent's


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
