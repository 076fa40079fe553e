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
# The same while every loop is armed (its tripwire wakes the watchdog as it
# wakes): the looks are then only a safety net, and each costs a wake-up of
# the watchdog's thread, 0.1-0.3 ms of CPU on a VM (issue 39).
_DEFAULT_ARMED_IDLE_MS = 250.0


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
    # start_cpu_sampling(precise_idle=...): whether an idle loop that cannot
    # be armed (_tripwire) is looked at every half threshold (a stall of 1.5x
    # the threshold after a quiet spell is seen; about 2 % of a core on a VM)
    # or every idle interval (a tenth of that; a wait or a short CPU-bound
    # stall after a quiet spell can go unseen). None: `precise_by_default`,
    # which the pytest plugin and `python -m aiocop run` set (issue 39).
    precise_idle: bool | None = None
    precise_by_default: bool = False

    def precise(self) -> bool:
        return self.precise_by_default if self.precise_idle is None else self.precise_idle

    def arm_after_s(self) -> float:
        if self.arm_after_ms is not None:
            return self.arm_after_ms / 1000.0
        return _state.config.threshold_ms / 2000.0

    def idle_s(self, *, armed: bool = False) -> float:
        if self.idle_interval_ms is not None:
            return self.idle_interval_ms / 1000.0
        return (_DEFAULT_ARMED_IDLE_MS if armed else _DEFAULT_IDLE_MS) / 1000.0


sampling = SamplingConfig()
