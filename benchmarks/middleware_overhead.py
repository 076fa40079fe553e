"""What AiocopMiddleware adds to a request, sampled and not, with detection on.

One task per request, as ASGI servers do, on uvloop; the three arms run in
turn, round after round, and the script prints the median extra time per
request against the bare application (no server, no network: the
middleware's own cost).

    python benchmarks/middleware_overhead.py [--rounds 15] [--requests 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import uvloop

import aiocop
from aiocop.asgi import AiocopMiddleware


async def app(scope: Any, receive: Any, send: Any) -> None:
    pass


async def per_request_us(target: Any, requests: int) -> float:
    loop = asyncio.get_running_loop()
    scope = {"type": "http", "method": "GET", "path": "/x", "headers": []}
    t0 = time.perf_counter()
    for _ in range(requests):
        await loop.create_task(target(dict(scope), None, None))
    return (time.perf_counter() - t0) / requests * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--requests", type=int, default=20_000)
    args = parser.parse_args()
    aiocop.start_blocking_io_detection()
    aiocop.register_slow_task_callback(lambda event: None)
    arms = {
        "bare app": app,
        "unsampled": AiocopMiddleware(app, sample_rate=0.0),
        "sampled": AiocopMiddleware(app, sample_rate=1.0),
    }
    runs: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(args.rounds):
        for name, target in arms.items():
            runs[name].append(uvloop.run(per_request_us(target, args.requests)))
    base = statistics.median(runs["bare app"])
    print(f"bare app: {base:.2f} us/request (median of {args.rounds} rounds of {args.requests})")
    for name in ("unsampled", "sampled"):
        extra = [r - base for r in runs[name]]
        print(f"{name:9}: +{statistics.median(extra):.2f} us/request (stdev {statistics.stdev(extra):.2f})")


if __name__ == "__main__":
    main()
