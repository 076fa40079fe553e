"""Severity weights and the score → level mapping (unchanged from aiocop 1.x)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

IoSeverityLevel = Literal["low", "medium", "high"]

WEIGHT_HEAVY = 50
"""Network, DNS, subprocesses, sleeps and waits: one is enough for "high"."""
WEIGHT_MODERATE = 10
"""File I/O, directory scans and file-system mutations."""
WEIGHT_LIGHT = 1
"""Metadata look-ups such as ``os.stat``: cheap, but still a syscall."""
WEIGHT_TRIVIAL = 0
"""Calls that are reported but do not count towards the severity score."""

THRESHOLD_HIGH = 50
THRESHOLD_MEDIUM = 10
THRESHOLD_LOW = 1

_LEVEL_RANK: dict[str, int] = {"low": 0, "medium": 1, "high": 2}


def calculate_io_severity_score(blocking_events: Iterable[Mapping[str, object]] | None) -> int:
    """Sum the weights of a step's blocking events.

    Args:
        blocking_events: The events of one step, as found in
            `SlowTaskEvent.blocking_events`. An event without a weight counts as
            `WEIGHT_MODERATE`, as in aiocop 1.x.

    Returns:
        The total score; `0` for `None` or no events.
    """
    if not blocking_events:
        return 0
    total = 0
    for event in blocking_events:
        weight = event.get("severity")
        total += weight if isinstance(weight, int) else WEIGHT_MODERATE
    return total


def get_severity_level_from_score(score: int) -> IoSeverityLevel:
    """Map a severity score to `"high"` (>= 50), `"medium"` (>= 10) or `"low"`."""
    if score >= THRESHOLD_HIGH:
        return "high"
    if score >= THRESHOLD_MEDIUM:
        return "medium"
    return "low"


def level_threshold(level: str) -> int:
    """The smallest score that reaches `level`; raises `ValueError` for unknown levels."""
    if level not in _LEVEL_RANK:
        raise ValueError(f"severity level must be one of 'low', 'medium', 'high', not {level!r}")
    return {"low": 0, "medium": THRESHOLD_MEDIUM, "high": THRESHOLD_HIGH}[level]


def level_rank(level: str) -> int:
    """Order of a severity level name: low (0) < medium (1) < high (2); unknown is -1."""
    return _LEVEL_RANK.get(level, -1)
