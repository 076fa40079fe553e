"""A small service that blocks its loop in the ways real ones do: the example of the configuration how-to.

`python -m aiocop run app.py` shows one row per cause, at this file's lines:
a package imported inside a task and a synchronous HTTP client call. What
the standard library and asyncio do on their own (`datetime.strptime()`
importing `_strptime`, `start_unix_server()` checking for a stale socket
file) is not reported.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import httpx


class Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


async def handle_upload() -> None:
    import structlog  # imported on the first upload, inside the task: one row, here

    structlog.get_logger("upload").bind(stage="received")


async def parse_date(text: str) -> datetime.datetime:
    return datetime.datetime.strptime(text, "%Y-%m-%d")


async def serve_unix(path: str) -> None:
    server = await asyncio.start_unix_server(lambda reader, writer: writer.close(), path)
    server.close()
    await server.wait_closed()


async def fetch_status(url: str) -> int:
    return httpx.get(url).status_code  # a blocking client inside a coroutine: one row, here


async def main(backend_url: str, folder: str) -> None:
    await asyncio.gather(
        handle_upload(),
        parse_date("2026-11-25"),
        serve_unix(os.path.join(folder, "app.sock")),
        fetch_status(backend_url),
    )


if __name__ == "__main__":
    # Set up outside the loop: a backend to call, and a folder for the socket.
    backend = HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(main(f"http://127.0.0.1:{backend.server_port}/health", folder))
    backend.shutdown()
