"""aiocop 1.x import path: `from aiocop.types.severity import ...` (aliases of the 2.x names)."""

from aiocop._model.severity import (
    THRESHOLD_HIGH,
    THRESHOLD_LOW,
    THRESHOLD_MEDIUM,
    WEIGHT_HEAVY,
    WEIGHT_LIGHT,
    WEIGHT_MODERATE,
    WEIGHT_TRIVIAL,
    IoSeverityLevel,
)

__all__ = [
    "THRESHOLD_HIGH",
    "THRESHOLD_LOW",
    "THRESHOLD_MEDIUM",
    "WEIGHT_HEAVY",
    "WEIGHT_LIGHT",
    "WEIGHT_MODERATE",
    "WEIGHT_TRIVIAL",
    "IoSeverityLevel",
]
