"""Bad input: every public function rejects a bad argument at once, naming it (`aiocop._common.validate`).

One table, public function x bad value: each row says which exception the
call must raise and which argument its message must name. A bad call must
also change nothing (no half-applied configuration), and every public
callable that takes arguments must appear in the table (or say why not).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

import aiocop
import aiocop.structlog
from aiocop.asgi import AiocopMiddleware
from tests.conftest import reset_aiocop

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

NAN, INF = math.nan, math.inf


async def asgi_app(scope: Any, receive: Any, send: Any) -> None:
    pass


def event_callback(event: aiocop.SlowTaskEvent) -> None:
    pass


def provider() -> dict[str, object]:
    return {}


def two_arguments(a: object, b: object) -> None:
    pass


class NotAFunction:
    """An instance of a class without __call__."""


@dataclass(frozen=True)
class Row:
    """One public function called with one bad value."""

    function: str
    call: Callable[[Any], object]
    bad: Any
    error: type[Exception]
    names: str  # what the message must mention: the argument
    xfail: str = ""  # a known gap, in a module this test cannot fix


def rows(function: str, call: Callable[[Any], object], names: str, *cases: tuple[Any, type[Exception]]) -> list[Row]:
    return [Row(function, call, bad, error, names) for bad, error in cases]


def ms_cases(zero_ok: bool = False) -> tuple[tuple[Any, type[Exception]], ...]:
    """Bad values for a duration in ms that must be > 0 (or >= 0, where 1.x accepted 0)."""
    cases = ((0, ValueError), (-1, ValueError), (NAN, ValueError), (INF, ValueError), (-INF, ValueError),
             ("30", TypeError), (True, TypeError), (None, TypeError), ([30], TypeError))  # fmt: skip
    return tuple(c for c in cases if not (zero_ok and c[0] == 0 and c[0] is not True))


def count_cases(zero_ok: bool = False) -> tuple[tuple[Any, type[Exception]], ...]:
    """Bad values for a whole count that must be >= 1 (or >= 0)."""
    cases: list[tuple[Any, type[Exception]]] = [(-1, ValueError), (True, TypeError), (False, TypeError),
             (2.0, TypeError), ("5", TypeError), (None, TypeError), (NAN, TypeError)]  # fmt: skip
    if not zero_ok:
        cases.insert(0, (0, ValueError))
    return tuple(cases)


NOT_CALLABLE: tuple[tuple[Any, type[Exception]], ...] = (
    (None, TypeError),
    ("print", TypeError),
    (42, TypeError),
    (NotAFunction(), TypeError),
)


async def async_callback(event: Any) -> None:
    pass


async def async_generator_callback(event: Any) -> Any:
    yield event


def generator_callback(event: Any) -> Any:
    yield event


class AsyncCallable:
    async def __call__(self, event: Any) -> None:
        pass


async def async_provider() -> dict[str, Any]:
    return {}


# Callables aiocop would call and get nothing done: it calls callbacks synchronously.
NOT_PLAIN: tuple[tuple[Any, type[Exception]], ...] = (
    (async_callback, TypeError),
    (async_generator_callback, TypeError),
    (generator_callback, TypeError),
    (AsyncCallable(), TypeError),
)

RAW_EVENT = {"event_name": "open", "raw_args": ("f",), "raw_stack": [("app.py", 3, "main")], "severity": 10,
             "timestamp": 0.0}  # fmt: skip

api = aiocop  # short, for the table
TABLE: list[Row] = [
    # --- set-up ---
    *rows("start_blocking_io_detection", lambda v: api.start_blocking_io_detection(trace_depth=v), "trace_depth",
          *count_cases()),
    *rows("start_blocking_io_detection", api.start_blocking_io_detection, "trace_depth", (0, ValueError)),
    *rows("start_blocking_io_detection", lambda v: api.start_blocking_io_detection(delivery=v), "delivery",
          ("nowhere", ValueError), ("LOOP", ValueError), (None, ValueError), (["loop"], ValueError)),
    *rows("start_blocking_io_detection", lambda v: api.start_blocking_io_detection(patch=v), "patch",
          ("no", TypeError), (0, TypeError), (None, TypeError)),
    *rows("start_blocking_io_detection", lambda v: api.start_blocking_io_detection(max_events_per_step=v),
          "max_events_per_step", *count_cases()),
    *rows("detect_slow_tasks", lambda v: api.detect_slow_tasks(threshold_ms=v, cpu_sampling=False), "threshold_ms",
          *ms_cases(zero_ok=True)),
    *rows("detect_slow_tasks", lambda v: api.detect_slow_tasks(30, on_slow_task=v, cpu_sampling=False),
          "on_slow_task", *NOT_CALLABLE[1:], (provider, TypeError), (two_arguments, TypeError)),
    *rows("detect_slow_tasks", lambda v: api.detect_slow_tasks(cpu_sampling=v), "cpu_sampling",
          ("yes", TypeError), (1, TypeError), (None, TypeError)),
    *rows("start_cpu_sampling", lambda v: api.start_cpu_sampling(interval_ms=v), "interval_ms", *ms_cases()),
    *rows("start_cpu_sampling", lambda v: api.start_cpu_sampling(arm_after_ms=v), "arm_after_ms",
          *[c for c in ms_cases(zero_ok=True) if c[0] is not None]),
    *rows("start_cpu_sampling", lambda v: api.start_cpu_sampling(idle_interval_ms=v), "idle_interval_ms",
          *[c for c in ms_cases() if c[0] is not None], (1e13, ValueError)),
    *rows("start_cpu_sampling", lambda v: api.start_cpu_sampling(interval_ms=v), "interval_ms", (1e13, ValueError)),
    *rows("start_cpu_sampling", lambda v: api.start_cpu_sampling(arm_after_ms=v), "arm_after_ms", (1e13, ValueError)),
    *rows("start_cpu_sampling", lambda v: api.start_cpu_sampling(max_samples_per_slice=v), "max_samples_per_slice",
          *count_cases()),
    *rows("start_cpu_sampling", lambda v: api.start_cpu_sampling(trace_depth=v), "trace_depth", *count_cases()),
    *rows("start_cpu_sampling", lambda v: api.start_cpu_sampling(precise_idle=v), "precise_idle",
          ("yes", TypeError), (1, TypeError), (0.0, TypeError)),
    # --- raising, scopes ---
    *rows("enable_raise_on_violations", lambda v: api.enable_raise_on_violations(level=v), "level",
          ("extreme", ValueError), ("HIGH", ValueError), (50, TypeError), (None, TypeError), (["high"], TypeError)),
    *rows("raise_on_violations", api.raise_on_violations(), "raise_on_violations",
          (None, TypeError), (3, TypeError)),
    *rows("monitored", lambda v: api.monitored(enabled=v), "enabled",
          (1, TypeError), ("no", TypeError), (None, TypeError), (event_callback, TypeError)),
    *rows("monitored", api.monitored(), "monitored", (None, TypeError), ("f", TypeError)),
    # --- allow rules ---
    *rows("allow_blocking", api.allow_blocking, "event",
          ("no.such.event", ValueError), (3, TypeError), (None, TypeError), (event_callback, TypeError)),
    *rows("allow_blocking", lambda v: api.allow_blocking(module=v), "module", ("", TypeError), (3, TypeError)),
    *rows("allow_blocking", lambda v: api.allow_blocking(path=v), "path", ("", TypeError), (b"/app", TypeError)),
    *rows("allow_blocking", lambda v: api.allow_blocking(call_site=v), "call_site",
          ("no-colon", ValueError), ("file.py:", ValueError), (":func", ValueError), (3, TypeError)),
    *rows("allow_blocking", api.allow_blocking(), "allow_blocking", (None, TypeError), (3, TypeError)),
    *rows("add_allow_rule", api.add_allow_rule, "event",
          ("no.such.event", ValueError), (3, TypeError), (["open"], TypeError), (None, TypeError)),
    *rows("add_allow_rule", lambda v: api.add_allow_rule(module=v), "module", ("", TypeError), (3, TypeError)),
    *rows("add_allow_rule", lambda v: api.add_allow_rule(path=v), "path", ("", TypeError), (3, TypeError)),
    *rows("add_allow_rule", lambda v: api.add_allow_rule(call_site=v), "call_site", ("nope", ValueError)),
    *rows("add_allow_rule", lambda v: api.add_allow_rule(api.AllowRule(everything=True), module=v), "AllowRule",
          ("myapp", TypeError)),
    # A rule that says nothing would allow every call: refused; allowing everything is spelled out.
    *rows("add_allow_rule", lambda v: api.add_allow_rule(*v), "everything=True", ((), ValueError)),
    *rows("add_allow_rule", lambda v: api.add_allow_rule(everything=v), "everything",
          ("yes", TypeError), (1, TypeError), (None, TypeError)),
    *rows("add_allow_rule", lambda v: api.add_allow_rule("open", everything=v), "no other field", (True, ValueError)),
    *rows("allow_blocking", lambda v: api.allow_blocking(everything=v), "everything", ("yes", TypeError)),
    *rows("AllowRule", lambda v: api.AllowRule(events=v), "everything=True", ((), ValueError), (set(), ValueError)),
    *rows("AllowRule", lambda v: api.AllowRule(everything=v), "everything", ("yes", TypeError), (0, TypeError)),
    *rows("remove_allow_rule", api.remove_allow_rule, "rule",
          ("open", TypeError), (None, TypeError), (3, TypeError)),
    *rows("AllowRule", lambda v: api.AllowRule(events=v), "events",
          ("open", TypeError), (None, TypeError), (3, TypeError), ([3], TypeError), (["no.such.event"], ValueError),
          ([["open"]], TypeError)),
    *rows("AllowRule", lambda v: api.AllowRule(module=v), "module", ("", TypeError), (3, TypeError)),
    *rows("AllowRule", lambda v: api.AllowRule(call_site=v), "call_site", ("x", ValueError), (3, TypeError)),
    # --- the rules table ---
    *rows("register_blocking_event", api.register_blocking_event, "event",
          ("", ValueError), (None, TypeError), (3, TypeError), (b"open", TypeError), (("open",), TypeError)),
    *rows("register_blocking_event", lambda v: api.register_blocking_event("myapp.call", weight=v), "weight",
          *count_cases(zero_ok=True), (1.5, TypeError), (INF, TypeError)),
    *rows("unregister_blocking_event", api.unregister_blocking_event, "event",
          ("", ValueError), (None, TypeError), (3, TypeError)),
    *rows("unregister_blocking_event", api.unregister_blocking_event, "no.such.event",
          ("no.such.event", KeyError)),
    *rows("patch_audit_functions", lambda v: api.patch_audit_functions(exclude=v), "target",
          (["os.nothing"], ValueError)),
    *rows("patch_audit_functions", lambda v: api.patch_audit_functions(exclude=v), "exclude", ("os.stat", TypeError)),
    *[Row("patch_audit_functions", lambda v: api.patch_audit_functions(exclude=v), bad, TypeError, "exclude")
      for bad in (None, 3)],
    # --- callbacks and providers ---
    *rows("register_slow_task_callback", api.register_slow_task_callback, "callback",
          *NOT_CALLABLE, (provider, TypeError), (two_arguments, TypeError), *NOT_PLAIN),
    *rows("detect_slow_tasks", lambda v: api.detect_slow_tasks(30, on_slow_task=v, cpu_sampling=False),
          "on_slow_task", *NOT_PLAIN),
    *rows("register_context_provider", api.register_context_provider, "provider",
          *NOT_CALLABLE, (event_callback, TypeError), (async_provider, TypeError)),
    *rows("AiocopMiddleware", lambda v: AiocopMiddleware(asgi_app, sampler=v), "sampler", *NOT_PLAIN),
    # --- severity helpers ---
    *rows("calculate_io_severity_score", api.calculate_io_severity_score, "blocking_events",
          (3, TypeError), ("open", TypeError), ([1, 2], TypeError), ([None], TypeError)),
    *rows("get_severity_level_from_score", api.get_severity_level_from_score, "score",
          ("50", TypeError), (None, TypeError), (True, TypeError), (NAN, ValueError)),
    *[Row("format_blocking_event", api.format_blocking_event, bad, TypeError, "raw_event")
      for bad in (None, {}, {"event_name": "open"})],
    *[Row("format_blocking_event", api.format_blocking_event, {**RAW_EVENT, key: bad}, TypeError, f"['{key}']")
      for key, bad in (("raw_stack", [1, 2]), ("raw_stack", 3), ("raw_args", 5), ("event_name", 7))],
    # --- logging ---
    *rows("log_events", lambda v: api.log_events(level=v), "level",
          ("loud", ValueError), (-1, ValueError), (None, TypeError), (True, TypeError), (2.5, TypeError)),
    *rows("log_events", lambda v: api.log_events(logger=v), "logger", (3, TypeError), (print, TypeError)),
    *rows("log_events", lambda v: api.log_events(repeat_interval_s=v), "repeat_interval_s",
          (-5, ValueError), (NAN, ValueError), (INF, ValueError), ("60", TypeError), (None, TypeError)),
    *rows("LoggingCallback", lambda v: api.LoggingCallback(level=v), "level", ("loud", ValueError)),
    *rows("LoggingCallback", lambda v: api.LoggingCallback(repeat_interval_s=v), "repeat_interval_s",
          (-1, ValueError), (True, TypeError)),
    *rows("structlog.log_events", lambda v: aiocop.structlog.log_events(level=v), "level",
          ("loud", ValueError), ("WARNING", ValueError), (30, TypeError), (None, TypeError)),
    *rows("structlog.log_events", lambda v: aiocop.structlog.log_events(logger=v), "logger",
          (3, TypeError), (logging.getLogger("x").handlers, TypeError)),
    *rows("structlog.log_events", lambda v: aiocop.structlog.log_events(repeat_interval_s=v), "repeat_interval_s",
          (-1, ValueError), (NAN, ValueError), ("1", TypeError)),
    *rows("structlog.StructlogCallback", lambda v: aiocop.structlog.StructlogCallback(level=v), "level",
          ("trace", ValueError)),
    # --- project configuration ---
    *rows("load_config", aiocop.load_config, "path", (3, TypeError), (b"pyproject.toml", TypeError),
          ("/nonexistent/pyproject.toml", aiocop.ConfigError)),
    *rows("configure", aiocop.configure, "path", (3, TypeError), ("/nonexistent/pyproject.toml", aiocop.ConfigError)),
    # --- ASGI middleware ---
    *rows("AiocopMiddleware", AiocopMiddleware, "app",
          (None, TypeError), ("app", TypeError), (event_callback, TypeError)),
    *rows("AiocopMiddleware", lambda v: AiocopMiddleware(asgi_app, sample_rate=v), "sample_rate",
          (1.5, ValueError), (-0.1, ValueError), (NAN, ValueError), (INF, ValueError), ("0.5", TypeError),
          (True, TypeError)),
    *rows("AiocopMiddleware", lambda v: AiocopMiddleware(asgi_app, sampler=v), "sampler",
          (0.5, TypeError), ("x", TypeError), (provider, TypeError), (two_arguments, TypeError)),
    *rows("AiocopMiddleware", lambda v: AiocopMiddleware(asgi_app, request_id_header=v), "request_id_header",
          ("", ValueError), ("x id", ValueError), (b"x-id", TypeError), (3, TypeError)),
]  # fmt: skip


def _param(row: Row) -> Any:
    marks = [pytest.mark.xfail(strict=True, reason=row.xfail)] if row.xfail else []
    bad = re.sub(r" at 0x[0-9a-f]+", "", repr(row.bad))  # ids the same in every process (pytest-xdist)
    return pytest.param(row, id=f"{row.function}-{row.names}={bad}"[:80], marks=marks)


@pytest.fixture(autouse=True)
def clean_state() -> Iterator[None]:
    """A rejected call must change nothing; whatever a test did is undone for the next."""
    yield
    reset_aiocop()


@pytest.mark.parametrize("row", [_param(row) for row in TABLE])
def test_bad_argument_is_rejected_naming_it(row: Row) -> None:
    with pytest.raises(row.error) as raised:
        row.call(row.bad)
    assert type(raised.value) is row.error, f"{type(raised.value).__name__}: {raised.value}"
    message = str(raised.value)
    assert row.names in message, f"the message does not name {row.names!r}: {message}"


# Public callables that take no arguments, are types or records users rarely
# build, or are lenient on purpose: each with the reason it is not in TABLE.
NOT_IN_TABLE = {
    "activate": "no arguments",
    "deactivate": "no arguments",
    "stop": "no arguments",
    "clear_allow_rules": "no arguments",
    "clear_context_providers": "no arguments",
    "clear_slow_task_callbacks": "no arguments",
    "disable_raise_on_violations": "no arguments",
    "get_allow_rules": "no arguments",
    "get_blocking_events_dict": "no arguments",
    "get_patched_functions": "no arguments",
    "get_slow_task_threshold_ms": "no arguments",
    "is_cpu_sampling_started": "no arguments",
    "is_monitored": "no arguments",
    "is_monitoring_active": "no arguments",
    "is_raise_on_violations_enabled": "no arguments",
    "reset_blocking_event_table": "no arguments",
    "reset_blocking_events": "no arguments; outside a step there is nothing to forget (as in 1.x)",
    "unregister_slow_task_callback": "removing what was never registered is a no-op, as in 1.x",
    "unregister_context_provider": "removing what was never registered is a no-op, as in 1.x",
    "BlockingCall": "a record of the rules table, read by the docs generator, not built by users",
    "BlockingEventInfo": "a TypedDict: event data aiocop produces",
    "CpuStackSample": "a TypedDict: event data aiocop produces",
    "RawBlockingEvent": "a TypedDict: event data aiocop produces",
    "SlowTaskEvent": "a frozen dataclass of event data, built by aiocop (users build them by hand in tests)",
    "HighSeverityBlockingIoException": "an exception aiocop raises",
    "ConfigError": "an exception aiocop raises",
    "ProjectConfig": (
        "a frozen dataclass load_config() builds from a checked table (tests/configuration/test_config.py)"
    ),
    "ContextProvider": "a type alias",
    "SlowTaskCallback": "a type alias",
    "IoSeverityLevel": "a type alias",
}


def test_every_public_callable_with_arguments_is_in_the_table() -> None:
    tested = {row.function for row in TABLE}
    missing = []
    for name in aiocop.__all__:
        value = getattr(aiocop, name)
        if not callable(value) or name in NOT_IN_TABLE or name in tested:
            continue
        missing.append(name)
    assert not missing, f"public callables with no bad-input row: {missing}"
    for name in NOT_IN_TABLE:
        assert name in aiocop.__all__, f"{name} is not public any more: drop it from NOT_IN_TABLE"
    for name, reason in NOT_IN_TABLE.items():
        value = getattr(aiocop, name)
        if reason == "no arguments":
            assert not inspect.signature(value).parameters, f"{name} takes arguments now: add rows for them"


def test_a_rejected_set_up_call_changes_nothing() -> None:
    assert aiocop.get_slow_task_threshold_ms() == 30.0
    with pytest.raises(TypeError, match="on_slow_task"):
        aiocop.detect_slow_tasks(threshold_ms=5, on_slow_task="print", cpu_sampling=False)  # type: ignore[arg-type]
    assert aiocop.get_slow_task_threshold_ms() == 30.0
    assert not aiocop.is_cpu_sampling_started()
    with pytest.raises(TypeError, match="patch"):
        aiocop.start_blocking_io_detection(trace_depth=3, patch="yes")  # type: ignore[arg-type]
    assert not aiocop.is_monitoring_active()
    assert aiocop.get_patched_functions() == []
    with pytest.raises(ValueError, match="max_samples_per_slice"):
        aiocop.start_cpu_sampling(interval_ms=1, max_samples_per_slice=0)
    assert not aiocop.is_cpu_sampling_started()
    with pytest.raises(TypeError, match="weight"):
        aiocop.register_blocking_event("myapp.call", weight=True)
    assert "myapp.call" not in aiocop.get_blocking_events_dict()
    with pytest.raises(ValueError, match=r"no\.such\.event"):
        aiocop.add_allow_rule("open", "no.such.event")
    assert aiocop.get_allow_rules() == []


def test_good_values_next_to_the_bad_ones_are_accepted() -> None:
    """The edges of each range are valid: the checks reject only what they must."""
    aiocop.start_blocking_io_detection(trace_depth=1, max_events_per_step=1, patch=False, delivery="thread")
    aiocop.start_blocking_io_detection()
    aiocop.detect_slow_tasks(threshold_ms=0.001, on_slow_task=print, cpu_sampling=False)
    aiocop.detect_slow_tasks(threshold_ms=10**9, on_slow_task=lambda *events: None, cpu_sampling=False)

    def with_an_optional_extra(event: aiocop.SlowTaskEvent, extra: object = None) -> None:
        pass

    aiocop.register_slow_task_callback(with_an_optional_extra)
    aiocop.register_context_provider(lambda **optional: None)
    aiocop.register_blocking_event("myapp.call", weight=0)
    aiocop.unregister_blocking_event("myapp.call")
    assert aiocop.get_severity_level_from_score(50.0) == "high"  # type: ignore[arg-type]  # a float, past 1.x's int
    assert aiocop.calculate_io_severity_score(None) == 0
    assert aiocop.calculate_io_severity_score(iter([{"severity": 1}])) == 1
    rule = aiocop.add_allow_rule(aiocop.AllowRule(events=("open",)))  # type: ignore[arg-type]  # any iterable
    aiocop.remove_allow_rule(rule)
    aiocop.remove_allow_rule(rule)  # removing twice is a no-op
    aiocop.log_events(level=0, repeat_interval_s=0)
    aiocop.log_events(level="debug", repeat_interval_s=1e9)
    aiocop.structlog.log_events(level="critical", repeat_interval_s=0)
    AiocopMiddleware(asgi_app, sample_rate=0, sampler=lambda scope: None)
    AiocopMiddleware(asgi_app, sample_rate=1.0, request_id_header=None)

    @aiocop.monitored(False)
    @aiocop.raise_on_violations()
    @aiocop.allow_blocking()
    async def decorated() -> int:
        return 1

    assert asyncio.run(decorated()) == 1


@pytest.mark.parametrize("make", [lambda: aiocop.monitored(False), aiocop.raise_on_violations, aiocop.allow_blocking])
def test_leaving_a_scope_it_never_entered_is_a_clear_error(make: Callable[[], Any]) -> None:
    """The API used from the wrong place: `__exit__` without `__enter__`, or in another task."""
    scope = make()
    with pytest.raises(RuntimeError, match=type(scope).__name__):
        scope.__exit__(None, None, None)

    async def main() -> None:
        scope.__enter__()
        await asyncio.create_task(leave())

    async def leave() -> None:
        scope.__exit__(None, None, None)

    with pytest.raises(RuntimeError, match=type(scope).__name__):
        asyncio.run(main())


@pytest.mark.parametrize(
    ("call", "suggestion"),
    [
        (lambda: aiocop.AllowRule(events=frozenset({"os.stats"})), "(did you mean 'os.stat'?)"),
        (lambda: aiocop.allow_blocking("time.slep"), "(did you mean 'time.sleep'?)"),
        (lambda: aiocop.unregister_blocking_event("subprocess.popen"), "(did you mean 'subprocess.Popen'?)"),
    ],
)
def test_a_mistyped_event_name_gets_a_suggestion(call: Callable[[], object], suggestion: str) -> None:
    with pytest.raises((ValueError, KeyError)) as raised:
        call()
    assert suggestion in str(raised.value)


def test_a_name_like_no_event_gets_no_suggestion() -> None:
    with pytest.raises(ValueError, match="unknown event 'zzz'") as raised:
        aiocop.AllowRule(events=frozenset({"zzz"}))
    assert "did you mean" not in str(raised.value)
