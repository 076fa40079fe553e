"""Public event types, kept field-compatible with aiocop 1.x.

New 2.x information is added after the 1.x fields, always with a default, so
that code constructing or unpacking the 1.x types keeps working.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from aiocop._model.severity import impact_level

if TYPE_CHECKING:
    from collections.abc import Callable


def _none() -> None:
    return None


class RawBlockingEvent(TypedDict):
    """A blocking event as captured, before formatting (1.x shape)."""

    event_name: str
    raw_args: tuple[Any, ...]
    raw_stack: list[tuple[str, int, str]]
    timestamp: float
    severity: int | None


class _BlockingEventInfoBase(TypedDict):
    event: str
    trace: str
    entry_point: str
    severity: int | None


class BlockingEventInfo(_BlockingEventInfoBase, total=False):
    """One blocking call, formatted for reporting.

    The 1.x keys are always present: `event` (name and summarised arguments),
    `trace` (frames joined by `" <- "`, innermost first), `entry_point` (the
    user's line, `path:line:function`) and `severity` (the call's weight).

    Added in 2.0, present on events aiocop 2 produces: `name` (the event name
    alone), `args` (the summarised arguments), `frames` (the trace as
    `(filename, lineno, function)` tuples), `timestamp` (wall-clock time of the
    call), `raised` (whether `raise_on_violations` failed the call) and
    `app_site` (the line of the application's own code that led to the call,
    `path:line:function`: the innermost frame not in the stdlib, an event loop
    or an installed package; `entry_point` when the application made the call
    itself or no frame of it was found). `entry_point` stays where it blocked:
    a library's line when a library made the call.
    """

    name: str
    args: str
    frames: list[tuple[str, int, str]]
    timestamp: float
    raised: bool
    app_site: str


class _CpuStackSampleBase(TypedDict):
    trace: str
    entry_point: str
    count: int


class CpuStackSample(_CpuStackSampleBase, total=False):
    """Identical stack samples taken while a step held the loop, with their count.

    The 1.x keys `trace`, `entry_point` and `count` are always present; `frames`
    (the trace as `(filename, lineno, function)` tuples) and `app_site` (the
    innermost line of the application's own code in the stack), and `time_ms`,
    the loop time these samples stand for, are added in 2.0.

    `time_ms` adds up, for each sample of this stack, the time since the
    sample before it (for the step's first, since the step was known to
    run: the step's head, half the threshold or more, goes to the first
    sample's stack). Later samples come at a steady pace while Python code
    runs, so it follows `count`; not where a C call held the GIL and kept
    the watchdog out: the one sample taken as the call returned stands for
    the whole hold. The flame graphs weigh stacks by it.
    """

    frames: list[tuple[str, int, str]]
    app_site: str
    time_ms: float


@dataclass(frozen=True)
class SlowTaskEvent:
    """What aiocop reports for one step (a task step or a callback) of an event loop.

    Attributes:
        elapsed_ms: For `"io_blocking"` events: wall time from the step's first
            blocking call until the loop got control back (measured when
            aiocop's delivery callback ran right after the step, so it can
            include other callbacks that were ready in the same loop
            iteration). It does not include the part of the step before the
            first blocking call, which aiocop cannot see without wrapping
            every callback. For `"cpu_blocking"` events (stalls seen by the
            watchdog): how long the step held the loop, estimated from the
            watchdog's polls.
        threshold_ms: The slow-task threshold in force (`detect_slow_tasks`).
        exceeded_threshold: `elapsed_ms >= threshold_ms`.
        severity_score: Sum of the weights of `blocking_events`.
        severity_level: `"low"`, `"medium"` or `"high"`.
        reason: `"io_blocking"` when blocking calls were intercepted,
            `"cpu_blocking"` when only the watchdog saw the step, `"hang"`
            for a step reported while it still runs (see `ongoing`).
        blocking_events: The step's blocking calls, in call order.
        context: What the registered context providers returned, evaluated in
            the step's context (contextvars as at its first blocking call).
        cpu_stack_samples: Stack samples taken while the loop was stuck.
        task_name: The task's name, or `None` for a plain callback. Added in 2.0.
        thread_name: Name of the thread running the loop. Added in 2.0.
        thread_id: Identifier of that thread. Added in 2.0.
        loop: The loop's class and id, e.g. `"uvloop.Loop@0x7f.."`. Added in 2.0.
        dropped_events: Blocking calls not kept because the step exceeded the
            per-step buffer. Added in 2.0.
        call_site: The application's line most to blame: the first blocking
            call's `app_site` (the line of the application's own code that led
            to it, where a library made the call), or for a stall the
            application's line in the stack the samples found most often.
            Added in 2.0.
        culprit: For a stall seen by the watchdog, what the loop was doing,
            e.g. `"waiting in sleep(0.05) (sleep)"` or `"running
            zlib.compress(data)"`. Added in 2.0.
        impact: How much the step hurt its loop, `"low"`, `"medium"` or
            `"high"`: the higher of its calls' level (`severity_level`) and
            how long it held the loop (from the threshold `"medium"`, from
            twice the threshold `"high"`). The one measure the CLI, the logs
            and the pytest plugin rank and fail on, for calls and stalls
            alike. Added in 2.0.
        ongoing: The step was still running when this event was made: a
            hang report (`reason="hang"`), sent by the watchdog while the
            loop is stuck, again at growing intervals while it stays stuck.
            `elapsed_ms` is then how long it has held the loop so far; its
            usual event follows when (if) it ends. Added in 2.0.
        hang_reports: How many hang reports were made of this step: on a
            hang report its number (1 for the first), on the step's final
            event how many preceded it (0: it was never reported as a hang).
            Added in 2.0.
        hung_ms: For a step reported as a hang, how long it held the loop:
            so far (hang report), or in all (its final event); 0 otherwise.
            Added in 2.0.
        blocker: On a hang report, who holds what the loop waits for, where
            that can be known without slowing anything else down (the owner
            of an `RLock` or a `Condition` built on one, a thread being
            joined), e.g. `"thread 'worker' (id 1402..) owns the RLock"`;
            `""` when not known. Added in 2.0.
        blocker_trace: That thread's stack, innermost frame first, joined by
            `" <- "`. Added in 2.0.
    """

    elapsed_ms: float
    threshold_ms: float
    exceeded_threshold: bool
    severity_score: int
    severity_level: str
    reason: Literal["io_blocking", "cpu_blocking", "hang"] | str
    blocking_events: list[BlockingEventInfo]
    context: dict[str, Any] = field(default_factory=dict)
    cpu_stack_samples: list[CpuStackSample] = field(default_factory=list)
    # An event built by aiocop starts with no fields at all, only a recipe for
    # them (`_resolve`), followed when a field is first read: a callback that
    # counts events, or drops them, never pays for them. So no field may have
    # a class-level default, which __getattr__ would never get past: they use
    # default factories.
    task_name: str | None = field(default_factory=_none)
    thread_name: str = field(default_factory=str)
    thread_id: int = field(default_factory=int)
    loop: str = field(default_factory=str)
    dropped_events: int = field(default_factory=int)
    call_site: str = field(default_factory=str)
    culprit: str = field(default_factory=str)
    impact: str = field(default_factory=str)
    ongoing: bool = field(default_factory=bool)
    hang_reports: int = field(default_factory=int)
    hung_ms: float = field(default_factory=float)
    blocker: str = field(default_factory=str)
    blocker_trace: str = field(default_factory=str)

    def __post_init__(self) -> None:
        # An event made by hand (as 1.x's tests and adapters do) ranks like
        # one aiocop made. (aiocop's own skip __init__: see __getattr__.)
        if not self.impact:
            object.__setattr__(self, "impact", impact_level(self.severity_score, self.elapsed_ms, self.threshold_ms))

    # Only called for attributes missing from __dict__: the fields of an event
    # built by aiocop, before anyone has read them. `_resolve` is
    # `(function, *arguments)`: a tuple costs less to build than a closure.
    def __getattr__(self, name: str) -> Any:
        if name not in _FIELD_NAMES or "_resolve" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        self._materialize()
        return self.__dict__[name]

    def _materialize(self) -> None:
        resolve: tuple[Callable[..., dict[str, Any]], Any] | None = self.__dict__.pop("_resolve", None)
        if resolve is not None:
            function, *arguments = resolve
            self.__dict__.update(function(*arguments))

    def __getstate__(self) -> dict[str, Any]:
        self._materialize()
        return dict(self.__dict__)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


_FIELD_NAMES = frozenset(f.name for f in fields(SlowTaskEvent))


def is_hang_report(event: SlowTaskEvent) -> bool:
    """Whether `event` is a hang report (`ongoing`), read without building the fields of any other event.

    An event aiocop builds lazily (every one but a hang report) is never
    ongoing: reading its `ongoing` would format all its fields, which a
    callback that only counts events (the OpenTelemetry instrumentor) avoids.
    """
    state = event.__dict__
    return "_resolve" not in state and bool(state.get("ongoing", False))
