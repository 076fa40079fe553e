"""aiocop's metrics and span events sent with OTLP, to an OpenTelemetry Collector or any OTLP receiver.

Run it: `OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 python examples/opentelemetry/otlp.py`
(a Collector's OTLP/HTTP receiver). A request, in its span, makes a blocking
call and holds the loop for 100 ms: the Collector gets the call and the stall
as metric points and as events of the request's span.
"""

from __future__ import annotations

import asyncio
import os
import time

# --8<-- [start:setup]
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from aiocop.opentelemetry import AiocopInstrumentor

resource = Resource.create({"service.name": "otlp-demo"})
meter_provider = MeterProvider(resource=resource, metric_readers=[PeriodicExportingMetricReader(OTLPMetricExporter())])
tracer_provider = TracerProvider(resource=resource)
tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
trace.set_tracer_provider(tracer_provider)

AiocopInstrumentor().instrument(meter_provider=meter_provider, tracer_provider=tracer_provider)
# --8<-- [end:setup]

tracer = trace.get_tracer("otlp-demo")


async def handle_request() -> None:
    with tracer.start_as_current_span("GET /report"):
        os.stat(__file__)  # OTLP-BLOCKING
        await asyncio.sleep(0.01)
        end = time.perf_counter() + 0.1  # CPU-bound work holding the loop for 100 ms
        while time.perf_counter() < end:  # OTLP-STALL
            pass
        await asyncio.sleep(0.2)  # the stall is reported while the request's span is open


asyncio.run(handle_request())
# Send what is left before the program ends.
tracer_provider.shutdown()
meter_provider.shutdown()
