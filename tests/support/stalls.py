"""Stalls used by the watchdog tests; each marks its line with `# STALLS`."""

from __future__ import annotations

import contextlib
import hashlib
import queue
import select
import threading
import time
from time import sleep as bound_sleep  # bound before aiocop patches time.sleep


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:  # STALLS
        pass


def sleep_bound_before_patching(seconds: float) -> None:
    bound_sleep(seconds)  # STALLS


def sleep_seen(seconds: float) -> None:
    time.sleep(seconds)  # STALLS


def wait_unseen(seconds: float) -> None:
    # A wait no audit event or wrapper sees, on any Python version (from 3.13
    # time.sleep raises an audit event of its own, even bound before patching).
    with contextlib.suppress(queue.Empty):
        queue.SimpleQueue().get(timeout=seconds)  # STALLS


def select_timeout(seconds: float) -> None:
    select.select([], [], [], seconds)  # STALLS


_held = threading.Lock()
_held.acquire()  # held for the whole session: acquiring it always waits


def wait_on_held_lock(seconds: float) -> None:
    _held.acquire(timeout=seconds)  # STALLS


_BUFFER = bytes(range(256)) * (1 << 16)  # 16 MiB


def hash_big_buffer(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        hashlib.sha256(_BUFFER).digest()  # STALLS


def sleep_then_work(seconds: float) -> None:
    time.sleep(seconds)  # STALLS
    spin(0.02)


class StepTimes:
    """The wall-clock length of each step of a task, as the task itself measures it (resumed to suspended).

    A busy machine can keep a loop's thread off a CPU in the middle of a
    short step: the step then really holds the loop past the threshold, and
    a stall reported for it is right. A test that expects no stall from
    short steps checks the events against these lengths (`unexplained`)
    instead of against none, so that it fails on steps merged or stretched
    by the watchdog, not on what the machine did.
    """

    def __init__(self) -> None:
        self.lengths: list[float] = []
        self._began = time.perf_counter()

    def resumed(self) -> None:
        self._began = time.perf_counter()

    def suspended(self) -> None:
        self.lengths.append(time.perf_counter() - self._began)

    def unexplained(self, elapsed_ms: list[float], threshold_ms: float, slack_ms: float = 5.0) -> list[float]:
        """The reported stall lengths no step of the task explains.

        A stall is explained by a step of its own that reached the threshold
        and was no shorter than it less `slack_ms` (the watchdog times a
        step's ends from its looks); each such step explains one stall.
        """
        long = sorted((length * 1000.0 for length in self.lengths if length * 1000.0 >= threshold_ms), reverse=True)
        left: list[float] = []
        for reported in sorted(elapsed_ms, reverse=True):
            if long and reported <= long[0] + slack_ms:
                long.pop(0)
            else:
                left.append(reported)
        return left
