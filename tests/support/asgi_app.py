"""The ASGI application that tests/integrations/test_asgi.py serves with uvicorn and Granian.

Detection starts when the server's worker process imports this module, as the
docs tell users to do. Every event is appended to the file named by
`$AIOCOP_ASGI_EVENTS` as one JSON line (`to_record`), so that the test process
can read what the server reported.

Routes; the `/sampled/...` ones are always watched, the `/unsampled/...` ones
never, the others follow `sample_rate=0.0` (never):

- `.../block`: awaits, makes one blocking call naming the request id
  (`os.path.exists(BLOCKED_PREFIX + request_id)`), awaits again;
- `.../clean`: the same work done right, in a thread;
- `.../spawn`: the blocking call made by a task the request starts;
- `/ready`: what the test polls until the server answers.

Each response is JSON: whether the request was watched, and the request id
the middleware gave it.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import aiocop
from aiocop._reporting.report import to_record
from aiocop.asgi import AiocopMiddleware, Receive, Scope, Send, current_request

if TYPE_CHECKING:
    from aiocop.asgi import Message

EVENTS_ENV = "AIOCOP_ASGI_EVENTS"
BLOCKED_PREFIX = "/nonexistent-aiocop-asgi-test/"

_events_file = Path(os.environ[EVENTS_ENV]) if EVENTS_ENV in os.environ else None


def write_event(event: aiocop.SlowTaskEvent) -> None:
    # Runs on the loop's thread right after the offending step; aiocop does
    # not report a callback's own blocking calls.
    if _events_file is not None:
        record = to_record(event)
        record["pid"] = os.getpid()
        with _events_file.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


aiocop.start_blocking_io_detection()
aiocop.register_slow_task_callback(write_event)


def request_id_of(scope: Scope) -> str:
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            return str(value.decode("latin-1"))
    return "none"


def block(scope: Scope) -> None:
    os.path.exists(BLOCKED_PREFIX + request_id_of(scope))  # BLOCKS


async def handle(scope: Scope) -> dict[str, object]:
    action = scope["path"].rpartition("/")[2]
    await asyncio.sleep(0.005)  # let concurrent requests interleave
    if action == "block":
        block(scope)
    elif action == "clean":
        await asyncio.to_thread(block, scope)
    elif action == "spawn":
        await asyncio.get_running_loop().create_task(asyncio.sleep(0.001))
        await asyncio.create_task(_child(scope))
    await asyncio.sleep(0.005)
    info = current_request()
    return {"watched": aiocop.is_monitored(), "request_id": None if info is None else info.request_id}


async def _child(scope: Scope) -> None:
    await asyncio.sleep(0)
    block(scope)


async def plain_app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        while True:
            message: Message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    body = json.dumps(await handle(scope)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


def sampler(scope: Scope) -> bool | None:
    path: str = scope["path"]
    if path.startswith("/sampled/"):
        return True
    if path.startswith("/unsampled/"):
        return False
    return None


app = AiocopMiddleware(plain_app, sample_rate=0.0, sampler=sampler)
