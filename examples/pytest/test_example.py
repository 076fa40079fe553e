"""aiocop's pytest plugin on a small async settings loader.

Run it with the plugin switched on (pytest-asyncio installed):

    pytest --aiocop examples/pytest/test_example.py

`test_load_settings_blocking` fails: `load_settings_blocking` reads its file
with `open()` on the event loop. The other tests pass: one reads the file in
a worker thread, one allows the blocking loader explicitly, one asserts on
the events with the `aiocop_events` fixture.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pathlib import Path

    from aiocop.pytest_plugin import EventLog


def read_settings(path: Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as file:
        return json.load(file)  # type: ignore[no-any-return]


async def load_settings_blocking(path: Path) -> dict[str, Any]:
    return read_settings(path)  # the whole loop waits for the disk here


async def load_settings(path: Path) -> dict[str, Any]:
    return await asyncio.to_thread(read_settings, path)  # the loop keeps running


@pytest.fixture
def settings_file(tmp_path: Path) -> Path:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"debug": True}), encoding="utf-8")
    return path


# --8<-- [start:failing]
@pytest.mark.asyncio
async def test_load_settings_blocking(settings_file: Path) -> None:
    settings = await load_settings_blocking(settings_file)  # fails under --aiocop
    assert settings["debug"] is True


# --8<-- [end:failing]


@pytest.mark.asyncio
async def test_load_settings(settings_file: Path) -> None:
    settings = await load_settings(settings_file)
    assert settings["debug"] is True


@pytest.mark.asyncio
@pytest.mark.aiocop_allow("open", call_site="test_example.py:read_settings")
async def test_legacy_loader_is_allowed(settings_file: Path) -> None:
    settings = await load_settings_blocking(settings_file)
    assert settings["debug"] is True


@pytest.mark.asyncio
async def test_blocking_loader_reports_open(settings_file: Path, aiocop_events: EventLog) -> None:
    await load_settings_blocking(settings_file)
    assert aiocop_events.names() == ["open"]
    assert aiocop_events.calls[0]["entry_point"].endswith(":read_settings")
