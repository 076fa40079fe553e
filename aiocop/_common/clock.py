"""aiocop's own clocks: the real ones, whatever a test freezes or mocks.

Test suites freeze time: freezegun replaces `time.monotonic`, `time.perf_counter`
and `time.time` in the `time` module *and* every module attribute that is one
of those functions (found by identity, in every loaded module), and its fakes
give the frozen time (`2030-01-01` as seconds since the epoch); a test's
`unittest.mock.patch("time.monotonic")` replaces the `time` module's attribute.
aiocop reading those clocks timed a 1 ms step as 1.9e12 ms, or as negative.

The clocks here are the very C functions of the `time` module, taken from a
second instance of that module made for aiocop alone (the `time` module is
built with multi-phase initialisation, so a fresh instance has its own
function objects): no scan by identity finds them, no patch of `time.*`
reaches them, and calling one costs exactly what calling `time.perf_counter`
costs (the hot path reads them as module globals, as before). time-machine
patches the C functions of the time of day (`time.time`, `clock_gettime` of
the real-time clock, ...) but leaves the monotonic clocks alone, so durations
are immune to it too; the time of day under time-machine is its travelled one.

Import the names (`from aiocop._common.clock import perf_counter`): never read a
clock as `time.<name>` at call time.
"""

from __future__ import annotations

import functools
import importlib.util
import time as _time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType


def _private_time_module() -> ModuleType | None:
    try:
        spec = importlib.util.find_spec("time")
        if spec is None or spec.loader is None:
            return None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception:  # an interpreter whose `time` cannot be instantiated twice
        return None
    return module if module is not _time else None


_module = _private_time_module()


def _real(name: str) -> Callable[..., Any]:
    clock: Callable[..., Any] = getattr(_module, name, None) or getattr(_time, name)
    if clock is getattr(_time, name):
        # No second module here: a distinct object that no scan by identity
        # matches (a partial adds a C-level call, no Python frame).
        clock = functools.partial(clock)
    return clock


perf_counter: Callable[[], float] = _real("perf_counter")
monotonic: Callable[[], float] = _real("monotonic")
thread_time: Callable[[], float] = _real("thread_time")
process_time: Callable[[], float] = _real("process_time")
time: Callable[[], float] = _real("time")
"""The time of day (seconds since the epoch), for timestamps."""


def elapsed(start: float, end: float) -> float:
    """`end - start`, never negative: a duration of aiocop's own clocks (nothing can move them backwards)."""
    return end - start if end > start else 0.0


del _real


def thread_cpu_clock(thread_id: int) -> int | None:
    """The CPU clock of the thread `thread_id` (for `time.clock_gettime`), readable from any thread; None if none.

    A loop thread's own CPU clock, read by the watchdog: it tells a CPU-bound
    stall from a wait, and when a CPU-bound stall began. None where the
    platform has no per-thread CPU clock, or the thread has gone.
    """
    try:
        return _time.pthread_getcpuclockid(thread_id)
    except (AttributeError, OSError):  # not on this platform
        return None
