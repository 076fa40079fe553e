"""Each worker process of a server: its own /metrics, listed for Prometheus to find.

Call `serve_metrics()` in the module that defines the app: every worker
imports it, so every worker serves its own metrics (a port of its own, found
free) and writes a one-target file in a folder Prometheus watches
(`file_sd_configs`). A worker that stops leaves its file (server workers end
without running exit handlers): start each deploy with an empty folder.
Used by fleet_app.py; see docs/how-to/prometheus.md.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from prometheus_client import start_http_server

from aiocop.opentelemetry import AiocopInstrumentor


def serve_metrics(service: str, targets: str, host: str = "127.0.0.1") -> None:
    """Serve this worker's metrics on a free port of `host`, and list it in the folder `targets`."""
    reader = PrometheusMetricReader()
    server, _ = start_http_server(0, addr=host)
    target = Path(targets) / f"{service}-{socket.gethostname()}-{os.getpid()}.json"
    listing = [{"targets": [f"{host}:{server.server_port}"], "labels": {"service": service}}]
    partial = target.with_suffix(".partial")
    partial.write_text(json.dumps(listing))
    partial.replace(target)  # whole or not at all: Prometheus may read it at any moment
    # Last: the set-up's own file and socket calls are not the application's.
    instance = f"{socket.gethostname()}:{os.getpid()}"
    resource = Resource.create({"service.name": service, "service.instance.id": instance})
    AiocopInstrumentor().instrument(meter_provider=MeterProvider(resource=resource, metric_readers=[reader]))
