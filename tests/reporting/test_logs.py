"""Logging integrations: standard logging, structlog, and the per-call-site rate limit."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import structlog
from structlog.testing import capture_logs

import aiocop
import aiocop.structlog
from aiocop._reporting.logs import CallSiteLimiter
from tests.conftest import SLOW_CALLBACK_WARNING, Collector, run_on
from tests.stalls.test_watchdog import only_event, timed_stall, watchdog  # noqa: F401 - fixture
from tests.support import stalls

ROOT = Path(__file__).resolve().parents[2]


async def stat_in_a_loop(times: int) -> None:
    for _ in range(times):
        os.stat(".")  # the hot blocking call
        await asyncio.sleep(0)


def make_event(site: str = "app.py:1:f", name: str = "open", elapsed_ms: float = 1.0) -> aiocop.SlowTaskEvent:
    call: aiocop.BlockingEventInfo = {
        "event": f"{name}()",
        "trace": site,
        "entry_point": site,
        "severity": 10,
        "name": name,
        "args": "",
        "frames": [],
    }
    return aiocop.SlowTaskEvent(elapsed_ms, 30.0, False, 10, "medium", "io_blocking", [call])


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_limiter_logs_first_then_once_per_interval_with_counts() -> None:
    clock = FakeClock()
    limiter = CallSiteLimiter(interval_s=60, clock=clock)
    first = limiter.check(make_event())
    assert first is not None
    assert first.first
    assert [limiter.check(make_event(elapsed_ms=ms)) for ms in (5.0, 9.0, 2.0)] == [None, None, None]
    assert limiter.check(make_event(site="other.py:2:g")) is not None  # its own first time
    assert limiter.check(make_event(name="os.stat")) is not None  # another event at the same site
    clock.now += 61
    later = limiter.check(make_event())
    assert later is not None
    assert (later.first, later.repeated, later.worst_ms) == (False, 3, 9.0)
    assert limiter.check(make_event()) is None  # a new interval began


def test_limiter_forgets_the_least_recently_seen_site_beyond_its_bound() -> None:
    limiter = CallSiteLimiter(interval_s=60, max_sites=2)
    for site in ("a.py:1:f", "b.py:1:f", "a.py:1:f", "c.py:1:f"):
        limiter.check(make_event(site=site))
    first_again = limiter.check(make_event(site="b.py:1:f"))
    assert first_again is not None
    assert first_again.first, "b was evicted (a was seen more recently)"
    assert limiter.check(make_event(site="c.py:1:f")) is None


def test_limiter_with_zero_interval_passes_everything() -> None:
    limiter = CallSiteLimiter(interval_s=0)
    assert all(limiter.check(make_event()) is not None for _ in range(5))


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"interval_s": -1}, ValueError, "repeat_interval_s must be >= 0"),
        ({"interval_s": "1"}, TypeError, "repeat_interval_s must be a number of seconds, not str"),
        ({"max_sites": 0}, ValueError, "max_sites must be >= 1"),
        ({"max_sites": 2.0}, TypeError, "max_sites must be an int"),
    ],
)
def test_limiter_rejects_bad_settings(kwargs: dict[str, object], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        CallSiteLimiter(**kwargs)  # type: ignore[arg-type]


def test_stdlib_logging_first_in_full_then_quiet(
    detector: Collector, loop_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    callback = aiocop.log_events()
    with caplog.at_level(logging.WARNING, logger="aiocop.events"):
        run_on(loop_name, stat_in_a_loop(20))
    assert len(detector.events) == 20, "every occurrence was reported to callbacks"
    records = [r for r in caplog.records if r.name == "aiocop.events"]
    assert len(records) == 1, [r.getMessage() for r in records]
    message = records[0].getMessage()
    assert message.startswith("aiocop: blocking call os.stat at tests/reporting/test_logs.py:")
    assert 'os.stat(".")  # the hot blocking call' in message, "the source line is shown"
    assert "trace:" in message
    data = records[0].aiocop  # type: ignore[attr-defined]
    assert data["call_site"].endswith(":stat_in_a_loop")
    assert data["blocking_calls"][0]["event"] == "os.stat"
    assert data["severity_level"] == "low"
    aiocop.unregister_slow_task_callback(callback)


def test_stdlib_logging_every_event_with_zero_interval(
    detector: Collector, loop_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    aiocop.log_events("myapp.blocking", level="error", repeat_interval_s=0)
    with caplog.at_level(logging.ERROR, logger="myapp.blocking"):
        run_on(loop_name, stat_in_a_loop(3))
    records = [r for r in caplog.records if r.name == "myapp.blocking"]
    assert [r.levelno for r in records] == [logging.ERROR] * 3
    assert "trace:" in records[0].getMessage()
    assert "trace:" not in records[1].getMessage(), "repeats are one line"
    assert records[1].aiocop["repeated"] == 0  # type: ignore[attr-defined]


def test_stdlib_logging_of_a_stall(
    watchdog: Collector,  # noqa: F811 - the fixture
    loop_name: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    aiocop.log_events()
    with caplog.at_level(logging.WARNING, logger="aiocop.events"):
        run_on(loop_name, timed_stall(stalls.spin))
        only_event(watchdog)
    (record,) = [r for r in caplog.records if r.name == "aiocop.events"]
    assert record.getMessage().startswith("aiocop: loop stalled")
    assert "stalls.py:" in record.getMessage()
    assert record.aiocop["reason"] == "cpu_blocking"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"level": "loud"}, ValueError, "level must be a logging level"),
        ({"logger": 3}, TypeError, "logger must be a logging.Logger"),
        ({"repeat_interval_s": -5}, ValueError, "repeat_interval_s"),
    ],
)
def test_log_events_rejects_bad_arguments(kwargs: dict[str, object], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        aiocop.log_events(**kwargs)  # type: ignore[arg-type]
    with pytest.raises((TypeError, ValueError)):
        aiocop.structlog.log_events(**{k: v for k, v in kwargs.items() if k != "level"}, level="loud")  # type: ignore[arg-type]


def test_structlog_one_entry_per_call_site(detector: Collector, loop_name: str) -> None:
    aiocop.register_context_provider(lambda: {"http_path": "/items"})
    callback = aiocop.structlog.log_events(repeat_interval_s=60)
    with capture_logs() as entries:
        run_on(loop_name, stat_in_a_loop(10))
    assert len(detector.events) == 10
    (entry,) = entries
    assert entry["event"] == "aiocop.blocking_call"
    assert entry["log_level"] == "warning"
    assert entry["blocking_event"] == "os.stat"
    assert entry["call_site"].startswith("tests/reporting/test_logs.py:")
    assert entry["call_site"].endswith(":stat_in_a_loop")
    assert entry["severity"] == "low"
    # One quick os.stat per step: impact low, unless a busy machine kept that
    # step past the slow-task threshold, when its length ranks it (the entry
    # is the first event's; its impact is the event's, however it came out).
    first = detector.events[0]
    assert entry["duration_ms"] == pytest.approx(first.elapsed_ms, abs=0.001) and entry["impact"] == first.impact
    if first.elapsed_ms < first.threshold_ms:
        assert entry["impact"] == "low"
    assert entry["task"] is not None
    assert entry["thread"] == "MainThread"
    assert entry["duration_ms"] >= 0
    assert "stat_in_a_loop" in entry["trace"]
    assert entry["http_path"] == "/items", "context providers' keys are top-level fields"
    aiocop.unregister_slow_task_callback(callback)


def test_structlog_entry_with_a_context_key_named_event(detector: Collector, loop_name: str) -> None:
    aiocop.register_context_provider(lambda: {"event": "checkout", "http_path": "/items"})
    callback = aiocop.structlog.log_events()
    with capture_logs() as entries:
        run_on(loop_name, stat_in_a_loop(1))
    assert [(e["event"], e["http_path"]) for e in entries] == [("aiocop.blocking_call", "/items")]
    aiocop.unregister_slow_task_callback(callback)


def test_structlog_repeats_carry_a_count(detector: Collector, loop_name: str) -> None:
    callback = aiocop.structlog.StructlogCallback(structlog.get_logger("custom"), level="error", repeat_interval_s=0)
    aiocop.register_slow_task_callback(callback)
    with capture_logs() as entries:
        run_on(loop_name, stat_in_a_loop(3))
    assert [(e["log_level"], "trace" in e, e.get("repeated")) for e in entries] == [
        ("error", True, None),
        ("error", False, 0),
        ("error", False, 0),
    ]


def test_structlog_counts_what_it_did_not_log(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    callback = aiocop.structlog.StructlogCallback(repeat_interval_s=10)
    monkeypatch.setattr(callback.limiter, "_clock", clock)
    with capture_logs() as entries:
        for _ in range(4):
            callback(make_event())
        clock.now += 11
        callback(make_event())
    assert [e.get("repeated") for e in entries] == [None, 3]


def test_logging_never_blocks_detection_of_the_next_step(detector: Collector, loop_name: str) -> None:
    # The callback's own file writes (a logging handler) run on the loop
    # thread during delivery: they must not be reported as blocking calls.
    handler = logging.FileHandler(os.devnull)
    log = logging.getLogger("aiocop.test_file")
    log.addHandler(handler)
    log.propagate = False
    try:
        aiocop.log_events(log, repeat_interval_s=0)
        run_on(loop_name, stat_in_a_loop(3))
    finally:
        log.removeHandler(handler)
        handler.close()
    assert detector.names() == ["os.stat"] * 3


def run_example(name: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, f"examples/{name}"], capture_output=True, text=True, cwd=ROOT, timeout=60, check=True
    )


def test_logging_example_runs_as_documented() -> None:
    done = run_example("log_with_logging.py")
    lines = [line for line in (done.stdout + done.stderr).splitlines() if not SLOW_CALLBACK_WARNING.fullmatch(line)]
    # (A busy machine can keep a step of the loop's off the CPU past the
    # threshold: a stall, logged at its own site, is not one of the example's.)
    headlines = [
        line
        for line in lines
        if line.startswith("WARNING aiocop.events aiocop:")
        and not line.startswith("WARNING aiocop.events aiocop: loop stalled ")
    ]
    assert len(headlines) == 3, lines
    first_open, sleep, later_open = headlines
    assert "blocking call open at examples/log_with_logging.py:" in first_open
    assert "blocking call time.sleep" in sleep
    assert later_open.endswith("ms]")
    assert "[+19 more since the last entry" in later_open, "the 2nd batch's 10 and the 3rd's 9 others"
    assert any("data = Path(__file__).read_bytes()" in line for line in lines), "the source line is shown"


def test_structlog_example_runs_as_documented() -> None:
    done = run_example("log_with_structlog.py")
    # structlog's entries on stdout; on stderr at most the warning of a
    # callback a busy machine slowed (seen in CI, load 10 on two cores).
    assert all(SLOW_CALLBACK_WARNING.fullmatch(line) for line in done.stderr.splitlines()), done.stderr
    entries = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(e["event"], e["blocking_event"], e["http_path"], e["level"]) for e in entries] == [
        ("aiocop.blocking_call", "os.stat", "/items", "warning")
    ], "three requests, one call site: one entry"
    assert entries[0]["call_site"].startswith("examples/log_with_structlog.py:")


def test_log_events_again_replaces_the_previous_callback(detector: Collector, loop_name: str) -> None:
    first = aiocop.log_events("aiocop.first", repeat_interval_s=0)
    second = aiocop.log_events("aiocop.second", repeat_interval_s=0)
    structlog_first = aiocop.structlog.log_events()
    structlog_second = aiocop.structlog.log_events()
    registered = aiocop._model.callbacks.registered()
    assert first not in registered
    assert structlog_first not in registered
    assert [c for c in registered if c in (second, structlog_second)] == [second, structlog_second]


def test_a_site_first_seen_while_the_logger_is_disabled_is_logged_in_full_later(
    caplog: pytest.LogCaptureFixture,
) -> None:
    callback = aiocop.LoggingCallback("aiocop.toggle", level="warning")
    with caplog.at_level(logging.ERROR, logger="aiocop.toggle"):
        callback(make_event())  # WARNING disabled: nothing logged, and the site not used up
    with caplog.at_level(logging.WARNING, logger="aiocop.toggle"):
        callback(make_event())
    (record,) = [r for r in caplog.records if r.name == "aiocop.toggle"]
    assert "trace:" in record.getMessage(), "the first entry logged is the full one"
