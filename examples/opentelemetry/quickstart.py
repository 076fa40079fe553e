"""AiocopInstrumentor in one line, on a program that makes a blocking call and stalls its loop.

Run it: `python examples/opentelemetry/quickstart.py` (needs `opentelemetry-sdk`).
It prints the points OpenTelemetry holds afterwards: the `os.stat` at its
line, the 80 ms stall, and the loop-delay histogram's largest value.
"""

from __future__ import annotations

import asyncio
import os
import time

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

reader = InMemoryMetricReader()  # your exporter's reader, in an application
provider = MeterProvider(metric_readers=[reader])

# --8<-- [start:setup]
from aiocop.opentelemetry import AiocopInstrumentor  # noqa: E402 - the line the page shows

AiocopInstrumentor().instrument(meter_provider=provider)  # or no argument: the global meter provider
# --8<-- [end:setup]


async def main() -> None:
    os.stat(__file__)  # a blocking call on the loop
    await asyncio.sleep(0.05)
    # CPU-bound work holding the loop for 80 ms of its thread's CPU time (at
    # least as long in wall time, however busy the machine)
    end = time.thread_time() + 0.08
    while time.thread_time() < end:
        pass
    await asyncio.sleep(0.05)


asyncio.run(main())

data = reader.get_metrics_data()
for metric in data.resource_metrics[0].scope_metrics[0].metrics if data else []:
    for point in metric.data.data_points:
        attributes = dict(point.attributes)
        if metric.name == "asyncio.eventloop.delay":
            print(f"{metric.name}: {point.count} values, max {point.max:.3f} s")
        elif metric.name != "aiocop.loop.blocked_time":
            where = f"{attributes.get('code.file.path')}:{attributes.get('code.line.number')}"
            print(f"{metric.name} {attributes.get('aiocop.event', '')} at {where}: {point.value}".replace("  ", " "))
