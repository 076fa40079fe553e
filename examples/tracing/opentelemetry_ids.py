"""OpenTelemetry trace and span ids on aiocop's events, through a context provider.

Run it: `python examples/tracing/opentelemetry_ids.py` (needs `opentelemetry-sdk`).
Two requests run concurrently, each in its own span; each blocks once. Every
event carries the ids of the span that was current where the blocking call
was made, so it can be found next to its trace.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

import aiocop

trace.set_tracer_provider(TracerProvider())  # your usual OpenTelemetry set-up (exporters, ...) goes here
tracer = trace.get_tracer("example")


# --8<-- [start:provider]
def trace_ids() -> dict[str, Any] | None:
    span_context = trace.get_current_span().get_span_context()
    if not span_context.is_valid:
        return None  # not inside a span: nothing to add
    return {
        "trace_id": trace.format_trace_id(span_context.trace_id),
        "span_id": trace.format_span_id(span_context.span_id),
    }


aiocop.register_context_provider(trace_ids)
# --8<-- [end:provider]


def report(event: aiocop.SlowTaskEvent) -> None:
    print(json.dumps({"event": "aiocop", "calls": [c["name"] for c in event.blocking_events], **event.context}))


aiocop.start_blocking_io_detection()
aiocop.detect_slow_tasks(threshold_ms=30, on_slow_task=report)


async def handle(path: str) -> None:
    with tracer.start_as_current_span(f"GET {path}") as span:
        ids = span.get_span_context()
        print(json.dumps({"event": "span", "path": path, "trace_id": trace.format_trace_id(ids.trace_id)}))
        await asyncio.sleep(0.01)
        os.path.exists("/etc/hosts")  # blocking os.stat, inside the span
        await asyncio.sleep(0.01)


async def main() -> None:
    await asyncio.gather(handle("/items"), handle("/users"))


asyncio.run(main())
