"""FastAPI with aiocop's sampling middleware.

Serve it from this directory with `uvicorn fastapi_app:app`. Run as a script
(`python examples/frameworks/fastapi_app.py`), it sends three requests through
the app, in-process, and prints what aiocop reported: `/readme` reads a file
on the loop and is reported; `/legacy` does the same in a `def` endpoint,
which FastAPI runs in a worker thread, so the loop is not blocked and nothing
is reported; `/health` blocks too, but is never sampled.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
from fastapi import FastAPI

import aiocop
from aiocop.asgi import AiocopMiddleware

if TYPE_CHECKING:
    from aiocop.asgi import Scope


def report(event: aiocop.SlowTaskEvent) -> None:
    calls = [call["name"] for call in event.blocking_events]
    print(json.dumps({"call_site": event.call_site, "calls": calls, **event.context}))


aiocop.start_blocking_io_detection()
aiocop.detect_slow_tasks(threshold_ms=30, on_slow_task=report)
# --8<-- [start:allow]
# FastAPI reads each endpoint's source file, on the loop, the first time the
# endpoint is called (to name it in error messages; cached after that).
aiocop.add_allow_rule(call_site="fastapi/routing.py:_extract_endpoint_context")
# anyio imports its asyncio back end on the first use of the thread pool (the
# first call of a `def` endpoint): once per process.
aiocop.add_allow_rule("import", module="anyio")
# --8<-- [end:allow]


def sampler(scope: Scope) -> bool | None:
    return False if scope["path"] == "/health" else None  # probes: never watched; the rest: sample_rate


# --8<-- [start:app]
app = FastAPI()
app.add_middleware(AiocopMiddleware, sample_rate=1.0, sampler=sampler)  # in production: 0.05, say
# --8<-- [end:app]


@app.get("/readme")
async def readme() -> str:
    return Path(__file__).read_text(encoding="utf-8")[:40]  # blocking file read, on the loop


@app.get("/legacy")
def legacy() -> str:
    return Path(__file__).read_text(encoding="utf-8")[:40]  # the same, in FastAPI's thread pool: not reported


@app.get("/health")
async def health() -> str:
    return "ok" if os.path.exists(__file__) else "missing"  # blocking os.stat, never sampled


async def main() -> None:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        for path in ("/readme", "/legacy", "/health"):
            response = await client.get(path, headers={"x-request-id": "req" + path.replace("/", "-")})
            response.raise_for_status()
            await asyncio.sleep(0)  # let the loop run between requests, as it would under a server


if __name__ == "__main__":
    asyncio.run(main())
