"""What Linux tells of a thread's scheduling (`aiocop/_stalls/sched.py`): the watchdog's own schedstat,
a loop thread's wait for a CPU and whether it is runnable, read from /proc, and what each says when it
cannot be read. The watchdog's decisions on these readings are tested with them faked
(tests/stalls/test_watchdog_logic.py); here, the readings themselves."""

from __future__ import annotations

import hashlib
import os
import sys
import threading
import time

import pytest

from aiocop._stalls import sched
from tests.support import cpu_waits

linux = pytest.mark.skipif(sys.platform != "linux", reason="/proc is Linux's")


def _burn(cpu_s: float) -> None:
    # CPU time of this thread, not wall time: the same on a busy machine, only slower.
    start = time.thread_time()
    while time.thread_time() - start < cpu_s:
        pass


@linux
def test_own_counts_the_cpu_this_thread_used_since_the_mark() -> None:
    own = sched.Own()
    try:
        own.mark()
        _burn(0.05)
        told = own.since()
        assert told is not None
        ran_or_queued, slices = told
        # schedstat's run time is the thread's CPU clock: at least what was burnt, give or take its tick.
        assert ran_or_queued >= 0.045 and slices >= 0
    finally:
        own.close()


def test_own_tells_nothing_where_the_file_cannot_be_opened(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object) -> int:
        raise PermissionError("no /proc here")

    monkeypatch.setattr("aiocop._stalls.sched.os.open", refuse)
    own = sched.Own()
    own.mark()
    assert own.since() is None
    own.close()  # (closes nothing, twice over)
    own.close()


@linux
def test_queued_reads_a_threads_wait_for_a_cpu_and_its_slices() -> None:
    told = sched.queued(threading.get_native_id())
    assert told is not None
    waited, slices = told
    assert waited >= 0.0 and slices >= 1  # (this thread has been given a CPU: it is reading)


@linux
def test_runnable_tells_a_running_thread_from_a_waiting_one() -> None:
    assert sched.runnable(threading.get_native_id()) is True  # (running: it is reading)
    release = threading.Event()
    started = threading.Event()
    native: list[int] = []

    def wait() -> None:
        native.append(threading.get_native_id())
        started.set()
        release.wait()

    thread = threading.Thread(target=wait)
    thread.start()
    try:
        started.wait(10)
        # It blocks in Event.wait as soon as it runs on; asked until it does (seconds on a busy machine).
        deadline = time.monotonic() + 30
        while sched.runnable(native[0]) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sched.runnable(native[0]) is False
    finally:
        release.set()
        thread.join()


def test_a_thread_that_is_not_there_tells_nothing() -> None:
    # No thread has id 0: its files do not exist (and off Linux nothing is read).
    assert sched.queued(0) is None
    assert sched.runnable(0) is None


@pytest.mark.parametrize(
    ("stat", "expected"),
    [
        (b"4242 (worker) R 1 4242", True),
        (b"4242 (worker) S 1 4242", False),
        # The command's name may hold brackets and a state letter: the state is read after the last ')'.
        (b"4242 (a) R (b) S 1 4242", False),
        (b"4242 (x) D 1", False),
        (b"no bracket at all", None),
        (b"4242 (worker)", None),
    ],
)
def test_runnable_reads_the_state_after_the_commands_name(
    monkeypatch: pytest.MonkeyPatch, stat: bytes, expected: bool | None
) -> None:
    monkeypatch.setattr(sched, "_task_file", lambda native_id, name, size: stat)
    assert sched.runnable(1) is expected


@pytest.mark.parametrize("schedstat", [b"1 2", b"x y z", b""])
def test_queued_tells_nothing_of_a_line_it_cannot_read(monkeypatch: pytest.MonkeyPatch, schedstat: bytes) -> None:
    monkeypatch.setattr(sched, "_task_file", lambda native_id, name, size: schedstat)
    assert sched.queued(1) is None


def _hash_for(cpu_s: float) -> None:
    # C code that lets go of the GIL: two such threads on one CPU wait for it, not for the GIL.
    block = b"x" * (1 << 20)
    start = time.thread_time()
    while time.thread_time() - start < cpu_s:
        hashlib.sha256(block).digest()


@linux
def test_the_timing_tests_tolerance_grows_by_what_their_threads_waited_for_a_cpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """tests/support/cpu_waits.py: SPEC's bound where nothing waited, widened by the measured wait of the
    threads it counts (those that ended too, through `counted`), up to a quarter of the stall; a count not
    started in the test refuses to be read."""
    cpu_waits.start()
    cpu_waits.assert_close_enough(105.0, 100.0)
    with pytest.raises(AssertionError, match=r"off by \+200\.0"):
        cpu_waits.assert_close_enough(300.0, 100.0)

    cpu = min(os.sched_getaffinity(0))
    try:
        os.sched_setaffinity(threading.get_native_id(), os.sched_getaffinity(0))
    except OSError as error:
        pytest.skip(f"threads cannot be pinned here: {error}")
    ready = threading.Barrier(2, timeout=20)

    def burn() -> None:
        with cpu_waits.counted():
            os.sched_setaffinity(threading.get_native_id(), {cpu})
            ready.wait()
            _hash_for(0.06)

    cpu_waits.start()
    threads = [threading.Thread(target=burn, daemon=True) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not any(thread.is_alive() for thread in threads)
    # Two threads runnable at once on one CPU: the one that finished last waited for the other's run.
    waited = cpu_waits.waited_ms()
    assert waited >= 40.0, waited
    cpu_waits.assert_close_enough(100.0 + 10.0 + min(waited, 25.0), 100.0)  # (the wait allowed, to the cap)
    with pytest.raises(AssertionError, match=r"up to 25% of the stall"):
        cpu_waits.assert_close_enough(100.0 + 10.0 + 25.0 + 1.0, 100.0)

    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/other.py::test_after (call)")
    with pytest.raises(RuntimeError, match=r"start\(\) was not called in this test \(tests/other.py::test_after\)"):
        cpu_waits.waited_ms()
