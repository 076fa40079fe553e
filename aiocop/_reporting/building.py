"""Building events: a step's raw records, and a stall, turned into a `SlowTaskEvent`'s fields.

An event is built lazily: delivery makes it with a recipe (`lazy_event`), and
its fields (frames as text, arguments, samples, severity) are computed the
first time a callback reads one (`SlowTaskEvent.__getattr__` calls
`step_fields`). Frames are formatted once per code location (`frame_of`).
`step_view` gives aiocop's own observers (OpenTelemetry, the timeline) the
length and raw calls without building anything.

May import: aiocop._common, aiocop._model, aiocop._interception, aiocop._stalls.
"""

from __future__ import annotations

import contextvars
import weakref
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from aiocop._common import clock as _clock
from aiocop._common.clock import elapsed, perf_counter
from aiocop._interception import hook as _hook
from aiocop._interception.frames import format_frame, is_app_file, is_internal_file
from aiocop._interception.trio_runs import TrioRun
from aiocop._model import state as _state
from aiocop._model.events import BlockingEventInfo, CpuStackSample, RawBlockingEvent, SlowTaskEvent
from aiocop._model.exceptions import HighSeverityBlockingIoException
from aiocop._model.severity import get_severity_level_from_score, impact_level
from aiocop._stalls import settings as _settings

if TYPE_CHECKING:
    from asyncio import Task
    from types import CodeType

    from aiocop._interception.hook import Record, StepGroup
    from aiocop._interception.trio_runs import TrioTask
    from aiocop._stalls.attribution import Sampled, Stall


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


def frame_of(code: CodeType, lasti: int) -> tuple[tuple[str, int, str], str]:
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
    pairs = [frame_of(code, lasti) for code, lasti in trace]
    site_text = frame_of(*site)[1] if site is not None else None
    info = _info(event, _format_args(args, event), [p[0] for p in pairs], [p[1] for p in pairs], site_text, weight)
    info["app_site"] = frame_of(*app)[1] if app is not None else info["entry_point"]
    if wall_offset is None:
        wall_offset = _clock.time() - perf_counter()
    info["timestamp"] = timestamp + wall_offset
    info["raised"] = raised
    return info


def record_site(record: Record) -> str:
    """A record's `app_site` alone, as `format_record` gives it (cheap: frames are formatted once per line)."""
    _, _, trace, site, _, _, app = record
    if app is not None:
        return frame_of(*app)[1]
    if site is not None:
        return frame_of(*site)[1]
    return frame_of(*trace[0])[1] if trace else "unknown"


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


def format_samples(samples: list[Sampled]) -> list[CpuStackSample]:
    formatted: list[CpuStackSample] = []
    for stack, count, seconds in samples:
        pairs = [frame_of(code, lasti) for code, lasti in stack]
        texts = [p[1] for p in pairs]
        user = next((p[1] for p in pairs if not is_internal_file(p[0][0])), texts[0] if texts else "unknown")
        app = next((p[1] for p in pairs if not is_internal_file(p[0][0]) and is_app_file(p[0][0])), user)
        frames = [p[0] for p in pairs]
        formatted.append(
            {
                "trace": " <- ".join(texts),
                "entry_point": user,
                "count": count,
                "frames": frames,
                "app_site": app,
                "time_ms": seconds * 1000.0,
            }
        )
    return formatted


class Origin:
    """What a batch of events shares: its loop (named when first asked), clock offset and threshold."""

    __slots__ = ("loop_ref", "loop_type", "threshold_ms", "wall_offset")

    def __init__(self, loop: object, wall_offset: float | None = None) -> None:
        self.wall_offset = _clock.time() - perf_counter() if wall_offset is None else wall_offset
        self.threshold_ms = _state.config.threshold_ms
        if isinstance(loop, TrioRun):
            loop = loop.name  # named after its trio Runner, which it does not keep alive
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


def step_fields(
    origin: Origin,
    group: StepGroup,
    context: dict[str, Any] | None,
    task_name: str | Task[Any] | TrioTask | None,
    reason: str,
) -> dict[str, Any]:
    """An event's fields, computed when one is first read (see `SlowTaskEvent.__getattr__`).

    `task_name`: the name, or the task itself while the event is being
    delivered (see `_deliver`: its name is asked for only if someone reads it).

    Read on a loop's thread (an event kept and read in a later step), the
    source lines they quote are aiocop's own reads, not the application's:
    not reported (`linecache` stats and opens each file once, which came out
    as a blocking call at the line that read the field).
    """
    state = _hook.current_state()
    was_busy, state.busy = state.busy, True
    try:
        return _step_fields(origin, group, context, task_name, reason)
    finally:
        state.busy = was_busy


def _step_fields(
    origin: Origin,
    group: StepGroup,
    context: dict[str, Any] | None,
    task_name: str | Task[Any] | TrioTask | None,
    reason: str,
) -> dict[str, Any]:
    if task_name is not None and not isinstance(task_name, str):
        task_name = _hook.task_name(task_name)
    stall = cast("Stall | None", group.stall)
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
    stall = cast("Stall | None", group.stall)
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


_get_attribute = object.__getattribute__


def resolve_of(event: SlowTaskEvent) -> tuple[Any, ...] | None:
    # The event's recipe, if its fields are not built yet. Read as an
    # attribute: `event.__dict__` would make the event's dict (its attributes
    # live inline until someone asks for it), and object.__getattribute__
    # never falls back to SlowTaskEvent.__getattr__.
    try:
        resolve: tuple[Any, ...] = _get_attribute(event, "_resolve")
    except AttributeError:
        return None
    return resolve


def step_view(event: SlowTaskEvent) -> StepView | None:
    """An event's length and raw calls, read without building its fields; None once they are built.

    Formatting an event (frames, arguments, samples) costs more than the
    rest of a detected call: a callback that reads a field pays it, once.
    The OpenTelemetry instrumentor needs only the length, the calls' names,
    weights and lines: from here, a detected call costs it a few look-ups.
    """
    resolve = resolve_of(event)
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


new_object = object.__new__


set_attribute = object.__setattr__


NO_CONTEXT = contextvars.Context()


def lazy_event(
    origin: Origin, group: StepGroup, context: dict[str, Any] | None, task_name: str | None, reason: str
) -> SlowTaskEvent:
    # SlowTaskEvent is a frozen dataclass (as in 1.x): its generated __init__
    # is skipped. The event starts with a recipe for its fields only.
    event = new_object(SlowTaskEvent)
    set_attribute(event, "_resolve", (step_fields, origin, group, context, task_name, reason))
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
    return lazy_event(
        Origin(watch.loop_name), group, context, _hook.task_name(task) if task is not None else None, "cpu_blocking"
    )


def make_violation(group: StepGroup) -> HighSeverityBlockingIoException:
    events = [format_record(r, raised=r is group.raised) for r in group.records]
    return HighSeverityBlockingIoException(
        severity_score=group.score,
        severity_level=get_severity_level_from_score(group.score),
        elapsed_ms=elapsed(group.t_first, perf_counter()) * 1000.0,
        threshold_ms=_state.config.threshold_ms,
        events=events,
    )
