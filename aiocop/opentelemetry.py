"""Event-loop health as OpenTelemetry metrics and span events: `AiocopInstrumentor`.

    from aiocop.opentelemetry import AiocopInstrumentor

    AiocopInstrumentor().instrument()  # the global meter provider, or meter_provider=...

or, with no code at all, `opentelemetry-instrument uvicorn app:app` (aiocop is
registered under the `opentelemetry_instrumentor` entry point). Detection is
started if the application has not started it. Recorded:

- `asyncio.eventloop.delay` (histogram, s): how late each loop ran its work:
  each stall's length, and a periodic probe's lateness on a healthy loop.
- `aiocop.blocking_calls` (counter, {call}): each blocking call, by event,
  application line (`code.*`) and severity.
- `aiocop.stalls` (counter, {stall}): each step that held its loop past the
  threshold, by application line.
- `aiocop.loop.blocked_time` (counter, s): loop time lost to blocking calls
  and stalls, by application line.
- `aiocop.hangs` (counter, {hang}): each step reported as a hang while it ran.
- `aiocop.loop.blocked` (gauge, s): how long each loop has been held by the
  step it is in now, read when the metrics are collected: a hung loop shows
  in a scrape while it hangs.

Every call and stall is also an event (`aiocop.blocking_call`,
`aiocop.stall`) on the span current at the call, a few per call site per
second at most. docs/reference/opentelemetry.md lists every name and why.

Needs the `opentelemetry` extra: `pip install 'aiocop[opentelemetry]'`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

try:
    from opentelemetry import metrics, trace

    # The module is marked `# type: ignore` (untyped): its class is Any to mypy.
    from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]
except ImportError as error:  # pragma: no cover - the message is the point
    raise ImportError(
        "aiocop.opentelemetry needs opentelemetry-api and opentelemetry-instrumentation: "
        "pip install 'aiocop[opentelemetry]'"
    ) from error

from aiocop import _api
from aiocop._common import forksafe as _forksafe
from aiocop._common.clock import perf_counter
from aiocop._common.validate import check_bool, check_int, check_ms, check_number, did_you_mean
from aiocop._model import callbacks as _callbacks
from aiocop._model import state as _state
from aiocop._model.events import is_hang_report
from aiocop._model.severity import THRESHOLD_HIGH, THRESHOLD_MEDIUM, get_severity_level_from_score
from aiocop._reporting import hangs as _hangs
from aiocop._reporting.building import record_call, record_site, step_view
from aiocop._reporting.sites import FILE, FUNCTION, LINE, OTHER, Attributes, RateLimit, SiteTable
from aiocop._stalls import settings as _settings
from aiocop._stalls import watchdog as _watchdog
from aiocop._stalls.probe import DelayProbe
from aiocop._version import __version__

if TYPE_CHECKING:
    from collections.abc import Callable, Collection

    from aiocop._interception.hook import Record
    from aiocop._model.events import SlowTaskEvent

__all__ = ["ATTRIBUTES", "DELAY_BUCKETS", "SIGNALS", "AiocopInstrumentor", "Signal"]

DELAY_BUCKETS: tuple[float, ...] = (
    *(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05),
    *(0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
"""`asyncio.eventloop.delay`'s bucket bounds, in seconds: 0.1 ms (a healthy loop) to 10 s (a frozen one)."""


@dataclass(frozen=True)
class Signal:
    """One instrument or span event aiocop records, as docs/reference/opentelemetry.md shows it."""

    name: str
    kind: str  # "histogram", "counter", "gauge" or "span event"
    unit: str
    attributes: tuple[str, ...]
    description: str
    why: str  # the reason for the name


_CODE = (FILE, LINE, FUNCTION)

SIGNALS: tuple[Signal, ...] = (
    Signal(
        "asyncio.eventloop.delay",
        "histogram",
        "s",
        (),
        "How late the event loop ran its work: each stall's length, and a periodic probe's lateness "
        "(less the part of it a stall explains: a stall is recorded once, whole).",
        "OpenTelemetry names Node.js's `nodejs.eventloop.delay.*`; no convention exists for Python yet "
        "(opentelemetry-python-contrib #1760). The same shape under `asyncio.` is what one would be, and the "
        "name says the measure belongs to the loop, not to aiocop.",
    ),
    Signal(
        "aiocop.blocking_calls",
        "counter",
        "{call}",
        ("aiocop.event", *_CODE, "aiocop.severity"),
        "Blocking calls made on an event loop's thread, at the application's line that led to them.",
        "What aiocop finds is its own notion: its namespace. `{call}` is the semantic conventions' way of "
        "counting things with no unit.",
    ),
    Signal(
        "aiocop.stalls",
        "counter",
        "{stall}",
        _CODE,
        "Steps that held their event loop for the threshold or longer, at the application's line most to "
        "blame (`SlowTaskEvent.call_site`).",
        "A stall is aiocop's word for a step past the threshold, whatever held the loop.",
    ),
    Signal(
        "aiocop.loop.blocked_time",
        "counter",
        "s",
        _CODE,
        "Event-loop time lost to blocking calls and stalls (`SlowTaskEvent.elapsed_ms`), by application line.",
        "Counts and lengths differ: a call made 10 000 times for 0.1 ms each costs what one 1 s stall "
        "costs. `.time` under the loop, in seconds, as `process.cpu.time` is.",
    ),
    Signal(
        "aiocop.hangs",
        "counter",
        "{hang}",
        _CODE,
        'Steps still running past `hang_after_ms`, reported while they hung (`SlowTaskEvent(reason="hang")`), '
        "once each, at the application's line where the first report found the loop.",
        "A hang is a stall that has not ended: counted apart, as it happens, since its stall may never be "
        "counted (the process is killed first).",
    ),
    Signal(
        "aiocop.loop.blocked",
        "gauge",
        "s",
        ("aiocop.loop", "thread.name"),
        "How long each running loop has been held by the step it is in now, if that step is past the "
        "threshold (0 otherwise), read when the metrics are collected (a scrape): it rises during a hang, "
        "before anything else reports it.",
        "The loop's current state, not a count: a gauge, read on the exporter's thread from what the "
        "watchdog saw at its last look. `thread.name` is a semantic convention.",
    ),
    Signal(
        "aiocop.blocking_call",
        "span event",
        "",
        ("aiocop.event", *_CODE, "aiocop.call"),
        "On the span current at the call: a slow trace shows what froze the loop under it.",
        "An event, not a span: the call is already over when aiocop reports it, and a span per call would "
        "cost what the spans of the request itself cost.",
    ),
    Signal(
        "aiocop.stall",
        "span event",
        "",
        (*_CODE, "aiocop.duration", "aiocop.culprit"),
        "On the span current in the stalled task, with how long the loop was held and what it was doing.",
        "As `aiocop.blocking_call`.",
    ),
)
"""Everything the instrumentor records: instruments first, then span events."""

ATTRIBUTES: dict[str, str] = {
    FILE: "The application's file (relative to the working directory when under it): the same in every "
    "worker and host of a service. A semantic convention.",
    LINE: "Its line number. A semantic convention.",
    FUNCTION: "Its function. A semantic convention.",
    "aiocop.event": "What blocked: the audit event or wrapped call (`open`, `socket.connect`, `time.sleep`, "
    "...), from a fixed table (docs/reference/detected-calls.md); `other` for calls past a step's buffer "
    "(`max_events_per_step`), counted but not kept.",
    "aiocop.severity": "The call's weight as a level: `low`, `medium` or `high`.",
    "aiocop.call": "The call with its arguments, shortened (`os.stat('/etc/hosts')`): span events only, "
    "never a metric attribute (unbounded).",
    "aiocop.duration": "How long the loop was held, in seconds.",
    "aiocop.culprit": "What the loop was doing, e.g. `running zlib.compress(data)`.",
    "aiocop.loop": "The loop's class, e.g. `uvloop.Loop` (several loops of a thread name and class share a "
    "series: the longest block is shown).",
    "thread.name": "The name of the thread running the loop. A semantic convention.",
}
"""The attributes of `SIGNALS`, with their meaning."""


# instrument()'s options besides the providers, with their defaults.
_DEFAULTS: dict[str, Any] = {
    "threshold_ms": None,  # None: as set up already, else 30 ms
    "max_call_sites": 200,
    "span_events": True,
    "span_events_per_second": 10.0,
    "probe_interval_ms": 500.0,  # two a second: 0.1 % of a core at most, idle
}
_PROVIDERS = ("meter_provider", "tracer_provider")


def _options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """instrument()'s keyword arguments, checked, with defaults filled in."""
    unknown = [name for name in kwargs if name not in _DEFAULTS and name not in _PROVIDERS]
    if unknown:
        name = unknown[0]
        raise TypeError(
            f"AiocopInstrumentor.instrument() got an unknown option {name!r}"
            f"{did_you_mean(name, [*_DEFAULTS, *_PROVIDERS])}; its options are: {', '.join([*_PROVIDERS, *_DEFAULTS])}"
        )
    options = {**_DEFAULTS, **{k: v for k, v in kwargs.items() if k in _DEFAULTS}}
    if options["threshold_ms"] is not None:
        check_ms("threshold_ms", options["threshold_ms"])
    check_int("max_call_sites", options["max_call_sites"], 1)
    check_bool("span_events", options["span_events"])
    check_number("span_events_per_second", options["span_events_per_second"], "events", allow_zero=False)
    check_number("probe_interval_ms", options["probe_interval_ms"], "milliseconds", allow_zero=True)
    return options


_identity = object.__hash__  # an object's address (rotated), unique among live objects; not audited
_acquire, _release = _forksafe.acquire, _forksafe.release


class _Totals:
    """A counter's totals per attribute set, kept in-process and read by an observable counter when collected.

    The SDK's `Counter.add()` costs about 6 us (it hashes the attributes and
    takes its locks at every call): two of them per detected call would
    triple what a detected call costs. This is a dict update under a lock;
    the SDK reads the totals once per collection (an export, a scrape).
    Attribute sets come from the `SiteTable`, which keeps each one for the
    life of the process: its identity is its key.
    """

    def __init__(self) -> None:
        self._lock = _forksafe.lock()
        self._totals: dict[int, list[Any]] = {}  # _identity(attributes) -> [attributes, total]
        _every_totals.add(self)

    def add(self, amount: float, attributes: Attributes) -> None:
        # On the loop's thread, at every detected call: the lock's own C
        # methods (`with` would pass through aiocop's wrapper of the lock
        # type), and the attribute set's address from object.__hash__, as
        # id() gives it without id()'s audit event.
        key = _identity(attributes)
        lock = self._lock
        _acquire(lock)
        try:
            entry = self._totals.get(key)
            if entry is None:
                self._totals[key] = [attributes, amount]
            else:
                entry[1] += amount
        finally:
            _release(lock)

    def observe(self, options: metrics.CallbackOptions) -> list[metrics.Observation]:
        with self._lock:
            return [metrics.Observation(total, attributes) for attributes, total in self._totals.values()]


# A forked worker (gunicorn --preload) is a process of its own: its counts start at zero.
_every_totals: weakref.WeakSet[_Totals] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for totals in list(_every_totals):
        totals._totals.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class _Instruments:
    """The instruments of one meter, made once: the SDK keeps the first callback of an observable counter.

    Instrumented again on the same meter provider (after `uninstrument()`),
    the counters go on from their totals; a new set would be ignored by the
    SDK, and the counters would stand still.
    """

    def __init__(self, meter: metrics.Meter) -> None:
        descriptions = {signal.name: (signal.unit, signal.description) for signal in SIGNALS}

        def counter(name: str) -> _Totals:
            totals = _Totals()
            unit, description = descriptions[name]
            meter.create_observable_counter(name, [totals.observe], unit=unit, description=description)
            return totals

        unit, description = descriptions["asyncio.eventloop.delay"]
        # Recorded at each stall and probe tick only: the SDK's own histogram.
        self.delay = meter.create_histogram(
            "asyncio.eventloop.delay",
            unit=unit,
            description=description,
            explicit_bucket_boundaries_advisory=list(DELAY_BUCKETS),
        )
        self.calls = counter("aiocop.blocking_calls")
        self.stalls = counter("aiocop.stalls")
        self.blocked = counter("aiocop.loop.blocked_time")
        self.hangs = counter("aiocop.hangs")
        unit, description = descriptions["aiocop.loop.blocked"]
        meter.create_observable_gauge("aiocop.loop.blocked", [_observe_blocked], unit=unit, description=description)


def _observe_blocked(options: metrics.CallbackOptions) -> list[metrics.Observation]:
    # Read at collection time, on the exporter's (or scraper's) thread.
    return [
        metrics.Observation(seconds, {"aiocop.loop": loop, "thread.name": thread})
        for (loop, thread), seconds in _hangs.blocked_by_loop().items()
    ]


# id(meter) -> (the meter, its instruments). A process has a meter provider or two.
_by_meter: dict[int, tuple[metrics.Meter, _Instruments]] = {}


def _instruments(meter: metrics.Meter) -> _Instruments:
    known = _by_meter.get(id(meter))
    if known is None or known[0] is not meter:
        known = _by_meter[id(meter)] = (meter, _Instruments(meter))
    return known[1]


logger = logging.getLogger("aiocop")


class _Recorder:
    """The observer that turns each `SlowTaskEvent` into metric points and span events.

    What the SDK (or a custom provider) raises while recording never reaches
    the application, whose loop thread most of this runs on: it is counted
    (`AiocopInstrumentor.recording_errors`) and the first one is logged.
    """

    def __init__(self, meter: metrics.Meter, options: dict[str, Any]) -> None:
        self.errors = 0
        self._errors_lock = threading.Lock()
        instruments = _instruments(meter)
        self.delay = instruments.delay
        self.calls = instruments.calls
        self.stalls = instruments.stalls
        self.blocked = instruments.blocked
        self.hangs = instruments.hangs
        self.probe: DelayProbe | None = None
        self.sites = SiteTable(options["max_call_sites"])
        self.span_events: bool = options["span_events"]
        self.span_limit = RateLimit(options["span_events_per_second"])
        self._current_context, self._span_key = _span_lookup()

    def failed(self, error: Exception, doing: str) -> None:
        with self._errors_lock:
            self.errors += 1
            first = self.errors == 1
        if first:
            logger.error(
                "aiocop: OpenTelemetry raised %s while %s (ignored: the application goes on; later errors are "
                "counted in AiocopInstrumentor().recording_errors, not logged)",
                type(error).__name__,
                doing,
                exc_info=error,
            )

    def record_delay(self, seconds: float) -> None:
        """The probe's lateness into the histogram (on the loop's thread)."""
        try:
            self.delay.record(seconds)
        except Exception as error:
            self.failed(error, "recording asyncio.eventloop.delay")

    def __call__(self, event: SlowTaskEvent) -> None:
        try:
            self._record(event)
        except Exception as error:
            self.failed(error, "recording a blocking call or stall")

    def _record(self, event: SlowTaskEvent) -> None:
        view = step_view(event)
        if view is None and is_hang_report(event):  # a lazy event (with a view) is never a hang report
            # A hang report (from aiocop's hang-report thread): the step's
            # time is counted by its final event, if it ends.
            if event.hang_reports == 1:
                self.hangs.add(1, self.sites.attributes(event.call_site))
            return
        if view is not None:  # nobody has read the event: its calls as recorded, nothing formatted
            elapsed_ms, exceeded = view.elapsed_ms, view.exceeded_threshold
            site = None
            calls, with_extra = self.calls, self.sites.with_extra
            for record in view.records:
                # _count_call, inline (once per detected call, on the loop's thread).
                record_at = record_site(record)
                if site is None:
                    site = record_at  # the step's line: its first call's
                weight = record[5]
                level = "high" if weight >= THRESHOLD_HIGH else "medium" if weight >= THRESHOLD_MEDIUM else "low"
                calls.add(1, with_extra(record_at, (("aiocop.event", record[0]), ("aiocop.severity", level))))
            dropped, end, thread_id = view.dropped, view.end, view.thread_id
        else:
            elapsed_ms, exceeded = event.elapsed_ms, event.exceeded_threshold
            for call in event.blocking_events:
                name = call.get("name") or call["event"].partition("(")[0]
                self._count_call(name, call.get("app_site") or call["entry_point"], call["severity"])
            site = event.call_site
            dropped, end, thread_id = event.dropped_events, perf_counter(), event.thread_id
        if site is None:
            site = event.call_site  # a stall seen by the watchdog alone: its samples' line (stalls are rare)
        if dropped:
            # Calls past the step's buffer (max_events_per_step): counted, at the step's line, under `other`.
            self.calls.add(dropped, self.sites.with_extra(site, (("aiocop.event", OTHER), ("aiocop.severity", "low"))))
        seconds = elapsed_ms / 1000.0
        attributes = self.sites.attributes(site)
        self.blocked.add(seconds, attributes)
        if exceeded:
            self.stalls.add(1, attributes)
            self.delay.record(seconds)
            if self.probe is not None:
                self.probe.stalled(thread_id, end - seconds, end)
            if self.span_events:
                self._add_stall_event(event, site, seconds)

    def _count_call(self, name: str, site: str, weight: int | None) -> None:
        level = get_severity_level_from_score(weight or 0)
        self.calls.add(1, self.sites.with_extra(site, (("aiocop.event", name), ("aiocop.severity", level))))

    def on_call(self, record: Record) -> None:
        """A blocking call, as it is made: an event on the span current at the call (on the loop's thread)."""
        # One frame, not two: this runs at every detected call (the try costs nothing until it catches).
        try:
            current_context = self._current_context
            if current_context is not None:
                # trace.get_current_span(), without its four Python calls:
                # nearly every call is made with no span current at all.
                span = current_context().get(self._span_key)
                if span is None or not isinstance(span, trace.Span):
                    return
            else:
                span = trace.get_current_span()
            if not span.is_recording():  # no span, or an unsampled one
                return
            site = record_site(record)
            sites = self.sites
            if not self.span_limit.allow(sites.key(site)):
                return
            name, call = record_call(record)
            span.add_event(
                "aiocop.blocking_call", {**sites.with_extra(site, (("aiocop.event", name),)), "aiocop.call": call}
            )
        except Exception as error:
            self.failed(error, "adding a span event")

    def _add_stall_event(self, event: SlowTaskEvent, site: str, seconds: float) -> None:
        # Delivered in the stalled task's context: its current span is the
        # request's. The stall is reported once its step is over: a span that
        # ended in that very step has no event (the metrics still count it).
        span = trace.get_current_span()
        if not span.is_recording():
            return
        if not self.span_limit.allow("stall:" + self.sites.key(site)):
            return
        attributes = {**self.sites.attributes(site), "aiocop.duration": seconds}
        if event.culprit:
            attributes["aiocop.culprit"] = event.culprit
        span.add_event("aiocop.stall", attributes, timestamp=int((time.time() - seconds) * 1e9))


def _span_lookup() -> tuple[Callable[[], Any] | None, str]:
    """How `on_call` reads the current span: the current OpenTelemetry context's getter and the span's key.

    `trace.get_current_span()` costs four Python calls (about 3 000
    instructions) at every detected call. With OpenTelemetry's default
    runtime context, the current context is one ContextVar's value: its
    `get` is read directly; with another runtime context, the public
    `context.get_current()`. An API without the span's key where
    `get_current_span` finds it: `(None, "")`, and `on_call` asks
    `trace.get_current_span()`.
    """
    try:
        from opentelemetry import context as otel_context  # noqa: PLC0415 - optional internals, looked at once
        from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext  # noqa: PLC0415
        from opentelemetry.trace.propagation import _SPAN_KEY  # noqa: PLC0415
    except ImportError:
        return None, ""
    runtime = getattr(otel_context, "_RUNTIME_CONTEXT", None)
    var = getattr(runtime, "_current_context", None)
    if type(runtime) is ContextVarsRuntimeContext and isinstance(var, ContextVar) and isinstance(_SPAN_KEY, str):
        return var.get, _SPAN_KEY
    return otel_context.get_current, _SPAN_KEY


def _make_recorder(meter_provider: Any, tracer_provider: Any, options: dict[str, Any]) -> _Recorder:
    """The recorder, its instruments made; a provider that cannot make them is named in a clear error.

    Made before anything starts: a failure here leaves detection as it was.
    """
    for name, value, method in (
        ("meter_provider", meter_provider, "get_meter"),
        ("tracer_provider", tracer_provider, "get_tracer"),
    ):
        if value is not None and not callable(getattr(value, method, None)):
            raise TypeError(
                f"AiocopInstrumentor.instrument(): {name} must be an OpenTelemetry provider (with {method}()), "
                f"not {type(value).__name__}: {value!r}"
            )
    try:
        meter = metrics.get_meter("aiocop", __version__, meter_provider)
        return _Recorder(meter, options)
    except Exception as error:
        which = "meter_provider" if meter_provider is not None else "the global meter provider"
        raise RuntimeError(
            f"AiocopInstrumentor.instrument(): {which} {_describe(meter_provider)} could not make aiocop's "
            f"instruments: {type(error).__name__}: {error}"
        ) from error


def _describe(provider: Any) -> str:
    try:
        return repr(provider if provider is not None else metrics.get_meter_provider())
    except Exception:  # a provider whose repr fails too: its type is name enough
        return f"({type(provider).__name__})"


class AiocopInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Records event-loop health with OpenTelemetry: `AiocopInstrumentor().instrument(**options)`.

    Options of `instrument()` (all optional):
        meter_provider: Where the metrics go (default: the global one).
        tracer_provider: Accepted as every instrumentor does; span events go
            to the span current at each call, whichever provider made it.
        threshold_ms: The stall threshold (default: as already set up, else
            30 ms). Detection is started if the application has not.
        max_call_sites: Call sites named in the metrics' attributes per
            process; the rest are counted under `other` (default 200).
        span_events: Add `aiocop.blocking_call` / `aiocop.stall` events to
            the current span (default True).
        span_events_per_second: Span events per call site per second at most
            (default 10).
        probe_interval_ms: How often each loop's delay is probed for the
            histogram (default 500; 0: no probe, stalls only).

    `uninstrument()` stops recording, and stops detection if `instrument()`
    started it.
    """

    _recorder: _Recorder | None = None
    _probe: DelayProbe | None = None
    _started: tuple[bool, bool] = (False, False)  # (interception, watchdog) started by instrument()
    _replaced: tuple[float, bool] | None = None  # the application's (threshold, sampling), if threshold_ms changed it

    def instrumentation_dependencies(self) -> Collection[str]:
        return ()  # instruments the event loop, whatever runs it

    _errors_before: int = 0  # the last recorder's count, kept past uninstrument()

    @property
    def recording_errors(self) -> int:
        """How many times OpenTelemetry raised while aiocop recorded, since the last `instrument()`.

        Each error was ignored (the application never sees one) and the first
        was logged. Added in 2.0.
        """
        return self._recorder.errors if self._recorder is not None else self._errors_before

    def _instrument(self, **kwargs: Any) -> None:
        options = _options(kwargs)
        recorder = _make_recorder(kwargs.get("meter_provider"), kwargs.get("tracer_provider"), options)
        started_interception = not _state.started
        if started_interception:
            _api.configure()  # [tool.aiocop] if the project has one
        started_watchdog = not _watchdog.watchdog.running
        sampling = _settings.sampling.share_samples
        self._replaced = None
        if started_watchdog:
            _api.detect_slow_tasks(threshold_ms=options["threshold_ms"] or _state.config.threshold_ms)
        elif options["threshold_ms"] is not None:
            # The application's watchdog: its threshold changed (and put back by
            # uninstrument()), its choice of CPU samples kept.
            self._replaced = (_state.config.threshold_ms, sampling)
            _api.detect_slow_tasks(
                threshold_ms=options["threshold_ms"], cpu_sampling=sampling, hang_after_ms=_state.config.hang_after_ms
            )
        self._started = (started_interception, started_watchdog)
        self._recorder = recorder
        _callbacks.add_observer(recorder)
        if recorder.span_events:
            _callbacks.add_call_observer(recorder.on_call)
        if options["probe_interval_ms"]:
            self._probe = recorder.probe = DelayProbe(options["probe_interval_ms"] / 1000.0, recorder.record_delay)
            self._probe.start()

    def _uninstrument(self, **kwargs: Any) -> None:
        if self._probe is not None:
            self._probe.stop()
            self._probe = None
        if self._recorder is not None:
            self._errors_before = self._recorder.errors
            _callbacks.remove_observer(self._recorder)
            _callbacks.remove_call_observer(self._recorder.on_call)
            self._recorder = None
        started_interception, started_watchdog = self._started
        if started_interception:
            _api.stop()
        elif started_watchdog:
            _api.stop_watchdog()
        elif self._replaced is not None and _watchdog.watchdog.running:
            threshold_ms, sampling = self._replaced
            _api.detect_slow_tasks(
                threshold_ms=threshold_ms, cpu_sampling=sampling, hang_after_ms=_state.config.hang_after_ms
            )
        self._started = (False, False)
        self._replaced = None
