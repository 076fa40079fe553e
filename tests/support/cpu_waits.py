"""The time a test process's threads waited for a CPU: what a busy machine took from a timing test.

A stall's reported length is right within SPEC's 10 % or 2 ms where the
machine gives aiocop's threads a CPU when they ask for one. What it withholds
is measured, not guessed from the load average, and added to the tolerance:
a watchdog thread kept waiting looks late, and a loop thread kept off the
CPUs makes a step outlast its call at a pace the watchdog cannot see. On a
quiet machine the sum is a fraction of a millisecond, and SPEC's bound is
the test's.

Linux's `/proc/self/task/<tid>/schedstat` (its second field: nanoseconds a
thread was runnable but waiting for a CPU), summed over the process's
threads; elsewhere nothing is told and SPEC's bound stands alone. A thread's
count goes with it when it ends: a thread that runs a loop and ends within
a test adds its own with `counted`. Read outside any running loop (a listing
of /proc in a task's step is a blocking call, which the tests would see).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator

_TASKS = "/proc/self/task"
_lock = threading.Lock()
_base: dict[int, float] = {}  # each thread's wait (s) at `start`
_ended = 0.0  # the waits (s) of threads that ended since `start`, told by `counted`
_ended_tids: set[int] = set()  # theirs (an ended thread's files may outlast its join by a moment)


def _waited(path: str) -> float | None:
    try:
        with open(path, "rb") as file:
            return int(file.read(128).split()[1]) / 1e9
    except (OSError, ValueError, IndexError):  # the thread gone, or no schedstat (off Linux)
        return None


def _snapshot() -> dict[int, float]:
    if sys.platform != "linux":
        return {}
    try:
        tids = [int(name) for name in os.listdir(_TASKS)]
    except (OSError, ValueError):
        return {}
    waits = {tid: _waited(f"{_TASKS}/{tid}/schedstat") for tid in tids}
    return {tid: waited for tid, waited in waits.items() if waited is not None}


def start() -> None:
    """Count from now (a timing test's start)."""
    global _ended
    snapshot = _snapshot()
    with _lock:
        _base.clear()
        _base.update(snapshot)
        _ended = 0.0
        _ended_tids.clear()


def waited_ms() -> float:
    """Milliseconds the process's threads waited for a CPU since `start`, all of them together."""
    now = _snapshot()
    with _lock:
        alive = sum(max(0.0, waited - _base.get(tid, 0.0)) for tid, waited in now.items() if tid not in _ended_tids)
        return (alive + _ended) * 1000.0


@contextlib.contextmanager
def counted() -> Iterator[None]:
    """Keep the calling thread's wait for a CPU in the count after it ends (wrap a thread's whole target)."""
    global _ended
    path = "/proc/thread-self/schedstat"
    before = _waited(path)
    try:
        yield
    finally:
        after = _waited(path)
        if before is not None and after is not None:
            tid = threading.get_native_id()
            with _lock:
                # A thread that began before `start` counts from its base there, as `waited_ms` does.
                _ended += max(0.0, after - max(_base.get(tid, before), before))
                _ended_tids.add(tid)


def assert_close_enough(reported_ms: float, true_ms: float, *context: object) -> None:
    """A stall's reported length is its true one within SPEC's 10 % or 2 ms, plus what the machine kept
    the process's threads waiting for a CPU since `start`; the failure says by how much, and `context`."""
    waited = waited_ms()
    allowed = max(0.1 * true_ms, 2.0) + waited
    error = reported_ms - true_ms
    if abs(error) > allowed:
        raise AssertionError(
            f"reported {reported_ms:.1f} ms for {true_ms:.1f} ms: off by {error:+.1f}, allowed {allowed:.1f} "
            f"(SPEC's 10 % or 2 ms, plus {waited:.1f} ms its threads waited for a CPU) {context or ''}"
        )
