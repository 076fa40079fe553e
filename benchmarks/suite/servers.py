"""Starting and stopping the servers under load: uvicorn and Granian (hello_app.py), the echo servers."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from suite.common import CHILDREN, HOST, child_env, spawn

if TYPE_CHECKING:
    from collections.abc import Iterator

# No proxy from the environment: everything here is 127.0.0.1.
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def uvicorn_http() -> str:
    """httptools, as `uvicorn[standard]` installs it and production runs it; h11 (much slower) without it."""
    return "httptools" if importlib.util.find_spec("httptools") is not None else "h11"


def asgi_command(server: str, port: int) -> list[str]:
    """One worker on uvloop."""
    if server == "uvicorn":
        return [
            *(sys.executable, "-m", "uvicorn", "hello_app:app", "--app-dir", str(CHILDREN)),
            *("--loop", "uvloop", "--http", uvicorn_http(), "--host", HOST, "--port", str(port)),
            *("--workers", "1", "--log-level", "warning", "--no-access-log"),
        ]
    if server == "granian":
        return [
            *(sys.executable, "-m", "granian", "hello_app:app", "--working-dir", str(CHILDREN)),
            *("--interface", "asgi", "--loop", "uvloop", "--host", HOST, "--port", str(port)),
            *("--workers", "1", "--log-level", "warning"),
        ]
    raise ValueError(f"unknown server {server!r}")


def http_get(port: int, path: str, timeout: float = 2.0) -> tuple[int, bytes]:
    with _opener.open(f"http://{HOST}:{port}{path}", timeout=timeout) as response:
        return response.status, response.read()


def _stop(process: subprocess.Popen[Any]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


def tree_cpu_seconds(root: int) -> float | None:
    """CPU time (user + system, all threads) of a process and its descendants; `None` without /proc.

    The server's own CPU time per request is insensitive to other processes
    taking the CPU away, unlike requests/s: on a shared machine it is the
    steadier measure of what aiocop adds to each request.
    """
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    parent: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text(encoding="ascii", errors="replace").rpartition(")")[2].split()
        except OSError:  # exited meanwhile
            continue
        pid = int(entry.name)
        parent[pid] = int(fields[1])
        ticks[pid] = int(fields[11]) + int(fields[12])  # utime + stime
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += ticks.get(pid, 0)
        stack += [child for child, ppid in parent.items() if ppid == pid]
    return total / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Running:
    port: int
    pid: int
    ready: dict[str, Any]  # what the server said when ready (echo servers)


@contextlib.contextmanager
def asgi_server(server: str, mode: str, cpu: int | None, timeout: float = 30.0) -> Iterator[Running]:
    """Serve hello_app.py in `mode`; yields it once `GET /` answers."""
    port = free_port()
    # A file, not a pipe: a pipe nobody reads during the load would block a chatty server.
    with tempfile.TemporaryFile("w+") as log:
        process = spawn(
            asgi_command(server, port), cpu, env=child_env(AIOCOP_BENCH_MODE=mode), stdout=log, stderr=subprocess.STDOUT
        )
        try:
            _wait_until_ready(server, process, port, timeout, log)
            yield Running(port, process.pid, {})
        finally:
            _stop(process)


def _wait_until_ready(server: str, process: subprocess.Popen[str], port: int, timeout: float, log: IO[str]) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"{server} exited with {process.returncode}:\n{log.read()[-3000:]}")
        with contextlib.suppress(OSError, urllib.error.URLError):
            if http_get(port, "/", timeout=0.5)[0] == 200:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{server} did not answer within {timeout} s")
        time.sleep(0.05)


@contextlib.contextmanager
def echo_server(mode: str, kind: str, loop: str, cpu: int | None) -> Iterator[Running]:
    """Run echo_server.py; yields it with its ready line (port, probe result)."""
    with tempfile.TemporaryFile("w+") as errors:
        process = spawn(
            [sys.executable, str(CHILDREN / "echo_server.py"), mode, kind, loop],
            cpu,
            env=child_env(),
            stdout=subprocess.PIPE,  # one line when ready, one at exit: never fills
            stderr=errors,
        )
        try:
            line = process.stdout.readline() if process.stdout is not None else ""
            if not line:
                process.wait(timeout=10)
                errors.seek(0)
                raise RuntimeError(f"the echo server did not start:\n{errors.read()[-3000:]}")
            ready: dict[str, Any] = json.loads(line)
            yield Running(ready["port"], process.pid, ready)
        finally:
            _stop(process)
