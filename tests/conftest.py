"""Shared fixtures: every supported event loop, and a clean detector per test."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import pytest

import aiocop
from aiocop._interception import hook as _hook
from aiocop._model import state as _state
from aiocop._stalls.settings import sampling
from tests.support import cpu_waits

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Iterator

pytest_plugins = ("pytester",)
ALL_LOOP_NAMES = ("asyncio", "uvloop", "winloop", "rloop", "veloxloop")


def _loops_asked() -> tuple[str, ...]:
    # AIOCOP_TEST_LOOPS=asyncio,uvloop runs the loop-parametrised tests on those
    # loops only (CI runs every loop on two Pythons and a subset on the others,
    # to stay within its time; the header of each run says which).
    text = os.environ.get("AIOCOP_TEST_LOOPS", "").strip()
    if not text:
        return ALL_LOOP_NAMES
    names = tuple(name.strip() for name in text.split(","))
    unknown = [name for name in names if name not in ALL_LOOP_NAMES]
    if unknown or not names:
        raise pytest.UsageError(
            f"AIOCOP_TEST_LOOPS={text!r}: unknown loop(s) {unknown}; expected a comma-separated subset of "
            f"{', '.join(ALL_LOOP_NAMES)}"
        )
    return names


LOOP_NAMES = _loops_asked()


# Which tests rest on what (issue 36): `make test` runs the deterministic tests
# first, then the `timing` ones on their own, each re-run once on failure and
# the re-runs listed at the end; CI runs the `cost`, `integration` and `repo`
# tests once, on CPython 3.12. A module listed here (by its path under tests/,
# as `module_key` names it) has its every test marked; a test elsewhere
# carries the marker itself.
#
# timing: the outcome rests on real time (the watchdog noticing a stall and
#   timing it, a hang reported while it lasts, the loop-delay probe's ticks):
#   sized well past their thresholds, but a machine that starves a thread
#   for tens of milliseconds can still move them.
TIMING_MODULES = frozenset(
    {
        "common/test_clock",
        "stalls/test_gil_catalogue",
        "stalls/test_gil_stalls",
        "stalls/test_concurrency",
        "reporting/test_worker",
        "reporting/test_hangs",
        "api/test_monitored",
        "integrations/test_opentelemetry",
        "stalls/test_rloop_race",
        "api/test_setup_races",
        "api/test_soak",
        "stalls/test_stall_after_io",
        "stalls/test_tripwire",
        "stalls/test_discovery",
        "stalls/test_waits",
        "stalls/test_watchdog",
    }
)
# Tests of other modules whose outcome rests on the watchdog seeing a stall in
# real time (found by running the rest with the machine 8 times oversubscribed).
TIMING_TESTS = frozenset(
    {
        "test_a_stall_inside_a_library_is_reported_at_the_application_line",  # reporting/test_app_line.py
        # interception/test_trio_runs.py:
        "test_a_spinning_trio_task_is_a_stall_at_its_line_and_work_off_the_loop_is_none",
        "test_a_hung_trio_run_is_reported_while_it_hangs",
        "test_a_blocking_call_that_stalls_a_trio_run_is_one_event",
        "test_a_spinning_test_on_trio_fails_as_a_stall",  # integrations/test_pytest_plugin.py
        "test_a_trio_program_with_a_stall",  # commands/test_cli.py
        "test_stalls_follow_the_request_sampling",  # integrations/test_asgi.py
        "test_stall_in_the_last_step_of_a_request_follows_its_sampling",
        "test_unsampled_stall_in_a_task_marked_watched_is_not_reported",
        "test_stall_events_carry_the_request",
        "test_watchdog_busy_cost_runs_and_checks_its_events",  # test_benchmarks.py
        "test_the_demo_catches_every_planted_call",  # commands/test_cli.py
        # configuration/test_config.py: no stall row (500 ms)
        "test_the_cli_shows_one_row_per_cause_at_the_applications_lines",
        "test_a_blocking_step_of_a_loop_started_before_detection_is_one_event",  # api/test_compat_1x.py
        "test_deactivate_pauses_stall_reports_too",
        "test_stalls_without_samples_and_zero_settings",
        "test_a_slow_callback_does_not_feed_back_into_stall_reports",  # api/test_faults.py
        "test_html_embeds_the_tables_rows_and_timed_steps",  # reporting/test_html_report.py
        "test_stdlib_logging_of_a_stall",  # reporting/test_logs.py
        "test_an_sdk_error_while_recording_never_reaches_the_application",  # integrations/test_opentelemetry_errors.py
        "test_recording_errors_are_counted",
        "test_threshold_fails_stalls",  # integrations/test_pytest_plugin.py
        "test_other_event_loop",  # (a 150 ms spin on uvloop, failed once at load 10)
        "test_stall_of_a_loop_in_another_thread",
        "test_quickstart_example_prints_what_the_page_shows",  # test_docs.py: "running", not "waiting", when starved
        "test_prometheus_sums_the_workers_of_a_fleet",  # integrations/test_prometheus.py: stalls and a hang, scraped
        # commands/test_attach.py (3.14+): a target's sleep against attach's window
        "test_a_target_that_exits_during_the_window",
        "test_another_user_s_target_removes_its_folder_when_it_runs_the_script_late",
    }
)
# cost: instruction counts under valgrind, system calls under strace and the
#   benchmark suite run end to end: deterministic, but minutes of CPU each.
COST_MODULES = frozenset({"test_cost_guard", "test_syscall_guard", "test_benchmarks"})
# repo: reads the repository's own files and nothing else (the package's
#   layering from its source, the marker tables above): the same on every
#   Python, so CI runs them once, on 3.12, like lint (7 s of CPU a Python).
REPO_MODULES = frozenset({"test_layers"})
REPO_TESTS = frozenset(
    {
        # tests/test_markers.py (its loop runtime check runs a loop: everywhere)
        "test_every_module_named_in_a_marker_table_exists",
        "test_every_test_named_in_a_marker_table_exists_outside_the_modules_marked_whole",
    }
)
# integration: a real Prometheus server, a real browser, or the package registry.
INTEGRATION_MODULES = frozenset({"integrations/test_prometheus"})
INTEGRATION_TESTS = frozenset(
    {
        "test_report_renders_in_headless_chromium",  # tests/reporting/test_html_report.py
        "test_the_aiocop_1x_list_is_its_sdists",  # tests/interception/test_coverage_peers.py: pip download
        "test_the_wheel_holds_the_package_and_no_docs_rendering_code",  # test_packaging.py: pip builds the wheel
    }
)


T = TypeVar("T")
F = TypeVar("F", bound="Callable[..., Any]")


def bare_raise_on_violations(func: F) -> F:
    """`@aiocop.raise_on_violations` without parentheses, typed as what it returns: `func`, decorated.

    The class's `__new__` hands back the decorated function; mypy reads a
    class called as making an instance of it, and cannot be told otherwise.
    """
    return cast("F", aiocop.raise_on_violations(func))


# What aiocop may print on a starved machine that is no part of a program's
# own output: its slow-task callback, kept off the CPU, ran long enough to be
# named (once per run).
SLOW_CALLBACK_WARNING = re.compile(
    r"aiocop: slow-task callback .* ran for \d+ ms on the event loop's thread, .*Logged once\."
)


def per_attempt(request: pytest.FixtureRequest, runs: dict[int, T], make: Callable[[], T]) -> T:
    """What `make` returns, made once per attempt at the requesting test and shared by the module's tests.

    For a timing module's one program whose output several tests read: a
    module-scoped fixture would hand a re-run (pytest-rerunfailures keeps
    fixtures wider than a function) the very output that failed it. `runs`
    is the module's cache (a module-scoped fixture's dict): the first
    attempts share one run, each re-run gets a run of its own.
    """
    attempt = getattr(request.node, "execution_count", 1)  # set by pytest-rerunfailures: 2 on the re-run
    if attempt not in runs:
        runs[attempt] = make()
    return runs[attempt]


TESTS = Path(__file__).resolve().parent


def module_key(path: Path) -> str:
    """A test module as the tables above name it: its path under tests/, without `.py` (`stalls/test_watchdog`)."""
    path = path.resolve()
    if not path.is_relative_to(TESTS):  # a module pytester writes elsewhere
        return path.stem
    return path.relative_to(TESTS).with_suffix("").as_posix()


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        module = module_key(item.path)
        name = getattr(item, "originalname", None)
        if module in TIMING_MODULES or name in TIMING_TESTS:
            item.add_marker(pytest.mark.timing)
        if module in COST_MODULES:
            item.add_marker(pytest.mark.cost)
        if module in REPO_MODULES or name in REPO_TESTS:
            item.add_marker(pytest.mark.repo)
        if module in INTEGRATION_MODULES or name in INTEGRATION_TESTS:
            item.add_marker(pytest.mark.integration)


def pytest_report_header() -> str:
    left_out = [name for name in ALL_LOOP_NAMES if name not in LOOP_NAMES]
    if not left_out:
        return f"aiocop test loops: {', '.join(LOOP_NAMES)}"
    return f"aiocop test loops: {', '.join(LOOP_NAMES)} (AIOCOP_TEST_LOOPS; not run here: {', '.join(left_out)})"


def _fix_rloop_double_close() -> None:
    """Work around an rloop 0.5 bug for the test session.

    At the end of every run, rloop closes its self-pipe fds in Rust while the
    Python socket objects still own them, and those close the same numbers
    again when collected. If anything delays that collection (another thread
    holding the GIL, a sampler such as aiocop's watchdog, a debugger), the
    second close hits whatever reused the numbers: rloop's own epoll fd or the
    next run's self-pipe. Detaching the already-closed sockets removes the
    double close without changing anything else rloop does.
    """
    try:
        from rloop.loop import RLoop
    except ImportError:
        return
    original = RLoop._ssock_stop

    def _ssock_stop(self: Any) -> None:
        sockets = (self._ssock_r, self._ssock_w)
        original(self)
        for sock in sockets:
            if sock is not None:
                sock.detach()

    RLoop._ssock_stop = _ssock_stop


_fix_rloop_double_close()


# Threads of a loop's own runtime, written in Rust (their kernel names, cut
# to 15 characters): veloxloop runs its default executor on them, spinning
# (about 10 % of a core), and they end only when the loop object is freed:
# closing it is not enough.
_RUNTIME_THREADS = ("veloxloop-", "tokio-runtime")


def _runtime_threads() -> dict[str, str]:
    # Linux only: the kernel's list of this process's threads and their names.
    if sys.platform != "linux":
        return {}
    found = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm", encoding="utf-8") as f:
                name = f.read().strip()
        except OSError:  # ended meanwhile
            continue
        if name.startswith(_RUNTIME_THREADS):
            found[tid] = name
    return found


@pytest.fixture(autouse=True)
def _no_loop_runtime_left() -> Iterator[None]:
    """A test that leaves a loop's runtime threads running fails, naming them.

    Each pytest worker runs many tests in one process, and threads left
    running by one are there in every test after it: veloxloop's made the
    watchdog's tests of GIL holds fail on a busy machine (issue 37). They
    were left by aiocop's delivery thread, which held the last stall report
    it delivered, and so its task and closed loop, until the next. A thread
    is given two seconds to end after the test.
    """
    before = _runtime_threads()
    yield
    deadline = time.monotonic() + 2.0
    while (left := {tid: name for tid, name in _runtime_threads().items() if tid not in before}) and (
        time.monotonic() < deadline
    ):
        gc.collect()  # a closed loop that only a reference cycle still holds
        time.sleep(0.02)
    if left:
        pytest.fail(
            f"the test left {len(left)} thread(s) of a loop's runtime running: {sorted(set(left.values()))} "
            "(something still holds a closed loop: its threads end when it is freed)"
        )


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    if name == "asyncio":
        return asyncio.new_event_loop
    module = importlib.import_module(name)
    return module.new_event_loop  # type: ignore[no-any-return]


def _loop_param(name: str) -> Any:
    if name == "asyncio":
        return pytest.param(name, id=name)
    try:
        importlib.import_module(name)
    except ImportError as exc:  # shown in the -ra summary, never silent
        return pytest.param(name, id=name, marks=pytest.mark.skip(reason=f"{name} not installable here: {exc}"))
    return pytest.param(name, id=name)


@pytest.fixture(params=[_loop_param(n) for n in LOOP_NAMES])
def loop_name(request: pytest.FixtureRequest) -> str:
    return request.param  # type: ignore[no-any-return]


def xfail_on_veloxloop(request: pytest.FixtureRequest, loop_name: str) -> None:
    """For tests of context inheritance: veloxloop 0.2 runs tasks in the loop's context."""
    if loop_name == "veloxloop":
        request.applymarker(
            pytest.mark.xfail(
                strict=True,
                reason="veloxloop 0.2 does not copy the context into tasks it creates (no contextvar inheritance)",
            )
        )


@contextlib.contextmanager
def quiet_rloop(loop_name: str) -> Iterator[None]:
    """rloop 0.5 drops its self-pipe socketpair at the end of every
    run_until_complete() without closing it; that ResourceWarning is rloop's,
    not the code under test's. (Warning filters are process-wide: use this in
    the main thread around any thread that runs an rloop loop.)"""
    with warnings.catch_warnings():
        if loop_name == "rloop":
            warnings.simplefilter("ignore", ResourceWarning)
        yield


def run_on(loop_name: str, coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine on a new loop of the given kind, created now, then close it."""
    in_main = threading.current_thread() is threading.main_thread()
    with quiet_rloop(loop_name) if in_main else contextlib.nullcontext():
        loop = loop_factory(loop_name)()
        try:
            return loop.run_until_complete(coro)
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()


def run_until_it_stops_itself(loop_name: str, coro: Coroutine[Any, Any, Any]) -> None:
    """Run a task that calls loop.stop() itself (so the last step's delivery callback may never run)."""
    with quiet_rloop(loop_name):
        loop = loop_factory(loop_name)()
        try:
            loop.create_task(coro)
            loop.run_forever()
        finally:
            loop.close()


def run_probed(loop_name: str, coro: Coroutine[Any, Any, Any], record: Callable[[float], None]) -> Any:
    """`run_on`, with a loop-delay probe ticking every 50 ms whose ticks call `record`."""
    from aiocop._stalls.probe import DelayProbe

    probe = DelayProbe(0.05, record)
    probe.start()
    try:
        return run_on(loop_name, coro)
    finally:
        probe.stop()


def run_in_thread(loop_name: str, coro_fn: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    result: list[Any] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            with cpu_waits.counted():  # (for a timing test's tolerance: the thread's count ends with it)
                result.append(run_on(loop_name, coro_fn()))
        except BaseException as exc:
            errors.append(exc)

    with quiet_rloop(loop_name):
        thread = threading.Thread(target=target, name="loop-thread")
        thread.start()
        thread.join(30)
    if errors:
        raise errors[0]
    return result[0] if result else None


class Collector:
    """The SlowTaskEvents delivered to a callback during a test."""

    def __init__(self) -> None:
        self.events: list[aiocop.SlowTaskEvent] = []
        self._lock = threading.Lock()

    def __call__(self, event: aiocop.SlowTaskEvent) -> None:
        with self._lock:
            self.events.append(event)

    @property
    def calls(self) -> list[aiocop.BlockingEventInfo]:
        return [call for event in self.events for call in event.blocking_events]

    def names(self) -> list[str]:
        return [call["name"] for call in self.calls]

    def settle(self, expected: int = 1, timeout: float = 10.0, grace: float = 0.05) -> list[aiocop.SlowTaskEvent]:
        """The events once `expected` have arrived (or `timeout` passed), and `grace` more seconds.

        The watchdog reports a stall shortly after it ends, from its own
        thread: on a busy machine "shortly" has no fixed bound, so wait for
        the events rather than a fixed time, then a little longer so that
        an unexpected extra one would show too.
        """
        deadline = time.monotonic() + timeout
        while len(self.events) < expected and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(grace)
        with self._lock:
            return list(self.events)


@pytest.fixture
def detector() -> Iterator[Collector]:
    """Detection installed before any loop of the test exists; torn down after."""
    collector = Collector()
    # As under the pytest plugin: an idle loop that cannot be armed is looked
    # at every half threshold (start_cpu_sampling's precise_idle), which the
    # tests of stalls after a quiet spell rest on; the cheap looks, production's
    # default, are asked for by their own tests.
    sampling.precise_by_default = True
    aiocop.start_blocking_io_detection(trace_depth=20)
    aiocop.register_slow_task_callback(collector)
    try:
        yield collector
    finally:
        reset_aiocop()
        sampling.precise_by_default = False
        assert not _hook.unclaimed, "every recorded step was delivered"


def reset_aiocop() -> None:
    """Undo whatever a test set up: detection stopped, every registration and switch back to its default."""
    aiocop.stop()
    aiocop.clear_slow_task_callbacks()
    aiocop.clear_context_providers()
    aiocop.clear_allow_rules()
    aiocop.reset_blocking_event_table()
    aiocop.disable_raise_on_violations()
    # The process-wide settings (threshold, trace depth, delivery, buffer,
    # raise level), each back to its default, in the object every module reads.
    vars(_state.config).update(vars(_state.Config()))
    sampling.precise_idle = None
    # The switch back on, as activate() sets it, but not activate() itself: in a
    # process where detection never started (a test run alone, or first), it
    # sets detection up (1.x's meaning), and the next test found it started.
    _state.active = True
    _hook.rebuild()


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(
    code: str,
    *script_args: str,
    interpreter_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    timeout: float = 60,
    check: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run `code` (dedented) in a fresh interpreter, with this checkout's aiocop importable."""
    return subprocess.run(
        [sys.executable, *interpreter_args, "-c", textwrap.dedent(code), *script_args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": ROOT, **(env or {})},
        cwd=ROOT,
        check=check,
    )
