"""Litestar with aiocop's sampling middleware.

Serve it from this directory with `uvicorn litestar_app:app`. Run as a
script (`python examples/frameworks/litestar_app.py`), it sends two requests
through the app, in-process, and prints what aiocop reported: the sampled
`/readme` request reads a file on the loop; `/health` does too, but is never
sampled.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
from litestar import Litestar, get
from litestar.middleware import DefineMiddleware

import aiocop
from aiocop.asgi import AiocopMiddleware

if TYPE_CHECKING:
    from aiocop.asgi import Scope


def report(event: aiocop.SlowTaskEvent) -> None:
    calls = [call["name"] for call in event.blocking_events]
    print(json.dumps({"call_site": event.call_site, "calls": calls, **event.context}))


aiocop.start_blocking_io_detection()
aiocop.detect_slow_tasks(threshold_ms=30, on_slow_task=report)


@get("/readme")
async def readme() -> str:
    return Path(__file__).read_text(encoding="utf-8")[:40]  # blocking file read


@get("/health")
async def health() -> str:
    return "ok" if os.path.exists(__file__) else "missing"  # blocking os.stat


def sampler(scope: Scope) -> bool | None:
    return False if scope["path"] == "/health" else None  # probes: never watched; the rest: sample_rate


# --8<-- [start:app]
app = Litestar(
    route_handlers=[readme, health],
    middleware=[DefineMiddleware(AiocopMiddleware, sample_rate=1.0, sampler=sampler)],  # in production: 0.05, say
)
# --8<-- [end:app]


async def main() -> None:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        for path in ("/readme", "/health"):
            response = await client.get(path, headers={"x-request-id": "req" + path.replace("/", "-")})
            response.raise_for_status()
            await asyncio.sleep(0)  # let the loop run between requests, as it would under a server


if __name__ == "__main__":
    asyncio.run(main())
