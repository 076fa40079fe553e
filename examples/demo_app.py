"""A small async web app with blocking calls hidden in its handlers.

`make demo` runs it: aiocop is switched on at start-up (before any loop
exists), a client sends a few requests over loopback, and the blocking calls
the handlers made are printed with the line that made them.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import aiocop

TEMPLATE = Path(__file__).with_name("demo_template.html")
events: list[aiocop.SlowTaskEvent] = []


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
    total = 0
    for i in range(600_000):  # pure CPU: no call to intercept, the stall watchdog sees it
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
    for path in ("/hello?aiocop", "/health", "/report", "/stats", "/fine", "/hello"):
        await get(port, path)
        await asyncio.sleep(0.01)
    server.close()
    await server.wait_closed()


# --- start-up: what a user adds --------------------------------------------


def print_report() -> None:
    calls = [(call, event) for event in events for call in event.blocking_events]
    stalls = [event for event in events if event.reason == "cpu_blocking"]
    print(f"\naiocop caught {len(calls)} blocking calls and {len(stalls)} stall(s) in {len(events)} steps:\n")
    print(f"{'severity':8}  {'event':22}  {'step ms':>8}  line that made the call")
    for call, event in calls:
        print(f"{event.severity_level:8}  {call['name']:22}  {event.elapsed_ms:8.2f}  {call['entry_point']}")
    for event in stalls:
        print(f"{'stall':8}  {'(no call to intercept)':22}  {event.elapsed_ms:8.2f}  {event.call_site}")
        print(f"{'':8}  {'':22}  {'':8}  {event.culprit}")
    by_site = Counter(call["entry_point"] for call, _ in calls)
    print(f"\n{len(by_site)} call sites; /fine (which uses asyncio.to_thread) is not among them.")


if __name__ == "__main__":
    aiocop.start_blocking_io_detection(trace_depth=10)
    aiocop.detect_slow_tasks(threshold_ms=30, on_slow_task=events.append)
    try:
        import uvloop

        runner = uvloop.run
        print(f"running on uvloop {uvloop.__version__}")
    except ImportError:
        runner = asyncio.run
        print("running on asyncio")
    runner(main())
    time.sleep(0.1)  # stalls are reported by the watchdog thread just after they end
    print_report()
    time.sleep(0.1)  # stalls are reported by the watchdog thread just after they end
    sites = {call["entry_point"].split(":")[0] for e in events for call in e.blocking_events}
    sites |= {e.call_site.split(":")[0] for e in events if e.reason == "cpu_blocking"}
    if sites != {"examples/demo_app.py"} or not any(e.reason == "cpu_blocking" for e in events):
        sys.exit(f"demo: unexpected report: {sites}")
