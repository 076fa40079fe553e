"""The smallest production set-up: detection, logs, and the sampling middleware.

Serve it from this directory with `uvicorn asgi_minimal:app` (or Granian).
The application is plain ASGI and checks a file on every request, a blocking
call that aiocop logs for the requests it samples (one in twenty).
"""

from __future__ import annotations

import os

import aiocop
from aiocop.asgi import AiocopMiddleware, Receive, Scope, Send


async def hello(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    found = os.path.exists(__file__)  # a blocking os.stat, on the loop
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"hello" if found else b"?"})


# --8<-- [start:setup]
aiocop.start_blocking_io_detection()  # at import: in every server worker process
aiocop.detect_slow_tasks(threshold_ms=50)
aiocop.log_events()  # standard logging, logger "aiocop.events"; or aiocop.structlog.log_events()

app = AiocopMiddleware(hello, sample_rate=0.05)  # wraps any ASGI app: FastAPI, Starlette, Litestar, ...
# --8<-- [end:setup]
