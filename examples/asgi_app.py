"""A plain ASGI application whose requests aiocop watches, a sample at a time.

Serve it from the `examples` directory with either server:

    granian --interface asgi --loop uvloop asgi_app:app
    uvicorn --loop uvloop asgi_app:app

then request `/report` (reads a file on the loop: logged when sampled),
`/health` (blocks too, but is never sampled), `/admin/stats` (always sampled)
and `/` (does nothing wrong). `AIOCOP_SAMPLE_RATE` sets the fraction of the
other requests that are watched (default 0.1).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from pathlib import Path

import aiocop
from aiocop.asgi import AiocopMiddleware, Receive, Scope, Send

logger = logging.getLogger("asgi_app.aiocop")


# --8<-- [start:log_event]
def log_event(event: aiocop.SlowTaskEvent) -> None:
    """Log each event as one line of JSON: easy to search, and to alert on."""
    logger.warning(
        "blocking call %s",
        json.dumps(
            {
                "call_site": event.call_site,
                "calls": [call["event"] for call in event.blocking_events],
                "culprit": event.culprit,
                "elapsed_ms": round(event.elapsed_ms, 1),
                "severity": event.severity_level,
                **event.context,  # http_method, http_path, request_id
            }
        ),
    )


# --8<-- [end:log_event]


# --8<-- [start:setup]
# At import, not under `if __name__ == "__main__"`: the server imports this
# module in each worker process, and each must start detection itself.
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
aiocop.start_blocking_io_detection()
aiocop.detect_slow_tasks(threshold_ms=30, on_slow_task=log_event)
# --8<-- [end:setup]


# --- the application: plain ASGI, no framework ------------------------------


async def index() -> str:
    await asyncio.sleep(0)
    return "hello"


async def report() -> str:
    return Path(__file__).read_text(encoding="utf-8")[:100]  # blocking file read on the loop


async def health() -> str:
    return "ok" if os.path.exists(__file__) else "missing"  # blocking os.stat, on every probe


async def admin_stats() -> str:
    time.sleep(0.01)  # a "short" pause that holds every other request
    return "{}"


ROUTES = {"/": index, "/report": report, "/health": health, "/admin/stats": admin_stats}


async def plain_app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    handler = ROUTES.get(scope["path"])
    status, body = (200, (await handler()).encode()) if handler is not None else (404, b"not found")
    headers: list[tuple[bytes, bytes]] = [(b"content-type", b"text/plain; charset=utf-8")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# --- aiocop: which requests to watch -----------------------------------------


# --8<-- [start:sampler]
def sampler(scope: Scope) -> bool | None:
    path: str = scope["path"]
    if path.startswith("/admin/"):
        return True  # rare and important: always watched
    if path == "/health":
        return False  # probed every second: never worth it
    return None  # everything else: sample_rate


app = AiocopMiddleware(
    plain_app,
    sample_rate=float(os.environ.get("AIOCOP_SAMPLE_RATE", "0.1")),
    sampler=sampler,
)
# --8<-- [end:sampler]
