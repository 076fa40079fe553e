"""Reports name the application's own line, and where a library blocked (issue 16).

A blocking call made inside an installed package (`httpx.get()` connecting
a socket in `httpcore`) is reported where it blocked, as before, and at the
line of the application that led there: in the event (`app_site`,
`call_site`), the CLI's summary, the pytest plugin's failure and the logs.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
from typing import TYPE_CHECKING, Any

import pytest

import aiocop
from aiocop._reporting.logs import headline
from aiocop._reporting.report import Summary, describe
from tests.conftest import Collector, run_on

if TYPE_CHECKING:
    from collections.abc import Iterator
    from types import ModuleType

LIBRARY = """
import os
import time


def fetch(path):
    return _connect(path)


def _connect(path):
    return os.stat(path)  # LIBRARY BLOCKS


def crunch(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:  # LIBRARY SPINS
        pass
"""


@pytest.fixture
def library(tmp_path: Any) -> Iterator[ModuleType]:
    """A third-party package, installed where pip puts them (site-packages)."""
    site = tmp_path / "lib" / "site-packages"
    site.mkdir(parents=True)
    (site / "fakelib_for_aiocop.py").write_text(LIBRARY, encoding="utf-8")
    sys.path.insert(0, str(site))
    try:
        import fakelib_for_aiocop  # installed by this fixture

        yield fakelib_for_aiocop
    finally:
        sys.path.remove(str(site))
        sys.modules.pop("fakelib_for_aiocop", None)


def _line(func: Any, marker: str) -> int:
    lines, first = inspect.getsourcelines(func)
    return first + next(i for i, text in enumerate(lines) if marker in text)


def _library_line(marker: str) -> int:
    return 1 + next(i for i, text in enumerate(LIBRARY.splitlines()) if marker in text)


def test_a_call_a_library_makes_is_reported_at_the_application_line(
    detector: Collector, loop_name: str, library: ModuleType
) -> None:
    async def handler() -> None:
        library.fetch(".")  # APP CALLS

    run_on(loop_name, handler())
    (event,) = detector.events
    (call,) = event.blocking_events
    app = f"tests/reporting/test_app_line.py:{_line(handler, '# APP CALLS')}:handler"
    assert call["entry_point"].endswith(f"fakelib_for_aiocop.py:{_library_line('# LIBRARY BLOCKS')}:_connect")
    assert call["app_site"] == app
    assert event.call_site == app
    text = describe(event).splitlines()
    assert text[2:5] == [
        f"    at {app}",
        '      library.fetch(".")  # APP CALLS',
        f"    blocked in {call['entry_point']}",
    ], text
    assert f"at {app}" in headline(event)
    summary = Summary()
    summary(event)
    assert [(row.call_site, row.event) for row in summary.rows()] == [(app, "os.stat")]


def test_a_call_the_application_makes_itself_has_one_line(detector: Collector) -> None:
    async def handler() -> None:
        open(__file__).close()  # the call under test

    run_on("asyncio", handler())
    (call,) = detector.calls
    assert call["app_site"] == call["entry_point"]
    assert "blocked in" not in describe(detector.events[0])


def test_a_stall_inside_a_library_is_reported_at_the_application_line(
    detector: Collector, loop_name: str, library: ModuleType
) -> None:
    aiocop.detect_slow_tasks(threshold_ms=30)

    async def handler() -> None:
        await asyncio.sleep(0.02)
        library.crunch(0.1)  # APP SPINS
        await asyncio.sleep(0.05)

    run_on(loop_name, handler())
    (event,) = detector.settle(1)
    assert event.reason == "cpu_blocking"
    assert event.call_site == f"tests/reporting/test_app_line.py:{_line(handler, '# APP SPINS')}:handler"
    assert "fakelib_for_aiocop.py" in event.cpu_stack_samples[0]["entry_point"]


SERVER = {
    "fakeserver_for_aiocop/__init__.py": """
import importlib


def start(protocol):
    return importlib.import_module(protocol)  # SERVER IMPORTS
""",
    "fakeserver_for_aiocop/protocols.py": "import fakeserver_for_aiocop.parser  # nested\n",
    "fakeserver_for_aiocop/parser.py": "import fakeserver_for_aiocop.tables  # nested again\n",
    "fakeserver_for_aiocop/tables.py": "TABLE = {}\n",
}


def test_a_library_import_chain_with_no_application_frame_is_one_row_at_its_start(
    detector: Collector, loop_name: str, tmp_path: Any
) -> None:
    # A server started inside a fixture's loop imports its protocol modules
    # (uvicorn: importlib.import_module() at start-up), and they import the
    # rest: no application frame is on the stack. One row, at the line that
    # started the chain, not one per nested module's import statement.
    site = tmp_path / "lib" / "site-packages"
    for name, text in SERVER.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(text, encoding="utf-8")
    sys.path.insert(0, str(site))
    try:
        import fakeserver_for_aiocop  # installed just above

        async def main() -> None:
            # A callback of the library's own: nothing of the application's runs in its step.
            asyncio.get_running_loop().call_soon(fakeserver_for_aiocop.start, "fakeserver_for_aiocop.protocols")
            await asyncio.sleep(0.01)

        run_on(loop_name, main())
    finally:
        sys.path.remove(str(site))
        for name in [m for m in sys.modules if m.startswith("fakeserver_for_aiocop")]:
            del sys.modules[name]
    first = SERVER["fakeserver_for_aiocop/__init__.py"].splitlines()
    start = f"fakeserver_for_aiocop/__init__.py:{1 + next(i for i, t in enumerate(first) if 'IMPORTS' in t)}:start"
    imports = [call for call in detector.calls if call["event"].startswith("import")]
    # importlib.import_module() is reported itself (issue 30: importlib's own
    # path raises no import event before 3.15), once: the imports nested in
    # the module it loads are part of it.
    assert [call["event"] for call in imports] == ["importlib.import_module(fakeserver_for_aiocop.protocols)"]
    assert {call["app_site"] for call in imports} == {start}
    summary = Summary()
    for event in detector.events:
        summary(event)
    assert [(row.call_site, set(row.events)) for row in summary.rows()] == [(start, {"importlib.import_module"})]
