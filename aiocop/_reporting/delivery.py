"""Turning a step's raw records into a `SlowTaskEvent` and handing it to callbacks.

Delivery normally happens on the loop's thread, in the callback the hook
scheduled with `loop.call_soon` at the step's first blocking call. With
`delivery="thread"`, or when a loop stopped before that callback could run,
a worker thread delivers instead.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import logging
import os
import sys
import threading
import weakref
from queue import SimpleQueue
from typing import TYPE_CHECKING, Any, NamedTuple

from aiocop._common import clock as _clock
from aiocop._common import forksafe as _forksafe
from aiocop._common.clock import elapsed, monotonic, perf_counter
from aiocop._interception import harmless as _harmless
from aiocop._interception import hook as _hook
from aiocop._interception import loops as _loops
from aiocop._interception.frames import format_frame, is_app_file, is_internal_file
from aiocop._model import callbacks as _callbacks
from aiocop._model import state as _state
from aiocop._model.events import BlockingEventInfo, CpuStackSample, RawBlockingEvent, SlowTaskEvent
from aiocop._model.exceptions import HighSeverityBlockingIoException
from aiocop._model.severity import get_severity_level_from_score, impact_level
from aiocop._stalls import attribution as _attribution
from aiocop._stalls import settings as _settings
from aiocop._stalls import timing as _timing
from aiocop._stalls import watchdog as _watchdog

if TYPE_CHECKING:
    from asyncio import AbstractEventLoop, Task
    from collections.abc import Callable
    from types import CodeType

    from aiocop._interception.hook import Record, StepGroup
    from aiocop._interception.loops import LoopWatch
    from aiocop._stalls.attribution import Stall

logger = logging.getLogger("aiocop")

_MAX_ARG_CHARS = 100


# Events whose arguments are shown in part: an import's are the module's name,
# its file, and the live sys.path, sys.meta_path and sys.path_hooks (hundreds
# of characters that say nothing of the call).
_SHOWN_ARGS: dict[str, int] = {"import": 1}


def _format_args(args: tuple[Any, ...], event: str = "") -> str:
    shown = _SHOWN_ARGS.get(event)
    if shown is not None:
        args = args[:shown]
    parts = []
    for arg in args:
        try:
            text = arg if isinstance(arg, str) else repr(arg)
        except Exception:
            text = f"<{type(arg).__name__}>"
        parts.append(text if len(text) <= _MAX_ARG_CHARS else text[: _MAX_ARG_CHARS - 3] + "...")
    return ", ".join(parts)


def _info(
    event: str,
    args_text: str,
    frames: list[tuple[str, int, str]],
    texts: list[str],
    site: str | None,
    severity: int | None,
) -> BlockingEventInfo:
    return {
        "event": f"{event}({args_text})",
        "trace": " <- ".join(texts),
        "entry_point": site or (texts[0] if texts else "unknown"),
        "severity": severity,
        "name": event,
        "args": args_text,
        "frames": frames,
    }


# (file, first line, function, f_lasti) -> (frame tuple, text). Not keyed by the
# code object, whose hash covers all its constants, nor by id(), which is an
# audited call.
_frame_cache: dict[tuple[str, int, str, int], tuple[tuple[str, int, str], str]] = {}
_FRAME_CACHE_SIZE = 8192


def _frame(code: CodeType, lasti: int) -> tuple[tuple[str, int, str], str]:
    """A captured frame as a `(filename, lineno, function)` tuple and as text (cached per code location)."""
    key = (code.co_filename, code.co_firstlineno, code.co_name, lasti)
    entry = _frame_cache.get(key)
    if entry is not None:
        return entry
    line: int = code.co_firstlineno
    for start, end, number in code.co_lines():
        if start <= lasti < end:
            line = line if number is None else int(number)
            break
    frame = (code.co_filename, line, code.co_name)
    text = format_frame(frame)
    if len(_frame_cache) >= _FRAME_CACHE_SIZE:
        _frame_cache.clear()
    _frame_cache[key] = (frame, text)
    return frame, text


def format_record(record: Record, wall_offset: float | None = None, raised: bool = False) -> BlockingEventInfo:
    event, args, trace, site, timestamp, weight, app = record
    pairs = [_frame(code, lasti) for code, lasti in trace]
    site_text = _frame(*site)[1] if site is not None else None
    info = _info(event, _format_args(args, event), [p[0] for p in pairs], [p[1] for p in pairs], site_text, weight)
    info["app_site"] = _frame(*app)[1] if app is not None else info["entry_point"]
    if wall_offset is None:
        wall_offset = _clock.time() - perf_counter()
    info["timestamp"] = timestamp + wall_offset
    info["raised"] = raised
    return info


def record_site(record: Record) -> str:
    """A record's `app_site` alone, as `format_record` gives it (cheap: frames are formatted once per line)."""
    _, _, trace, site, _, _, app = record
    if app is not None:
        return _frame(*app)[1]
    if site is not None:
        return _frame(*site)[1]
    return _frame(*trace[0])[1] if trace else "unknown"


def record_call(record: Record) -> tuple[str, str]:
    """A record's event name, and the call as `BlockingEventInfo["event"]` shows it."""
    event, args = record[0], record[1]
    return event, f"{event}({_format_args(args, event)})"


def format_blocking_event(raw_event: RawBlockingEvent) -> BlockingEventInfo:
    """Format a raw 1.x-style event into a `BlockingEventInfo`.

    Args:
        raw_event: A `RawBlockingEvent` (event name, raw arguments, raw stack
            of `(filename, lineno, function)` tuples innermost first, ...).
    """
    if not isinstance(raw_event, dict):
        raise TypeError(f"raw_event must be a RawBlockingEvent dict, not {type(raw_event).__name__}")
    missing = [key for key in RawBlockingEvent.__annotations__ if key not in raw_event]
    if missing:
        raise TypeError(f"raw_event lacks the RawBlockingEvent key(s) {missing}")
    args = raw_event["raw_args"]
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"raw_event['raw_args'] must be a tuple of the call's arguments, not {args!r}")
    if len(args) == 2 and isinstance(args[0], tuple) and isinstance(args[1], dict):
        args = args[0]  # 1.x wrappers passed (args, kwargs)
    stack = raw_event["raw_stack"]
    if not isinstance(stack, (tuple, list)) or not all(
        isinstance(frame, (tuple, list)) and len(frame) == 3 for frame in stack
    ):
        raise TypeError(f"raw_event['raw_stack'] must be a list of (filename, lineno, function) tuples, not {stack!r}")
    if not isinstance(raw_event["event_name"], str):
        raise TypeError(f"raw_event['event_name'] must be a string, not {raw_event['event_name']!r}")
    frames = list(stack)
    texts = [format_frame(f) for f in frames]
    name = raw_event["event_name"]
    info = _info(name, _format_args(tuple(args), name), frames, texts, None, raw_event["severity"])
    info["timestamp"] = raw_event["timestamp"]
    return info


def _loop_name(loop: object) -> str:
    # object.__repr__ gives the address without calling id() (an audited call).
    cls = type(loop)
    address = object.__repr__(loop).rpartition(" at ")[2].rstrip(">")
    return f"{cls.__module__}.{cls.__qualname__}@{address}"


def format_samples(samples: list[tuple[tuple[tuple[CodeType, int], ...], int]]) -> list[CpuStackSample]:
    formatted: list[CpuStackSample] = []
    for stack, count in samples:
        pairs = [_frame(code, lasti) for code, lasti in stack]
        texts = [p[1] for p in pairs]
        user = next((p[1] for p in pairs if not is_internal_file(p[0][0])), texts[0] if texts else "unknown")
        app = next((p[1] for p in pairs if not is_internal_file(p[0][0]) and is_app_file(p[0][0])), user)
        frames = [p[0] for p in pairs]
        formatted.append(
            {"trace": " <- ".join(texts), "entry_point": user, "count": count, "frames": frames, "app_site": app}
        )
    return formatted


class _Origin:
    """What a batch of events shares: its loop (named when first asked), clock offset and threshold."""

    __slots__ = ("loop_ref", "loop_type", "threshold_ms", "wall_offset")

    def __init__(self, loop: object, wall_offset: float | None = None) -> None:
        self.wall_offset = _clock.time() - perf_counter() if wall_offset is None else wall_offset
        self.threshold_ms = _state.config.threshold_ms
        if isinstance(loop, str):  # already named (the watchdog names loops when they start)
            self.loop_type: Any = loop
            self.loop_ref: Any = None
        else:
            self.loop_type = type(loop)
            self.loop_ref = weakref.ref(loop)

    def loop_name(self) -> str:
        cls = self.loop_type
        if isinstance(cls, str):
            return cls
        loop = self.loop_ref()
        return _loop_name(loop) if loop is not None else f"{cls.__module__}.{cls.__qualname__}@(gone)"


def _step_fields(
    origin: _Origin, group: StepGroup, context: dict[str, Any] | None, task_name: str | Task[Any] | None, reason: str
) -> dict[str, Any]:
    """An event's fields, computed when one is first read (see `SlowTaskEvent.__getattr__`).

    `task_name`: the name, or the task itself while the event is being
    delivered (see `_deliver`: its name is asked for only if someone reads it).
    """
    if task_name is not None and not isinstance(task_name, str):
        task_name = task_name.get_name()
    stall: Stall | None = group.stall
    elapsed_ms = _elapsed_ms(group)
    threshold_ms = origin.threshold_ms
    raised = group.raised
    events = [format_record(r, origin.wall_offset, r is raised) for r in group.records]
    samples = format_samples(stall.samples) if stall is not None and _settings.sampling.share_samples else []
    return {
        "elapsed_ms": elapsed_ms,
        "threshold_ms": threshold_ms,
        "exceeded_threshold": elapsed_ms >= threshold_ms,
        "severity_score": group.score,
        "severity_level": get_severity_level_from_score(group.score),
        "reason": reason,
        "blocking_events": events,
        "context": context if context is not None else {},  # None: no provider registered
        "cpu_stack_samples": samples,
        "task_name": task_name,
        "thread_name": group.thread_name,
        "thread_id": group.thread_id,
        "loop": origin.loop_name(),
        "dropped_events": group.dropped,
        "call_site": events[0]["app_site"] if events else samples[0]["app_site"] if samples else "",
        "culprit": stall.culprit() if stall is not None else "",
        "impact": impact_level(group.score, elapsed_ms, threshold_ms),
        # Reported as a hang while it ran (issue 25): say so, and for how long.
        "hang_reports": stall.hang_reports if stall is not None else 0,
        # Never less than a hang report made while it ran said (the two ends are estimated apart).
        "hung_ms": max(elapsed_ms, stall.hung_s * 1000.0) if stall is not None and stall.hang_reports else 0.0,
        "ongoing": False,
        "blocker": "",
        "blocker_trace": "",
    }


def _elapsed_ms(group: StepGroup) -> float:
    stall: Stall | None = group.stall
    # A CPU-bound stall's start (from the thread's CPU clock) can be earlier
    # than the first blocking call, and then it is the step's; for a wait,
    # the call's own timestamp is the better bound.
    start = group.t_first if stall is None or stall.waiting else min(group.t_first, stall.start)
    return elapsed(start, group.t_end) * 1000.0


class StepView(NamedTuple):
    """What aiocop's own observers read of an event without formatting it (see `step_view`)."""

    elapsed_ms: float
    exceeded_threshold: bool
    records: list[Record]  # the step's blocking calls as the hook recorded them
    dropped: int  # calls past the per-step buffer, not recorded
    end: float  # perf_counter() when the step was seen to be over
    thread_id: int


def step_view(event: SlowTaskEvent) -> StepView | None:
    """An event's length and raw calls, read without building its fields; None once they are built.

    Formatting an event (frames, arguments, samples) costs more than the
    rest of a detected call: a callback that reads a field pays it, once.
    The OpenTelemetry instrumentor needs only the length, the calls' names,
    weights and lines: from here, a detected call costs it a few look-ups.
    """
    resolve = _resolve_of(event)
    if resolve is None:
        return None
    origin, group = resolve[1], resolve[2]
    elapsed_ms = _elapsed_ms(group)
    # tuple.__new__ directly: a named tuple's own __new__ is a Python function.
    return _new_tuple(
        StepView,
        (elapsed_ms, elapsed_ms >= origin.threshold_ms, group.records, group.dropped, group.t_end, group.thread_id),
    )


_new_tuple = tuple.__new__
_get_attribute = object.__getattribute__


def _resolve_of(event: SlowTaskEvent) -> tuple[Any, ...] | None:
    # The event's recipe, if its fields are not built yet. Read as an
    # attribute: `event.__dict__` would make the event's dict (its attributes
    # live inline until someone asks for it), and object.__getattribute__
    # never falls back to SlowTaskEvent.__getattr__.
    try:
        resolve: tuple[Any, ...] = _get_attribute(event, "_resolve")
    except AttributeError:
        return None
    return resolve


_new_object = object.__new__
_set_attribute = object.__setattr__
_NO_CONTEXT = contextvars.Context()


def _lazy_event(
    origin: _Origin, group: StepGroup, context: dict[str, Any] | None, task_name: str | None, reason: str
) -> SlowTaskEvent:
    # SlowTaskEvent is a frozen dataclass (as in 1.x): its generated __init__
    # is skipped. The event starts with a recipe for its fields only.
    event = _new_object(SlowTaskEvent)
    _set_attribute(event, "_resolve", (_step_fields, origin, group, context, task_name, reason))
    return event


def build_stall_event(stall: Stall, task: Any, context: dict[str, Any]) -> SlowTaskEvent:
    watch = stall.watch
    group = _hook.StepGroup()
    group.thread_id = watch.thread_id
    group.thread_name = watch.thread_name
    group.records = []
    group.t_first = stall.start
    group.t_end = stall.end
    group.stall = stall  # the score stays 0: as in 1.x, it counts intercepted calls only
    return _lazy_event(
        _Origin(watch.loop_name), group, context, task.get_name() if task is not None else None, "cpu_blocking"
    )


def deliver_now(group: StepGroup, origin: _Origin | None = None) -> None:
    """Build the event and run providers and callbacks (in the step's context)."""
    state = _hook.current_state()
    was_busy, state.busy = state.busy, True  # a callback's own blocking calls are not reported
    try:
        _deliver(group, origin if origin is not None else _Origin(group.loop))
    finally:
        state.busy = was_busy


def _deliver(group: StepGroup, origin: _Origin) -> None:
    # deliver_now without the busy flag, which the caller holds. Called once
    # per group, after the step (group.t_end is set).
    if not group.records and not group.dropped:
        return  # reset_blocking_events() emptied it
    task = group.task
    try:
        if group.imports:
            _harmless.note_failed_imports(group.records)
        provided = group.provided
        if provided is None and _callbacks._providers:
            provided = _callbacks.capture_context()  # providers registered after the step's first call
        # _lazy_event, inline (once per step, on the loop's thread). The task
        # itself stands for its name while the callbacks run: get_name()
        # formats a default name ("Task-N") at its first call, 1 800
        # instructions per step on 3.12, for a field few callbacks read.
        event = _new_object(SlowTaskEvent)
        _set_attribute(event, "_resolve", (_step_fields, origin, group, provided, task, "io_blocking"))
    except Exception:
        _hook._internal_error("delivering an event")
        return
    finally:
        # The event keeps the group for its fields: not what the group holds
        # only to find and run its step (task, context, loop, the key frame).
        group.task = group.key = group.ident = group.loop = None
        group.context = _NO_CONTEXT
    try:
        _callbacks.invoke_callbacks(event)
    finally:
        # An event kept by a callback (or a KeyboardInterrupt's traceback)
        # outlives its delivery: it takes its task's name now, and keeps no
        # task alive. One nobody kept goes with this frame, task and all.
        if task is not None and _refcount(event) > _LOCAL_REFS:
            resolve = _resolve_of(event)
            if resolve is not None:
                _set_attribute(event, "_resolve", (*resolve[:4], task.get_name(), *resolve[5:]))


_refcount = sys.getrefcount


def _refs_of_a_local() -> int:
    # What sys.getrefcount() says of an object only a local variable holds,
    # measured as _deliver reads it (3.14 counts the argument's reference no
    # longer). Counted high, the name is read for nothing; never counted low:
    # a kept event with a task, not a name, still has its name to give.
    local = object()
    return _refcount(local)


_LOCAL_REFS = _refs_of_a_local()


def flush(batch: list[StepGroup]) -> None:
    """Run by the loop after the steps of an iteration: they are over, deliver them."""
    state = _hook.current_state()
    was_busy, state.busy = state.busy, True  # nothing aiocop does here is the app's blocking
    try:
        _flush(batch, state)
    finally:
        state.busy = was_busy


def _flush(batch: list[StepGroup], state: Any) -> None:
    now = perf_counter()
    if state.pending is batch:
        state.pending = state.pending_loop = None
    if state.group is not None and state.group in batch:
        state.group = None
    for group in batch:
        if not group.t_end:
            group.t_end = now
    claimed = _claim(batch)
    if not claimed:
        return
    if _state.config.delivery == "thread":
        _worker.submit(claimed)
        return
    if not _callbacks.listening():
        return  # nobody to tell: no event is built
    origin = _Origin(claimed[0].loop)  # a batch is one loop's
    for group in claimed:
        # Each step's providers and callbacks run in (a copy of) its own context.
        group.context.run(_deliver, group, origin)


def _claim(batch: list[StepGroup]) -> list[StepGroup]:
    """The groups of `batch` this delivery takes (`_hook.claim`), with the watchdog's stalls."""
    take = _hook.unclaimed.pop
    watches = _loops.watches
    if not watches:
        # No watchdog: nobody hands stalls over, claiming alone decides.
        return [group for group in batch if take(group, None) is not None]
    claimed = []
    # A batch is one loop's, run on its thread: one watch for all its groups.
    watch = watches.get(batch[0].thread_id)
    # Claiming and taking the watchdog's stall under one lock: the watchdog
    # either finds a group unclaimed (and hands it the stall) or sees it
    # taken, never the moment in between. One lock round per batch, taken
    # with the lock's C method (`with` would go through aiocop's wrapper).
    lock = _watchdog.merge_lock
    _acquire(lock)
    try:
        step = watch.step if watch is not None else None
        # Only a step the watchdog saw stall has anything to hand over
        # (_take_stall_of's first test, read once for the batch).
        stalled = step is not None and step.stalled and not step.merged
        for group in batch:
            if take(group, None) is not None:
                if stalled:
                    _take_stall_of(group, watch)  # type: ignore[arg-type]  # stalled: watch is not None
                claimed.append(group)
        if watch is not None and claimed:
            # The watchdog reads the last io event delivered (under this
            # lock): the batch's last step, whose end is the latest.
            last = claimed[-1]
            stall = last.stall
            watch.delivered(last.ident, last.t_first if stall is None else min(last.t_first, stall.start), last.t_end)
    finally:
        _release(lock)
    return claimed


_acquire, _release = _forksafe.acquire, _forksafe.release


def _take_stall(group: StepGroup) -> None:
    """`group`'s share of the watchdog's view of its step, as a delivery takes it (under merge_lock)."""
    watch = _loops.watches.get(group.thread_id)
    if watch is None:
        return
    _take_stall_of(group, watch)
    stall = group.stall
    watch.delivered(group.ident, group.t_first if stall is None else min(group.t_first, stall.start), group.t_end)


def _take_stall_of(group: StepGroup, watch: LoopWatch) -> None:
    # Under merge_lock. If the watchdog is watching this very step stall, its
    # samples join this event and it will not report the stall again. If it
    # is watching another step stall, seen running after this step's first
    # blocking call, this step had ended when that one began (steps of one
    # thread never overlap): its event does not last into that stall (a
    # task's call followed, in the same loop iteration, by another task's
    # CPU-bound step).
    step = watch.step
    if step is not None and step.stalled and not step.merged and group.stall is None:
        start = step.start()
        if step.ident is group.ident:
            step.merged = True
            group.stall = _timing.stall_of(step, start, group.t_end, watch)
        elif step.t_last > group.t_first:
            group.t_end = max(group.t_first, min(group.t_end, start))
    if group.stall is not None:
        group.stall.release()  # the io event knows its task: keep no frame, task or context alive


def _attach_to_io(watch: LoopWatch, stall: Stall) -> bool:
    # Called by the watchdog (under merge_lock) when a stall ends: an io event
    # of the same step still waiting for delivery takes the stall over. An
    # undelivered io event of another step of that thread whose first call
    # falls inside the stall's estimated span contradicts it (steps of one
    # thread never overlap): if the call came while the watchdog still saw
    # the stalled step, that step began after the event's step had ended (the
    # stall's start is an estimate, which may fall a little before the call);
    # if it came after the last look that saw the stalled step, that step had
    # ended by then, and it is the stall's estimated end that ran on (a look
    # long after, with the thread's CPU time of the steps between counted in).
    taken = False
    for group in list(_hook.unclaimed):
        if group.thread_id != watch.thread_id:
            continue
        if group.ident is stall.ident:
            if not taken and group.stall is None and group.t_first <= stall.end:
                group.stall = stall
                taken = True
        elif group.t_first < stall.end and (not group.t_end or group.t_end > stall.start):
            if stall.seen_until and group.t_first > stall.seen_until:
                stall.end = max(stall.seen_until, group.t_first)
            else:
                group.t_end = max(group.t_first, stall.start)
    if taken:
        stall.release()  # the io event knows its task: keep no frame, task or context alive
    return taken


def _report_stall(stall: Stall) -> None:
    if not _state.active:
        stall.release()
        return  # deactivate() pauses stall reports too, as it pauses everything else
    seen = stall.task or _attribution.StalledTask.of(stall.watch.loop, stall.root)
    stall.release()  # the task is known: the event keeps no frame (and its locals), task or context alive
    if not seen.monitored:
        return  # the stalled task runs under monitored(False)
    task, context = seen.task, seen.context

    def deliver() -> None:
        state = _hook.current_state()
        was_busy, state.busy = state.busy, True
        try:
            _callbacks.invoke_callbacks(build_stall_event(stall, task, _callbacks.capture_context()))
        except Exception:
            _hook._internal_error("delivering a stall")
        finally:
            state.busy = was_busy

    loop = stall.watch.loop
    if _state.config.delivery == "loop" and loop is not None and loop.is_running():
        _hand_to_loop(loop, deliver, context)
    elif _state.config.delivery == "loop" and threading.get_ident() == stall.watch.thread_id:
        context.run(deliver)  # the loop's own thread, as the loop stops (_loop_stopping)
    else:
        _worker.submit_call(lambda: context.run(deliver))


# Stall reports handed to a loop and not run there yet. The watchdog reports a
# stall just after it ends, which can be after the loop's last iteration: a
# report queued then would wait for the loop's next run, or for ever. Whoever
# pops a report's entry delivers it: the loop, or the worker once that loop
# has stopped (at its stop, or in drain()).
_on_loops: dict[object, tuple[AbstractEventLoop, Callable[[], None]]] = {}


def _hand_to_loop(loop: AbstractEventLoop, deliver: Callable[[], None], context: contextvars.Context) -> None:
    token = object()

    def run_on_loop() -> None:
        if _on_loops.pop(token, None) is not None:
            deliver()

    _on_loops[token] = (loop, lambda: context.run(deliver))
    with contextlib.suppress(RuntimeError):  # closed meanwhile: delivered just below
        loop.call_soon_threadsafe(run_on_loop, context=context)
    if not loop.is_running():  # it stopped while we queued: its stop may have looked before we did
        deliver_stranded()


def deliver_stranded(stopping: AbstractEventLoop | None = None) -> None:
    """Deliver the stall reports queued on loops that are not running (or on `stopping`).

    On the stopping loop's own thread, with `delivery="loop"`, they run here
    and now; the rest go to the worker.
    """
    here = stopping is not None and _state.config.delivery == "loop"
    for token, (loop, run) in list(_on_loops.items()):
        if (loop is stopping or not loop.is_running()) and _on_loops.pop(token, None) is not None:
            if here and loop is stopping:
                run()
            else:
                _worker.submit_call(run)


# How long a stopping loop waits for the delivery thread to report its last
# steps (delivery="thread"): every event reaches its callback before
# `asyncio.run()` returns, unless a callback is this slow.
_STOP_WAIT_S = 2.0


def _loop_stopping(watch: LoopWatch, stopped: float, cpu: float | None) -> None:
    """Called by a loop's own thread as the loop stops, after its last step.

    That step is over: the watchdog's view of it is finished here (a stall
    in it is reported now, not at the watchdog's next look, which can come
    after `asyncio.run()` has returned), and every report of this loop is
    delivered before the loop's run returns: on this thread with
    `delivery="loop"`, by the delivery thread, waited for, with `"thread"`.
    """
    state = _hook.current_state()
    was_busy, state.busy = state.busy, True  # some loops (veloxloop) are still "running" here
    try:
        queued = _worker.pending()
        _watchdog.watchdog.finish(watch, stopped, cpu)
        loop = watch.loop
        if loop is not None:
            deliver_stranded(loop)
        if _worker.pending() > queued or (_state.config.delivery == "thread" and queued):
            _worker.wait(_STOP_WAIT_S)
    finally:
        state.busy = was_busy


def make_violation(group: StepGroup) -> HighSeverityBlockingIoException:
    events = [format_record(r, raised=r is group.raised) for r in group.records]
    return HighSeverityBlockingIoException(
        severity_score=group.score,
        severity_level=get_severity_level_from_score(group.score),
        elapsed_ms=elapsed(group.t_first, perf_counter()) * 1000.0,
        threshold_ms=_state.config.threshold_ms,
        events=events,
    )


# Steps queued for the delivery thread at most (its documented capacity). A
# callback slower than the events arrive (a network exporter) must not make
# memory grow without bound: past this, new steps are dropped, counted and
# logged, never silently.
MAX_PENDING = 10_000
_DROP_LOG_INTERVAL_S = 10.0
# stop() (and the exit) waits this long for the queue to be delivered; what
# is left then is dropped, counted and logged. A callback running at that
# moment is waited for, up to _CALLBACK_WAIT_S more: none starts afterwards.
DRAIN_S = 1.0
_CALLBACK_WAIT_S = 5.0


class _Worker:
    """A daemon thread that delivers groups off the loop threads, from a bounded queue."""

    def __init__(self) -> None:
        # Items: groups to deliver, stall reports (calls), or an Event to set
        # once everything queued before it has been handled (see drain).
        self._queue: SimpleQueue[list[StepGroup] | threading.Event | Callable[[], None]] = SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = _forksafe.lock()
        self._queued = 0  # steps put, under _lock
        self._handled = 0  # steps taken and handled (or dropped): written by the worker thread only
        # Set by drain() when out of time: every item queued before this
        # marker is dropped, not delivered. Cleared by the worker alone, as it
        # reaches the marker: nothing queued before stop() runs after it.
        self._discard_until: threading.Event | None = None
        self.dropped = 0  # steps dropped, since the process started
        self._dropped_logged = 0
        self._last_drop_log = 0.0

    def pending(self) -> int:
        return self._queued - self._handled

    def submit(self, groups: list[StepGroup]) -> None:
        if self._thread is None:
            self._start()
        with self._lock:
            room = MAX_PENDING - (self._queued - self._handled)
            kept = groups if len(groups) <= room else groups[: max(room, 0)]
            self.dropped += len(groups) - len(kept)
            self._queued += len(kept)
        if kept:
            self._queue.put(kept)
        if len(kept) < len(groups):
            self._log_dropped(at_most_every=_DROP_LOG_INTERVAL_S)

    def submit_call(self, call: Callable[[], None]) -> None:
        if self._thread is None:
            self._start()
        with self._lock:
            full = self._queued - self._handled >= MAX_PENDING
            if full:
                self.dropped += 1
            else:
                self._queued += 1
        if full:
            self._log_dropped(at_most_every=_DROP_LOG_INTERVAL_S)
        else:
            self._queue.put(call)

    def _log_dropped(self, at_most_every: float = 0.0) -> None:
        now = monotonic()
        new = self.dropped - self._dropped_logged
        if new <= 0 or now - self._last_drop_log < at_most_every:
            return
        self._dropped_logged, self._last_drop_log = self.dropped, now
        logger.warning(
            "aiocop: %d event(s) dropped (%d in all): the slow-task callbacks run slower than events arrive "
            "(delivery='thread' keeps at most %d waiting, and stop() delivers for %.0f s); make them faster, "
            "or sample fewer requests",
            new,
            self.dropped,
            MAX_PENDING,
            DRAIN_S,
        )

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="aiocop-delivery", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _SHUTDOWN:
                return
            if isinstance(item, threading.Event):
                if item is self._discard_until:
                    self._discard_until = None
                item.set()
                continue
            steps = 1 if callable(item) else len(item)
            try:
                if self._discard_until is not None:
                    with self._lock:  # loop threads count their drops too (in submit)
                        self.dropped += steps
                else:
                    self._handle(item)
            except BaseException:  # this thread must outlive anything a delivery raises
                _hook._internal_error("delivering off the loop")
            finally:
                self._handled += steps

    def _handle(self, item: list[StepGroup] | Callable[[], None]) -> None:
        if callable(item):
            item()
            return
        for group in item:
            if not group.t_end:
                group.t_end = perf_counter()
            # A copy: the loop thread may still be inside the original.
            group.context.copy().run(deliver_now, group)

    def wait(self, timeout: float) -> bool:
        """Wait until what is queued now has been handled; False if `timeout` passed first."""
        thread = self._thread
        if thread is None or not thread.is_alive() or thread is threading.current_thread():
            return False
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout)

    def drain(self, timeout: float = DRAIN_S) -> None:
        """Deliver what is queued, within `timeout`; drop (count, log) what is left; no callback starts after.

        The callback running when time is up is waited for (up to
        `_CALLBACK_WAIT_S`): returns within `timeout` plus that callback.
        Then deliver what was never scheduled, on this thread.
        """
        thread = self._thread
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            done = threading.Event()
            self._queue.put(done)
            if not done.wait(timeout):
                # Out of time: the rest, up to the marker, is dropped by the
                # worker (quickly); only the callback running now is waited for.
                self._discard_until = done
                if done.is_set():  # the worker reached the marker meanwhile: nothing left to drop
                    self._discard_until = None
                elif not done.wait(_CALLBACK_WAIT_S):
                    logger.warning(
                        "aiocop: a slow-task callback has been running for over %.0f s; stop() returns without "
                        "waiting for it (no other callback will start)",
                        timeout + _CALLBACK_WAIT_S,
                    )
        self._log_dropped()
        for group in _claim_all(list(_hook.unclaimed)):
            if not group.t_end:
                group.t_end = perf_counter()
            group.context.copy().run(deliver_now, group)

    def shutdown(self) -> None:
        """End the thread once what is queued has been handled (an attach session leaving its target)."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            self._queue.put(_SHUTDOWN)  # type: ignore[arg-type]
            thread.join(_STOP_WAIT_S)

    def reinit_after_fork(self) -> None:
        self.__init__()  # type: ignore[misc]


_SHUTDOWN = object()
_worker = _Worker()


def _claim_all(groups: list[StepGroup]) -> list[StepGroup]:
    # Under merge_lock, as every claim: the watchdog hands a stall to an
    # unclaimed group (_attach_to_io) only while no delivery is taking it.
    lock = _watchdog.merge_lock
    _acquire(lock)
    try:
        return [g for g in groups if _hook.claim(g)]
    finally:
        _release(lock)


def _orphans(groups: list[StepGroup], at_boundary: bool) -> None:
    # Steps whose loop stopped before their delivery callback ran. At a loop
    # boundary (on that thread, as its loop stops or the next one starts, no
    # loop running) they are delivered before the loop's run returns, like
    # every other event; found later, by another loop's step, off the loop.
    claimed = _claim(groups)
    if not claimed:
        return
    here = at_boundary and all(g.thread_id == threading.get_ident() for g in claimed)
    if here and _state.config.delivery == "loop":
        for group in claimed:
            if not group.t_end:
                group.t_end = perf_counter()
            group.context.copy().run(deliver_now, group)
        return
    _worker.submit(claimed)
    if here:
        _worker.wait(_STOP_WAIT_S)


def drain() -> None:
    deliver_stranded()
    _worker.drain()


_hook.flush_callback = flush
_watchdog.report_stall = _report_stall
_watchdog.attach_to_io = _attach_to_io
_hook.orphan_handler = _orphans
_hook.make_violation = make_violation
_loops.on_stop = _loop_stopping
atexit.register(drain)


def _after_fork_in_child() -> None:
    # The parent's pending steps are the parent's to deliver: a child that
    # delivered them too would report every one of them twice.
    _hook.unclaimed.clear()
    _on_loops.clear()
    state = _hook.current_state()
    state.pending = state.pending_loop = None
    state.group = None
    _worker.reinit_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
