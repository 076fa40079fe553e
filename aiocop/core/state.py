"""aiocop 1.x import path: `from aiocop.core.state import ...` (aliases of the 2.x names)."""

from aiocop._api import (
    activate,
    deactivate,
    disable_raise_on_violations,
    enable_raise_on_violations,
    is_monitoring_active,
    is_raise_on_violations_enabled,
)
from aiocop._api import raise_on_violations as raise_on_violations_context

__all__ = [
    "activate",
    "deactivate",
    "disable_raise_on_violations",
    "enable_raise_on_violations",
    "is_monitoring_active",
    "is_raise_on_violations_enabled",
    "raise_on_violations_context",
]
