"""Datadog (ddtrace) trace and span ids on aiocop's events, through a context provider.

Run it: `python examples/tracing/datadog_ids.py` (needs `ddtrace`; no agent is
needed for this demo, though ddtrace may log that it cannot reach one).
Two requests run concurrently, each in its own span; each blocks once. Every
event carries the ids of the span that was current where the blocking call
was made.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from ddtrace.trace import tracer

import aiocop


# --8<-- [start:provider]
def trace_ids() -> dict[str, Any] | None:
    span = tracer.current_span()
    if span is None:
        return None  # not inside a span: nothing to add
    return {"dd.trace_id": str(span.trace_id), "dd.span_id": str(span.span_id)}


aiocop.register_context_provider(trace_ids)
# --8<-- [end:provider]


def report(event: aiocop.SlowTaskEvent) -> None:
    print(json.dumps({"event": "aiocop", "calls": [c["name"] for c in event.blocking_events], **event.context}))


aiocop.start_blocking_io_detection()
aiocop.detect_slow_tasks(threshold_ms=30, on_slow_task=report)


async def handle(path: str) -> None:
    with tracer.trace("web.request", resource=f"GET {path}") as span:
        print(json.dumps({"event": "span", "path": path, "trace_id": str(span.trace_id)}))
        await asyncio.sleep(0.01)
        os.path.exists("/etc/hosts")  # blocking os.stat, inside the span
        await asyncio.sleep(0.01)


async def main() -> None:
    await asyncio.gather(handle("/items"), handle("/users"))


asyncio.run(main())
