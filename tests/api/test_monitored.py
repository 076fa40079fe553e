"""monitored(): per-context switching, as the ASGI middleware samples requests."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import TYPE_CHECKING

import pytest

import aiocop
from aiocop._model import state as _state
from tests.conftest import Collector, run_on, xfail_on_veloxloop
from tests.stalls.test_watchdog import only_event, timed_stall, watchdog  # noqa: F401 - fixture
from tests.support import stalls

if TYPE_CHECKING:
    import contextlib

Watchdog = Collector


def test_unmonitored_scope_hides_only_its_own_tasks(
    detector: Collector, loop_name: str, request: pytest.FixtureRequest
) -> None:
    xfail_on_veloxloop(request, loop_name)

    async def serve(path: str, sampled: bool) -> None:
        with aiocop.monitored(enabled=sampled):
            await asyncio.sleep(0)
            os.stat(path)  # both requests block, interleaved on one loop
            await asyncio.sleep(0)
            # A task started by the request inherits its setting.
            await asyncio.create_task(asyncio.to_thread(int))  # harmless: runs in a thread
            await asyncio.get_running_loop().create_task(child(path))

    async def child(path: str) -> None:
        os.listdir(path)

    async def main() -> None:
        await asyncio.gather(serve("/", sampled=True), serve(".", sampled=False))
        os.stat("/")  # outside any scope: monitored, as by default

    run_on(loop_name, main())
    assert [(c["name"], c["args"]) for c in detector.calls] == [
        ("os.stat", "/"),
        ("os.listdir", "/"),
        ("os.stat", "/"),
    ]


def test_unmonitored_call_does_not_raise(detector: Collector, loop_name: str) -> None:
    @aiocop.monitored(enabled=False)
    async def unsampled() -> str:
        os.stat(".")
        return "served"

    @aiocop.monitored()
    async def sampled() -> None:
        os.stat(".")

    async def main() -> tuple[str | BaseException, BaseException | None]:
        aiocop.enable_raise_on_violations(level="low")
        return await asyncio.gather(unsampled(), sampled(), return_exceptions=True)

    unsampled_result, sampled_result = run_on(loop_name, main())
    assert unsampled_result == "served"
    assert isinstance(sampled_result, aiocop.HighSeverityBlockingIoException)


def test_is_monitored_follows_the_scope_and_global_switches(detector: Collector) -> None:
    assert aiocop.is_monitored()
    with aiocop.monitored(enabled=False):
        assert not aiocop.is_monitored()
        with aiocop.monitored():
            assert aiocop.is_monitored()
        assert not aiocop.is_monitored()
    aiocop.deactivate()
    assert not aiocop.is_monitored()
    aiocop.activate()
    assert aiocop.is_monitored()


def test_monitored_rejects_a_non_bool() -> None:
    with pytest.raises(TypeError, match="enabled must be a bool"):
        aiocop.monitored(enabled="no")  # type: ignore[arg-type]


@pytest.mark.parametrize("sampled", [True, False])
def test_stalls_of_unmonitored_tasks_are_not_reported(
    watchdog: Watchdog,  # noqa: F811 - the fixture
    loop_name: str,
    sampled: bool,
) -> None:
    async def main() -> None:
        with aiocop.monitored(enabled=sampled):
            await timed_stall(stalls.spin)
        if not sampled:
            # A monitored stall after it, in a task of its own name: the
            # watchdog reports stalls in the order they end, so once this one
            # is in, a report of the first would be too (instead of waiting
            # the settling time out for an event that should never come).
            await asyncio.create_task(timed_stall(stalls.spin), name="marker")

    run_on(loop_name, main())
    event = only_event(watchdog)
    assert event.reason == "cpu_blocking"
    assert (event.task_name == "marker") is not sampled, event.task_name


SHARED_SCOPES: dict[str, contextlib.AbstractContextManager[object]] = {
    "monitored": aiocop.monitored(enabled=False),
    "allow_blocking": aiocop.allow_blocking("os.stat"),
    "raise_on_violations": aiocop.raise_on_violations(),
}


@pytest.mark.parametrize("kind", SHARED_SCOPES)
def test_one_scope_instance_entered_by_concurrent_tasks(detector: Collector, loop_name: str, kind: str) -> None:
    # A module-level `QUIET = aiocop.monitored(enabled=False)` used as `with
    # QUIET:` by every request: each task leaves the scope it entered.
    scope = SHARED_SCOPES[kind]

    async def handler(entered: asyncio.Event, leave: asyncio.Event) -> str:
        with scope:
            entered.set()
            await leave.wait()
        return "served"

    async def main() -> list[object]:
        first_in, second_in, first_out, second_out = (asyncio.Event() for _ in range(4))
        tasks = [asyncio.create_task(handler(first_in, first_out))]
        await first_in.wait()
        tasks.append(asyncio.create_task(handler(second_in, second_out)))
        await second_in.wait()
        first_out.set()  # the first task leaves while the second is still inside
        await asyncio.sleep(0)
        second_out.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        return [*results, aiocop.is_monitored(), aiocop.is_raise_on_violations_enabled()]

    assert run_on(loop_name, main()) == ["served", "served", True, False]
    assert dict(_state.task_monitored) == {}


def test_task_setting_is_restored_when_the_scope_exits(detector: Collector, loop_name: str) -> None:
    # What the watchdog reads for a task: its record, else its own context
    # (3.12+). Records are kept only where the context cannot tell.
    async def main() -> list[object]:
        task = asyncio.current_task()
        assert task is not None
        seen: list[object] = []

        def setting() -> tuple[object, object]:
            get_context = getattr(task, "get_context", None)
            return _state.task_monitored.get(task), get_context().get(_state.monitored) if get_context else None

        with aiocop.monitored(enabled=False):
            seen.append(setting())
            with aiocop.monitored():
                seen.append(setting())
            seen.append(setting())
        seen.append(setting())
        return seen

    seen = run_on(loop_name, main())
    watchdog_view = [
        True if record is None and value is None else value if record is None else record for record, value in seen
    ]
    assert watchdog_view == [False, True, False, True]
    assert seen[-1][0] is None  # no record left behind
    if sys.version_info >= (3, 12) and loop_name != "veloxloop":
        assert all(record is None for record, _ in seen)  # the task's context tells: no record kept
