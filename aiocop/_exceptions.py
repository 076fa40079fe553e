"""The exception raised inside the offending task by `raise_on_violations`."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aiocop._events import BlockingEventInfo


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
        lines = [
            "blocking call in async code "
            f"(severity {self.severity_level}, score {self.severity_score}, "
            f"{self.elapsed_ms:.2f} ms since the step's first blocking call)",
        ]
        for event in self.events:
            lines.append(f"  - {event['event']}")
            lines.append(f"    at {event['entry_point']}")
            lines.append(f"    trace: {event['trace']}")
        return "\n".join(lines)
