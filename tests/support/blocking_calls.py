"""Blocking calls used by the tests, each marking its line with `# BLOCKS`."""

from __future__ import annotations

import contextlib
import inspect
import os
import select
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from time import sleep as bound_sleep  # bound before aiocop patches time.sleep
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable


def do_sleep() -> None:
    time.sleep(0.001)  # BLOCKS


def do_bound_sleep() -> None:
    bound_sleep(0.001)  # BLOCKS


def do_open_read() -> None:
    with open(__file__, encoding="utf-8") as f:  # BLOCKS
        f.read()


def do_stat() -> None:
    os.stat(__file__)  # BLOCKS


def do_listdir() -> None:
    os.listdir(os.path.dirname(__file__))  # BLOCKS


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def do_connect_refused() -> None:
    port = _closed_port()
    with socket.socket() as s, contextlib.suppress(OSError):
        s.connect(("127.0.0.1", port))  # BLOCKS


def do_recv_socketpair() -> None:
    a, b = socket.socketpair()
    with a, b:
        b.send(b"x")  # a blocking send, not what this case checks
        a.recv(1)  # BLOCKS


def do_getaddrinfo() -> None:
    socket.getaddrinfo("localhost", 80)  # BLOCKS


def do_subprocess() -> None:
    subprocess.run([sys.executable, "-c", "pass"], check=True)  # BLOCKS


def do_select() -> None:
    select.select([], [], [], 0.001)  # BLOCKS


def do_event_wait() -> None:
    threading.Event().wait(0.001)  # BLOCKS


# Held for the whole test session: a plain Lock blocks every acquirer, even
# the thread that holds it, so acquiring it with a timeout always waits.
_held = threading.Lock()
_held.acquire()


def do_held_lock() -> None:
    _held.acquire(timeout=0.001)  # BLOCKS


def do_pipe_read() -> None:
    r, w = os.pipe()
    try:
        os.write(w, b"x")
        os.read(r, 1)  # BLOCKS
    finally:
        os.close(r)
        os.close(w)


# A database file (one in memory reads and writes none: not reported), named
# at import so that finding the temporary folder is not part of the call.
SQLITE_FILE = os.path.join(tempfile.gettempdir(), "aiocop-tests.sqlite3")


def do_sqlite() -> None:
    with sqlite3.connect(SQLITE_FILE) as db:  # BLOCKS
        db.execute("select 1").fetchall()
    db.close()


@dataclass(frozen=True)
class Case:
    name: str
    event: str
    func: Callable[[], None]

    @property
    def line(self) -> int:
        lines, first = inspect.getsourcelines(self.func)
        return first + next(i for i, text in enumerate(lines) if "# BLOCKS" in text)

    @property
    def site(self) -> str:
        return f"blocking_calls.py:{self.line}:{self.func.__name__}"


CASES: tuple[Case, ...] = (
    Case("sleep", "time.sleep", do_sleep),
    Case("open_read", "open", do_open_read),
    Case("stat", "os.stat", do_stat),
    Case("listdir", "os.listdir", do_listdir),
    Case("connect_refused", "socket.connect", do_connect_refused),
    Case("recv_socketpair", "socket.socket.recv", do_recv_socketpair),
    Case("getaddrinfo", "socket.getaddrinfo", do_getaddrinfo),
    Case("subprocess", "subprocess.Popen", do_subprocess),
    Case("select", "select.select", do_select),
    Case("event_wait", "threading.Event.wait", do_event_wait),
    Case("held_lock", "threading.Lock.acquire", do_held_lock),
    Case("pipe_read", "os.read", do_pipe_read),
    Case("sqlite", "sqlite3.connect", do_sqlite),
)
