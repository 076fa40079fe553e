"""Stalls used by the watchdog tests; each marks its line with `# STALLS`."""

from __future__ import annotations

import contextlib
import hashlib
import queue
import select
import threading
import time
from time import sleep as bound_sleep  # bound before aiocop patches time.sleep


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:  # STALLS
        pass


def sleep_bound_before_patching(seconds: float) -> None:
    bound_sleep(seconds)  # STALLS


def sleep_seen(seconds: float) -> None:
    time.sleep(seconds)  # STALLS


def wait_unseen(seconds: float) -> None:
    # A wait no audit event or wrapper sees, on any Python version (from 3.13
    # time.sleep raises an audit event of its own, even bound before patching).
    with contextlib.suppress(queue.Empty):
        queue.SimpleQueue().get(timeout=seconds)  # STALLS


def select_timeout(seconds: float) -> None:
    select.select([], [], [], seconds)  # STALLS


_held = threading.Lock()
_held.acquire()  # held for the whole session: acquiring it always waits


def wait_on_held_lock(seconds: float) -> None:
    _held.acquire(timeout=seconds)  # STALLS


_BUFFER = bytes(range(256)) * (1 << 16)  # 16 MiB


def hash_big_buffer(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        hashlib.sha256(_BUFFER).digest()  # STALLS


def sleep_then_work(seconds: float) -> None:
    time.sleep(seconds)  # STALLS
    spin(0.02)
