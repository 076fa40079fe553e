"""A service run as several worker processes, each exposing aiocop's metrics for Prometheus.

Run it with uvicorn or Granian, several workers, and a folder Prometheus
watches for targets (`file_sd_configs`, see docs/how-to/prometheus.md):

    AIOCOP_PROMETHEUS_TARGETS=/tmp/aiocop-targets \\
        uvicorn fleet_app:app --app-dir examples/opentelemetry --workers 4
    AIOCOP_PROMETHEUS_TARGETS=/tmp/aiocop-targets \\
        granian --interface asgi --workers 4 --working-dir examples/opentelemetry fleet_app:app

tests/integrations/test_prometheus.py runs it with a real Prometheus server.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from worker_metrics import serve_metrics

if TYPE_CHECKING:
    from starlette.requests import Request

# --8<-- [start:setup]
serve_metrics("fleet-demo", os.environ["AIOCOP_PROMETHEUS_TARGETS"])
# --8<-- [end:setup]


async def clean(request: Request) -> JSONResponse:
    await asyncio.sleep(0)
    return JSONResponse({"pid": os.getpid()})


async def blocking(request: Request) -> JSONResponse:
    os.stat(__file__)  # FLEET-BLOCKING: a blocking call on the loop
    return JSONResponse({"pid": os.getpid()})


async def stalling(request: Request) -> JSONResponse:
    # CPU-bound work that holds the loop for 250 ms: past the watchdog's idle look interval (100 ms),
    # since Granian's default loop (rloop) tells the watchdog nothing of when it woke, and a shorter
    # stall right after a quiet spell can go unseen there (docs/concepts/watchdog.md).
    end = time.perf_counter() + 0.25
    while time.perf_counter() < end:  # FLEET-STALL
        pass
    return JSONResponse({"pid": os.getpid()})


# Held for ever: a request to /hang waits for it, as a deadlocked handler would (for `seconds` at most).
NEVER_FREE = threading.Lock()
NEVER_FREE.acquire()


async def hang(request: Request) -> JSONResponse:
    seconds = min(float(request.query_params.get("seconds", "10")), 60.0)
    NEVER_FREE.acquire(timeout=seconds)  # FLEET-HANG: the worker's loop is stuck here meanwhile
    return JSONResponse({"pid": os.getpid()})


app = Starlette(
    routes=[Route("/clean", clean), Route("/blocking", blocking), Route("/stalling", stalling), Route("/hang", hang)]
)
