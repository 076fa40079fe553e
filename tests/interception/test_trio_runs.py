"""Blocking calls in trio tasks: reported at their line, with the trio task's name, as on asyncio (issue 41).

trio is an optional dependency: without it these tests are skipped, saying so.
"""

from __future__ import annotations

import gc
import os
import socket
import sys
import threading
import time
import weakref
from typing import Any

import pytest

import aiocop
from aiocop._interception import hook as _hook
from tests.conftest import Collector, run_python
from tests.support.blocking_calls import CASES, Case

trio = pytest.importorskip("trio", reason="trio is not installed (it comes with the dev extra)")

# The same calls, under the same rules, as on asyncio (tests/interception/test_hook.py).
TRIO_CASES = [pytest.param(case, id=case.name) for case in CASES]


def _reported(detector: Collector, case: Case) -> aiocop.BlockingEventInfo:
    matching = [c for c in detector.calls if c["name"] == case.event]
    assert len(matching) == 1, f"{case.event} reported {len(matching)} times: {detector.names()}"
    same_line = [c["name"] for c in detector.calls if c["entry_point"] == matching[0]["entry_point"]]
    assert same_line == [case.event], "one call, one report (not also its internals)"
    assert matching[0]["entry_point"].endswith(case.site), matching[0]
    return matching[0]


@pytest.mark.parametrize("case", TRIO_CASES)
def test_a_blocking_call_in_a_trio_task_is_reported_at_its_line(detector: Collector, case: Case) -> None:
    async def main() -> None:
        case.func()

    trio.run(main)
    call = _reported(detector, case)
    event = next(e for e in detector.events if call in e.blocking_events)
    assert event.reason == "io_blocking"
    assert event.loop.startswith("trio._core._run.Runner@"), event.loop
    assert event.thread_id == threading.get_ident()
    assert event.task_name is not None and event.task_name.endswith("main"), event.task_name


def test_each_task_is_its_own_step_named_after_the_trio_task(detector: Collector) -> None:
    async def child(path: str) -> None:
        os.stat(path)  # in the child's step
        await trio.sleep(0)
        os.stat(path)  # the child's next step: an event of its own

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(child, ".", name="first")
            nursery.start_soon(child, "..", name="second")

    trio.run(main)
    steps = sorted((e.task_name, [c["event"] for c in e.blocking_events]) for e in detector.events)
    assert steps == [
        ("first", ["os.stat(.)"]),
        ("first", ["os.stat(.)"]),
        ("second", ["os.stat(..)"]),
        ("second", ["os.stat(..)"]),
    ]
    # The trace ends at the task's own coroutine: trio's run loop is the step's edge, not part of it.
    trace = detector.events[0].blocking_events[0]["trace"]
    assert trace.split(" <- ")[-1].endswith(":child"), trace


def test_work_run_in_trios_worker_threads_and_outside_any_run_is_not_reported(detector: Collector) -> None:
    async def main() -> None:
        await trio.to_thread.run_sync(time.sleep, 0.001)
        await trio.to_thread.run_sync(os.stat, ".")
        os.stat("..")  # the one call on the run loop

    os.stat(".")  # before the run
    trio.run(main)
    os.stat(".")  # after it
    assert [c["event"] for c in detector.calls] == ["os.stat(..)"]


def test_raise_on_violations_fails_the_trio_task_at_the_call(detector: Collector) -> None:
    outcome: dict[str, Any] = {}
    listener = socket.create_server(("127.0.0.1", 0))

    async def offender() -> None:
        with socket.socket() as sock:  # a blocking socket: its connect() is a heavy call
            try:
                sock.connect(listener.getsockname())
            except aiocop.HighSeverityBlockingIoException as exc:
                outcome["raised"] = exc  # raised at the call, in this task
        outcome["offender_went_on"] = True

    async def bystander() -> None:
        await trio.sleep(0)
        outcome["bystander_finished"] = True

    async def main() -> None:
        with aiocop.raise_on_violations():
            async with trio.open_nursery() as nursery:
                nursery.start_soon(offender)
                nursery.start_soon(bystander)

    with listener:
        trio.run(main)
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()  # no connection came: the call was stopped before it ran
    assert isinstance(outcome["raised"], aiocop.HighSeverityBlockingIoException)
    assert "socket.connect" in str(outcome["raised"])
    assert outcome == {**outcome, "offender_went_on": True, "bystander_finished": True}
    (call,) = detector.calls
    assert call["name"] == "socket.connect" and call["raised"]


def test_an_uncaught_violation_ends_the_run_with_the_tasks_error(detector: Collector) -> None:
    async def main() -> None:
        with aiocop.raise_on_violations():
            time.sleep(0.2)

    with pytest.raises(aiocop.HighSeverityBlockingIoException):
        trio.run(main)  # raised by the main task itself: no nursery, no group
    assert [c["name"] for c in detector.calls] == ["time.sleep"]


def test_detection_started_inside_a_running_trio_run(detector: Collector) -> None:
    aiocop.stop()

    async def main() -> None:
        aiocop.start_blocking_io_detection()
        os.stat(".")

    trio.run(main)
    assert [c["event"] for c in detector.calls] == ["os.stat(.)"]


def test_a_run_leaves_nothing_of_itself_behind(detector: Collector) -> None:
    runs: list[weakref.ref[Any]] = []

    async def main() -> None:
        from trio.lowlevel import current_root_task

        runs.append(weakref.ref(current_root_task()))
        os.stat(".")

    trio.run(main)
    gc.collect()
    state = _hook.current_state()
    assert state.base_frame is None, "a frame of trio's (and its run) kept as a loop's edge"
    assert state.trio_run is None
    assert runs[0]() is None, "the run's root task outlived it"
    assert len(detector.events) == 1


def test_delivered_off_the_run_with_delivery_thread(detector: Collector) -> None:
    aiocop.start_blocking_io_detection(delivery="thread")
    threads: list[int] = []
    aiocop.register_slow_task_callback(lambda event: threads.append(threading.get_ident()))

    async def main() -> None:
        os.stat(".")

    trio.run(main)
    events = detector.settle(1)
    assert [c["event"] for e in events for c in e.blocking_events] == ["os.stat(.)"]
    assert threads and threads[0] != threading.get_ident()


def test_a_guest_run_is_checked_as_anyio_runs_tests() -> None:
    # anyio's pytest plugin runs trio as a guest of a plain loop on the test's thread
    # (trio.lowlevel.start_guest_run): a step's calls are delivered before its outcome reaches the host.
    out = run_python("""
        import os, queue, time, trio, trio.lowlevel
        import aiocop

        seen = []
        aiocop.start_blocking_io_detection()
        aiocop.register_slow_task_callback(lambda e: seen.append([c["event"] for c in e.blocking_events]))

        async def main():
            time.sleep(0.001)
            return seen[:]  # the step is not over yet: nothing delivered

        calls, done = queue.Queue(), []
        trio.lowlevel.start_guest_run(main, run_sync_soon_threadsafe=calls.put, done_callback=done.append)
        while not done:
            calls.get()()
        print(done[0].unwrap(), seen)
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[] [['time.sleep(0.001)']]"


def test_trio_imported_after_detection_started() -> None:
    # The usual order: detection first, at start-up; trio's run is learnt as it starts.
    out = run_python("""
        import sys
        import aiocop

        seen = []
        aiocop.start_blocking_io_detection()
        aiocop.register_slow_task_callback(lambda e: seen.extend(c["event"] for c in e.blocking_events))
        assert "trio" not in sys.modules
        import os, trio

        async def main():
            os.stat(".")

        trio.run(main)
        print(seen)
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['os.stat(.)']"


def test_both_backends_in_one_process(detector: Collector) -> None:
    # anyio runs a suite on asyncio and trio in one process: each run reports its own calls.
    import asyncio

    async def on_trio() -> None:
        os.stat(".")

    async def on_asyncio() -> None:
        os.stat("..")

    trio.run(on_trio)
    asyncio.run(on_asyncio())
    trio.run(on_trio)
    loops = [(e.loop.partition(".")[0], e.blocking_events[0]["event"]) for e in detector.events]
    assert loops == [("trio", "os.stat(.)"), ("asyncio", "os.stat(..)"), ("trio", "os.stat(.)")]


def test_a_scope_set_before_start_soon_follows_into_the_child_task(detector: Collector) -> None:
    # trio copies the spawning task's context into the child, as asyncio does: scoped switches follow.
    async def child(path: str) -> None:
        os.stat(path)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            with aiocop.allow_blocking("os.stat"):
                nursery.start_soon(child, ".")
            nursery.start_soon(child, "..")

    trio.run(main)
    assert [c["event"] for c in detector.calls] == ["os.stat(..)"]


def test_trios_own_numeric_lookups_and_process_start_are_not_reported(detector: Collector) -> None:
    # trio tries getaddrinfo with AI_NUMERICHOST in the task (no DNS), and wraps a process's pidfd in a
    # FileIO: known-harmless (harmless.HARMLESS). Its sockets are non-blocking, its Popen in a thread.
    async def echo(stream: Any) -> None:
        async for data in stream:
            await stream.send_all(data)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(trio.serve_tcp, echo, 0)
            port = listeners[0].socket.getsockname()[1]
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(b"ping")
            assert await stream.receive_some(4) == b"ping"
            await stream.aclose()
            done = await trio.run_process([sys.executable, "-c", "pass"])
            assert done.returncode == 0
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert detector.calls == []


def test_a_custom_resolvers_own_lookup_is_still_reported(detector: Collector) -> None:
    # The near miss of the rule above: an application's resolver, called by trio's getaddrinfo.
    from trio.abc import HostnameResolver  # trio is there: the module is skipped without it

    class BlockingResolver(HostnameResolver):
        async def getaddrinfo(self, *args: Any) -> Any:
            return socket.getaddrinfo("127.0.0.1", 80)  # the resolver's blocking line

        async def getnameinfo(self, *args: Any) -> Any:
            raise NotImplementedError

    async def main() -> None:
        trio.socket.set_custom_hostname_resolver(BlockingResolver())
        await trio.socket.getaddrinfo("example.invalid", 80)

    trio.run(main)
    (call,) = detector.calls
    assert call["name"] == "socket.getaddrinfo"
    assert call["entry_point"].endswith(":getaddrinfo") and "test_trio_runs.py" in call["entry_point"], call


def test_runs_in_two_threads_at_once_each_report_their_own(detector: Collector) -> None:
    both_running = threading.Barrier(2, timeout=30)

    async def main(path: str) -> None:
        await trio.to_thread.run_sync(both_running.wait)  # off the run loops: both runs are under way
        os.stat(path)

    threads = [threading.Thread(target=trio.run, args=(main, path), name=f"trio-{path}") for path in (".", "..")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    seen = sorted((e.thread_name, e.blocking_events[0]["event"]) for e in detector.events)
    assert seen == [("trio-.", "os.stat(.)"), ("trio-..", "os.stat(..)")]
    assert len({e.loop for e in detector.events}) == 2, "each run is its own loop"


def test_the_entry_queue_lock_held_by_a_worker_thread_is_not_reported(detector: Collector) -> None:
    # trio's worker threads hand results back through the run's entry queue, under its lock: the run
    # loop waiting a moment for it is trio's own synchronisation (harmless.HARMLESS). Held here by a
    # thread of the test's, through trio's private attribute, so that the task's run_sync_soon waits.
    release = threading.Event()

    async def main() -> None:
        token = trio.lowlevel.current_trio_token()
        lock = token._reentry_queue.lock  # trio's entry queue lock (what the rule is about)
        held = threading.Event()

        def holder() -> None:
            with lock:
                held.set()
                release.wait(30)

        thread = threading.Thread(target=holder)
        thread.start()
        while not held.is_set():
            await trio.sleep(0.001)
        threading.Timer(0.2, release.set).start()  # the task below waits on the lock until then
        token.run_sync_soon(lambda: None)
        await trio.to_thread.run_sync(thread.join, 30)

    trio.run(main)
    assert detector.calls == []


# --- stalls and hangs of trio's run loop: the watchdog watches a trio run as a loop -------------------


def test_a_trio_run_is_the_threads_loop_from_its_start_and_again_after_an_asyncio_run_in_between(
    detector: Collector,
) -> None:
    # What the watchdog watches on the thread: the run from its start (trio installs its asyncgen
    # hooks), and again once an asyncio loop run on the same thread between a guest run's ticks (a
    # synchronous test under anyio's plugin) has stopped, restoring trio's hooks.
    import asyncio
    import queue

    from aiocop._interception import loops as _loops

    aiocop.detect_slow_tasks(threshold_ms=30)
    ticks: queue.Queue[Any] = queue.Queue()
    state: dict[str, Any] = {}

    def watched() -> str:
        return _loops.watches[threading.get_ident()].loop_name

    async def main() -> None:
        state["first step"] = watched()
        await trio.sleep(0.001)
        state["ticked"] = True
        while "go" not in state:
            await trio.sleep(0.001)

    def done(outcome: Any) -> None:
        state["done"] = outcome

    trio.lowlevel.start_guest_run(main, run_sync_soon_threadsafe=ticks.put, done_callback=done)
    while "ticked" not in state:
        ticks.get()()
    asyncio.run(asyncio.sleep(0))
    state["after asyncio.run"] = watched()
    state["go"] = True
    while "done" not in state:
        ticks.get()()
    state["done"].unwrap()
    assert state["first step"].startswith("trio._core._run.Runner@")
    assert state["after asyncio.run"] == state["first step"]
    assert threading.get_ident() not in _loops.watches, "the run's end unregistered it"


# (Real time from here: named in conftest's TIMING_TESTS. Sized well past the threshold.)


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:  # SPIN
        pass


def test_a_spinning_trio_task_is_a_stall_at_its_line_and_work_off_the_loop_is_none(detector: Collector) -> None:
    aiocop.detect_slow_tasks(threshold_ms=30)

    async def spinner() -> None:
        await trio.sleep(0.05)
        _spin(0.3)  # the stall's line
        await trio.sleep(0.05)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(spinner, name="spinner")
            nursery.start_soon(trio.sleep, 0.4)  # a task waiting in trio.sleep: no stall
            nursery.start_soon(trio.to_thread.run_sync, _spin, 0.3)  # in trio's worker thread: off the loop

    trio.run(main)
    [event] = detector.settle(expected=1)
    assert event.reason == "cpu_blocking"
    assert event.task_name == "spinner"
    assert event.loop.startswith("trio._core._run.Runner@"), event.loop
    assert event.thread_id == threading.get_ident()
    assert 270 <= event.elapsed_ms <= 345, event.elapsed_ms
    sample = event.cpu_stack_samples[0]
    assert sample["entry_point"].endswith(":_spin"), sample
    spin_line = _spin.__code__.co_firstlineno + 2
    caller_line = spinner.__code__.co_firstlineno + 2
    here = "tests/interception/test_trio_runs.py"
    assert sample["trace"] == f"{here}:{spin_line}:_spin <- {here}:{caller_line}:spinner", (
        "at the spinning line, up to the task's coroutine (trio's dispatch frame is the step's edge)"
    )


def test_a_hung_trio_run_is_reported_while_it_hangs(detector: Collector) -> None:
    aiocop.detect_slow_tasks(threshold_ms=30, hang_after_ms=500)
    arrived: list[tuple[str, float]] = []
    aiocop.register_slow_task_callback(lambda event: arrived.append((event.reason, time.perf_counter())))
    ended: list[float] = []

    async def main() -> None:
        await trio.sleep(0.02)
        _spin(1.6)  # holds the run loop: hung
        ended.append(time.perf_counter())

    trio.run(main, instruments=())
    events = detector.settle(expected=3)
    hangs = [e for e in events if e.reason == "hang"]
    assert len(hangs) >= 2, [(e.reason, e.elapsed_ms) for e in events]
    assert all(e.task_name is not None and e.task_name.endswith("main") for e in hangs)
    assert all(e.loop.startswith("trio._core._run.Runner@") for e in hangs)
    # Reported while the step still held the loop, at 500 ms and again at 1 s.
    assert [when < ended[0] for reason, when in arrived if reason == "hang"] == [True] * len(hangs)
    assert hangs[0].hung_ms == pytest.approx(500, abs=100)
    [final] = [e for e in events if e.reason != "hang"]
    assert final.reason == "cpu_blocking" and 1500 <= final.elapsed_ms <= 1760, final.elapsed_ms


def test_a_blocking_call_that_stalls_a_trio_run_is_one_event(detector: Collector) -> None:
    # The call's own event and the watchdog's stall of the same step are one report, as on asyncio.
    aiocop.detect_slow_tasks(threshold_ms=30)

    async def main() -> None:
        await trio.sleep(0.02)
        time.sleep(0.3)  # seen by both: intercepted, and holding the run past the threshold
        await trio.sleep(0.02)

    trio.run(main)
    [event] = detector.settle(expected=1, grace=0.3)
    assert event.reason == "io_blocking"
    assert [c["name"] for c in event.blocking_events] == ["time.sleep"]
    assert 290 <= event.elapsed_ms <= 345, event.elapsed_ms
    assert event.cpu_stack_samples, "the watchdog's samples joined the call's event"
