"""Severity weights and the score → level mapping (unchanged from aiocop 1.x)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal, get_args

IoSeverityLevel = Literal["low", "medium", "high"]
"""A step's severity level, from its score (`get_severity_level_from_score`)."""
LEVELS: tuple[IoSeverityLevel, ...] = get_args(IoSeverityLevel)
"""The severity levels (`IoSeverityLevel`), lowest first."""

WEIGHT_HEAVY = 50
"""Network, DNS, subprocesses, sleeps and waits: one is enough for "high"."""
WEIGHT_MODERATE = 10
"""File I/O, directory scans and file-system mutations."""
WEIGHT_LIGHT = 1
"""Metadata look-ups such as ``os.stat``: cheap, but still a syscall."""
WEIGHT_TRIVIAL = 0
"""Calls that are reported but do not count towards the severity score."""

THRESHOLD_HIGH = 50
"""The smallest score of a "high" step."""
THRESHOLD_MEDIUM = 10
"""The smallest score of a "medium" step."""
THRESHOLD_LOW = 1
"""The smallest score of a "low" step with any weighted call (below it: trivial calls only)."""

_LEVEL_RANK: dict[str, int] = {level: rank for rank, level in enumerate(LEVELS)}


def calculate_io_severity_score(blocking_events: Iterable[Mapping[str, object]] | None) -> int:
    """Sum the weights of a step's blocking events.

    Args:
        blocking_events: The events of one step, as found in
            `SlowTaskEvent.blocking_events`. An event without a weight counts as
            `WEIGHT_MODERATE`, as in aiocop 1.x.

    Returns:
        The total score; `0` for `None` or no events.
    """
    if blocking_events is None:
        return 0
    if isinstance(blocking_events, (str, bytes)) or not isinstance(blocking_events, Iterable):
        raise TypeError(
            "blocking_events must be a list of blocking events (SlowTaskEvent.blocking_events), "
            f"not {type(blocking_events).__name__}: {blocking_events!r}"
        )
    total = 0
    for event in blocking_events:
        if not isinstance(event, Mapping):
            raise TypeError(f"blocking_events must hold BlockingEventInfo dicts, not {type(event).__name__}: {event!r}")
        weight = event.get("severity")
        total += weight if isinstance(weight, int) else WEIGHT_MODERATE
    return total


def get_severity_level_from_score(score: int) -> IoSeverityLevel:
    """Map a severity score to `"high"` (>= 50), `"medium"` (>= 10) or `"low"`."""
    if type(score) is not int:  # the common case first: aiocop's own scores are ints
        _check_score(score)
    if score >= THRESHOLD_HIGH:
        return "high"
    if score >= THRESHOLD_MEDIUM:
        return "medium"
    return "low"


def impact_level(score: int, elapsed_ms: float, threshold_ms: float) -> IoSeverityLevel:
    """How much a step hurt its loop: the higher of what it called and how long it held the loop.

    What it called: the level of its score (`get_severity_level_from_score`),
    when it made a call that weighs anything. How long it held the loop: from
    the slow-task threshold `"medium"`, from twice the threshold `"high"`. A
    stall, which has no calls to weigh (score 0, level `"low"`, as in 1.x),
    ranks by its length; a `time.sleep(0.001)` by the call; a step of
    `os.stat()` calls that held the loop 200 ms by its length.
    """
    level: IoSeverityLevel = get_severity_level_from_score(score) if score >= THRESHOLD_LOW else "low"
    if elapsed_ms >= 2 * threshold_ms:
        return "high"
    if elapsed_ms >= threshold_ms and level == "low":
        return "medium"
    return level


def _check_score(score: object) -> None:
    if isinstance(score, bool) or not isinstance(score, (int, float)):
        raise TypeError(f"score must be a number (a severity score), not {type(score).__name__}: {score!r}")
    if score != score:  # NaN  # noqa: PLR0124 - the NaN test
        raise ValueError("score must be a number, not NaN")


def level_threshold(level: str) -> int:
    """The smallest score that reaches `level`; raises `ValueError` for unknown levels."""
    if level not in _LEVEL_RANK:
        raise ValueError(f"severity level must be one of {', '.join(map(repr, LEVELS))}, not {level!r}")
    return {"low": 0, "medium": THRESHOLD_MEDIUM, "high": THRESHOLD_HIGH}[level]


def level_rank(level: str) -> int:
    """Order of a severity level name: low (0) < medium (1) < high (2); unknown is -1."""
    return _LEVEL_RANK.get(level, -1)
