"""Blocking calls as structured log entries, through structlog.

Run it: `python examples/log_with_structlog.py` (`pip install 'aiocop[structlog]'`).
Each entry is one JSON object: event name, call site, duration, severity,
task, thread, trace, plus what your context providers return.
"""

import asyncio
import contextvars
import os

import structlog

import aiocop
import aiocop.structlog

structlog.configure(processors=[structlog.processors.add_log_level, structlog.processors.JSONRenderer()])

request_path: contextvars.ContextVar[str] = contextvars.ContextVar("request_path", default="-")

# --8<-- [start:setup]
aiocop.start_blocking_io_detection()
aiocop.register_context_provider(lambda: {"http_path": request_path.get()})
aiocop.structlog.log_events()  # first entry per call site in full, then counts
# --8<-- [end:setup]


async def handle(path: str) -> bool:
    request_path.set(path)
    return os.path.exists("/etc/hosts")  # blocking os.stat


async def main() -> None:
    await asyncio.gather(handle("/items"), handle("/users"), handle("/items"))


asyncio.run(main())
