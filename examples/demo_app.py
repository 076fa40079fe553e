"""A small async web app with blocking calls hidden in its handlers.

It knows nothing of aiocop. `make demo` runs it under aiocop's CLI:

    python -m aiocop run --uvloop examples/demo_app.py

A client sends a few requests over loopback; at exit aiocop prints the call
sites that blocked the event loop, worst first.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

TEMPLATE = Path(__file__).with_name("demo_template.html")


# --- the application -------------------------------------------------------


def render(name: str) -> str:
    return TEMPLATE.read_text(encoding="utf-8").replace("{name}", name)  # blocking file read


async def hello(query: str) -> str:
    await asyncio.sleep(0)
    return render(query or "world")


async def health(query: str) -> str:
    disk_ok = os.path.exists("/")  # blocking os.stat
    host = socket.gethostbyname("localhost")  # blocking DNS
    return json.dumps({"disk": disk_ok, "host": host})


async def report(query: str) -> str:
    time.sleep(0.05)  # "just a short pause" that freezes every other request
    out = subprocess.run([sys.executable, "-c", "print('built')"], capture_output=True, text=True, check=True)
    return out.stdout


async def stats(query: str) -> str:
    # Pure CPU, no call to intercept: the stall watchdog sees it. Sized in time
    # (150 ms, 5x the 30 ms threshold), so it stalls on any machine.
    deadline = time.perf_counter() + 0.15
    total = 0
    while time.perf_counter() < deadline:
        for i in range(1000):
            total += i * i % 7
    return str(total)


async def fine(query: str) -> str:
    data = await asyncio.to_thread(TEMPLATE.read_text, encoding="utf-8")  # done right: off the loop
    return str(len(data))


ROUTES = {"/hello": hello, "/health": health, "/report": report, "/stats": stats, "/fine": fine}


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    request_line = (await reader.readline()).decode()
    while (await reader.readline()) not in (b"\r\n", b""):
        pass
    path, _, query = request_line.split(" ")[1].partition("?")
    body = (await ROUTES[path](query)).encode()
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    await writer.drain()
    writer.close()


async def get(port: int, path: str) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: demo\r\n\r\n".encode())
    await writer.drain()
    data = await reader.read()
    writer.close()
    return data


async def main() -> None:
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    print(f"demo app on {type(asyncio.get_running_loop()).__module__} serving 127.0.0.1:{port}")
    for path in ("/hello?aiocop", "/health", "/report", "/stats", "/fine", "/hello"):
        response = await get(port, path)
        status = response.partition(b"\r\n")[0].decode()
        print(f"GET {path:14} -> {status}, {len(response)} bytes")
        await asyncio.sleep(0.01)
    server.close()
    await server.wait_closed()


if __name__ == "__main__":
    asyncio.run(main())
