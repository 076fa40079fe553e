"""aiocop 1.x import path: `from aiocop.core.slow_tasks import ...` (aliases of the 2.x names)."""

from aiocop._api import detect_slow_tasks, get_slow_task_threshold_ms
from aiocop._model.callbacks import SlowTaskCallback

__all__ = ["SlowTaskCallback", "detect_slow_tasks", "get_slow_task_threshold_ms"]
