"""The exception raised inside the offending task by `raise_on_violations`."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aiocop._model.events import BlockingEventInfo


class HighSeverityBlockingIoException(Exception):  # noqa: N818 - public 1.x name
    """Raised at a blocking call when `raise_on_violations` is in force.

    The exception is raised by aiocop's audit hook before the blocking call
    proceeds, so it surfaces at the offending line inside the task (or
    callback) that made it; other tasks and the loop are not affected.

    Attributes:
        severity_score: The step's score, this call included.
        severity_level: `"low"`, `"medium"` or `"high"`.
        elapsed_ms: Time from the step's first blocking call to this one.
        threshold_ms: The slow-task threshold in force.
        events: The step's blocking calls so far, formatted; the one that
            raised has `raised` set.
    """

    def __init__(
        self,
        severity_score: int,
        severity_level: str,
        elapsed_ms: float,
        threshold_ms: float,
        events: list[BlockingEventInfo],
    ) -> None:
        self.severity_score = severity_score
        self.severity_level = severity_level
        self.elapsed_ms = elapsed_ms
        self.threshold_ms = threshold_ms
        self.events = events
        super().__init__(self._format_message())

    def _format_message(self) -> str:
        # 1.x's layout (its header is what 1.x users grep their logs and CI
        # output for), with the application's line of each call. Events made
        # by hand may carry only some keys.
        rule = "=" * 80
        lines = [
            "",
            rule,
            "HIGH SEVERITY BLOCKING I/O DETECTED",
            rule,
            "Blocking call in async code, stopped before it ran:",
            f"  - Severity Score: {self.severity_score}",
            f"  - Severity Level: {self.severity_level}",
            f"  - Elapsed Time: {self.elapsed_ms:.2f}ms (since the step's first blocking call)",
            f"  - Threshold: {self.threshold_ms:.2f}ms",
            "",
            "Blocking I/O Events:",
        ]
        for event in self.events or ():
            lines.append(f"  - {event.get('event', '?')}")
            where = event.get("app_site") or event.get("entry_point")
            if where:
                lines.append(f"    at {where}")
            if event.get("trace"):
                lines.append(f"    trace: {event['trace']}")
        lines.append(rule)
        return "\n".join(lines)
