"""`delivery="thread"`: a bounded queue, drops counted and reported, and a `stop()` that means stopped.

The figures (memory under a flood, how long `stop()` takes) are measured by
`benchmarks/thread_delivery_flood.py`, not asserted here.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import re
import subprocess
import sys
import threading
import time
import weakref
from typing import TYPE_CHECKING

import pytest

import aiocop
from aiocop._reporting import delivery as _delivery
from aiocop._reporting import worker as _delivery_worker
from tests.conftest import ROOT, reset_aiocop

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


@pytest.fixture
def thread_delivery() -> Iterator[None]:
    aiocop.start_blocking_io_detection(delivery="thread")
    aiocop.clear_slow_task_callbacks()
    try:
        yield
    finally:
        reset_aiocop()


def _run_steps(rounds: int, tasks: int) -> None:
    # `tasks` steps with a blocking call in each loop iteration: one batch of
    # that many steps handed to the delivery thread per iteration.
    async def one() -> None:
        os.stat(".")

    async def main() -> None:
        for _ in range(rounds):
            await asyncio.gather(*(one() for _ in range(tasks)))

    asyncio.run(main())


@pytest.mark.usefixtures("thread_delivery")
def test_the_queue_holds_at_most_its_capacity_in_steps_and_counts_the_rest(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Batches of 50 steps against a capacity of 20: the bound is in steps,
    # not in batches, and every step is either delivered or counted.
    monkeypatch.setattr(_delivery_worker, "MAX_PENDING", 20)
    release = threading.Event()
    delivered: list[int] = []
    high_water: list[int] = []

    def exporter(event: aiocop.SlowTaskEvent) -> None:
        high_water.append(_delivery._worker.pending())
        release.wait(10)
        delivered.append(1)

    aiocop.register_slow_task_callback(exporter)
    dropped_before = _delivery._worker.dropped
    with caplog.at_level(logging.WARNING, logger="aiocop"):
        _run_steps(rounds=4, tasks=50)
        assert _delivery._worker.pending() <= 20
        release.set()
        aiocop.stop()
    dropped = _delivery._worker.dropped - dropped_before
    assert len(delivered) + dropped == 4 * 50
    assert len(delivered) <= 20, "the callback held the first step: only the capacity's worth could wait"
    assert max(high_water) <= 20
    assert any("dropped" in r.getMessage() and "at most 20" in r.getMessage() for r in caplog.records)


@pytest.mark.usefixtures("thread_delivery")
def test_no_callback_starts_after_stop_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    # More queued than stop() has time to deliver: it delivers for DRAIN_S,
    # waits for the callback running then, and drops the rest.
    monkeypatch.setattr(_delivery_worker, "DRAIN_S", 0.2)
    starts: list[float] = []

    def exporter(event: aiocop.SlowTaskEvent) -> None:
        starts.append(time.perf_counter())
        time.sleep(0.05)

    aiocop.register_slow_task_callback(exporter)
    dropped_before = _delivery._worker.dropped
    _run_steps(rounds=100, tasks=1)
    aiocop.stop()
    returned = time.perf_counter()
    time.sleep(0.3)
    assert starts, "some events were delivered"
    assert all(start < returned for start in starts), "a callback started after stop() returned"
    assert len(starts) + _delivery._worker.dropped - dropped_before == 100


@pytest.mark.usefixtures("thread_delivery")
def test_the_worker_keeps_nothing_it_delivered_while_it_waits_for_more() -> None:
    # A delivered step or stall report holds its task, and so its loop: the
    # worker kept the last one it handled until the next arrived, which kept
    # a closed veloxloop loop, and its runtime threads, alive (issue 37).
    class Payload:
        pass

    payload = Payload()
    gone = threading.Event()
    weakref.finalize(payload, gone.set)
    ran = threading.Event()

    def call(kept: Payload = payload) -> None:
        ran.set()

    _delivery._worker.submit_call(call)
    del call, payload
    assert ran.wait(30), "the worker ran the call"
    assert _delivery._worker.wait(30), "the worker finished handling it"
    gc.collect()
    assert gone.wait(10), "the call, and what it holds, was let go of once delivered"


@pytest.mark.usefixtures("thread_delivery")
def test_a_callback_that_never_returns_does_not_hold_stop(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The callback running when stop()'s time is up is waited for, within a
    # bound: then stop() returns, says so, and still no other callback starts.
    monkeypatch.setattr(_delivery_worker, "DRAIN_S", 0.1)
    monkeypatch.setattr(_delivery_worker, "_CALLBACK_WAIT_S", 0.2)
    release = threading.Event()
    calls: list[int] = []

    def stuck(event: aiocop.SlowTaskEvent) -> None:
        calls.append(1)
        release.wait(30)

    aiocop.register_slow_task_callback(stuck)
    with caplog.at_level(logging.WARNING, logger="aiocop"):
        _run_steps(rounds=5, tasks=1)
        aiocop.stop()
    assert any("running for" in r.getMessage() for r in caplog.records)
    release.set()
    _wait_until(lambda: _delivery._worker.pending() == 0)
    assert calls == [1], "only the callback that was running when stop() was called ran"


@pytest.mark.usefixtures("thread_delivery")
def test_stop_gives_up_inside_one_big_batch_and_says_why(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # One loop iteration of 50 steps is one batch for the delivery thread (the
    # flood of `asyncio.gather`): stop() stops it between two of its steps, not
    # at its end, counts the 49 never started as dropped in one warning that
    # says why, and none of them starts after it returns. Deterministic: the
    # first callback blocks until released, after stop() has returned.
    monkeypatch.setattr(_delivery_worker, "DRAIN_S", 0.05)
    monkeypatch.setattr(_delivery_worker, "_CALLBACK_WAIT_S", 0.05)
    release = threading.Event()
    calls: list[int] = []

    def exporter(event: aiocop.SlowTaskEvent) -> None:
        calls.append(1)
        release.wait(30)

    aiocop.register_slow_task_callback(exporter)
    dropped_before = _delivery._worker.dropped
    monkeypatch.setattr(_delivery_worker, "STOP_WAIT_S", 0.0)  # the loop's stop does not wait for the batch
    with caplog.at_level(logging.WARNING, logger="aiocop"):
        _run_steps(rounds=1, tasks=50)
        _wait_until(lambda: bool(calls))  # the first step's callback runs, and holds the batch
        aiocop.stop()
    release.set()
    _wait_until(lambda: _delivery._worker.pending() == 0)
    assert calls == [1], "a step of the batch started after stop() returned"
    assert _delivery._worker.dropped - dropped_before == 49
    messages = [r.getMessage() for r in caplog.records]
    assert sum("stop() dropped 49 event(s) not delivered" in m for m in messages) == 1, messages
    assert sum("running for" in m for m in messages) == 1, messages


def test_stop_is_bounded_by_two_seconds_whatever_the_callbacks() -> None:
    # The bound stop() keeps with delivery="thread": the queue's time plus the
    # running callback's; the test above shows it gives up at each.
    assert _delivery_worker.DRAIN_S + _delivery_worker._CALLBACK_WAIT_S <= 1.5


def _wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the delivery thread never caught up"
        time.sleep(0.01)


@pytest.mark.timeout(330)  # the benchmark is given 300 s; the test's own timeout sits above it
def test_the_flood_benchmark_runs_and_accounts_for_every_step() -> None:
    # benchmarks/thread_delivery_flood.py gives the figures in the docs; here
    # it runs small, and its own accounting must hold (no timing checked).
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "thread_delivery_flood.py"), "--steps", "3000"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    accounted = re.search(r"delivered (\d+), dropped (\d+), delivered \+ dropped = (\d+)", done.stdout)
    assert accounted is not None, done.stdout
    delivered, dropped, total = map(int, accounted.groups())
    assert delivered > 0 and dropped > 0 and total >= 3000
    assert "callbacks started after stop() returned: 0" in done.stdout
