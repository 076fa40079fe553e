"""What aiocop costs a debug-mode loop: TCP connections opened and closed, with and without aiocop.

An event loop in debug mode (every `unittest.IsolatedAsyncioTestCase` runs
one, as do `asyncio.run(debug=True)` and `PYTHONASYNCIODEBUG=1`) records a
traceback with every callback and future it makes, and `linecache` checks
each frame's source file with `os.stat`: hundreds of known-harmless calls
per connection, which aiocop sees and drops. This times a connect and close
to a local server on such a loop, in separate processes (the baseline never
imports aiocop), alternating, and prints medians and spread.

    python benchmarks/debug_loop_connect.py [--rounds 5] [--connections 300]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

CHILD = r"""
import asyncio, sys, time
mode, count = sys.argv[1], int(sys.argv[2])
reported = [0]
if mode == "aiocop":
    import aiocop
    aiocop.start_blocking_io_detection()
    aiocop.register_slow_task_callback(lambda event: reported.__setitem__(0, reported[0] + 1))

async def handle(reader, writer):
    writer.close()
    await writer.wait_closed()

async def connect_once(port):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    await reader.read()
    writer.close()
    await writer.wait_closed()

async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    for _ in range(20):  # warm-up: imports, caches
        await connect_once(port)
    started = time.perf_counter()
    for _ in range(count):
        await connect_once(port)
    elapsed = time.perf_counter() - started
    server.close()
    await server.wait_closed()
    return elapsed / count * 1e3

print(asyncio.run(main(), debug=True), reported[0])
"""


def run(mode: str, connections: int) -> tuple[float, int]:
    out = subprocess.run(
        [sys.executable, "-X", "dev", "-c", CHILD, mode, str(connections)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return float(out[0]), int(out[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--connections", type=int, default=300)
    args = parser.parse_args()
    times: dict[str, list[float]] = {"baseline": [], "aiocop": []}
    reports = 0
    for _ in range(args.rounds):
        for mode, values in times.items():  # alternate: A B A B ...
            ms, reported = run(mode, args.connections)
            values.append(ms)
            reports += reported
    print(f"debug-mode loop, ms per connect and close, Python {sys.version.split()[0]} ({args.rounds} rounds)")
    for mode, values in times.items():
        spread = f"{min(values):.3f}-{max(values):.3f}"
        print(f"{mode:9} median {statistics.median(values):.3f} ms  (spread {spread})")
    ratio = statistics.median(times["aiocop"]) / statistics.median(times["baseline"])
    print(f"aiocop / baseline: {ratio:.2f}; events reported: {reports} (every call here is harmless)")


if __name__ == "__main__":
    main()
