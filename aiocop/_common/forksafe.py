"""Locks that a forked child can use.

`fork()` copies a process with only the forking thread: a lock another thread
held at that moment stays held in the child for ever, and the child hangs at
the first aiocop call that takes it (a blocking call's delivery, a stall's
hand-over). Every lock aiocop makes comes from here, and each is reset to
unlocked in the child right after a fork, as the standard library does for
its own (`logging`, `threading`), before any other of aiocop's fork handlers
runs (handlers run in the order they were registered, and every module that
registers one imports this module first).
"""

from __future__ import annotations

import os
import threading
import weakref
from _thread import LockType
from typing import Any

# Weakly held: a lock that belongs to an object (a Summary, a log filter) goes
# with it.
_locks: weakref.WeakSet[Any] = weakref.WeakSet()


# The lock type's own C methods, read before aiocop wraps `acquire` and
# `__enter__` (patch_audit_functions runs after every aiocop module is
# imported). aiocop's own locks taken on a loop's thread (a delivery, the
# OpenTelemetry totals) go through these, `acquire(lock)` ... `release(lock)`,
# not `with lock:`, which would pass through aiocop's Python wrapper of
# `__enter__` (about 2 400 instructions each time).
acquire = LockType.acquire
release = LockType.release


def lock() -> threading.Lock:
    """A `threading.Lock` that is unlocked again in a forked child."""
    new = threading.Lock()
    _locks.add(new)
    return new


def held() -> list[Any]:
    """Every live lock made here (for the tests)."""
    return list(_locks)


def _reinit_in_child() -> None:
    for each in list(_locks):
        each._at_fork_reinit()  # CPython's own reset of a lock, used by threading and logging


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reinit_in_child)
