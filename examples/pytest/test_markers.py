"""The aiocop pytest plugin's markers and fixture, one test each.

Run it with the plugin switched on (pytest-asyncio installed); every test passes:

    pytest --aiocop examples/pytest/test_markers.py
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import TYPE_CHECKING, Any

import pytest
import pytest_asyncio

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from aiocop.pytest_plugin import EventLog


def read_settings(path: Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as file:
        return json.load(file)  # type: ignore[no-any-return]


async def load_settings_blocking(path: Path) -> dict[str, Any]:
    return read_settings(path)


@pytest.fixture
def settings_file(tmp_path: Path) -> Path:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"debug": True}), encoding="utf-8")
    return path


@pytest_asyncio.fixture
async def server() -> AsyncIterator[asyncio.Server]:
    server = await asyncio.start_server(lambda reader, writer: writer.close(), "127.0.0.1", 0)
    yield server
    server.close()
    await server.wait_closed()


async def main() -> None:
    await asyncio.sleep(0)


# --8<-- [start:allow]
@pytest.mark.asyncio
@pytest.mark.aiocop_allow  # any blocking call, and any stall
async def test_legacy_client() -> None:
    time.sleep(0.001)


@pytest.mark.asyncio
@pytest.mark.aiocop_allow("open", "os.stat")  # only these calls
async def test_template_cache(settings_file: Path) -> None:
    assert os.path.exists(settings_file)
    assert (await load_settings_blocking(settings_file))["debug"]


@pytest.mark.asyncio
@pytest.mark.aiocop_allow(call_site="test_markers.py:read_settings")  # only calls made under this function
async def test_reload(settings_file: Path) -> None:
    assert (await load_settings_blocking(settings_file))["debug"]


# --8<-- [end:allow]


# --8<-- [start:check]
@pytest.mark.aiocop_check  # a synchronous test: checked anyway
def test_cli_main() -> None:
    asyncio.run(main())


@pytest.mark.asyncio
@pytest.mark.aiocop_check(fixtures=True)  # also the set-up and teardown of its fixtures
async def test_with_server(server: asyncio.Server) -> None:
    assert server.is_serving()


# --8<-- [end:check]


# --8<-- [start:events]
@pytest.mark.asyncio
async def test_loader_reads_its_file_once(settings_file: Path, aiocop_events: EventLog) -> None:
    await load_settings_blocking(settings_file)
    assert aiocop_events.names() == ["open"]


# --8<-- [end:events]
