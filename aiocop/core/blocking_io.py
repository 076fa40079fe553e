"""aiocop 1.x import path: `from aiocop.core.blocking_io import ...` (aliases of the 2.x names)."""

from aiocop._api import reset_blocking_events, start_blocking_io_detection
from aiocop._interception.frames import format_frame as format_stack_frame
from aiocop._interception.rules import get_blocking_events_dict
from aiocop._model.state import Config
from aiocop._reporting.building import format_blocking_event

# 1.x's module constants, as they stand when this module is imported (the
# live table is `aiocop.get_blocking_events_dict()` / `aiocop.BLOCKING_CALLS`).
MAX_EVENTS_PER_TASK: int = Config.max_events_per_step
BLOCKING_EVENTS_DICT: dict[str, int] = get_blocking_events_dict()
BLOCKING_EVENTS: set[str] = set(BLOCKING_EVENTS_DICT)

__all__ = [
    "BLOCKING_EVENTS",
    "BLOCKING_EVENTS_DICT",
    "MAX_EVENTS_PER_TASK",
    "format_blocking_event",
    "format_stack_frame",
    "get_blocking_events_dict",
    "reset_blocking_events",
    "start_blocking_io_detection",
]
