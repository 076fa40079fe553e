"""Hung loops reported while they hang (issue 25): a deadlock, an endless loop, a silent peer.

Each hang is held until its report has arrived (or a generous timeout
passed), then released by the test: nothing here depends on how fast the
machine is, only on the order of things.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
import queue
import socket
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest

import aiocop
from aiocop._reporting import hangs as _hangs
from tests.conftest import Collector, run_in_thread, run_on, run_probed

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

HANG_AFTER_MS = 1000
WAIT_S = 30.0  # for a report that comes after about a second: a busy machine's worst day
request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")


def line_of(func: Callable[..., object], marker: str) -> int:
    lines, first = inspect.getsourcelines(func)
    return first + next(i for i, text in enumerate(lines) if marker in text)


class Hangs:
    """The hang reports a callback received, and the moment each hang's first one arrived."""

    def __init__(self) -> None:
        self.events: list[aiocop.SlowTaskEvent] = []
        self.first = threading.Event()
        self._lock = threading.Lock()
        self.arrived = threading.Condition(self._lock)

    def __call__(self, event: aiocop.SlowTaskEvent) -> None:
        if event.reason != "hang":
            return
        with self.arrived:
            self.events.append(event)
            self.arrived.notify_all()
        self.first.set()

    def wait_for(self, count: int, timeout: float = WAIT_S) -> bool:
        with self.arrived:
            return self.arrived.wait_for(lambda: len(self.events) >= count, timeout)


@pytest.fixture
def hangs(detector: Collector) -> Hangs:
    aiocop.detect_slow_tasks(threshold_ms=100, hang_after_ms=HANG_AFTER_MS)
    aiocop.register_context_provider(lambda: {"request_id": request_id.get()})
    collector = Hangs()
    aiocop.register_slow_task_callback(collector)
    return collector


def released_after_report(
    hangs: Hangs, release: Callable[[], object], count: int = 1
) -> tuple[threading.Thread, list[bool]]:
    """A thread that releases the hang once `count` reports arrived (or WAIT_S passed); records which."""
    seen: list[bool] = []

    def run() -> None:
        seen.append(hangs.wait_for(count))
        release()

    thread = threading.Thread(target=run, name="releaser")
    thread.start()
    return thread, seen


def serve(coro: Coroutine[Any, Any, None], name: str = "handler") -> Coroutine[Any, Any, None]:
    async def main() -> None:
        await asyncio.get_running_loop().create_task(coro, name=name)

    return main()


async def wait_for_lock(lock: threading.Lock) -> None:
    request_id.set("req-42")
    await asyncio.sleep(0)
    lock.acquire()  # HANGS
    lock.release()


def check_report(event: aiocop.SlowTaskEvent, line: str, *, request: bool = True) -> None:
    assert event.reason == "hang"
    assert event.ongoing
    assert event.hang_reports == 1
    assert event.exceeded_threshold
    assert event.elapsed_ms >= HANG_AFTER_MS
    assert event.hung_ms == event.elapsed_ms
    assert event.call_site.endswith(line), (event.call_site, line)
    assert event.task_name == "handler"
    assert event.thread_name
    assert event.loop
    assert event.cpu_stack_samples
    assert line in event.cpu_stack_samples[0]["trace"]
    assert event.impact == "high"
    if request:
        assert event.context == {"request_id": "req-42"}


def test_a_loop_waiting_for_a_held_lock_is_reported_before_it_is_released(
    detector: Collector, hangs: Hangs, loop_name: str
) -> None:
    lock = threading.Lock()
    lock.acquire()
    releaser, seen = released_after_report(hangs, lock.release)
    run_on(loop_name, serve(wait_for_lock(lock)))
    releaser.join()
    assert seen == [True], "no hang report arrived while the lock was held"
    event = hangs.events[0]
    check_report(event, f"test_hangs.py:{line_of(wait_for_lock, '# HANGS')}:wait_for_lock")
    assert event.culprit.startswith("waiting in lock.acquire()"), event.culprit
    # When it ends, the step's usual event says it hung, and for how long.
    final = [e for e in detector.settle(2) if e.reason != "hang"]
    assert len(final) == 1
    assert final[0].reason == "io_blocking"
    assert not final[0].ongoing
    assert final[0].hung_ms >= event.elapsed_ms


async def spin(stop: list[bool]) -> None:
    request_id.set("req-42")
    await asyncio.sleep(0)
    n = 0
    while not stop[0]:  # HANGS
        n += 1


def test_an_endless_loop_is_reported_while_it_runs(hangs: Hangs, loop_name: str) -> None:
    stop = [False]
    releaser, seen = released_after_report(hangs, lambda: stop.__setitem__(0, True))
    run_on(loop_name, serve(spin(stop)))
    releaser.join()
    assert seen == [True]
    event = hangs.events[0]
    first = line_of(spin, "# HANGS")
    assert any(event.call_site.endswith(f"test_hangs.py:{n}:spin") for n in (first, first + 1)), event.call_site
    assert event.culprit == "running Python code"
    assert event.task_name == "handler"
    # No blocking call: the providers ran on the reporter's thread, in the task's context.
    assert event.context == {"request_id": "req-42"}


async def read_silent(sock: socket.socket) -> None:
    request_id.set("req-42")
    await asyncio.sleep(0)
    sock.recv(16)  # HANGS


def test_a_recv_from_a_silent_peer_is_reported_while_it_waits(hangs: Hangs, loop_name: str) -> None:
    reader, writer = socket.socketpair()
    with reader, writer:
        releaser, seen = released_after_report(hangs, lambda: writer.send(b"x"))
        run_on(loop_name, serve(read_silent(reader)))
        releaser.join()
    assert seen == [True]
    event = hangs.events[0]
    check_report(event, f"test_hangs.py:{line_of(read_silent, '# HANGS')}:read_silent")
    assert event.culprit.startswith("waiting in sock.recv(16)"), event.culprit


def test_a_probe_tick_that_hangs_is_reported_while_it_hangs(hangs: Hangs, loop_name: str) -> None:
    """The loop-delay probe's tick is aiocop's own step while short; one stuck in its `record` is a hang."""
    gate: queue.SimpleQueue[None] = queue.SimpleQueue()
    entered = threading.Event()

    def record(delay_s: float) -> None:
        if not entered.is_set():
            entered.set()
            gate.get()  # HANGS

    async def main() -> None:
        while not entered.is_set():
            await asyncio.sleep(0.01)

    releaser, seen = released_after_report(hangs, lambda: gate.put(None))
    try:
        run_probed(loop_name, main(), record)
    finally:
        releaser.join()
    assert seen == [True], "no hang report arrived while the tick was stuck"
    event = hangs.events[0]
    assert event.ongoing
    assert event.elapsed_ms >= HANG_AFTER_MS
    assert event.call_site.endswith(f"test_hangs.py:{line_of(record, '# HANGS')}:record"), event.call_site
    assert event.culprit.startswith("waiting in gate.get()"), event.culprit


def test_a_hang_is_reported_again_at_doubling_intervals(detector: Collector, loop_name: str) -> None:
    aiocop.detect_slow_tasks(threshold_ms=50, hang_after_ms=200)
    hangs = Hangs()
    aiocop.register_slow_task_callback(hangs)
    lock = threading.Lock()
    lock.acquire()
    releaser, seen = released_after_report(hangs, lock.release, count=3)
    run_on(loop_name, serve(wait_for_lock(lock)))
    releaser.join()
    assert seen == [True]
    numbers = [e.hang_reports for e in hangs.events]
    assert numbers[:3] == [1, 2, 3]
    elapsed = [e.elapsed_ms for e in hangs.events]
    # Due at 200, 400 and 800 ms of the step: each later than the one before,
    # and at least when it was due (when exactly depends on the machine).
    assert elapsed == sorted(elapsed)
    assert elapsed[1] >= 400 and elapsed[2] >= 800
    final = [e for e in detector.settle(1) if e.reason != "hang"]
    assert [e.hang_reports for e in final] == [len(hangs.events)]


def test_hung_loops_in_threads_several_at_once(hangs: Hangs, loop_name: str) -> None:
    locks = [threading.Lock(), threading.Lock()]
    for lock in locks:
        lock.acquire()

    def release_all() -> None:
        for lock in locks:
            lock.release()

    releaser, seen = released_after_report(hangs, release_all, count=2)
    threads = [
        threading.Thread(
            target=run_in_thread, args=(loop_name, lambda lock=lock: serve(wait_for_lock(lock))), name=f"t{i}"
        )
        for i, lock in enumerate(locks)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    releaser.join()
    assert seen == [True]
    firsts = [e for e in hangs.events if e.hang_reports == 1]
    assert len({e.thread_id for e in firsts}) == 2
    assert len({e.loop for e in firsts}) == 2
    for event in firsts:
        check_report(event, f"test_hangs.py:{line_of(wait_for_lock, '# HANGS')}:wait_for_lock")


async def unsampled_wait_for_lock(lock: threading.Lock) -> None:
    with aiocop.monitored(False):  # as the ASGI middleware leaves the requests it does not sample
        await wait_for_lock(lock)


def test_a_hang_is_reported_in_an_unsampled_request_too(hangs: Hangs) -> None:
    lock = threading.Lock()
    lock.acquire()
    releaser, seen = released_after_report(hangs, lock.release)
    run_on("asyncio", serve(unsampled_wait_for_lock(lock)))
    releaser.join()
    assert seen == [True], "a hung loop stops every request: sampled out or not, it is reported"
    check_report(hangs.events[0], f"test_hangs.py:{line_of(wait_for_lock, '# HANGS')}:wait_for_lock")


def test_hang_after_none_reports_a_hang_only_when_it_ends(detector: Collector, loop_name: str) -> None:
    aiocop.detect_slow_tasks(threshold_ms=50, hang_after_ms=None)
    lock = threading.Lock()
    lock.acquire()
    timer = threading.Timer(0.5, lock.release)
    timer.start()
    run_on(loop_name, serve(wait_for_lock(lock)))
    timer.join()
    events = detector.settle(1)
    assert [e.reason for e in events] == ["io_blocking"]
    assert events[0].hang_reports == 0
    assert events[0].hung_ms == 0.0


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "1000", True, 86_400_001])
def test_hang_after_ms_is_checked(bad: object) -> None:
    with pytest.raises((TypeError, ValueError), match="hang_after_ms"):
        aiocop.detect_slow_tasks(hang_after_ms=bad)  # type: ignore[arg-type]


def test_a_callback_that_raises_or_blocks_does_not_stop_the_watchdog(hangs: Hangs, loop_name: str) -> None:
    unblock = threading.Event()
    blocked = threading.Event()

    def raises(event: aiocop.SlowTaskEvent) -> None:
        if event.reason == "hang":
            raise RuntimeError("a broken callback")

    def blocks(event: aiocop.SlowTaskEvent) -> None:
        if event.reason == "hang":
            blocked.set()
            unblock.wait(WAIT_S)

    aiocop.unregister_slow_task_callback(hangs)
    for callback in (raises, hangs, blocks):
        aiocop.register_slow_task_callback(callback)
    stalls = Collector()
    aiocop.register_slow_task_callback(stalls)
    lock = threading.Lock()
    lock.acquire()
    releaser, seen = released_after_report(hangs, lock.release)
    try:
        run_on(loop_name, serve(wait_for_lock(lock)))
        releaser.join()
        assert seen == [True], "a callback that raised stopped the others"
        assert blocked.wait(WAIT_S)

        async def cpu() -> None:
            end = asyncio.get_running_loop().time() + 0.4
            while asyncio.get_running_loop().time() < end:  # a stall while the hang callback is stuck
                pass

        run_on(loop_name, cpu())
        assert any(e.reason == "cpu_blocking" for e in stalls.settle(2)), "the watchdog stopped watching"
    finally:
        unblock.set()
    assert _hangs.reporter.idle(WAIT_S)


async def enter_rlock(lock: Any) -> None:
    request_id.set("req-42")
    await asyncio.sleep(0)
    with lock:  # HANGS
        pass


@pytest.mark.parametrize("kind", ["rlock", "condition"])
def test_a_hang_names_the_thread_that_owns_the_lock(hangs: Hangs, loop_name: str, kind: str) -> None:
    lock: Any = threading.RLock() if kind == "rlock" else threading.Condition()
    holding, release = threading.Event(), threading.Event()

    def hold_it() -> None:
        with lock:
            holding.set()
            release.wait(WAIT_S)  # HOLDS

    holder = threading.Thread(target=hold_it, name="the-holder")
    holder.start()
    assert holding.wait(WAIT_S)
    releaser, seen = released_after_report(hangs, release.set)
    run_on(loop_name, serve(enter_rlock(lock)))
    releaser.join()
    holder.join()
    assert seen == [True]
    event = hangs.events[0]
    assert event.blocker.startswith("thread 'the-holder'"), event.blocker
    assert f"test_hangs.py:{line_of(hold_it, '# HOLDS')}:hold_it" in event.blocker_trace


async def join_thread(thread: threading.Thread) -> None:
    request_id.set("req-42")
    await asyncio.sleep(0)
    thread.join()  # HANGS


def test_a_hang_names_the_thread_it_joins(hangs: Hangs, loop_name: str) -> None:
    release = threading.Event()

    def work() -> None:
        release.wait(WAIT_S)  # WORKS

    worker = threading.Thread(target=work, name="the-worker")
    worker.start()
    releaser, seen = released_after_report(hangs, release.set)
    run_on(loop_name, serve(join_thread(worker)))
    releaser.join()
    assert seen == [True]
    event = hangs.events[0]
    assert event.blocker.startswith("joining thread 'the-worker'"), event.blocker
    assert f"test_hangs.py:{line_of(work, '# WORKS')}:work" in event.blocker_trace
    check_report(event, f"test_hangs.py:{line_of(join_thread, '# HANGS')}:join_thread")


def test_the_hang_is_logged_at_error_with_its_stack(hangs: Hangs, caplog: pytest.LogCaptureFixture) -> None:
    aiocop.log_events(level="WARNING")
    lock = threading.Lock()
    lock.acquire()
    releaser, seen = released_after_report(hangs, lock.release)
    with caplog.at_level("WARNING", logger="aiocop.events"):
        run_on("asyncio", serve(wait_for_lock(lock)))
        releaser.join()
        assert _hangs.reporter.idle(WAIT_S)
    assert seen == [True]
    line = line_of(wait_for_lock, "# HANGS")
    (hang,) = [r for r in caplog.records if "HUNG" in r.getMessage()]
    assert hang.levelname == "ERROR"
    message = hang.getMessage()
    assert "still running" in message
    assert f"test_hangs.py:{line} in wait_for_lock" in message
    assert "lock.acquire()  # HANGS" in message  # the stack, with each frame's source line
    assert "request_id='req-42'" in message
    assert hang.aiocop["ongoing"] is True  # type: ignore[attr-defined]
    # The final event, when the lock came free, says it hung.
    final = [r for r in caplog.records if "HUNG" not in r.getMessage()]
    assert final and "reported as a hang 1 time" in final[0].getMessage()


def test_the_hang_is_logged_by_structlog_at_error(hangs: Hangs) -> None:
    structlog = pytest.importorskip("structlog")
    import aiocop.structlog as aiocop_structlog

    lock = threading.Lock()
    lock.acquire()
    releaser, seen = released_after_report(hangs, lock.release)
    with structlog.testing.capture_logs() as logs:
        aiocop_structlog.log_events()
        run_on("asyncio", serve(wait_for_lock(lock)))
        releaser.join()
        assert _hangs.reporter.idle(WAIT_S)
    assert seen == [True]
    (entry,) = [e for e in logs if e["event"] == "aiocop.loop_hang"]
    assert entry["log_level"] == "error"
    assert entry["ongoing"] is True
    assert entry["task"] == "handler"
    assert entry["request_id"] == "req-42"
    assert f"test_hangs.py:{line_of(wait_for_lock, '# HANGS')}:wait_for_lock" in entry["trace"]


def test_opentelemetry_counts_the_hang_and_shows_the_blocked_time_while_it_lasts(detector: Collector) -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint

    from aiocop.opentelemetry import SIGNALS, AiocopInstrumentor

    reader = InMemoryMetricReader()
    instrumentor = AiocopInstrumentor()
    instrumentor.instrument(meter_provider=MeterProvider(metric_readers=[reader]), probe_interval_ms=0)
    try:
        aiocop.detect_slow_tasks(threshold_ms=100, hang_after_ms=HANG_AFTER_MS)
        hangs = Hangs()
        aiocop.register_slow_task_callback(hangs)
        lock = threading.Lock()
        lock.acquire()
        during: list[Any] = []

        def read_then_release() -> None:
            if hangs.wait_for(1):
                assert _hangs.reporter.idle(WAIT_S)  # the instrumentor has seen the report too
                during.append(reader.get_metrics_data())
            lock.release()

        releaser = threading.Thread(target=read_then_release)
        releaser.start()
        run_on("asyncio", serve(wait_for_lock(lock)))
        releaser.join()
        after = reader.get_metrics_data()
    finally:
        instrumentor.uninstrument()
    assert during, "no hang report arrived"
    metrics = {m.name: m for r in during[0].resource_metrics for s in r.scope_metrics for m in s.metrics}
    kinds = {"counter": "Sum", "gauge": "Gauge"}
    for signal in SIGNALS:
        if signal.name in ("aiocop.hangs", "aiocop.loop.blocked"):
            metric = metrics[signal.name]
            assert (type(metric.data).__name__, metric.unit) == (kinds[signal.kind], signal.unit)
            for point in metric.data.data_points:
                assert set(point.attributes) == set(signal.attributes)
    (hang,) = metrics["aiocop.hangs"].data.data_points
    assert hang.value == 1
    assert hang.attributes["code.function.name"] == "wait_for_lock"
    assert hang.attributes["code.line.number"] == line_of(wait_for_lock, "# HANGS")
    blocked = [
        p for p in metrics["aiocop.loop.blocked"].data.data_points if p.attributes["thread.name"] == "MainThread"
    ]
    assert blocked and blocked[0].value >= HANG_AFTER_MS / 1000.0
    # Once it ended, the loop is gone from the gauge (or reads 0), and the hang is still counted once.
    assert after is not None
    ended = {m.name: m for r in after.resource_metrics for s in r.scope_metrics for m in s.metrics}
    assert all(
        p.value == 0
        for p in ended.get("aiocop.loop.blocked", metrics["aiocop.hangs"]).data.data_points
        if "thread.name" in p.attributes
    )
    assert [p.value for p in ended["aiocop.hangs"].data.data_points if isinstance(p, NumberDataPoint)] == [1]


HUNG_SCRIPT = """\
import asyncio, threading

lock = threading.Lock()
lock.acquire()


async def handler():
    await asyncio.sleep(0)
    lock.acquire()  # HANGS


async def main():
    await asyncio.get_running_loop().create_task(handler(), name="handler")


asyncio.run(main())
"""


def run_until_hung(
    arguments: list[str],
    cwd: Any,
    signum: int | None = None,
    status: int | None = None,
    until: str = "HUNG",
    after_s: float = 0.0,
) -> str:
    """`python -m aiocop run ...` until it prints a hang (`until`), then SIGTERM (or `signum`): what it wrote.

    The signal is sent `after_s` after that line. It must end with `status` (default: killed by the signal).
    """
    import os
    import queue
    import signal
    import subprocess
    import sys

    from tests.conftest import ROOT

    # As a terminal's Ctrl-C reaches it: a background job may have been started with SIGINT ignored,
    # which exec keeps (a default action it resets).
    unignore = (
        "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", unignore, sys.executable, "-m", "aiocop", "run", *arguments],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    signum = signal.SIGTERM if signum is None else signum
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert process.stderr is not None
        for text in process.stderr:
            lines.put(text)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    seen: list[str] = []
    try:
        while not any(until in text for text in seen):
            text = lines.get(timeout=WAIT_S)
            assert text is not None, "".join(seen)
            seen.append(text)
        time.sleep(after_s)
        process.send_signal(signum)
        assert process.wait(WAIT_S) == (-signum if status is None else status), "".join(seen)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    while (text := lines.get(timeout=WAIT_S)) is not None:
        seen.append(text)
    assert process.stderr is not None
    process.stderr.close()
    return "".join(seen)


@pytest.mark.parametrize("where", ["main thread", "a thread"])
def test_the_cli_prints_a_hang_as_it_happens_and_its_report_on_sigterm(tmp_path: Any, where: str) -> None:
    source = HUNG_SCRIPT
    if where == "a thread":
        source = source.replace("asyncio.run(main())", "threading.Thread(target=asyncio.run, args=(main(),)).start()")
    script = tmp_path / "app.py"
    script.write_text(source)
    line = next(i for i, text in enumerate(source.splitlines(), 1) if "# HANGS" in text)
    output = run_until_hung(["--threshold-ms", "100", "--hang-after-ms", "1000", str(script)], tmp_path)
    first, _, report = output.partition("aiocop: terminated by SIGTERM")
    # As it happened: the line, the task, what it waits in, the stack with its source.
    assert f"app.py:{line}:handler" in first
    assert "task 'handler'" in first
    assert "waiting in lock.acquire()" in first
    assert "lock.acquire()  # HANGS" in first
    # On SIGTERM: the report, the hung loop first.
    assert report, output
    assert report.lstrip().startswith("aiocop: 1 loop(s) hung during the run, 1 still hung now:\n[STILL HUNG]")
    assert f"app.py:{line}:handler" in report


def test_sigterm_while_hung_writes_every_file_asked_for(tmp_path: Any) -> None:
    """Issue 38: a container stop (SIGTERM) printed the report and wrote none of the files asked for."""
    script = tmp_path / "app.py"
    script.write_text(HUNG_SCRIPT)
    files = {
        flag: tmp_path / name
        for flag, name in [
            ("--json", "j.json"),
            ("--html", "r.html"),
            ("--speedscope", "s.json"),
            ("--folded", "f.txt"),
        ]
    }
    options = [text for flag, path in files.items() for text in (flag, str(path))]
    output = run_until_hung(["--threshold-ms", "100", "--hang-after-ms", "1000", *options, str(script)], tmp_path)
    assert "aiocop: terminated by SIGTERM" in output
    for flag, path in files.items():
        assert path.is_file() and path.stat().st_size, (flag, output)
    document = json.loads(files["--json"].read_text())
    assert document["exit_status"] == 128 + 15
    [hang] = document["hangs"]
    assert hang["ongoing"] and not hang["ended"] and hang["call_site"].endswith("app.py:9:handler")
    assert "app.py:9" in files["--folded"].read_text()
    assert "hang" in files["--html"].read_text()


def test_sigterm_during_a_stall_short_of_hang_after_reports_the_step_still_running(tmp_path: Any) -> None:
    """Issue 38: a loop stuck below hang_after_ms, then SIGTERM, ended in "no blocking calls or stalls"."""
    source = HUNG_SCRIPT.replace(
        "    lock.acquire()  # HANGS",
        "    print('about to hang', file=__import__('sys').stderr, flush=True)\n    lock.acquire()  # HANGS",
    )
    script = tmp_path / "app.py"
    script.write_text(source)
    line = next(i for i, text in enumerate(source.splitlines(), 1) if "# HANGS" in text)
    json_file = tmp_path / "j.json"
    output = run_until_hung(
        ["--threshold-ms", "100", "--hang-after-ms", "600000", "--json", str(json_file), str(script)],
        tmp_path,
        until="about to hang",
        after_s=1.5,  # well past the 100 ms threshold, on a busy machine too
    )
    report = output.partition("aiocop: terminated by SIGTERM")[2]
    assert "no blocking calls or stalls were seen" not in report, output
    assert "1 loop(s) still held by one step at exit (for less than hang_after_ms):" in report, output
    assert "[STILL HELD AT EXIT]" in report
    headline = next(text for text in report.splitlines() if text.startswith("loop STILL HELD for "))
    assert f"app.py:{line}:handler" in headline and "task 'handler'" in headline
    held_s = float(headline.split()[4])
    assert held_s >= 1.0, headline
    assert "lock.acquire()  # HANGS" in report  # its stack, with the source
    [hang] = json.loads(json_file.read_text())["hangs"]
    assert hang["ongoing"] and hang["elapsed_ms"] >= 1000.0 and "hang_reports" not in hang


def test_ctrl_c_while_hung_prints_the_report_hangs_first(tmp_path: Any) -> None:
    import signal

    # Under asyncio.run(), Python's first Ctrl-C asks the main task to cancel, which a hung loop cannot
    # do, and the second raises KeyboardInterrupt; a loop run directly gets it at the first.
    source = HUNG_SCRIPT.replace("asyncio.run(main())", "asyncio.new_event_loop().run_until_complete(main())")
    script = tmp_path / "app.py"
    script.write_text(source)
    line = next(i for i, text in enumerate(source.splitlines(), 1) if "# HANGS" in text)
    output = run_until_hung(
        ["--threshold-ms", "100", "--hang-after-ms", "1000", str(script)], tmp_path, signal.SIGINT, status=130
    )
    report = output.partition("KeyboardInterrupt")[2]
    # The interrupt ended the hung call (Python interrupts a lock's wait): the hang is shown first, as ended.
    assert report.lstrip().startswith("aiocop: 1 loop(s) hung during the run, 0 still hung now:\n[ended, after"), output
    assert f"app.py:{line}:handler" in report


def test_the_hangs_how_to_example() -> None:
    """examples/hangs/deadlock.py, run as docs/how-to/hangs.md runs it."""
    from pathlib import Path

    from tests.conftest import ROOT

    example = Path(ROOT) / "examples" / "hangs" / "deadlock.py"
    lines = example.read_text().splitlines()
    deadlock = next(i for i, text in enumerate(lines, 1) if "# DEADLOCK" in text)
    refresh = next(i for i, text in enumerate(lines, 1) if "# REFRESH" in text)
    output = run_until_hung(["--hang-after-ms", "1000", "examples/hangs/deadlock.py"], ROOT)
    first = output.partition("aiocop: terminated by SIGTERM")[0]
    assert (
        "in task 'request-0' on thread 'MainThread': waiting in threading.RLock.__enter__ (lock) at "
        f"examples/hangs/deadlock.py:{deadlock}:handle"
    ) in first
    assert "context: request_id='req-0'" in first
    assert "blocked by: thread 'cache-refresher'" in first
    assert f"its stack: examples/hangs/deadlock.py:{refresh}:refresh_cache <- " in first
    assert "[STILL HUNG]" in output


@pytest.mark.timeout(150)  # its pytest run is given 120 s; the test's own timeout sits above it
def test_the_pytest_plugin_writes_the_hang_into_the_output_of_a_test_pytest_timeout_kills(
    pytester: pytest.Pytester,
) -> None:
    from tests.support.pytester_args import QUIET

    pytester.makepyfile(
        test_stuck="""
        import asyncio, threading
        import aiocop

        LOCK = threading.Lock()
        LOCK.acquire()

        async def handler():
            await asyncio.sleep(0)
            LOCK.acquire()  # HANGS

        def test_stuck():
            aiocop.detect_slow_tasks(threshold_ms=100, hang_after_ms=1000)
            asyncio.run(handler())
        """
    )
    result = pytester.runpytest_subprocess(
        *QUIET, "--aiocop", "--aiocop-threshold-ms=100", "--timeout=10", "--timeout-method=thread", timeout=120
    )
    output = result.stdout.str() + result.stderr.str()
    # pytest-timeout ended the run (os._exit), showing what the test had written: the hang, at its line.
    assert "Timeout" in output, output
    assert "loop HUNG for" in output, output
    assert "test_stuck.py:9:handler" in output, output
    assert "LOCK.acquire()  # HANGS" in output, output


@pytest.mark.timeout(150)  # its pytest run is given 120 s; the test's own timeout sits above it
def test_under_pytest_timeouts_thread_method_the_hang_is_on_the_terminal_before_the_timeout(
    pytester: pytest.Pytester,
) -> None:
    # Default settings (no stall threshold): the plugin reports the hang after
    # half the 8 s timeout, 4 s before pytest-timeout ends the process with
    # os._exit. The test captures its own output (capfd), which pytest-timeout
    # never shows: the report goes straight to the terminal.
    from tests.support.pytester_args import QUIET

    pytester.makepyfile(
        test_stuck="""
        import asyncio, threading

        async def handler():
            lock = threading.Lock()
            lock.acquire()
            lock.acquire()  # HANGS

        def test_stuck(capfd):
            asyncio.run(handler())
        """
    )
    result = pytester.runpytest_subprocess(*QUIET, "--aiocop", "--timeout=8", "--timeout-method=thread", timeout=120)
    output = result.stdout.str() + result.stderr.str()
    assert "hangs under pytest-timeout: reported after half a test's timeout, at most 5000 ms" in output, output
    assert "Timeout" in output, output
    assert "aiocop: loop HUNG for 4.0 s (still running)" in result.stderr.str(), output
    assert "test_stuck.py:6:handler" in output, output
    assert "lock.acquire()  # HANGS" in output, output


PAUSED_SCRIPT = """\
import asyncio, sys, time

async def main():
    print("stepping", file=sys.stderr, flush=True)
    for _ in range(8):
        t = time.perf_counter()
        while time.perf_counter() - t < 0.5:  # a step of 0.5 s, in wall time
            pass
        await asyncio.sleep(0.05)

asyncio.run(main())
"""


@pytest.mark.skipif(sys.platform != "linux", reason="a stopped process is told apart by Linux's schedstat")
def test_a_stopped_process_is_no_hung_loop(tmp_path: Any) -> None:
    """Issue 38: SIGSTOP for 3 s, then SIGCONT (Ctrl-Z and fg, a paused container), during a loop of 0.5 s
    steps under --hang-after-ms 1500 was reported as "HUNG 3.2 s": the pause is not the loop's doing."""
    import os
    import signal
    import subprocess

    from tests.conftest import ROOT

    script = tmp_path / "app.py"
    script.write_text(PAUSED_SCRIPT)
    process = subprocess.Popen(
        [sys.executable, "-m", "aiocop", "run", "--threshold-ms", "100", "--hang-after-ms", "1500", str(script)],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    try:
        assert process.stderr is not None
        assert process.stderr.readline().strip() == "stepping"
        time.sleep(0.2)  # inside the first step
        process.send_signal(signal.SIGSTOP)
        time.sleep(3.0)
        process.send_signal(signal.SIGCONT)
        output = process.stderr.read()
        assert process.wait(timeout=120) == 0, output
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()
    assert "HUNG" not in output, output
    assert "8 stall(s)" in output, output
