"""The watchdog's state of a loop (`aiocop/_stalls/state.py`): made for a watch registered before its factory."""

from __future__ import annotations

import asyncio

import pytest

from aiocop._interception import loops
from aiocop._stalls.state import LoopState, state_of


@pytest.fixture
def unwatched(monkeypatch: pytest.MonkeyPatch) -> None:
    # As before any start installed the watchdog's factory (its install_sink).
    monkeypatch.setattr(loops, "_new_state", loops._Unwatched)


def test_a_loop_started_before_the_factory_keeps_its_start(unwatched: None) -> None:
    loop = asyncio.new_event_loop()
    try:
        watch = loops.LoopWatch(loop, None, None)
        watch.watchdog.loop_started(12.5, 3.25)
        state = state_of(watch)
        assert type(state) is LoopState
        assert (state.idle_t, state.idle_cpu) == (12.5, 3.25)  # the start, as a watch made after the factory has it
        assert state_of(watch) is state
    finally:
        loop.close()
