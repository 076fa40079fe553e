"""Before: blockbuster's pytest pattern (see docs/migration-blockbuster.md).

Run it: `pytest examples/migration/test_with_blockbuster.py` (needs blockbuster).
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

import pytest
from blockbuster import BlockBuster, BlockingError, blockbuster_ctx

if TYPE_CHECKING:
    from collections.abc import Iterator


# --8<-- [start:before]
@pytest.fixture(autouse=True)
def blockbuster() -> Iterator[BlockBuster]:
    with blockbuster_ctx() as bb:
        bb.functions["os.stat"].can_block_in("test_with_blockbuster.py", {"read_mtime"})
        yield bb


def read_mtime() -> float:
    return os.stat(__file__).st_mtime


@pytest.mark.asyncio
async def test_time_sleep() -> None:
    with pytest.raises(BlockingError, match="sleep"):
        time.sleep(0.001)


@pytest.mark.asyncio
async def test_read_mtime_is_allowed() -> None:
    assert read_mtime() > 0


# --8<-- [end:before]
