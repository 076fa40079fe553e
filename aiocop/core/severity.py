"""aiocop 1.x import path: `from aiocop.core.severity import ...` (aliases of the 2.x names)."""

from aiocop._model.severity import calculate_io_severity_score, get_severity_level_from_score

__all__ = ["calculate_io_severity_score", "get_severity_level_from_score"]
