"""The watchdog's part of the seam: what it hands on about stalls and hangs (see `_interception.sink`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiocop._interception.sink import Sink

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType

    from aiocop._interception.loops import LoopWatch
    from aiocop._stalls.attribution import Stall
    from aiocop._stalls.timing import Step


@dataclass(frozen=True)
class StallSink(Sink):
    """The sink of the whole process: interception's part, and what the watchdog hands on."""

    # Under the watchdog's merge_lock, as a stall ends: true if an io event of the same step, still to be
    # delivered, took the stall over (its samples join that event).
    attach_to_io: Callable[[LoopWatch, Stall], bool]
    # A stall nobody else took, reported alone (called on the watchdog's thread, or on the loop's as it stops).
    stall: Callable[[Stall], None]
    # A step still running past hang_after_ms, reported while it runs (on the watchdog's thread: quick):
    # the loop's watch, the step, the loop thread's innermost frame, the time.
    hang: Callable[[LoopWatch, Step, FrameType, float], None]
