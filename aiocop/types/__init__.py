"""aiocop 1.x import path: `from aiocop.types import ...` (aliases of the 2.x names)."""

from aiocop._model.events import BlockingEventInfo, RawBlockingEvent, SlowTaskEvent
from aiocop._model.severity import IoSeverityLevel

__all__ = ["BlockingEventInfo", "IoSeverityLevel", "RawBlockingEvent", "SlowTaskEvent"]
