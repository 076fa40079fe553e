"""`run`'s end by SIGTERM/SIGHUP (`aiocop._commands.exits`): the program's own choice of handler is kept."""

from __future__ import annotations

import os
import signal
import threading
from typing import TYPE_CHECKING, Any

import pytest

from aiocop._commands import exits as _exits

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="POSIX signals")


@pytest.fixture
def held(
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[_exits.ExitSignals, list[tuple[str, int]], threading.Event]]:
    monkeypatch.setattr(_exits, "GRACE_S", 0.01)
    seen: list[tuple[str, int]] = []
    late = threading.Event()

    def on_late(signum: int) -> None:
        seen.append(("late", signum))
        late.set()

    before = {s: signal.getsignal(s) for s in _exits.SIGNALS}
    for s in _exits.SIGNALS:
        signal.signal(s, signal.SIG_DFL)
    exits = _exits.ExitSignals(lambda signum: seen.append(("exit", signum)), on_late)
    exits.install()
    try:
        yield exits, seen, late
    finally:
        exits.restore()
        for s, handler in before.items():
            signal.signal(s, handler)


def test_the_programs_handler_runs_and_the_report_is_written_if_it_does_not_end(held: Any) -> None:
    exits, seen, late = held
    calls: list[int] = []

    def handler(signum: int, frame: object) -> None:
        calls.append(signum)

    # The program sees its own choice, as without aiocop ...
    assert signal.signal(signal.SIGTERM, handler) is signal.SIG_DFL
    assert signal.getsignal(signal.SIGTERM) is handler
    os.kill(os.getpid(), signal.SIGTERM)
    # ... its handler runs; the process is still running a moment later: the report so far is written.
    assert calls == [signal.SIGTERM]
    assert late.wait(30.0)
    assert seen == [("late", signal.SIGTERM)]
    exits.restore()
    assert signal.getsignal(signal.SIGTERM) is handler  # the program's, once the run is over


def test_asyncio_signal_handlers_still_run_and_a_hung_wait_is_interrupted(held: Any) -> None:
    import asyncio

    _, _, late = held
    got: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGHUP, got.append, "hup")  # as uvicorn: siginterrupt(False) too
        loop.call_soon(os.kill, os.getpid(), signal.SIGHUP)
        await asyncio.sleep(0.05)
        loop.remove_signal_handler(signal.SIGHUP)

    asyncio.run(main())
    assert got == ["hup"]
    assert late.wait(30.0)  # aiocop's handler ran: the loop's was called through it
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL  # what remove_signal_handler set


def test_ignoring_the_signal_is_the_programs_choice(held: Any) -> None:
    _, seen, _ = held
    assert signal.signal(signal.SIGTERM, signal.SIG_IGN) is signal.SIG_DFL
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    os.kill(os.getpid(), signal.SIGTERM)  # ignored: nothing happens
    assert seen == []


def test_a_bad_handler_is_refused_as_python_refuses_it(held: Any) -> None:
    with pytest.raises(TypeError):
        signal.signal(signal.SIGTERM, 42)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
