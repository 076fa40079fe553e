"""C calls that hold the GIL, and C calls that let go of it, sized in time (issue 37).

Shared by tests/stalls/test_gil_catalogue.py (each call as one step of a task, on
every loop) and tests/stalls/test_gil_stalls.py (the watchdog's decisions around a
hold). Each call is sized at its first use to HOLD_S of its thread's CPU
clock: at least that long in wall time, whatever the load, ten times the
threshold. The sizes are found once per test process (`functools.cache`).

Holding the GIL for the whole call (measured with a thread that ticks while
it can: its longest gap spans the call): `json.dumps`, a backtracking `re`,
`sum(range(...))`, `sorted`, and pydantic-core's validation, which hands the
GIL over only as the core call returns into pydantic's Python code (and at
the garbage collections its allocations bring on, after it). Letting go of
it: `hashlib.sha256` and `zlib.compress` of a big buffer, `time.sleep`.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import inspect
import json
import os
import random
import re
import sys
import time
import zlib
from typing import TYPE_CHECKING

import pytest
from pydantic import BaseModel, TypeAdapter

from aiocop._reporting import delivery as _delivery
from aiocop._stalls import watchdog as _watchdog_module

if TYPE_CHECKING:
    from collections.abc import Callable

    import aiocop
    from tests.conftest import Collector

LINUX = sys.platform == "linux"
THRESHOLD_MS = 30.0
HOLD_S = 0.3  # of the calling thread's CPU clock: at least as long in wall time


def cpu_of(call: Callable[[], object]) -> float:
    t0 = time.thread_time()
    call()
    return time.thread_time() - t0


def timed(call: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    call()
    return time.perf_counter() - t0


def _grown(n: int, took: float) -> int:
    return int(n * min(8.0, max(1.2, 1.1 * HOLD_S / max(took, 1e-3))))


# --- holding the GIL -----------------------------------------------------------------------------


@functools.cache
def json_data() -> list[dict[str, object]]:
    n = 20_000
    while True:
        data = [{"a": i, "b": "x" * 10} for i in range(n)]
        took = cpu_of(functools.partial(json.dumps, data))
        if took >= HOLD_S:
            return data
        n = _grown(n, took)


@functools.cache
def regex_subject() -> str:
    n = 16  # each more "a" doubles the backtracking of (a+)+$
    while cpu_of(functools.partial(re.match, r"(a+)+$", "a" * n + "b")) < HOLD_S:
        n += 1
    return "a" * n + "b"


@functools.cache
def sum_count() -> int:
    n = 1_000_000
    while (took := cpu_of(functools.partial(sum, range(n)))) < HOLD_S:
        n = _grown(n, took)
    return n


def _runs(n: int) -> list[int]:
    # Millions of ints in descending runs of 64 consecutive values, the runs
    # in a shuffled order: timsort merges them (a shuffled list of millions
    # takes seconds, its compares missing the cache; a sorted one, none).
    starts = list(range(0, n, 64))
    random.Random(37).shuffle(starts)
    return [x for s in starts for x in range(min(s + 64, n) - 1, s - 1, -1)]


@functools.cache
def sort_data() -> list[int]:
    # Sized with the sorted list's release, which the step does too (the
    # statement drops it): tens of milliseconds of a 300 ms step for 3
    # million ints, holding the GIL as well.
    n = 1_000_000
    while True:
        data = _runs(n)
        took = cpu_of(functools.partial(_sort_and_drop, data))
        if took >= HOLD_S:
            return data
        n = _grown(n, took)


def _sort_and_drop(data: list[int]) -> None:
    sorted(data)


class Item(BaseModel):
    a: int
    b: str


@functools.cache
def items() -> TypeAdapter[list[Item]]:
    return TypeAdapter(list[Item])


@functools.cache
def item_data() -> list[dict[str, object]]:
    adapter = items()
    n = 20_000
    while True:
        data: list[dict[str, object]] = [{"a": i, "b": "x" * 10} for i in range(n)]
        took = cpu_of(functools.partial(adapter.validate_python, data))
        if took >= HOLD_S:
            return data
        n = _grown(n, took)


def hold_json() -> None:
    json.dumps(json_data())  # GIL HELD


def hold_regex() -> None:
    re.match(r"(a+)+$", regex_subject())  # GIL HELD


def hold_sum() -> None:
    sum(range(sum_count()))  # GIL HELD


def hold_sorted() -> None:
    sorted(sort_data())  # GIL HELD


def hold_pydantic() -> None:
    items().validate_python(item_data())  # GIL HELD


HOLDS: dict[str, Callable[[], None]] = {
    "json": hold_json,
    "regex": hold_regex,
    "sum": hold_sum,
    "sorted": hold_sorted,
    "pydantic": hold_pydantic,
}


# --- letting go of the GIL -----------------------------------------------------------------------


@functools.cache
def hash_buffer() -> bytes:
    # Zeros from calloc: pages the kernel maps to its one zero page as they
    # are read, so hundreds of megabytes cost no memory.
    n = 32 << 20
    while True:
        data = bytes(n)
        took = cpu_of(functools.partial(hashlib.sha256, data))
        if took >= HOLD_S:
            return data
        n = _grown(n, took)


@functools.cache
def zlib_buffer() -> bytes:
    n = 1 << 20
    while True:
        data = random.Random(37).randbytes(n)  # (incompressible: no os.urandom, no audit event)
        took = cpu_of(functools.partial(zlib.compress, data))
        if took >= HOLD_S:
            return data
        n = _grown(n, took)


def release_hashlib() -> None:
    hashlib.sha256(hash_buffer())  # GIL RELEASED


def release_zlib() -> None:
    zlib.compress(zlib_buffer())  # GIL RELEASED


def release_sleep() -> None:
    time.sleep(HOLD_S)  # GIL RELEASED


RELEASES: dict[str, Callable[[], None]] = {
    "hashlib": release_hashlib,
    "zlib": release_zlib,
    "sleep": release_sleep,
}


def line_of(func: Callable[[], None]) -> int:
    """The line of `func` that makes its C call."""
    lines, first = inspect.getsourcelines(func)
    return first + next(i for i, line in enumerate(lines) if "# GIL HELD" in line or "# GIL RELEASED" in line)


def site_of(func: Callable[[], None]) -> str:
    """The call site a stall of `func` is reported at: this file, the calling line."""
    return f"tests/support/gil_holds.py:{line_of(func)}:{func.__name__}"


# --- what the assertions allow for ---------------------------------------------------------------


class Queued:
    """How long a thread waited for a CPU (Linux's /proc/self/task/<tid>/schedstat; 0 elsewhere), since `mark`.

    Opened off the loop (`asyncio.to_thread`): an open in the task's own
    steps is a blocking call, whose io event took the next step's stall on
    loops written in C (one task's steps share a frame there). Read with
    os.pread (no audit event).
    """

    def __init__(self, native_id: int | None) -> None:
        self.fd = -1
        if LINUX and native_id:
            try:
                self.fd = os.open(f"/proc/self/task/{native_id}/schedstat", os.O_RDONLY)
            except OSError:
                self.fd = -1
        self.base = 0.0

    def mark(self) -> None:
        self.base = self._read()

    def _read(self) -> float:
        try:
            return int(os.pread(self.fd, 128, 0).split()[1]) / 1e9 if self.fd >= 0 else 0.0
        except (OSError, ValueError, IndexError):
            return 0.0

    def waited_ms(self) -> float:
        waited = (self._read() - self.base) * 1000.0
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        return waited


async def queued(native_id: int | None) -> Queued:
    return await asyncio.to_thread(Queued, native_id)


def watchdog_native_id() -> int | None:
    thread = _watchdog_module.watchdog._thread
    return thread.native_id if thread is not None else None


def stalls(detector: Collector) -> list[aiocop.SlowTaskEvent]:
    return [e for e in detector.settle(1) if e.reason != "io_blocking"]


def no_more_stalls(detector: Collector) -> list[aiocop.SlowTaskEvent]:
    """The stalls, once the watchdog has looked again (finishing a stopped loop's step) and its reports
    are delivered: a test that expects none does not wait `settle`'s ten seconds for one."""
    _watchdog_module.watchdog.sync()
    _delivery.drain()
    return [e for e in detector.settle(0, grace=0.1) if e.reason != "io_blocking"]


def not_veloxloop(loop_name: str) -> None:
    if loop_name == "veloxloop":
        # Left open (issue 37): veloxloop's own runtime threads use CPU while
        # the loop's thread holds the GIL (170 ms against a 595 ms hold), which
        # the watchdog takes for another thread sharing the GIL: no hold found.
        pytest.skip("veloxloop's runtime threads look like a thread sharing the GIL (issue 37, open)")


def within(reported_ms: float, true_ms: float, starved_ms: float) -> bool:
    """The reported length is the call's within 10 % or 5 ms, plus what the loop's and the watchdog's
    threads waited for a CPU meanwhile (a starved look comes late, and a starved loop's step outlasts its
    call)."""
    return abs(reported_ms - true_ms) <= max(5.0, 0.1 * true_ms) + starved_ms
