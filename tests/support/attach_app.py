"""An ASGI app that never imports aiocop, for tests/commands/test_attach.py: /blocking, /stalling, /clean."""

from __future__ import annotations

import os
import time
from typing import Any


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    if scope["path"] == "/blocking":
        os.stat(__file__)  # ATTACH-APP-BLOCKING
    elif scope["path"] == "/stalling":
        end = time.perf_counter() + 0.1  # 100 ms holding the loop: 3x the threshold
        while time.perf_counter() < end:  # ATTACH-APP-STALL
            pass
    body = str(os.getpid()).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})
