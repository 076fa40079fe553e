"""Log aiocop's events through structlog: one structured entry per event.

```python
import aiocop
import aiocop.structlog

aiocop.start_blocking_io_detection()
aiocop.detect_slow_tasks(threshold_ms=50)
aiocop.structlog.log_events()
```

Each entry is logged as `"aiocop.blocking_call"` (or `"aiocop.loop_stall"`,
or `"aiocop.loop_hang"` at `error` for a loop still hung, with `trace`, `ongoing`,
`hang_reports` and `blocker` when known)
with the keys `blocking_event`, `call_site`, `duration_ms`, `severity`,
`task`, `thread`, `trace` (first occurrence of a call site) or `repeated`
(later ones), `reason`, `loop`, and whatever the context providers returned
(`http_path`, trace ids, ...). structlog is imported only by this module
(`pip install 'aiocop[structlog]'`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import structlog

from aiocop._reporting.logs import CallSiteLimiter, Occurrence, replace_callback, structured_fields

if TYPE_CHECKING:
    from aiocop._model.events import SlowTaskEvent

__all__ = ["StructlogCallback", "log_events"]

_LEVELS = ("debug", "info", "warning", "error", "critical")


class StructlogCallback:
    """A slow-task callback that logs each event as one structlog entry.

    A call site's first event carries the full `trace`; later ones are
    logged at most once per `repeat_interval_s`, with `repeated`: the number
    of its events not logged since.

    Args:
        logger: A structlog logger, or `None` for `structlog.get_logger("aiocop")`.
        level: The method the entries are logged with: `"debug"`, `"info"`, `"warning"`, ...
        repeat_interval_s: At most one entry per call site in this many seconds after its first.
    """

    def __init__(
        self,
        logger: Any | None = None,
        *,
        level: str = "warning",
        repeat_interval_s: float = 60.0,
    ) -> None:
        if not isinstance(level, str):
            raise TypeError(f"level must be one of {', '.join(_LEVELS)}, not {type(level).__name__}: {level!r}")
        if level not in _LEVELS:
            raise ValueError(f"level must be one of {', '.join(_LEVELS)}, not {level!r}")
        if logger is not None and not callable(getattr(logger, level, None)):
            raise TypeError(f"logger must be a structlog logger (with a .{level}() method), not {logger!r}")
        self.logger = logger if logger is not None else structlog.get_logger("aiocop")
        self.level = level
        self.limiter = CallSiteLimiter(repeat_interval_s)

    def __call__(self, event: SlowTaskEvent) -> None:
        if event.ongoing:
            # A hang, while it lasts: at "error" at least, always with its stack.
            level = self.level if _LEVELS.index(self.level) >= _LEVELS.index("error") else "error"
            fields = structured_fields(event, Occurrence(first=True))
            fields.pop("event", None)
            getattr(self.logger, level)("aiocop.loop_hang", **fields)
            return
        occurrence = self.limiter.check(event)
        if occurrence is None:
            return
        name = "aiocop.loop_stall" if event.reason == "cpu_blocking" else "aiocop.blocking_call"
        fields = structured_fields(event, occurrence)
        # structlog's own key, the entry's name: a context provider's "event"
        # would make the call fail (as other keys of aiocop's, it gives way).
        fields.pop("event", None)
        getattr(self.logger, self.level)(name, **fields)


def log_events(
    logger: Any | None = None,
    *,
    level: str = "warning",
    repeat_interval_s: float = 60.0,
) -> StructlogCallback:
    """Log every event through structlog, from now on.

    Args:
        logger: A structlog logger (default `structlog.get_logger("aiocop")`).
        level: The method used: `"warning"` (default), `"error"`, `"info"`, ...
        repeat_interval_s: After a call site's first entry, log it at most
            once per this many seconds, with the count in between (0 logs
            every event).

    Calling it again replaces the callback it registered before.

    Returns:
        The registered callback (pass it to `aiocop.unregister_slow_task_callback`).
    """
    callback = StructlogCallback(logger, level=level, repeat_interval_s=repeat_interval_s)
    replace_callback(StructlogCallback, callback)
    return callback
