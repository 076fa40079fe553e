"""A TCP echo server for the throughput benchmark, in the style of uvloop's echoserver.py.

    python echo_server.py MODE KIND LOOP      (KIND: streams | protocol)

Listens on a free port of 127.0.0.1 and prints a JSON line with it once
ready. Before that, a task on the serving loop makes one blocking call, and
the line says whether aiocop delivered its event (in the aiocop modes), so
that the run proves detection was live on this loop. Runs until SIGTERM.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys

import _mode


class EchoProtocol(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)


async def echo_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        data = await reader.read(102400)
        if not data:
            break
        writer.write(data)
    writer.close()


async def startup_probe(probe: _mode.Probe | None) -> dict[str, object]:
    if probe is None:
        return {"probe_delivered": False, "probe_problem": None}
    os.stat(".")  # the probe's blocking call
    await asyncio.sleep(0.01)
    event = probe.kept[0] if probe.kept else None
    problem = _mode.check_event(event, ("os.stat",), "echo_server.py:") if event is not None else "no event"
    return {"probe_delivered": event is not None, "probe_problem": problem}


async def serve(kind: str, probe: _mode.Probe | None) -> None:
    loop = asyncio.get_running_loop()
    status = await startup_probe(probe)
    if kind == "streams":
        server = await asyncio.start_server(echo_stream, "127.0.0.1", 0)
    else:
        server = await loop.create_server(EchoProtocol, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    ready = {"port": port, "aiocop_imported": _mode.aiocop_imported(), "loop": type(loop).__module__, **status}
    print(json.dumps(ready), flush=True)
    await stop.wait()
    server.close()


def main() -> None:
    mode, kind, loop_name = sys.argv[1], sys.argv[2], sys.argv[3]
    probe = _mode.setup(mode, keep_every=1)
    loop = _mode.loop_factory(loop_name)()
    try:
        loop.run_until_complete(serve(kind, probe))
    finally:
        loop.close()
    print(json.dumps({"events_total": probe.count if probe is not None else 0}), flush=True)


if __name__ == "__main__":
    main()
