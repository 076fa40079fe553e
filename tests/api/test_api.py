"""The public API: 1.x compatibility, reconfiguration, stop(), bad input."""

from __future__ import annotations

import asyncio
import inspect
import linecache
import logging
import os
import socket
import sys
import threading
import time
from typing import TYPE_CHECKING

import pytest

import aiocop
from tests.conftest import Collector, run_on, run_until_it_stops_itself

if TYPE_CHECKING:
    from types import CodeType

API_1X = [
    "patch_audit_functions",
    "start_blocking_io_detection",
    "detect_slow_tasks",
    "activate",
    "deactivate",
    "is_monitoring_active",
    "enable_raise_on_violations",
    "disable_raise_on_violations",
    "is_raise_on_violations_enabled",
    "raise_on_violations",
    "register_slow_task_callback",
    "unregister_slow_task_callback",
    "clear_slow_task_callbacks",
    "register_context_provider",
    "unregister_context_provider",
    "clear_context_providers",
    "calculate_io_severity_score",
    "get_severity_level_from_score",
    "format_blocking_event",
    "get_blocking_events_dict",
    "get_patched_functions",
    "get_slow_task_threshold_ms",
    "reset_blocking_events",
    "start_cpu_sampling",
    "is_cpu_sampling_started",
    "SlowTaskEvent",
    "BlockingEventInfo",
    "RawBlockingEvent",
    "CpuStackSample",
    "HighSeverityBlockingIoException",
    "WEIGHT_HEAVY",
    "WEIGHT_MODERATE",
    "WEIGHT_LIGHT",
    "WEIGHT_TRIVIAL",
    "THRESHOLD_HIGH",
    "THRESHOLD_MEDIUM",
]


def test_exported_members_are_sorted_and_exist() -> None:
    assert aiocop.__all__ == sorted(aiocop.__all__, key=lambda n: (not n.isupper(), not n[0].isupper(), n))
    for name in aiocop.__all__:
        assert hasattr(aiocop, name), name
    # Public submodules (the pytest plugin, integrations) are not re-exported;
    # pytest rewrites the asserts of plugin distributions, adding "@py_*" names.
    public = {n for n in dir(aiocop) if not n.startswith(("_", "@")) and not inspect.ismodule(getattr(aiocop, n))} | {
        "__version__"
    }
    assert set(aiocop.__all__) == public - {"annotations"}


@pytest.mark.parametrize("name", [n for n in API_1X if n not in ("start_cpu_sampling", "is_cpu_sampling_started")])
def test_1x_names_exist(name: str) -> None:
    assert name in aiocop.__all__


def test_1x_signatures_and_constants() -> None:
    assert inspect.signature(aiocop.start_blocking_io_detection).parameters["trace_depth"].default == 20
    params = inspect.signature(aiocop.detect_slow_tasks).parameters
    assert [params[n].default for n in ("threshold_ms", "on_slow_task", "cpu_sampling")] == [30, None, True]
    assert (aiocop.WEIGHT_HEAVY, aiocop.WEIGHT_MODERATE, aiocop.WEIGHT_LIGHT, aiocop.WEIGHT_TRIVIAL) == (50, 10, 1, 0)
    assert (aiocop.THRESHOLD_HIGH, aiocop.THRESHOLD_MEDIUM) == (50, 10)
    assert aiocop.get_severity_level_from_score(50) == "high"
    assert aiocop.get_severity_level_from_score(10) == "medium"
    assert aiocop.get_severity_level_from_score(9) == "low"
    assert aiocop.calculate_io_severity_score(None) == 0
    assert aiocop.calculate_io_severity_score([{"severity": 50}, {"severity": None}]) == 60


def test_1x_setup_sequence_reports(loop_name: str) -> None:
    got: list[aiocop.SlowTaskEvent] = []
    aiocop.patch_audit_functions()
    aiocop.start_blocking_io_detection(trace_depth=5)
    aiocop.detect_slow_tasks(threshold_ms=5, on_slow_task=got.append)
    aiocop.activate()  # before any loop runs: must still work
    try:
        assert aiocop.is_monitoring_active()

        async def main() -> None:
            time.sleep(0.01)

        run_on(loop_name, main())
    finally:
        aiocop.stop()
        aiocop.clear_slow_task_callbacks()
        aiocop.detect_slow_tasks(threshold_ms=30)
    # The sleep's step, once. (A busy machine can keep another step of the
    # loop's off the CPU for the 5 ms threshold: a stall of its own, no call.)
    [event] = [e for e in got if e.blocking_events]
    assert all(e.reason == "cpu_blocking" for e in got if e is not event), got
    assert event.exceeded_threshold and event.elapsed_ms >= 10
    assert event.threshold_ms == 5
    assert event.severity_level == "high" and event.severity_score == 50
    assert len(event.blocking_events[0]["trace"].split(" <- ")) <= 5


def test_format_blocking_event_accepts_1x_raw_events() -> None:
    raw: aiocop.RawBlockingEvent = {
        "event_name": "open",
        "raw_args": (("/etc/hosts", "r"), {}),
        "raw_stack": [("/app/src/handlers.py", 12, "handle"), ("/app/src/main.py", 3, "main")],
        "timestamp": 1.0,
        "severity": 10,
    }
    info = aiocop.format_blocking_event(raw)
    assert info["event"] == "open(/etc/hosts, r)"
    assert info["entry_point"] == "/app/src/handlers.py:12:handle"
    assert info["trace"] == "/app/src/handlers.py:12:handle <- /app/src/main.py:3:main"
    assert info["severity"] == 10


def test_deactivate_pauses_and_activate_resumes(detector: Collector, loop_name: str) -> None:
    async def main() -> None:
        os.stat(".")

    aiocop.deactivate()
    assert not aiocop.is_monitoring_active()
    run_on(loop_name, main())
    assert detector.names() == []
    aiocop.activate()
    run_on(loop_name, main())
    assert detector.names() == ["os.stat"]


def test_stop_restores_every_patched_function() -> None:
    originals = {name: getattr(os, name) for name in ("stat", "lstat", "read", "write", "getcwd")}
    # threading.Lock's methods are set on its C type and restored there (aiocop._interception.typepatch).
    lock_acquire = threading.Lock.acquire if isinstance(threading.Lock, type) else type(threading.Lock()).acquire
    recv = socket.socket.recv
    aiocop.start_blocking_io_detection()
    assert "os.stat" in aiocop.get_patched_functions()
    assert os.stat is not originals["stat"]
    aiocop.stop()
    assert aiocop.get_patched_functions() == []
    assert {name: getattr(os, name) for name in originals} == originals
    assert socket.socket.recv is recv
    assert "recv" not in vars(socket.socket)
    assert type(threading.Lock()).acquire is lock_acquire
    assert not aiocop.is_monitoring_active()


def test_nothing_is_reported_after_stop(detector: Collector, loop_name: str) -> None:
    aiocop.stop()

    async def main() -> None:
        time.sleep(0.001)
        with open(__file__, encoding="utf-8"):
            pass

    run_on(loop_name, main())
    assert detector.names() == []


def test_wrapped_functions_behave_like_the_originals(detector: Collector) -> None:
    async def main() -> None:
        assert os.path.exists(__file__) and not os.path.exists("/no/such/file")
        assert os.stat(__file__).st_size > 0
        with pytest.raises(FileNotFoundError):
            os.stat("/no/such/file")
        assert inspect.signature(os.stat) == inspect.signature(os.stat.__wrapped__)  # type: ignore[attr-defined]
        lock = threading.Lock()
        assert lock.acquire(timeout=1) is True
        assert lock.acquire(blocking=True, timeout=0.001) is False
        lock.release()
        with pytest.raises(TypeError):
            time.sleep("x")  # type: ignore[arg-type]

    asyncio.run(main())


def test_wrappers_raise_the_originals_errors_for_bad_arguments(detector: Collector, loop_name: str) -> None:
    def error(func: object, *args: object) -> tuple[type[BaseException], str]:
        try:
            func(*args)  # type: ignore[operator]
        except (TypeError, ValueError, OverflowError, OSError) as exc:
            return type(exc), str(exc)
        raise AssertionError(f"{func} did not raise")

    async def main() -> None:
        r, w = os.pipe()
        lock, event = threading.Lock(), threading.Event()
        try:
            calls = [(os.write, (w, 42)), (os.read, (r, "x")), (os.stat, (3.5,))]
            if hasattr(time.sleep, "__wrapped__"):  # from 3.13 time.sleep has its own audit event
                calls.append((time.sleep, (-1,)))
            for wrapped, args in calls:
                assert error(wrapped, *args) == error(wrapped.__wrapped__, *args), wrapped  # type: ignore[attr-defined]
            # Methods: the wrapper against the original, both unbound.
            for cls, obj, args in (
                (type(lock), lock, (True, "x")),
                (type(lock), lock, (True, 1e300)),
                (threading.Event, event, ("x",)),
            ):
                method = cls.__dict__["acquire" if obj is lock else "wait"]
                assert error(method, obj, *args) == error(method.__wrapped__, obj, *args), cls
        finally:
            os.close(r)
            os.close(w)

    run_on(loop_name, main())


def test_table_changes_take_effect_at_once(detector: Collector, loop_name: str) -> None:
    async def main() -> None:
        os.stat(".")
        os.listdir(".")

    aiocop.unregister_blocking_event("os.stat")
    aiocop.register_blocking_event("os.listdir", weight=aiocop.WEIGHT_HEAVY)
    assert aiocop.get_blocking_events_dict()["os.listdir"] == 50
    run_on(loop_name, main())
    assert detector.names() == ["os.listdir"]
    assert detector.events[0].severity_level == "high"
    with pytest.raises(KeyError, match=r"os\.stat"):
        aiocop.unregister_blocking_event("os.stat")


def test_custom_event_from_user_code(detector: Collector, loop_name: str) -> None:
    import sys

    aiocop.register_blocking_event("myapp.legacy_call", aiocop.WEIGHT_HEAVY)

    async def main() -> None:
        sys.audit("myapp.legacy_call", "arg")

    run_on(loop_name, main())
    assert detector.calls[0]["event"] == "myapp.legacy_call(arg)"


def test_reset_blocking_events_forgets_the_current_step(detector: Collector, loop_name: str) -> None:
    async def main() -> None:
        os.stat(".")
        aiocop.reset_blocking_events()
        await asyncio.sleep(0)
        os.listdir(".")

    run_on(loop_name, main())
    assert detector.names() == ["os.listdir"]


def test_context_providers_see_the_step_context(
    detector: Collector, loop_name: str, request: pytest.FixtureRequest
) -> None:
    import contextvars

    if loop_name == "veloxloop":
        request.applymarker(pytest.mark.xfail(strict=True, reason="veloxloop 0.2 does not copy contexts into tasks"))

    request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
    aiocop.register_context_provider(lambda: {"request_id": request_id.get()})

    async def handler(rid: str) -> None:
        request_id.set(rid)
        await asyncio.sleep(0)
        os.stat(".")

    async def main() -> None:
        await asyncio.gather(handler("a"), handler("b"))

    run_on(loop_name, main())
    assert sorted(e.context["request_id"] for e in detector.events) == ["a", "b"]


def test_raising_callbacks_and_providers_are_contained(
    detector: Collector, loop_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    def bad_provider() -> dict[str, object]:
        raise RuntimeError("provider boom")

    def bad_callback(event: aiocop.SlowTaskEvent) -> None:
        raise RuntimeError("callback boom")

    aiocop.register_context_provider(bad_provider)
    aiocop.register_slow_task_callback(bad_callback)

    async def main() -> str:
        os.stat(".")
        await asyncio.sleep(0.001)
        return "ok"

    with caplog.at_level(logging.ERROR, logger="aiocop"):
        assert run_on(loop_name, main()) == "ok"
    assert detector.names() == ["os.stat"]  # the other callback still ran
    assert "provider boom" in caplog.text and "callback boom" in caplog.text


def test_callbacks_own_blocking_calls_are_not_reported(detector: Collector, loop_name: str) -> None:
    def logging_callback(event: aiocop.SlowTaskEvent) -> None:
        with open(os.devnull, "w", encoding="utf-8") as f:
            f.write(str(event))

    aiocop.register_slow_task_callback(logging_callback)

    async def main() -> None:
        os.stat(".")
        await asyncio.sleep(0.001)

    run_on(loop_name, main())
    assert detector.names() == ["os.stat"]


def test_thread_delivery(loop_name: str) -> None:
    got: list[tuple[aiocop.SlowTaskEvent, str]] = []
    delivered = threading.Event()

    def callback(event: aiocop.SlowTaskEvent) -> None:
        got.append((event, threading.current_thread().name))
        delivered.set()

    aiocop.start_blocking_io_detection(delivery="thread")
    aiocop.register_slow_task_callback(callback)
    try:

        async def main() -> None:
            os.stat(".")
            await asyncio.sleep(0.001)

        run_on(loop_name, main())
        assert delivered.wait(30)  # the delivery thread, which a busy machine can keep off the CPU for seconds
    finally:
        aiocop.stop()
        aiocop.clear_slow_task_callbacks()
        aiocop.start_blocking_io_detection(delivery="loop")
        aiocop.stop()
    [(event, thread)] = got
    assert thread == "aiocop-delivery" and event.thread_name == "MainThread"


def test_a_step_left_over_by_a_stopped_loop_is_delivered_when_the_next_loop_blocks(
    detector: Collector, loop_name: str
) -> None:
    # The first loop stops before its delivery callback can run; loops that
    # announce no stop (veloxloop) must not hold that step until exit.
    async def first() -> None:
        asyncio.get_running_loop().stop()
        time.sleep(0.001)

    async def second() -> None:
        os.stat(".")
        await asyncio.sleep(0.01)

    run_until_it_stops_itself(loop_name, first())
    run_on(loop_name, second())
    # The left-over step is delivered off the loop, by the delivery thread
    # (veloxloop): wait for it, not for a fixed time a busy machine may outlast.
    detector.settle(2, timeout=30)
    assert sorted(detector.names()) == ["os.stat", "time.sleep"]


def test_last_step_before_loop_stops_is_still_delivered(detector: Collector, loop_name: str) -> None:
    async def main() -> None:
        asyncio.get_running_loop().stop()
        os.stat(".")

    run_until_it_stops_itself(loop_name, main())
    aiocop.stop()  # delivers anything still pending
    assert detector.names() == ["os.stat"]


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda: aiocop.start_blocking_io_detection(trace_depth=0), ValueError),
        (lambda: aiocop.start_blocking_io_detection(trace_depth="5"), TypeError),  # type: ignore[arg-type]  # bad on purpose
        (lambda: aiocop.start_blocking_io_detection(delivery="nowhere"), ValueError),  # type: ignore[arg-type]  # bad on purpose
        (lambda: aiocop.detect_slow_tasks(threshold_ms=-1), ValueError),
        (lambda: aiocop.detect_slow_tasks(threshold_ms="30"), TypeError),  # type: ignore[arg-type]  # bad on purpose
        (lambda: aiocop.register_slow_task_callback("not callable"), TypeError),  # type: ignore[arg-type]  # bad on purpose
        (lambda: aiocop.register_context_provider(42), TypeError),  # type: ignore[arg-type]  # bad on purpose
        (lambda: aiocop.allow_blocking("no.such.event"), ValueError),
        (lambda: aiocop.AllowRule(frozenset(["open"]), call_site="no-colon"), ValueError),
        (lambda: aiocop.enable_raise_on_violations(level="extreme"), ValueError),
        (lambda: aiocop.register_blocking_event("x", weight=-1), ValueError),
        (lambda: aiocop.patch_audit_functions(exclude=["os.nothing"]), ValueError),
    ],
)
def test_bad_input_is_rejected_with_a_clear_error(call: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        call()  # type: ignore[operator]
    aiocop.stop()


def test_events_format_lazily_and_behave_like_dataclasses(detector: Collector, loop_name: str) -> None:
    import copy
    import dataclasses
    import pickle

    async def main() -> None:
        os.stat(".")
        await asyncio.sleep(0)

    run_on(loop_name, main())
    [event] = detector.events
    assert "blocking_events" not in vars(event)  # nothing formatted until read
    [call] = event.blocking_events
    assert call["name"] == "os.stat" and call["entry_point"].endswith(":main")
    assert event.loop.split("@")[0].split(".")[0] in ("asyncio", "uvloop", "winloop", "rloop", "veloxloop")
    assert dataclasses.asdict(event)["blocking_events"][0]["name"] == "os.stat"
    assert dataclasses.replace(event, elapsed_ms=1.0).blocking_events == event.blocking_events
    assert pickle.loads(pickle.dumps(event)) == event
    assert copy.deepcopy(event) == event
    assert "os.stat" in repr(event)
    with pytest.raises(AttributeError):
        event.no_such_field
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.elapsed_ms = 0  # type: ignore[misc]


def test_reading_an_event_on_the_loop_reports_none_of_aiocops_own_source_reads(
    detector: Collector, loop_name: str
) -> None:
    # An event's fields are formatted when first read, and a stall's quote
    # its source lines (`culprit`): linecache stats and opens the file the
    # first time. Read in a step of the loop's (an event kept, then logged
    # by the application), those reads are aiocop's, and were reported as a
    # blocking call at the line that read the field. The stall is built as
    # the watchdog builds one (no real stall: this is no timing test).
    from aiocop._interception.loops import LoopWatch
    from aiocop._reporting.building import build_stall_event
    from aiocop._stalls.attribution import Stall

    def inner() -> tuple[CodeType, int]:
        caller = sys._getframe(1)
        return caller.f_code, caller.f_lasti

    def outer() -> tuple[CodeType, int]:
        return inner()  # the sample: `outer` inside this call

    watch = LoopWatch.__new__(LoopWatch)
    watch.thread_id, watch.thread_name, watch.loop_name = -1, "MainThread", "asyncio"
    stall = Stall(watch, 1.0, 1.1, [((outer(),), 1, 0.1)], waiting=False, root=None)
    event = build_stall_event(stall, None, {})

    async def main() -> None:
        linecache.clearcache()  # (the file read again, as the first time)
        # THE READ: every field formatted (the call's text on 3.11+, its whole line on 3.10)
        assert event.culprit.startswith("running ") and "inner()" in event.culprit
        await asyncio.sleep(0)

    run_on(loop_name, main())
    assert detector.events == []


def test_events_built_by_hand_keep_working() -> None:
    event = aiocop.SlowTaskEvent(1.0, 30.0, False, 0, "low", "cpu_blocking", [])
    assert event.blocking_events == [] and event.loop == "" and event.context == {}


@pytest.mark.parametrize(
    ("score", "elapsed_ms", "impact"),
    [
        (1, 0.05, "low"),
        (50, 1.1, "high"),
        (0, 45.0, "medium"),
        (0, 246.0, "high"),
        (10, 80.0, "high"),
        (10, 5, "medium"),
    ],
)
def test_impact_is_the_higher_of_the_calls_and_the_hold(score: int, elapsed_ms: float, impact: str) -> None:
    # The table of docs/concepts/severity.md, on events made by hand as 1.x's tests make them.
    level = aiocop.get_severity_level_from_score(score)
    event = aiocop.SlowTaskEvent(elapsed_ms, 30.0, elapsed_ms >= 30.0, score, level, "io_blocking", [])
    assert event.impact == impact
