"""The 1 KB hello-world ASGI app of the throughput benchmark, served by uvicorn or Granian.

`$AIOCOP_BENCH_MODE` picks the mode (see `_mode.py`); the baseline never
imports aiocop. `GET /` answers 1024 bytes and makes no blocking call, so
what the benchmark measures is the cost of aiocop being switched on, not of
reporting. `GET /aiocop-probe`, sent once after the load, makes one blocking
call and answers what the server process saw: whether aiocop was imported
and whether the probe's event was delivered, proving that detection was live
in the worker that served the load.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import _mode

MODE = os.environ.get("AIOCOP_BENCH_MODE", _mode.BASELINE)
BODY = (b"Hello, world! " * 74)[:1024]
HEADERS = [(b"content-type", b"text/plain"), (b"content-length", str(len(BODY)).encode())]
PROBE_PATH = "/aiocop-probe"

probe = _mode.setup(MODE, keep_every=1)


async def status() -> bytes:
    before = probe.count if probe is not None else 0
    os.stat(".")  # the probe's blocking call
    await asyncio.sleep(0.01)  # its event is delivered right after this step
    event = probe.kept[-1] if probe is not None and probe.count > before else None
    return json.dumps(
        {
            "mode": MODE,
            "pid": os.getpid(),
            "loop": type(asyncio.get_running_loop()).__module__,
            "aiocop_imported": _mode.aiocop_imported(),
            "instrumented": _mode.instrumented(),
            "probe_delivered": event is not None,
            "probe_problem": _mode.check_event(event, ("os.stat",), "hello_app.py:") if event is not None else None,
            "probe_context": dict(event.context) if event is not None else None,
            "events_total": probe.count if probe is not None else 0,
        }
    ).encode()


async def plain_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    if scope["path"] == PROBE_PATH:
        body = await status()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})
        return
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": BODY})


if MODE == _mode.MIDDLEWARE:
    from aiocop.asgi import AiocopMiddleware

    app: Any = AiocopMiddleware(plain_app, sample_rate=1.0)
else:
    app = plain_app
