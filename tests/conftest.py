"""Shared fixtures: every supported event loop, and a clean detector per test."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from typing import TYPE_CHECKING, Any

import pytest

import aiocop
from aiocop._interception import hook as _hook
from aiocop._model import state as _state

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

    RLoop._ssock_stop = _ssock_stop  # type: ignore[method-assign]


_fix_rloop_double_close()


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
    aiocop.start_blocking_io_detection(trace_depth=20)
    aiocop.register_slow_task_callback(collector)
    try:
        yield collector
    finally:
        reset_aiocop()
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
