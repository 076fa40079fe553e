"""Events to logs: the standard `logging` callback and the per-call-site rate limit.

A hot blocking call runs on every request; logging each occurrence would
flood the pipeline with the same trace. Each call site is logged in full the
first time, then at most once per interval, as a short entry with the number
of occurrences it stands for.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiocop._common import forksafe as _forksafe
from aiocop._common.clock import monotonic
from aiocop._common.escape import printable
from aiocop._common.validate import check_callable, check_int, check_number
from aiocop._model import callbacks as _callbacks
from aiocop._reporting.report import STALL, call_site, describe, describe_hang, hang_headline, step_held, to_record

if TYPE_CHECKING:
    from collections.abc import Callable

    from aiocop._model.callbacks import SlowTaskCallback
    from aiocop._model.events import SlowTaskEvent


# aiocop's own lock is taken with the lock type's C methods: `with lock:` would
# pass through aiocop's Python wrapper of `__enter__` on a loop's thread (issue 26).
_acquire, _release = _forksafe.acquire, _forksafe.release


@dataclass(frozen=True)
class Occurrence:
    """The limiter's verdict on an event that is to be logged.

    Attributes:
        first: This call site was never logged before (log it in full).
        repeated: Events of this call site not logged since its last entry.
        worst_ms: The longest of those, in ms (0 when `repeated` is 0).
    """

    first: bool
    repeated: int = 0
    worst_ms: float = 0.0


@dataclass
class _Site:
    last_logged: float
    suppressed: int = 0
    worst_ms: float = 0.0


class CallSiteLimiter:
    """Decides which events to log: the first per call site, then one per interval.

    Thread-safe. At most `max_sites` call sites are remembered (the least
    recently seen is forgotten first), so memory stays bounded however many
    distinct sites an application has.
    """

    def __init__(
        self, interval_s: float = 60.0, max_sites: int = 10_000, clock: Callable[[], float] = monotonic
    ) -> None:
        self.interval_s = check_number("repeat_interval_s", interval_s, "seconds", allow_zero=True)
        self.max_sites = check_int("max_sites", max_sites, 1)
        check_callable("clock", clock, 0)
        self._clock = clock
        self._sites: OrderedDict[tuple[str, str], _Site] = OrderedDict()
        self._lock = _forksafe.lock()

    def check(self, event: SlowTaskEvent) -> Occurrence | None:
        """`None` to skip this event, else how to log it."""
        first_call = event.blocking_events[0] if event.blocking_events else None
        key = (call_site(event), first_call.get("name", first_call["event"]) if first_call else STALL)
        now = self._clock()
        _acquire(self._lock)
        try:
            site = self._sites.get(key)
            if site is None:
                self._sites[key] = _Site(now)
                if len(self._sites) > self.max_sites:
                    self._sites.popitem(last=False)
                return Occurrence(first=True)
            self._sites.move_to_end(key)
            if now - site.last_logged < self.interval_s:
                site.suppressed += 1
                site.worst_ms = max(site.worst_ms, event.elapsed_ms)
                return None
            verdict = Occurrence(first=False, repeated=site.suppressed, worst_ms=site.worst_ms)
            site.last_logged, site.suppressed, site.worst_ms = now, 0, 0.0
            return verdict
        finally:
            _release(self._lock)


def headline(event: SlowTaskEvent) -> str:
    """One line naming what blocked, where, and for how long."""
    site = printable(call_site(event))
    if event.ongoing:
        return f"aiocop: {hang_headline(event)}"
    if event.reason == "cpu_blocking":
        return (
            f"aiocop: loop stalled {event.elapsed_ms:.1f} ms at {site} (impact {event.impact}): "
            f"{printable(event.culprit or 'no call to intercept')}"
        )
    names = printable(", ".join(dict.fromkeys(info.get("name", info["event"]) for info in event.blocking_events)))
    task = f", task {printable(repr(event.task_name))}" if event.task_name else ""
    return (
        f"aiocop: blocking call {names} at {site} "
        f"(impact {event.impact}, severity {event.severity_level}, {step_held(event)}{task})"
    )


class LoggingCallback:
    """A slow-task callback that logs each event through the standard `logging` module.

    The first event of a call site is logged in full (what blocked, the line,
    its source and the trace); later ones at most once per
    `repeat_interval_s`, as one line with the count they stand for. Every
    entry carries the event as plain data in `record.aiocop` (see
    `logging.LogRecord` "extra"), for JSON formatters.

    Args:
        logger: A `logging.Logger`, a logger name, or `None` for `"aiocop.events"`.
        level: The level of the entries, as a number or a name (`"WARNING"`).
        repeat_interval_s: At most one entry per call site in this many seconds after its first.
    """

    def __init__(
        self,
        logger: logging.Logger | str | None = None,
        *,
        level: int | str = logging.WARNING,
        repeat_interval_s: float = 60.0,
    ) -> None:
        if logger is None or isinstance(logger, str):
            logger = logging.getLogger(logger or "aiocop.events")
        elif not isinstance(logger, logging.Logger):
            raise TypeError(f"logger must be a logging.Logger, a logger name or None, not {logger!r}")
        self.logger = logger
        self.level = _check_level(level)
        self.limiter = CallSiteLimiter(repeat_interval_s)

    def __call__(self, event: SlowTaskEvent) -> None:
        if event.ongoing:
            # A hang, while it lasts: at ERROR at least, always with the
            # stack, never folded into a call site's count (its repeats are
            # spaced already, each with a fresh stack).
            level = max(self.level, logging.ERROR)
            if self.logger.isEnabledFor(level):
                message = "aiocop: " + describe_hang(event)
                self.logger.log(level, "%s", message, extra={"aiocop": to_record(event)})
            return
        if not self.logger.isEnabledFor(self.level):
            return  # before the limiter: a site first seen while disabled is logged in full later
        occurrence = self.limiter.check(event)
        if occurrence is None:
            return
        data = to_record(event)
        if occurrence.first:
            details = describe(event).splitlines()[1:]  # its first line says what the headline says
            message = "\n".join([headline(event), *details])
        else:
            data["repeated"] = occurrence.repeated
            message = f"{headline(event)} [{_repeats(occurrence)}]"
        self.logger.log(self.level, "%s", message, extra={"aiocop": data})


def _repeats(occurrence: Occurrence) -> str:
    if not occurrence.repeated:
        return "again"
    return f"+{occurrence.repeated} more since the last entry, worst {occurrence.worst_ms:.1f} ms"


def _check_level(level: object) -> int:
    if isinstance(level, str):
        value = logging.getLevelName(level.upper())
        if isinstance(value, int):
            return value
    elif isinstance(level, bool) or not isinstance(level, int):
        raise TypeError(
            f"level must be a logging level such as logging.WARNING or 'warning', not {type(level).__name__}: {level!r}"
        )
    elif level >= 0:
        return level
    raise ValueError(f"level must be a logging level such as logging.WARNING or 'warning', not {level!r}")


def log_events(
    logger: logging.Logger | str | None = None,
    *,
    level: int | str = logging.WARNING,
    repeat_interval_s: float = 60.0,
) -> LoggingCallback:
    """Log every event through the standard `logging` module, from now on.

    ```python
    aiocop.start_blocking_io_detection()
    aiocop.detect_slow_tasks(threshold_ms=50)
    aiocop.log_events()  # logger "aiocop.events", level WARNING
    ```

    Args:
        logger: A logger or logger name (default `"aiocop.events"`).
        level: The level of the entries.
        repeat_interval_s: After a call site's first entry, log it at most
            once per this many seconds, with the count of events in between
            (0 logs every event).

    Calling it again replaces the callback it registered before.

    Returns:
        The registered callback (pass it to `unregister_slow_task_callback`).

    Added in 2.0.
    """
    callback = LoggingCallback(logger, level=level, repeat_interval_s=repeat_interval_s)
    replace_callback(LoggingCallback, callback)
    return callback


def replace_callback(kind: type, callback: SlowTaskCallback) -> None:
    """Register `callback` in place of any registered callback of type `kind`.

    Calling a `log_events()` again reconfigures logging rather than logging
    every event twice.
    """
    for registered in _callbacks.registered():
        if type(registered) is kind:
            _callbacks.unregister_slow_task_callback(registered)
    _callbacks.register_slow_task_callback(callback)


def structured_fields(event: SlowTaskEvent, occurrence: Occurrence) -> dict[str, Any]:
    """The fields of one structured log entry (see `aiocop.structlog`)."""
    data = to_record(event)
    calls = data.pop("blocking_calls")
    impact = data.pop("impact")
    severity = data.pop("severity_level")
    fields: dict[str, Any] = {
        "blocking_event": calls[0]["event"] if calls else STALL,
        "call_site": data.pop("call_site"),
        "duration_ms": data.pop("elapsed_ms"),
        "impact": impact,
        # The calls' severity where the step made calls. A stall or a hang has
        # none to weigh (1.x's score 0, "low"), and severity=low beside
        # impact=high misleads whoever filters on it: its severity is its impact.
        "severity": severity if calls else impact,
        "task": data.pop("task"),
        "thread": data.pop("thread"),
    }
    if occurrence.first or event.ongoing:
        fields["trace"] = calls[0]["trace"] if calls else _stall_trace(data)
        if len(calls) > 1:
            fields["calls"] = [f"{c['event']}({c['args']}) at {c['entry_point']}" for c in calls]
    else:
        fields["repeated"] = occurrence.repeated
    context = data.pop("context", {})
    fields.update(data)
    for key, value in context.items():
        fields.setdefault(key, value)  # context providers' keys (http_path, trace ids, ...) at the top level
    # structlog's renderers print strings as they are (its ConsoleRenderer, a
    # key=value one): the fields are text for a terminal or a log, made printable.
    return {printable(str(key)): _printable_value(value) for key, value in fields.items()}


def _printable_value(value: object) -> object:
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, list):
        return [_printable_value(item) for item in value]
    if isinstance(value, dict):
        return {printable(str(key)): _printable_value(item) for key, item in value.items()}
    return value


def _stall_trace(data: dict[str, Any]) -> str:
    samples = data.get("stack_samples") or [{"trace": ""}]
    return str(samples[0]["trace"])
