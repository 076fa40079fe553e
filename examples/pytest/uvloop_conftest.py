"""A `conftest.py` that runs pytest-asyncio's tests on uvloop, with no event loop policy.

Copy it into your tests' `conftest.py`. pytest-asyncio 1.4+ takes the loop
factories from this hook; event loop policies (`uvloop.install()`,
`asyncio.set_event_loop_policy`) are deprecated from Python 3.14.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import uvloop

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable, Mapping

    import pytest


# --8<-- [start:hook]
def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    return {"uvloop": uvloop.new_event_loop}


# --8<-- [end:hook]
