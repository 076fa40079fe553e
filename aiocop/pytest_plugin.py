"""pytest plugin: fail async tests that block their event loop.

Installed with aiocop and registered through the `pytest11` entry point, it
does nothing until switched on with `--aiocop` or `aiocop = true` in the ini
file. Then detection runs for the whole session, and a test fails when its
body, or any task or callback that ran on a loop during it, made a blocking
call (or, with `--aiocop-threshold-ms`, held its loop that long). See the
"pytest" how-to in the docs for every option.

Events are attributed to a test by *phase*: each one is filed under the
phase (set-up, call, teardown) running when it is delivered, and a phase is
closed only once what it left pending has been delivered (`_pytest_events`).
Test bodies are checked, async and synchronous (a synchronous test that
runs a loop, in any thread: `asyncio.run()`, a `TestClient`'s portal;
`--no-aiocop-check-sync` checks async tests only); fixtures only when asked
(`--aiocop-check-fixtures`, or the `aiocop_check` marker).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import os
import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

import aiocop
from aiocop._pytest_support import portal as _portal
from aiocop._pytest_support import settings as _pytest_settings
from aiocop._pytest_support import timeouts as _timeouts
from aiocop._stalls.settings import sampling as _sampling

if TYPE_CHECKING:
    from collections.abc import Generator

    from aiocop._interception.allow import AllowRule
    from aiocop._model.events import SlowTaskEvent
    from aiocop._pytest_support.events import EventLog, Recorder
    from aiocop._pytest_support.settings import Settings
    from aiocop._reporting.timeline import Timeline

__all__ = ["EventLog"]


# Every pytest run loads this plugin (the pytest11 entry point). Switched off,
# it must cost next to nothing: the detector and the event log
# (`aiocop._pytest_support.events`, which loads the whole detector) are imported only
# once a session turns the plugin on, or someone reads `EventLog`.
def __getattr__(name: str) -> Any:
    if name == "EventLog":
        from aiocop._pytest_support.events import EventLog

        return EventLog
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


PHASES = ("setup", "call", "teardown")


def _no_events() -> dict[str, list[SlowTaskEvent]]:
    return {phase: [] for phase in PHASES}


class _Session:
    """Detection for one pytest session: started at configure, stopped at unconfigure."""

    def __init__(self, settings: Settings) -> None:
        from aiocop._pytest_support.events import Recorder

        self.settings = settings
        self.recorder: Recorder = Recorder()
        # With --aiocop-write-baseline: how many times each call site failed a test.
        self.seen: dict[tuple[str, str], int] = {}
        self.baseline_written: str | None = None  # what writing it said, for the summary
        self.timeline: Timeline | None = None  # with --aiocop-html: the session's steps
        self.html_written: str | None = None
        # Beside pytest-timeout (`_pytest_support.timeouts`): the terminal's
        # stderr, kept for the tests it ends with os._exit; whether a timed
        # test's hang threshold is in force; whether the watchdog runs for
        # those hangs only (no --aiocop-threshold-ms); the pair's note, once.
        self.terminal: int | None = None
        self.timing = False
        self.hangs_only = False
        self.pair_note: str | None = None

    def start(self) -> None:
        from aiocop._interception.frames import set_app_paths

        settings = self.settings
        # A test run looks at idle loops written in C every half threshold
        # (start_cpu_sampling's precise_idle): its stalls after a quiet spell
        # are seen, at a cost that matters in production, not in a test.
        _sampling.precise_by_default = True
        aiocop.start_blocking_io_detection(trace_depth=settings.trace_depth)
        if settings.threshold_ms is not None:
            aiocop.detect_slow_tasks(threshold_ms=settings.threshold_ms, hang_after_ms=settings.hang_after_ms)
        if settings.html is not None:
            from aiocop._reporting.report import Summary
            from aiocop._reporting.timeline import Timeline

            self.timeline = Timeline(Summary(settings.baseline))
            # Before the recorder: the timeline reads when a step ended before anything formats the event.
            aiocop.register_slow_task_callback(self.timeline)
        aiocop.register_slow_task_callback(self.recorder)
        aiocop.register_context_provider(_portal.provider)
        for rule in settings.allow:
            aiocop.add_allow_rule(rule)
        set_app_paths(settings.app_paths, settings.library_paths)
        if settings.timeout_plugin:
            self.terminal = _timeouts.terminal_fd()

    def timed(self, nodeid: str, timeout_s: float, method: object) -> None:
        """A test pytest-timeout ends after `timeout_s`: its hang is reported before that."""
        settings = self.settings
        hang = _timeouts.hang_after_ms(timeout_s, settings.hang_after_ms, settings.hang_after_explicit)
        exits = _timeouts.ends_by_exit(method)
        out = None if self.terminal is None or not exits else functools.partial(_timeouts.write, self.terminal)
        note = _timeouts.pair_note(timeout_s, hang, settings.threshold_ms, nodeid)
        if note is not None and self.pair_note is None:
            self.pair_note = note
            if out is not None:  # the summary may never come
                out(note)
        if hang is not None:
            self.timing = True
            if settings.threshold_ms is not None:
                aiocop.detect_slow_tasks(threshold_ms=settings.threshold_ms, hang_after_ms=hang)
            else:  # the watchdog runs for the hang alone: it times nothing shorter
                self.hangs_only = True
                aiocop.detect_slow_tasks(threshold_ms=hang, hang_after_ms=hang)
        self.recorder.hang_out = out

    def untimed(self) -> None:
        """The timed test is over (its timer cancelled): the session's own settings again."""
        self.recorder.hang_out = None
        if not self.timing:
            return
        self.timing = False
        settings = self.settings
        if settings.threshold_ms is not None:
            aiocop.detect_slow_tasks(threshold_ms=settings.threshold_ms, hang_after_ms=settings.hang_after_ms)
        else:  # left running (stopping it would lose the loops it tracks), timing nothing
            from aiocop._configuration.config import MAX_THRESHOLD_MS

            aiocop.detect_slow_tasks(threshold_ms=MAX_THRESHOLD_MS, hang_after_ms=None)

    def stop(self) -> None:
        from aiocop._interception.frames import set_app_paths

        aiocop.unregister_slow_task_callback(self.recorder)
        aiocop.unregister_context_provider(_portal.provider)
        _portal.uninstall()
        if self.timeline is not None:
            aiocop.unregister_slow_task_callback(self.timeline)
        for rule in self.settings.allow:
            aiocop.remove_allow_rule(rule)
        set_app_paths((), ())
        aiocop.stop()
        # What start() set for the test run only: the process's own later
        # detect_slow_tasks() (a pytester run in process) gets production's default.
        _sampling.precise_by_default = False
        self.recorder.hang_out = None
        if self.terminal is not None:
            with contextlib.suppress(OSError):
                os.close(self.terminal)
            self.terminal = None

    def write_html(self, command: str) -> bool:
        from aiocop._reporting import report_files as _report_files
        from aiocop._reporting.timeline import Facts

        path, timeline = self.settings.html, self.timeline
        assert path is not None
        assert timeline is not None
        timeline.finish()
        facts = Facts(command, self.settings.threshold_ms, "the tests' own")
        if not _report_files.write(timeline, facts, {"--html": path}):
            self.html_written = f"aiocop: could not write the HTML report {path} (see above)"
            return False
        self.html_written = f"aiocop: wrote the HTML report {path}"
        return True

    def write_baseline(self) -> bool:
        from aiocop._configuration import baseline as _baseline

        path = self.settings.write_baseline
        assert path is not None
        try:
            _baseline.write(path, self.seen)
        except OSError as exc:
            self.baseline_written = f"aiocop: could not write the baseline {path}: {exc}"
            return False
        self.baseline_written = f"aiocop: wrote {len(self.seen)} call site(s) to the baseline {path}"
        return True


@dataclass
class _TestState:
    """What the plugin knows about one test, and the events of each of its phases."""

    check_body: bool
    check_fixtures: bool
    rules: tuple[AllowRule, ...]  # from its aiocop_allow markers
    events: dict[str, list[SlowTaskEvent]] = field(default_factory=_no_events)
    log_requested: bool = False  # it asked for aiocop_events: it judges the events itself

    def checked(self, phase: str) -> bool:
        if phase == "call":
            return self.check_body and not self.log_requested
        return self.check_fixtures


_SESSION = pytest.StashKey[_Session]()
_TEST = pytest.StashKey[_TestState]()


def pytest_addoption(parser: pytest.Parser) -> None:
    _pytest_settings.add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    for line in _pytest_settings.MARKERS:
        config.addinivalue_line("markers", line)
    # Switched off, nothing of aiocop's is read: not its ini keys, not
    # [tool.aiocop], not a baseline (a file planted in a parent folder must
    # not break a run that never asked for aiocop).
    if not _pytest_settings.enabled(config):
        return
    settings = _pytest_settings.read(config)
    session = _Session(settings)
    session.start()
    config.stash[_SESSION] = session
    config.add_cleanup(session.stop)


def pytest_report_header(config: pytest.Config) -> list[str]:
    session = config.stash.get(_SESSION, None)
    return [session.settings.header()] if session is not None else []


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    # Written here, where the exit status can still change: a run asked for a
    # baseline it did not get has not succeeded (CI would commit nothing).
    state = session.config.stash.get(_SESSION, None)
    if state is None:
        return
    written = True
    if state.settings.write_baseline is not None:
        written = state.write_baseline()
    if state.settings.html is not None:
        command = shlex.join(["pytest", *session.config.invocation_params.args])
        written = state.write_html(command) and written
    if not written and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    session = config.stash.get(_SESSION, None)
    if session is not None and session.pair_note is not None:
        terminalreporter.write_line(session.pair_note)
    if session is not None and session.baseline_written is not None:
        terminalreporter.write_line(session.baseline_written)
    if session is not None and session.html_written is not None:
        terminalreporter.write_line(session.html_written)


# pytest-timeout's own hooks (optional: without it they are never called),
# given the test's settings as it resolved them from --timeout, the ini key,
# PYTEST_TIMEOUT or the test's marker, just before it starts the timer.
@pytest.hookimpl(optionalhook=True, wrapper=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> Generator[None, object, object]:
    session = item.config.stash.get(_SESSION, None)
    timeout = getattr(settings, "timeout", None)
    if session is not None and isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0:
        session.timed(item.nodeid, float(timeout), getattr(settings, "method", None))
    return (yield)


@pytest.hookimpl(optionalhook=True, wrapper=True)
def pytest_timeout_cancel_timer(item: pytest.Item) -> Generator[None, object, object]:
    try:
        return (yield)
    finally:  # once the timer can no longer fire
        session = item.config.stash.get(_SESSION, None)
        if session is not None:
            session.untimed()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Markers are read here, once per test, so that a bad one is a usage
    # error before anything runs rather than a failure halfway through.
    session = config.stash.get(_SESSION, None)
    if session is None:  # switched off: markers are not read either
        return
    for item in items:
        item.stash[_TEST] = _test_state(item, session.settings)


def _test_state(item: pytest.Item, settings: Settings) -> _TestState:
    rules = _pytest_settings.marker_rules(item)
    check_body, check_fixtures = _pytest_settings.marker_check(item)
    return _TestState(
        check_body=check_body or settings.check_sync or _is_async(item),
        check_fixtures=settings.check_fixtures if check_fixtures is None else check_fixtures,
        rules=rules,
    )


def _is_async(item: pytest.Item) -> bool:
    # Read at collection, before pytest-asyncio swaps the test function for
    # a synchronous wrapper for the duration of the call.
    function: Any = getattr(item, "obj", None)
    inner = getattr(getattr(function, "hypothesis", None), "inner_test", None)  # @given on an async test
    if inner is not None:
        function = inner
    return inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _watch(item, "setup"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _watch(item, "call"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _watch(item, "teardown"))


def _watch(item: pytest.Item, phase: str) -> Generator[None, object, object]:
    session = item.config.stash.get(_SESSION, None)
    if session is None:
        return (yield)
    settings = session.settings
    state = item.stash.get(_TEST, None)
    if state is None:  # an item made after collection (by some plugin)
        state = item.stash[_TEST] = _test_state(item, settings)
    if phase == "setup":
        state.events = _no_events()  # a test run again (e.g. by a rerun plugin) starts afresh
        state.log_requested = False
        # The test's allow rules hold from its first fixture to its last
        # teardown, everywhere: a server task a fixture started is covered too.
        for rule in state.rules:
            aiocop.add_allow_rule(rule)
    _portal.install()  # a TestClient's requests carry the test's line (cheap once done)
    events = state.events[phase]
    try:
        with session.recorder.phase(events):
            result = yield
    except BaseException:
        # The test failed (or was skipped) for its own reasons: still say
        # what blocked, beside the traceback.
        bad = _verdict(session, _failing(state, phase, settings) if state.checked(phase) else [])
        if bad:
            item.add_report_section(phase, "aiocop", _message(bad, phase, settings.fail_on, settings.threshold_ms))
        raise
    finally:
        if phase == "teardown":
            for rule in state.rules:
                aiocop.remove_allow_rule(rule)
    if state.checked(phase):
        bad = _verdict(session, _failing(state, phase, settings))
        if bad:
            pytest.fail(_message(bad, phase, settings.fail_on, settings.threshold_ms), pytrace=False)
    return result


def _verdict(session: _Session, bad: list[SlowTaskEvent]) -> list[SlowTaskEvent]:
    """The events that fail the test: none while recording a baseline, which takes their call sites instead."""
    if not bad or session.settings.write_baseline is None:
        return bad
    from aiocop._configuration.baseline import count
    from aiocop._pytest_support.events import baseline_keys

    for event in bad:
        count(baseline_keys(event), session.seen)
    return []


def _message(bad: list[SlowTaskEvent], phase: str, fail_on: str, threshold_ms: float | None) -> str:
    from aiocop._pytest_support.events import message

    return message(bad, phase, fail_on, threshold_ms)


def _failing(state: _TestState, phase: str, settings: Settings) -> list[SlowTaskEvent]:
    from aiocop._pytest_support.events import failing  # loaded with the session: no cost here

    return failing(
        state.events[phase],
        settings.fail_on,
        settings.threshold_ms is not None,
        (*settings.allow, *state.rules),
        settings.baseline,
    )


@pytest.fixture
def aiocop_events(request: pytest.FixtureRequest) -> EventLog:
    """The events of the running test's body (`aiocop.SlowTaskEvent`s), for assertions.

    A test that requests it is not failed by aiocop for blocking: it judges
    the events itself. Needs the plugin switched on.
    """
    session = request.config.stash.get(_SESSION, None)
    state = request.node.stash.get(_TEST, None)
    if session is None or state is None:
        pytest.fail(
            "the aiocop_events fixture needs the aiocop plugin switched on: run pytest with --aiocop, "
            "or set aiocop = true in the ini file",
            pytrace=False,
        )
    from aiocop._pytest_support.events import EventLog

    state.log_requested = True
    return EventLog(state.events["call"])
