"""The stall watchdog: stuck loops reported once, with the right duration and line."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import inspect
import os
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from typing import TYPE_CHECKING

import pytest

import aiocop
from aiocop._reporting import delivery as _delivery
from aiocop._stalls import settings as _settings
from aiocop._stalls import watchdog as _watchdog
from aiocop._stalls.state import state_of
from tests.conftest import (
    SLOW_CALLBACK_WARNING,
    Collector,
    _loop_param,
    loop_factory,
    quiet_rloop,
    reset_aiocop,
    run_in_thread,
    run_on,
    run_probed,
)
from tests.support import cpu_waits, stalls
from tests.support.cpu_waits import assert_close_enough

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

STALL_S = 0.1  # 3.3x the fixture's 30 ms threshold: a stall on any machine


def stall_lines(func: Callable[..., object]) -> tuple[str, ...]:
    """The call sites a stall in `func` is reported at: its `# STALLS` line (and, for a
    `while` loop, the loop's body, where a sample can fall too, as on 3.15)."""
    lines, first = inspect.getsourcelines(func)
    index = next(i for i, text in enumerate(lines) if "# STALLS" in text)
    loop = lines[index].strip().startswith("while ")
    return tuple(f"stalls.py:{first + index + extra}:{func.__name__}" for extra in ((0, 1) if loop else (0,)))


def stall_details(watchdog: Collector) -> list[tuple[float, str | None, str, str]]:
    """Each stall's length, task, call site and culprit: which step it was, where a test did not expect it."""
    return [(e.elapsed_ms, e.task_name, e.call_site, e.culprit) for e in watchdog.events]


@pytest.fixture
def watchdog(detector: Collector) -> Iterator[Collector]:
    aiocop.detect_slow_tasks(threshold_ms=30)
    assert aiocop.is_cpu_sampling_started()
    cpu_waits.start()
    yield detector
    aiocop.stop()
    assert not aiocop.is_cpu_sampling_started()
    aiocop.detect_slow_tasks(threshold_ms=30, cpu_sampling=False)


async def timed_stall(func: Callable[[float], None], seconds: float = STALL_S) -> float:
    await asyncio.sleep(0.02)  # let the watchdog see the loop idle first
    t0 = time.perf_counter()
    func(seconds)
    true_ms = (time.perf_counter() - t0) * 1000.0
    await asyncio.sleep(0.02)  # and come back
    return true_ms


def only_event(collector: Collector) -> aiocop.SlowTaskEvent:
    events = collector.settle(1)  # stalls are reported by the watchdog thread shortly after they end
    assert len(events) == 1, [(e.reason, e.elapsed_ms, e.culprit) for e in events]
    return events[0]


CPU_STALLS = [
    pytest.param(stalls.spin, "running", id="pure_python"),
    pytest.param(stalls.sleep_bound_before_patching, "waiting in bound_sleep", id="sleep_bound_before_patching"),
    pytest.param(stalls.hash_big_buffer, "running hashlib.sha256", id="c_extension"),
]


# The culprit: what the stalled loop was doing, named from its stack (aiocop._stalls.culprit).
@pytest.mark.parametrize(("func", "culprit"), CPU_STALLS)
def test_cpu_stall_reported_at_its_line_with_its_duration(
    watchdog: Collector, loop_name: str, func: Callable[[float], None], culprit: str
) -> None:
    true_ms = run_on(loop_name, timed_stall(func))
    event = only_event(watchdog)
    if sys.version_info >= (3, 13) and func is stalls.sleep_bound_before_patching:
        assert event.reason == "io_blocking"  # the native time.sleep event, with the samples attached
        assert [c["name"] for c in event.blocking_events] == ["time.sleep"]
    else:
        assert event.reason == "cpu_blocking"
        assert event.blocking_events == []
    assert_close_enough(event.elapsed_ms, true_ms, sorted(t.name for t in threading.enumerate()))
    assert event.exceeded_threshold
    assert event.call_site.endswith(stall_lines(func)), event.call_site
    assert event.culprit.startswith(culprit), event.culprit
    assert event.task_name is not None
    assert event.cpu_stack_samples and all(s["count"] >= 1 for s in event.cpu_stack_samples)


@pytest.mark.parametrize(
    ("func", "event_name"),
    [
        pytest.param(stalls.select_timeout, "select.select", id="select"),
        pytest.param(stalls.wait_on_held_lock, "threading.Lock.acquire", id="held_lock"),
        pytest.param(stalls.sleep_then_work, "time.sleep", id="sleep_then_work"),
    ],
)
def test_stall_with_intercepted_call_is_one_merged_event(
    watchdog: Collector, loop_name: str, func: Callable[[float], None], event_name: str
) -> None:
    true_ms = run_on(loop_name, timed_stall(func))
    event = only_event(watchdog)
    assert event.reason == "io_blocking"
    assert [c["name"] for c in event.blocking_events] == [event_name]
    assert event.cpu_stack_samples, "the watchdog's samples are attached to the io event"
    assert_close_enough(event.elapsed_ms, true_ms)
    assert event.culprit.startswith("waiting in"), event.culprit
    assert event.call_site.endswith(stall_lines(func)), event.call_site


def test_with_the_watchdog_on_steps_keep_their_edges(watchdog: Collector, loop_name: str) -> None:
    # The watchdog wraps sys.set_asyncgen_hooks; the frame that entered a C
    # loop must still be the caller of the loop, not aiocop's wrapper.
    async def main() -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def first() -> None:
            os.stat(".")

        def second() -> None:
            os.stat(".")
            done.set_result(None)

        loop.call_soon(first)
        loop.call_soon(second)
        await done

    run_on(loop_name, main())
    assert sorted(e.blocking_events[0]["entry_point"].rsplit(":", 1)[1] for e in watchdog.events) == [
        "first",
        "second",
    ]
    assert all(len(e.blocking_events[0]["frames"]) == 1 for e in watchdog.events)


def test_stall_events_keep_no_frame_alive(watchdog: Collector, loop_name: str) -> None:
    import gc
    import weakref

    class Payload:
        pass

    refs: list[weakref.ref[Payload]] = []

    async def handler() -> None:
        payload = Payload()
        refs.append(weakref.ref(payload))
        stalls.spin(STALL_S)

    async def main() -> None:
        await asyncio.sleep(0.02)
        await asyncio.ensure_future(handler())
        await asyncio.sleep(0.02)

    run_on(loop_name, main())
    event = only_event(watchdog)  # held, and not yet read (its fields are formatted lazily)
    gc.collect()
    assert refs[0]() is None, "the stall event keeps the handler's frame (and its locals) alive"
    assert event.cpu_stack_samples and event.culprit


def test_steps_under_the_threshold_are_not_reported(watchdog: Collector, loop_name: str) -> None:
    steps = stalls.StepTimes()

    async def main() -> None:
        for _ in range(10):
            steps.resumed()
            stalls.spin(0.005)  # a sixth of the threshold
            steps.suspended()
            await asyncio.sleep(0)

    run_on(loop_name, main())
    time.sleep(0.05)
    # None, unless the machine kept the loop's thread off a CPU mid-step past the threshold.
    reported = [e.elapsed_ms for e in watchdog.events]
    assert steps.unexplained(reported, 30.0) == [], (max(steps.lengths), stall_details(watchdog))


def test_a_task_that_keeps_yielding_is_not_a_stall(
    watchdog: Collector, loop_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One task works 2 ms and yields, for 300 ms: the loop stays responsive.
    # On loops written in C its steps share a root frame, and a busy thread
    # can starve the watchdog of the GIL; two sightings far apart must not be
    # taken for one long step.
    steps = stalls.StepTimes()

    async def main() -> None:
        end = time.perf_counter() + 0.3
        while time.perf_counter() < end:
            steps.resumed()
            stalls.spin(0.002)
            steps.suspended()
            await asyncio.sleep(0)

    # Polls 40 ms apart, as when a busy thread starves the watchdog.
    monkeypatch.setattr(_settings.sampling, "busy_poll_ms", 40.0)
    monkeypatch.setattr(_watchdog, "_FAST_IDLE_S", 0.04)
    run_on(loop_name, main())
    time.sleep(0.1)
    # None, unless the machine kept the loop's thread off a CPU mid-step past
    # the threshold (seen in a run of the timing tests under two `yes`: a 36
    # ms stall on uvloop, 3.11): then that step's, no longer.
    reported = [e.elapsed_ms for e in watchdog.events]
    assert steps.unexplained(reported, 30.0) == [], (max(steps.lengths), stall_details(watchdog))


def test_idle_loop_waiting_for_io_is_not_reported(watchdog: Collector, loop_name: str) -> None:
    async def main() -> None:
        reader, writer = await asyncio.open_connection(*server_address)
        await asyncio.wait_for(reader.read(1), 0.2) if False else await asyncio.sleep(0.15)
        writer.close()

    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    server_address = listener.getsockname()
    try:
        run_on(loop_name, main())
    finally:
        listener.close()
    time.sleep(0.05)
    assert watchdog.events == []


def test_loop_in_a_non_main_thread(watchdog: Collector, loop_name: str) -> None:
    true_ms = run_in_thread(loop_name, lambda: timed_stall(stalls.spin))
    event = only_event(watchdog)
    assert event.thread_name == "loop-thread"
    assert_close_enough(event.elapsed_ms, true_ms)


def test_two_loops_in_two_threads_at_once(watchdog: Collector, loop_name: str) -> None:
    # One loop spins, the other waits: two CPU-bound loops would share the GIL
    # with the watchdog itself, which blurs its timing (see the accuracy
    # benchmark); detection itself is checked by test_loop_in_a_non_main_thread.
    results: dict[str, float] = {}
    started = threading.Barrier(2)
    kinds = {"a": stalls.spin, "b": stalls.sleep_bound_before_patching}

    def run(name: str, seconds: float) -> None:
        async def main() -> None:
            await asyncio.get_running_loop().run_in_executor(None, started.wait)
            results[name] = await timed_stall(kinds[name], seconds)
            await asyncio.get_running_loop().run_in_executor(None, started.wait)

        with cpu_waits.counted():
            loop = loop_factory(loop_name)()
            try:
                loop.run_until_complete(main())
            finally:
                loop.close()

    threads = [threading.Thread(target=run, args=(n, s), name=n) for n, s in (("a", 0.1), ("b", 0.15))]
    with quiet_rloop(loop_name):
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    watchdog.settle(2)
    by_thread = {e.thread_name: e for e in watchdog.events}
    assert sorted(by_thread) == ["a", "b"], [(e.thread_name, e.elapsed_ms) for e in watchdog.events]
    for name, event in by_thread.items():
        assert_close_enough(event.elapsed_ms, results[name], name)


def test_threshold_changes_at_run_time(watchdog: Collector, loop_name: str) -> None:
    aiocop.detect_slow_tasks(threshold_ms=1000)
    assert aiocop.get_slow_task_threshold_ms() == 1000
    run_on(loop_name, timed_stall(stalls.spin))  # a tenth of the threshold
    time.sleep(0.05)
    assert watchdog.events == []
    aiocop.detect_slow_tasks(threshold_ms=30)
    run_on(loop_name, timed_stall(stalls.spin))
    assert only_event(watchdog).threshold_ms == 30


def test_loops_starting_and_stopping_repeatedly(watchdog: Collector, loop_name: str) -> None:
    async def quick() -> None:
        await asyncio.sleep(0)

    for _ in range(20):
        run_on(loop_name, quick())
    run_on(loop_name, timed_stall(stalls.spin))
    assert only_event(watchdog).reason == "cpu_blocking"


def tick_began() -> float:
    """When the probe's tick under way on this thread began, as it noted it.

    What a held tick is timed against: the tick holds the loop from there,
    not only in `record`'s own hold (on a busy machine its thread can wait
    for a CPU before or after it: 50.7 ms came out of a 45 ms hold).
    """
    from aiocop._interception import loops as _loops

    started = state_of(_loops.watches[threading.get_ident()]).probe_started
    assert started is not None
    return started[0]


@pytest.mark.parametrize("arm_after_ms", [None, 200.0], ids=["arm_after default", "arm_after past the threshold"])
@pytest.mark.parametrize("hold", [stalls.wait_unseen, stalls.spin], ids=["waits", "works"])
def test_a_probe_tick_that_holds_the_loop_is_a_stall(
    watchdog: Collector,
    loop_name: str,
    hold: Callable[[float], None],
    arm_after_ms: float | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The loop-delay probe's tick is aiocop's own step while short; one that holds the loop is a stall.

    A `record` that waits on its metrics SDK's lock (held by an exporter) or
    works for long: a stall of aiocop's making, reported at its line and
    timed from the tick's start. Taken for no step at all, it went unreported;
    with `arm_after_ms` past the threshold, it was none until that late.
    """
    monkeypatch.setattr(_settings.sampling, "arm_after_ms", arm_after_ms)
    held: list[float] = []
    ticks = [0]

    def record(delay_s: float) -> None:
        ticks[0] += 1
        if ticks[0] == 3:
            t0 = tick_began()
            hold(STALL_S)
            held.append((time.perf_counter() - t0) * 1000.0)

    async def main() -> None:
        while not held:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)

    run_probed(loop_name, main(), record)
    event = only_event(watchdog)
    assert event.reason == "cpu_blocking"
    if arm_after_ms is None:  # (sampled from arm_after on, as any step: a later one has no samples)
        assert event.call_site.endswith(stall_lines(hold)), event.call_site
    assert_close_enough(event.elapsed_ms, held[0])


@pytest.mark.parametrize(
    "hold", [stalls.wait_unseen, stalls.spin, stalls.sleep_seen], ids=["waits", "works", "blocking call"]
)
def test_a_probe_tick_that_holds_an_idle_loop_reports_itself(
    watchdog: Collector, loop_name: str, hold: Callable[[float], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On an idle loop the watchdog looks seldom, and a tick does not trip the loop's tripwire.

    A tick held 1.5x the threshold, after a quiet spell with looks a second
    apart, is reported all the same: by the tick itself as it ends (timed
    exactly, named by its `record`), or by a look that landed in it. Once:
    a blocking call in `record` makes an io event of the tick, which takes
    the stall (the tick's own report made a second event, and cut the io
    event to 0 ms: review).
    """
    monkeypatch.setattr(_settings.sampling, "idle_interval_ms", 1000.0)
    held: list[float] = []
    started = time.perf_counter()
    done: list[asyncio.Event] = []

    def record(delay_s: float) -> None:
        if not held and time.perf_counter() - started > 1.2:
            t0 = tick_began()
            hold(0.045)
            held.append((time.perf_counter() - t0) * 1000.0)
            done[0].set()

    async def main() -> None:
        done.append(asyncio.Event())
        await done[0].wait()  # nothing of the test's runs until then: the ticks alone
        await asyncio.sleep(0.05)

    run_probed(loop_name, main(), record)
    event = only_event(watchdog)
    lines, first = inspect.getsourcelines(record)
    record_lines = tuple(f"test_watchdog.py:{first + n}:record" for n in range(len(lines)))
    if hold is stalls.sleep_seen:
        assert event.reason == "io_blocking"
        assert event.exceeded_threshold
        assert event.call_site.endswith(stall_lines(hold)), event.call_site
    else:
        assert event.call_site.endswith((*stall_lines(hold), *record_lines)), event.call_site
    assert_close_enough(event.elapsed_ms, held[0])


def test_a_tick_held_on_one_loop_leaves_the_other_loops_ticking(watchdog: Collector, loop_name: str) -> None:
    """Loops in two threads, one probe: loop a's tick waits in `record` while loop b's come due.

    The ticks once shared one empty context, which one thread at a time can
    enter: b's tick failed while a's waited, and b was never probed again.
    """
    from aiocop._stalls.probe import DelayProbe

    ticks: dict[str, list[float]] = {"a": [], "b": []}
    held: list[float] = []  # when a's held tick ended, and how long it held (ms)

    def record(delay_s: float) -> None:
        name = threading.current_thread().name
        ticks[name].append(time.perf_counter())
        if name == "a" and len(ticks["a"]) == 3:
            t0 = tick_began()
            stalls.wait_unseen(0.15)
            held.extend((time.perf_counter(), (time.perf_counter() - t0) * 1000.0))

    async def main() -> None:
        # Until b has ticked a few times after a's hold (a generous bound, for a busy machine).
        deadline = time.perf_counter() + 20
        while time.perf_counter() < deadline and not (held and sum(t > held[0] for t in ticks["b"]) >= 3):
            await asyncio.sleep(0.05)

    probe = DelayProbe(0.02, record)
    probe.start()
    try:
        threads = [threading.Thread(target=run_on, args=(loop_name, main()), name=name) for name in "ab"]
        with quiet_rloop(loop_name):
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
    finally:
        probe.stop()
    assert held, "loop a's third tick never came"
    assert sum(t > held[0] for t in ticks["b"]) >= 3, len(ticks["b"])
    event = only_event(watchdog)  # a's held tick
    assert_close_enough(event.elapsed_ms, held[1])


def test_stall_in_a_loops_last_step(watchdog: Collector, loop_name: str) -> None:
    # The loop stops right after the stall, before the watchdog can see the
    # step end: the stop itself ends it. (Delivered off the loop: a report
    # handed to a loop as it stops can miss its last iteration, another matter.)
    aiocop.start_blocking_io_detection(delivery="thread")

    async def main() -> float:
        await asyncio.sleep(0.02)
        t0 = time.perf_counter()
        stalls.spin(STALL_S)
        return (time.perf_counter() - t0) * 1000.0

    true_ms = run_on(loop_name, main())
    event = only_event(watchdog)
    assert event.reason == "cpu_blocking"
    assert_close_enough(event.elapsed_ms, true_ms)
    assert event.call_site.endswith(stall_lines(stalls.spin)), event.call_site


def test_stop_right_after_a_stall_in_a_loops_last_step(
    watchdog: Collector, loop_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Polls far apart: the watchdog has not looked since the loop stopped.
    monkeypatch.setattr(_settings.sampling, "busy_poll_ms", 40.0)
    monkeypatch.setattr(_watchdog, "_FAST_IDLE_S", 0.04)
    aiocop.start_blocking_io_detection(delivery="thread")

    async def main() -> None:
        await asyncio.sleep(0.02)
        stalls.spin(0.15)

    with quiet_rloop(loop_name):
        loop = loop_factory(loop_name)()
        try:
            loop.run_until_complete(main())
            aiocop.stop()  # "delivers any pending events": the stall too
        finally:
            loop.close()
    assert [e.reason for e in watchdog.events] == ["cpu_blocking"]


def test_stall_in_a_new_loops_first_step(watchdog: Collector, loop_name: str) -> None:
    # Timed from the loop's start, not from a guess of when it was last idle.
    async def main() -> float:
        t0 = time.perf_counter()
        stalls.spin(STALL_S)
        true_ms = (time.perf_counter() - t0) * 1000.0
        await asyncio.sleep(0.02)
        return true_ms

    true_ms = run_on(loop_name, main())
    event = only_event(watchdog)
    assert_close_enough(event.elapsed_ms, true_ms)


def test_sync_reports_a_stall_that_just_ended(
    watchdog: Collector, loop_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Polls far apart: without sync() the watchdog would see the end of the
    # stall only at its next look, after the assertion.
    monkeypatch.setattr(_settings.sampling, "busy_poll_ms", 40.0)
    monkeypatch.setattr(_watchdog, "_FAST_IDLE_S", 0.04)
    aiocop.start_blocking_io_detection(delivery="thread")  # delivered by the worker: drain() waits for it
    ended = threading.Event()
    release = threading.Event()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(0.02)
        stalls.spin(0.1)
        loop.call_soon(ended.set)  # runs once the step has ended
        await loop.run_in_executor(None, release.wait)  # the loop keeps running, idle

    thread = threading.Thread(target=run_on, args=(loop_name, main()))
    with quiet_rloop(loop_name):
        thread.start()
        try:
            assert ended.wait(10)
            assert _watchdog.watchdog.sync()
            _delivery.drain()
            assert [e.reason for e in watchdog.events] == ["cpu_blocking"]
        finally:
            release.set()
            thread.join(10)
    aiocop.stop()
    assert not _watchdog.watchdog.sync()  # not running: no look to wait for


def test_start_cpu_sampling_options_and_validation(watchdog: Collector, loop_name: str) -> None:
    aiocop.start_cpu_sampling(interval_ms=5, arm_after_ms=5, idle_interval_ms=2, max_samples_per_slice=3)
    assert _settings.sampling.max_samples_per_slice == 3
    run_on(loop_name, timed_stall(stalls.spin))
    event = only_event(watchdog)
    # Capped at three (a 5 ms interval over the stall would take many more); a busy
    # machine may let the watchdog take fewer.
    assert 1 <= sum(s["count"] for s in event.cpu_stack_samples) <= 3
    for bad in ({"interval_ms": 0}, {"max_samples_per_slice": 0}, {"trace_depth": "x"}):
        with pytest.raises((ValueError, TypeError)):
            aiocop.start_cpu_sampling(**bad)
    aiocop.start_cpu_sampling()


SHUTDOWN_SCRIPT = textwrap.dedent(
    """
    import asyncio, os, time
    import aiocop
    aiocop.start_blocking_io_detection()
    # 200 ms: in dev mode, on a starved machine, a step of asyncio's own that
    # first reads source files for its tracebacks took over 30 ms of the loop
    # thread's CPU, a real stall but not this test's.
    aiocop.detect_slow_tasks(threshold_ms=200, on_slow_task=lambda e: print(e.reason, flush=True))

    async def main():
        asyncio.get_running_loop().slow_callback_duration = 60  # dev mode's own note of a step over 100 ms
        await asyncio.sleep(0.02)
        os.stat(".")
        end = time.perf_counter() + 0.4
        while time.perf_counter() < end:
            pass

    asyncio.run(main())
    # exit at once: the watchdog thread and any pending report meet shutdown
    """
)


def test_interpreter_shutdown_with_the_watchdog_running() -> None:
    for _ in range(3):
        out = subprocess.run(
            [sys.executable, "-X", "dev", "-c", SHUTDOWN_SCRIPT],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert out.returncode == 0, out.stderr
        # Nothing on stderr but, on a starved machine, the note of a callback that ran long.
        assert all(SLOW_CALLBACK_WARNING.fullmatch(line) for line in out.stderr.splitlines()), out.stderr
        assert out.stdout.split() in (["io_blocking"], []), out.stdout


FORK_AFTER_BLOCKING_SCRIPT = textwrap.dedent(
    """
    import asyncio, os, time, warnings
    warnings.simplefilter("ignore", DeprecationWarning)
    import aiocop
    aiocop.start_blocking_io_detection()
    aiocop.register_slow_task_callback(lambda e: print(os.getpid(), [c["name"] for c in e.blocking_events], flush=True))

    async def main():
        time.sleep(0.001)
        pid = os.fork()  # the step's events are pending when the process forks
        if pid == 0:
            return "child"  # the child then exits normally, through its atexit handlers
        os.waitpid(pid, 0)
        return "parent"

    print("done", asyncio.run(main()), os.getpid(), flush=True)
    """
)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_child_does_not_report_its_parents_steps() -> None:
    out = subprocess.run(
        [sys.executable, "-c", FORK_AFTER_BLOCKING_SCRIPT], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    reports = [line for line in out.stdout.splitlines() if not line.startswith("done")]
    pids = {line.split()[1]: line.split()[2] for line in out.stdout.splitlines() if line.startswith("done")}
    assert len(reports) == 1, out.stdout
    assert reports[0].split()[0] == pids["parent"], out.stdout


FORK_SCRIPT = textwrap.dedent(
    """
    import asyncio, os, sys, time, warnings
    warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads running
    import aiocop
    events = []
    aiocop.detect_slow_tasks(threshold_ms=30, on_slow_task=events.append)

    def spin(seconds):
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    async def main():
        await asyncio.sleep(0.02)
        spin(0.1)
        await asyncio.sleep(0.02)

    pid = os.fork()
    asyncio.run(main())
    deadline = time.monotonic() + 10  # reported shortly after: however busy the machine
    while not events and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(0.05)
    mine = [e for e in events if e.reason == "cpu_blocking"]
    if pid == 0:
        os._exit(0 if len(mine) == 1 and aiocop.is_cpu_sampling_started() else 3)
    _, status = os.waitpid(pid, 0)
    print("parent", len(mine), "child exit", os.waitstatus_to_exitcode(status))
    """
)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_fork_child_reports_its_own_stalls(tmp_path: object) -> None:
    out = subprocess.run([sys.executable, "-c", FORK_SCRIPT], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "parent 1 child exit 0", out.stdout + out.stderr


@pytest.mark.parametrize("loop_name", [_loop_param("asyncio"), _loop_param("uvloop")])
def test_looks_at_a_busy_loop_leave_no_reference_cycle(watchdog: Collector, loop_name: str) -> None:
    # What a look at a loop saw must be freed by reference counting as soon
    # as it is gone: a look that ties frames into a reference cycle keeps
    # them, and every task and local they hold, alive until the next garbage
    # collection (one did: sys._current_frames() includes the watchdog's own
    # frame). Without the watchdog this run leaves no garbage at all.
    async def step() -> None:
        os.getcwd()  # detected, and releases the GIL: the watchdog gets its looks
        await asyncio.sleep(0)

    async def main() -> int:
        # Until the watchdog has looked 20 times (0.3 s on a quiet machine),
        # not for a fixed time: on a busy one it got 18 looks in 0.3 s.
        polls = _watchdog.watchdog.polls
        deadline = time.perf_counter() + 20.0
        while _watchdog.watchdog.polls - polls < 20 and time.perf_counter() < deadline:
            await asyncio.gather(*(step() for _ in range(500)))
        return _watchdog.watchdog.polls - polls

    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds is kept in gc.garbage, to show
    try:
        looks = run_on(loop_name, main())
        gc.collect()
        garbage = sorted({type(o).__name__ for o in gc.garbage})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert looks >= 20, f"only {looks} looks at the busy loop in 20 s"
    assert not garbage, f"reference cycles left behind, of: {garbage}"


class Marker:
    """Something a task and a context variable hold, watched with a weak reference."""


_request: contextvars.ContextVar[Marker | None] = contextvars.ContextVar("request", default=None)


@pytest.mark.parametrize("with_call", [False, True], ids=["stall", "stall_in_a_step_with_a_call"])
@pytest.mark.parametrize("loop_name", [_loop_param("asyncio"), _loop_param("uvloop")])
def test_held_stall_events_keep_no_task_or_context_alive(watchdog: Collector, loop_name: str, with_call: bool) -> None:
    # As for io events (test_soak.py): an event a callback keeps must not keep
    # the stalled task, its result or its context's values alive, whether the
    # stall is reported alone or joins the io event of its step.
    result, value = Marker(), Marker()
    watched: list[weakref.ref[object]] = [weakref.ref(result), weakref.ref(value)]

    async def step(answer: Marker) -> Marker:
        if with_call:
            os.getcwd()
        stalls.spin(STALL_S)
        await asyncio.sleep(0)
        return answer

    async def main(answer: Marker, seen: Marker) -> None:
        _request.set(seen)
        await asyncio.sleep(0.02)  # let the watchdog see the loop idle first
        task = asyncio.ensure_future(step(answer))
        watched.append(weakref.ref(task))
        await task
        await asyncio.sleep(0.02)

    run_on(loop_name, main(result, value))
    del result, value
    assert len(watchdog.settle(1)) == 1
    # Checked before any field is read: until then the event holds only the
    # recipe of its fields (the step's group, and the stall).
    gc.collect()
    alive = [ref() is not None for ref in watched]
    assert alive == [False] * 3, "a held event keeps the stalled task, its result or its context alive"
    event = watchdog.events[0]
    assert event.reason == ("io_blocking" if with_call else "cpu_blocking")
    assert event.cpu_stack_samples, "the stall's samples are in the event"
    assert event.task_name, "the event names the stalled task"


def test_stalls_of_a_loop_already_running_when_detection_starts(loop_name: str) -> None:
    """Set up inside a step of a running loop, as an app module imported by a uvicorn worker does.

    A loop written in C is told apart from its steps by the frame that called
    into it, which a step cannot see: aiocop registers such a loop from its
    next callback. (Registered from the step, it had no edge, and the
    watchdog saw none of its stalls: every stall of a multi-worker uvicorn
    app went unreported.)
    """
    collector = Collector()

    async def main() -> None:
        aiocop.start_blocking_io_detection()
        aiocop.detect_slow_tasks(threshold_ms=20, on_slow_task=collector)
        await asyncio.sleep(0.05)
        stalls.spin(0.25)  # 12x the threshold
        await asyncio.sleep(0.05)

    try:
        run_on(loop_name, main())
        (event,) = collector.settle(1)
        assert event.reason == "cpu_blocking"
        assert event.elapsed_ms >= 100  # timed from the step's edge, not from the watchdog's first sight of it
        assert event.call_site.endswith(":spin")
    finally:
        reset_aiocop()


def test_no_watchdog_thread_while_no_loop_runs() -> None:
    """Issue 24 item 5: the thread starts with the first loop and ends when none has run for a while."""
    result = run_python_code(
        """
        import asyncio, os, sys, threading, time, warnings
        import aiocop
        from aiocop._stalls import watchdog as _watchdog
        _watchdog._IDLE_STOP_S = 0.3  # (5 s by default)

        def fork_warnings():
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                pid = os.fork()
                if pid == 0:
                    os._exit(0)
                os.waitpid(pid, 0)
            return [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]

        aiocop.start_blocking_io_detection()
        events = []
        aiocop.detect_slow_tasks(threshold_ms=30, on_slow_task=events.append)
        assert aiocop.is_cpu_sampling_started()
        print("before a loop:", threading.active_count(), [t.name for t in threading.enumerate()])
        print("fork before a loop:", fork_warnings())

        async def main():
            print("in a loop:", sorted(t.name for t in threading.enumerate()))
            end = time.perf_counter() + 0.5  # 16x the threshold: seen however busy the machine
            while time.perf_counter() < end:  # a stall only the watchdog (started with this loop) sees
                pass
            await asyncio.sleep(0)

        asyncio.run(main())
        print("stalls:", [e.reason for e in events])
        print("fork right after the loop:", fork_warnings())
        deadline = time.monotonic() + 30
        while threading.active_count() > 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        print("a while after:", threading.active_count())
        asyncio.run(main())
        print("stalls:", len(events))
        """
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "before a loop: 1 ['MainThread']"
    assert lines[1] == "fork before a loop: []"
    assert lines[2] == "in a loop: ['MainThread', 'aiocop-watchdog']"
    assert lines[3] == "stalls: ['cpu_blocking']"
    assert lines[4] == "fork right after the loop: []"
    assert lines[5] == "a while after: 1"
    assert lines[6] == "in a loop: ['MainThread', 'aiocop-watchdog']"
    assert lines[7] == "stalls: 2"


def run_python_code(code: str) -> subprocess.CompletedProcess[str]:
    from tests.conftest import run_python

    return run_python(code, timeout=120)


STARVED_SCRIPT = textwrap.dedent(
    """
    import asyncio, os, subprocess, sys, time
    import aiocop

    seen = []
    aiocop.start_blocking_io_detection()
    aiocop.detect_slow_tasks(
        threshold_ms=30,
        on_slow_task=lambda e: seen.append(f"{e.call_site} {e.culprit}") if e.reason == "cpu_blocking" else None,
    )
    # One CPU shared with a busy process of higher priority: the loop's thread
    # gets about a tenth of it, in slices (nice 10 against 0: weights 110 and
    # 1024). Set up first: the watchdog's thread, started before, keeps nice 0.
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # (before the nice: it keeps 0)
    os.nice(10)

    def spin(seconds):
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            for _ in range(1000):
                pass

    async def main():
        for _ in range(3):
            spin(0.4)
            await asyncio.sleep(0.05)

    try:
        asyncio.run(main())
        time.sleep(0.2)
    finally:
        hog.kill()
    print("\\n".join(seen))
    """
)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="pins the program to one CPU (Linux)")
def test_a_spin_starved_of_cpu_by_other_processes_is_running_not_waiting() -> None:
    # Its CPU clock stands still between many of the stall's samples (the
    # machine gave the CPU to the other process), but the thread was runnable
    # all along (its schedstat): "running Python code", as on a quiet machine.
    # Before, every one of the three read "waiting" (issue 38).
    out = subprocess.run(
        [sys.executable, "-c", STARVED_SCRIPT], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    seen = out.stdout.splitlines()
    assert len(seen) == 3, (seen, out.stderr)
    for line in seen:
        assert line.endswith(":spin running Python code"), seen
