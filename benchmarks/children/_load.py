"""A closed-loop load generator: N connections, each sends a request, waits for the whole reply, repeats.

Used by `echo_client.py` (1 KB TCP echo, as uvloop's echoclient.py does) and
by `http_client.py` (the fallback for wrk). Latency is measured per request,
from the write to the last byte of the reply; requests completed during the
warm-up are not counted. Results use the field names of `wrk_report.lua`.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import statistics
import time
from typing import Any


class Window:
    """The measurement window and what was recorded in it."""

    def __init__(self, warmup: float, duration: float) -> None:
        now = time.perf_counter()
        self.start = now + warmup
        self.end = self.start + duration
        self.latencies: list[float] = []
        self.errors = 0
        self.done: asyncio.Future[None] | None = None

    def record(self, sent: float) -> bool:
        """Note a completed request; whether the connection should send another."""
        now = time.perf_counter()
        if now >= self.end:
            return False
        if now >= self.start:
            self.latencies.append(now - sent)
        return True


class ClosedLoopClient(asyncio.Protocol):
    """One connection; subclasses say when a reply is complete."""

    def __init__(self, request: bytes, window: Window) -> None:
        self.request = request
        self.window = window
        self.sent = 0.0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.send()

    def send(self) -> None:
        self.sent = time.perf_counter()
        assert self.transport is not None
        self.transport.write(self.request)

    def reply_complete(self) -> None:
        if self.window.record(self.sent):
            self.send()
        else:
            assert self.transport is not None
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            self.window.errors += 1


def new_loop() -> asyncio.AbstractEventLoop:
    # The client should cost as little CPU as it can: uvloop when it is there.
    if importlib.util.find_spec("uvloop") is not None:
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


async def drive(factory: Any, port: int, connections: int, window: Window) -> None:
    loop = asyncio.get_running_loop()
    transports = []
    for _ in range(connections):
        transport, _protocol = await loop.create_connection(lambda: factory(window), "127.0.0.1", port)
        transports.append(transport)
    await asyncio.sleep(max(0.0, window.end - time.perf_counter()) + 0.05)
    for transport in transports:
        transport.close()
    await asyncio.sleep(0.01)


def report(window: Window, duration: float, **extra: Any) -> str:
    latencies = sorted(window.latencies)
    count = len(latencies)
    us = [x * 1e6 for x in latencies]
    return json.dumps(
        {
            "requests": count,
            "duration_us": duration * 1e6,
            "rps": count / duration,
            "mean_us": statistics.fmean(us) if us else None,
            "p50_us": us[count // 2] if us else None,
            "p99_us": us[min(count - 1, int(count * 0.99))] if us else None,
            "max_us": us[-1] if us else None,
            "errors": window.errors,
            **extra,
        }
    )
