"""A service that deadlocks: its request handlers wait for a lock a background thread never releases.

    python -m aiocop run --hang-after-ms 1000 examples/hangs/deadlock.py

aiocop prints the hang a second in, with the stack, the task, the request and
the thread holding the lock; end it with Ctrl-C or SIGTERM for the report.
See docs/how-to/hangs.md.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time

import aiocop

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
aiocop.register_context_provider(lambda: {"request_id": request_id.get()})

cache_lock = threading.RLock()


def refresh_cache() -> None:
    with cache_lock:
        time.sleep(3600)  # REFRESH: a call that does not return, holding the lock


async def handle(number: int) -> int:
    request_id.set(f"req-{number}")
    await asyncio.sleep(0.01)
    with cache_lock:  # DEADLOCK: the loop waits here for the refresher's lock
        return number


async def main() -> None:
    threading.Thread(target=refresh_cache, name="cache-refresher", daemon=True).start()
    await asyncio.sleep(0.1)
    await asyncio.gather(*(asyncio.create_task(handle(n), name=f"request-{n}") for n in range(3)))


if __name__ == "__main__":
    asyncio.run(main())
