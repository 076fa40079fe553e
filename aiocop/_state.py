"""Switches shared by the hook, the wrappers and the public API.

Global switches are module attributes (read on the hot path as one global
look-up); per-scope switches are context variables, so a task created inside
a scope inherits it and one created outside does not.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import Literal

from aiocop._severity import THRESHOLD_HIGH

Delivery = Literal["loop", "thread"]


@dataclass
class Config:
    trace_depth: int = 20
    threshold_ms: float = 30.0
    delivery: Delivery = "loop"
    max_events_per_step: int = 64
    raise_min_score: int = THRESHOLD_HIGH


config = Config()

# Whether start_blocking_io_detection() has installed detection (until stop()).
started = False
# activate()/deactivate(): pause detection without uninstalling anything.
active = True

# raise_on_violations: kept under its 1.x name for code that imported it.
raise_on_violations: ContextVar[bool] = ContextVar("aiocop_raise_on_violations", default=False)
