"""Scripted inputs for the watchdog's decisions (tests/stalls/test_watchdog_logic.py, issue 36).

The watchdog decides from what it reads at a look: a loop thread's stack,
the time and that thread's CPU clock. Here each is given instead of read:

* stacks are real frames, captured once from one real iteration of a real
  asyncio loop (`BaseEventLoop._run_once`, run by hand, not by a running
  loop): the frame a thread waiting in its selector has on top, and the
  frames of callbacks run by `Handle._run`. A frame that has returned keeps
  its callers (`f_back`) and its locals, so the watchdog's walk finds the
  same edges it finds on a live stack; the dispatch frame of each callback
  is a distinct object, so each is a step of its own.
* the time and the CPU clock are numbers the test passes to the look
  (`Watchdog._poll_one(watch, frame, now, cpu)` takes both), and clocks the
  code reads as module globals are replaced with `monkeypatch`.
* the loop is a stand-in that records what the watchdog asks of it.

Nothing here sleeps, starts a thread or reads a clock.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiocop._interception.loops import LoopWatch
from aiocop._stalls.state import LoopState

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType


class StubLoop:
    """A loop as the watchdog sees one from its thread: running or not, and taking thread-safe calls."""

    def __init__(self, running: bool = True) -> None:
        self.running = running
        self.calls: list[tuple[Callable[..., object], tuple[object, ...]]] = []

    def is_running(self) -> bool:
        return self.running

    def call_soon_threadsafe(self, callback: Callable[..., object], *args: object, context: object = None) -> None:
        self.calls.append((callback, args))

    def get_debug(self) -> bool:
        return False


class ScriptedWatch(LoopWatch):
    """A loop's watch whose thread CPU clock reads `cpu_now` (set by the test), not the OS's."""

    __slots__ = ("cpu_now",)

    def __init__(self, loop: object, base_frame: FrameType | None = None) -> None:
        super().__init__(loop, base_frame)  # type: ignore[arg-type]
        self.cpu_now: float | None = 0.0
        # The watchdog's state of the loop, whatever factory the loops' tracking holds (none unless
        # detection was started in this process).
        self.watchdog: LoopState = LoopState()

    def cpu_time(self) -> float | None:
        return self.cpu_now


# LoopWatch holds its loop weakly: the stand-in loops are kept alive here.
_kept: list[object] = []


def watch_of(loop: object | None = None, base_frame: FrameType | None = None) -> ScriptedWatch:
    loop = loop if loop is not None else StubLoop()
    _kept.append(loop)
    return ScriptedWatch(loop, base_frame)


@dataclass
class Frames:
    """Frames captured from one iteration of an asyncio loop."""

    idle: FrameType  # inside the selector's select, under _run_once: the loop waits (no step)
    steps: list[FrameType] = field(default_factory=list)  # one callback frame per step, each under its own Handle._run


def asyncio_frames(steps: int = 2, end_time: float = 100.0) -> Frames:
    """Run one iteration of a real asyncio loop by hand, with `steps` callbacks, and keep their frames.

    `loop.time()` reads `end_time`, so the `end_time` local that `_run_once`
    notes as the select returns (read by `timing.woke_at`) is that number.
    """
    loop = asyncio.new_event_loop()
    captured: dict[str, FrameType] = {}
    step_frames: list[FrameType] = []
    try:
        loop.time = lambda: end_time  # type: ignore[method-assign]
        loop._clock_resolution = 0.0  # type: ignore[attr-defined]
        selector = loop._selector  # type: ignore[attr-defined]

        def select(timeout: float | None = None) -> Any:
            captured["idle"] = sys._getframe()  # (in the loop's wait: what an idle loop's stack shows on top)
            return type(selector).select(selector, 0)

        selector.select = select
        for _ in range(steps):
            loop.call_soon(lambda: step_frames.append(sys._getframe()))
        loop._run_once()  # type: ignore[attr-defined]
        del selector.select
    finally:
        loop.close()
    assert len(step_frames) == steps
    return Frames(captured["idle"], step_frames)


def c_loop_frames() -> tuple[FrameType, FrameType]:
    """(base frame, innermost frame) of a step on a loop written in C.

    Such a loop has no Python frame that dispatches steps: the walk stops at
    the frame that called into the loop (the watch's base frame), and the
    step's identity is its outermost frame, shared by one task's steps.
    """

    def body() -> FrameType:
        return sys._getframe()

    def run_forever() -> FrameType:  # stands for the frame that called loop.run_forever()
        return body()

    innermost = run_forever()
    base = innermost.f_back
    assert base is not None
    return base, innermost
