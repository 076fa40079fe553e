"""aiocop 1.x import path: `from aiocop.types.events import ...` (aliases of the 2.x names)."""

from aiocop._model.events import BlockingEventInfo, CpuStackSample, RawBlockingEvent, SlowTaskEvent

__all__ = ["BlockingEventInfo", "CpuStackSample", "RawBlockingEvent", "SlowTaskEvent"]
