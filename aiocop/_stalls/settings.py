"""The watchdog's settings: how often it looks and samples, and how much it keeps.

`sampling` is the one instance, set by `detect_slow_tasks()` (and attach's
agent, from the target's own settings); every module of the watchdog reads it
at the moment it needs a value, so a change takes effect at the next look.

May import: aiocop._model.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiocop._model import state as _state

# The interval between looks while every loop is idle, unless set.
_DEFAULT_IDLE_MS = 100.0


@dataclass
class SamplingConfig:
    interval_ms: float = 10.0
    arm_after_ms: float | None = None  # None: half the slow-task threshold
    idle_interval_ms: float | None = None  # None: _DEFAULT_IDLE_MS
    busy_poll_ms: float = 2.0
    max_samples_per_slice: int = 32
    trace_depth: int = 20
    # detect_slow_tasks(cpu_sampling=False): stalls are still found (as 1.x
    # found them, by timing), but events carry no stack samples.
    share_samples: bool = True

    def arm_after_s(self) -> float:
        if self.arm_after_ms is not None:
            return self.arm_after_ms / 1000.0
        return _state.config.threshold_ms / 2000.0

    def idle_s(self) -> float:
        return (self.idle_interval_ms if self.idle_interval_ms is not None else _DEFAULT_IDLE_MS) / 1000.0


sampling = SamplingConfig()
