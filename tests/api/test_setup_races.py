"""Setting up and tearing down from any threads, across fork(), and after stop(): nothing breaks or doubles."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import threading
from typing import TYPE_CHECKING

import pytest

import aiocop
from aiocop._common import forksafe as _forksafe
from aiocop._interception import loops as _loops
from tests.conftest import reset_aiocop, run_python

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


def _watchdog_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "aiocop-watchdog" and t.is_alive()]


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    yield
    reset_aiocop()


def test_concurrent_setup_and_stop_leave_one_watchdog() -> None:
    # Rounds of several threads starting the watchdog at once, and one stopping
    # it meanwhile: never two watchdog threads, never an error.
    errors: list[BaseException] = []

    def call(barrier: threading.Barrier, function: Callable[[], None]) -> None:
        barrier.wait()
        try:
            function()
        except BaseException as error:
            errors.append(error)

    # The watchdog's thread runs while a loop does (issue 24): a loop starts
    # in the same rounds, and one runs at the end of each.
    async def one_watchdog() -> None:
        await asyncio.sleep(0)
        seen.append(len(_watchdog_threads()))

    seen: list[int] = []
    for _ in range(30):
        barrier = threading.Barrier(5)
        actions = [lambda: aiocop.detect_slow_tasks(threshold_ms=30)] * 3 + [
            lambda: asyncio.run(asyncio.sleep(0.001)),
            aiocop.stop,
        ]
        threads = [threading.Thread(target=call, args=(barrier, action)) for action in actions]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert len(_watchdog_threads()) <= 1, [t.ident for t in _watchdog_threads()]
        aiocop.detect_slow_tasks(threshold_ms=30)
        asyncio.run(one_watchdog())
    assert seen == [1] * 30
    assert errors == []
    aiocop.stop()
    assert _watchdog_threads() == []


def test_a_start_signal_bound_during_detection_still_works_after_stop() -> None:
    # rloop binds asyncio.events._set_running_loop at import: imported while
    # the watchdog runs, it holds aiocop's wrapper, which must keep passing
    # through once aiocop is stopped.
    aiocop.detect_slow_tasks(threshold_ms=30)
    bound = asyncio.events._set_running_loop
    assert bound is _loops._set_running_loop
    aiocop.stop()
    loop = asyncio.new_event_loop()
    try:
        bound(loop)
        assert asyncio.events._get_running_loop() is loop
    finally:
        bound(None)
        loop.close()
    assert asyncio.events._get_running_loop() is None
    assert asyncio.run(asyncio.sleep(0, "ok")) == "ok"


@pytest.mark.skipif(importlib.util.find_spec("rloop") is None, reason="rloop is not installed")
# its subprocess is given 60 s: the test's own timeout sits above it, so that bound fires first (issue 36)
@pytest.mark.timeout(90)
def test_rloop_imported_during_detection_runs_after_stop() -> None:
    result = run_python(
        """
        import asyncio, os
        import aiocop
        aiocop.detect_slow_tasks(threshold_ms=30)
        import rloop  # binds aiocop's wrapper of _set_running_loop
        aiocop.stop()
        for _ in range(2):
            loop = rloop.new_event_loop()
            print(loop.run_until_complete(asyncio.sleep(0, "ran")))
            loop.close()
        """,
        interpreter_args=("-W", "ignore::DeprecationWarning", "-W", "ignore::ResourceWarning"),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["ran", "ran"]


FORK_WHILE_HELD = """
import asyncio, os, signal, sys, threading, time, warnings
warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads running
import aiocop
from aiocop._common import forksafe as _forksafe

events = []
aiocop.start_blocking_io_detection()
aiocop.detect_slow_tasks(threshold_ms=30, on_slow_task=events.append)
loop_factory = asyncio.new_event_loop
if sys.argv[1] == "uvloop":
    import uvloop
    loop_factory = uvloop.new_event_loop

async def main():
    os.stat(".")  # a blocking call: its delivery takes aiocop's locks
    await asyncio.sleep(0.02)
    end = time.perf_counter() + 0.1  # a stall: the watchdog's hand-over takes them too
    while time.perf_counter() < end:
        pass
    await asyncio.sleep(0.02)

held = threading.Event()
release = threading.Event()

def hold_every_lock():
    locks = _forksafe.held()
    for lock in locks:
        lock.acquire()
    held.set()
    release.wait()
    for lock in reversed(locks):
        lock.release()

holder = threading.Thread(target=hold_every_lock)
holder.start()
held.wait()
pid = os.fork()
if pid == 0:
    signal.alarm(20)  # a hang fails the test instead of blocking it
    loop = loop_factory()
    loop.run_until_complete(main())
    loop.close()
    deadline = time.monotonic() + 10
    while len(events) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    os._exit(0 if sorted(e.reason for e in events) == ["cpu_blocking", "io_blocking"] else 3)
release.set()
holder.join()
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status), "locks", len(_forksafe.held()))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
@pytest.mark.parametrize("loop_name", ["asyncio", "uvloop"])
# its subprocess is given 60 s: the test's own timeout sits above it, so that bound fires first (issue 36)
@pytest.mark.timeout(90)
def test_fork_while_another_thread_holds_every_aiocop_lock(loop_name: str) -> None:
    if loop_name == "uvloop":
        pytest.importorskip("uvloop")
    result = run_python(FORK_WHILE_HELD, loop_name, timeout=60)
    assert result.returncode == 0, result.stderr
    child, status, locks, count = result.stdout.split()
    assert (child, status, locks) == ("child", "0", "locks"), result.stdout + result.stderr
    assert int(count) >= 5, "every lock of aiocop's modules is made by _forksafe"


def test_forksafe_locks_are_reset_in_the_child() -> None:
    lock = _forksafe.lock()
    lock.acquire()
    _forksafe._reinit_in_child()
    assert not lock.locked()
    assert lock in _forksafe.held()
