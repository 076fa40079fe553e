"""Allow rules: blocking calls you have decided to accept are not reported.

Run it: `python examples/allow_rules/main.py`. Every blocking call the
handler makes is listed in a comment: allowed, or reported. The script
prints the reported ones.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import legacy_sdk

import aiocop


def report(event: aiocop.SlowTaskEvent) -> None:
    for call in event.blocking_events:
        print(f"reported: {call['name']} at {call['entry_point']}")


aiocop.start_blocking_io_detection()
aiocop.register_slow_task_callback(report)

# --8<-- [start:global]
# For the whole process, from now on:
aiocop.add_allow_rule("open", module="legacy_sdk")  # `open` made inside legacy_sdk or its submodules
aiocop.add_allow_rule(call_site="main.py:load_templates")  # any call made under this function
# --8<-- [end:global]


def load_templates() -> str:
    return Path(__file__).read_text(encoding="utf-8")


# --8<-- [start:decorator]
@aiocop.allow_blocking("os.stat")  # while this coroutine runs, and in the tasks it creates
async def warm_cache() -> bool:
    return os.path.exists(__file__)


# --8<-- [end:decorator]


async def handler() -> None:
    legacy_sdk.read_config()  # open in legacy_sdk: allowed
    legacy_sdk.ping()  # time.sleep in legacy_sdk: reported (the rule names `open` only)
    load_templates()  # open under load_templates: allowed
    await warm_cache()  # os.stat in warm_cache: allowed
    # --8<-- [start:scoped]
    with aiocop.allow_blocking("os.stat"):
        os.path.exists(__file__)  # allowed inside the block
    os.path.exists(__file__)  # reported
    # --8<-- [end:scoped]


asyncio.run(handler())
