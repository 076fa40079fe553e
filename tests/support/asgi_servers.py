"""Serving an ASGI app with uvicorn or Granian in a subprocess, for tests/integrations/test_asgi.py."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

if TYPE_CHECKING:
    from collections.abc import Iterable

ROOT = Path(__file__).resolve().parents[2]

HOST = "127.0.0.1"
BLOCKED_PREFIX = "/nonexistent-aiocop-asgi-test/"  # as in tests/support/asgi_app.py


def server_command(kind: str, port: int, target: str, app_dir: Path) -> list[str]:
    """`uvicorn`, `granian` (both with uvloop), or `granian-rloop` (Granian's default loop when rloop is installed)."""
    if kind == "uvicorn":
        return [
            *(sys.executable, "-m", "uvicorn", target, "--app-dir", str(app_dir)),
            *("--loop", "uvloop", "--host", HOST, "--port", str(port), "--log-level", "warning", "--no-access-log"),
        ]
    loop = kind.partition("-")[2] or "uvloop"
    return [
        *(sys.executable, "-m", "granian", target, "--working-dir", str(app_dir)),
        *("--interface", "asgi", "--loop", loop, "--host", HOST, "--port", str(port), "--workers", "1"),
        *("--log-level", "warning"),
    ]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


class Server:
    """A server subprocess serving one ASGI app on 127.0.0.1, and what it reported."""

    def __init__(self, kind: str, target: str, app_dir: Path, workdir: Path, env: dict[str, str]) -> None:
        self.kind = kind
        self.events_path = workdir / "events.jsonl"
        self.log_path = workdir / "server.log"
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        environment = {**os.environ, "AIOCOP_ASGI_EVENTS": str(self.events_path), **env}
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                server_command(kind, self.port, target, app_dir),
                cwd=ROOT,
                env=environment,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def wait_until_ready(self, path: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        with httpx.Client(base_url=self.url, trust_env=False, timeout=1.0) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"{self.kind} exited with {self.process.returncode}:\n{self.log()}")
                with contextlib.suppress(httpx.TransportError):
                    if client.get(path).status_code < 500:
                        return
                time.sleep(0.05)
        raise RuntimeError(f"{self.kind} did not answer within {timeout} s:\n{self.log()}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def events(self) -> list[dict[str, Any]]:
        if not self.events_path.exists():
            return []
        lines = self.events_path.read_text(encoding="utf-8").splitlines(keepends=True)
        return [json.loads(line) for line in lines if line.endswith("\n")]  # a line being written is skipped

    def wait_for(self, request_id: str, timeout: float = 15.0) -> list[dict[str, Any]]:
        """All events so far, once one of them is the given request's."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            events = self.events()
            if any(e.get("context", {}).get("request_id") == request_id for e in events):
                return events
            time.sleep(0.02)
        raise AssertionError(f"no event of request {request_id} from {self.kind}:\n{self.log()}\n{events}")

    def settle(self, client: httpx.Client) -> list[dict[str, Any]]:
        """Every event of the requests answered so far.

        A sampled blocking request sent now is delivered after every earlier
        step of the server's (single) loop: once its event is written, those
        of earlier requests are too.
        """
        request_id = new_id("barrier")
        client.get("/sampled/block", headers={"x-request-id": request_id}).raise_for_status()
        return self.wait_for(request_id)

    def wait_for_logged(self, request_id: str, timeout: float = 15.0) -> list[dict[str, Any]]:
        """The events examples/asgi_app.py logged (`blocking call {json}`), once the given request's is among them."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            logged = [
                json.loads(line.partition("blocking call ")[2])
                for line in self.log().splitlines()
                if "blocking call {" in line
            ]
            if any(e.get("request_id") == request_id for e in logged):
                return logged
            time.sleep(0.02)
        raise AssertionError(f"the example logged no event of {request_id}:\n{self.log()}")


def new_id(label: str) -> str:
    return f"{label}-{uuid.uuid4().hex[:12]}"


def mentioning(events: Iterable[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    return [e for e in events if text in json.dumps(e)]


def rloop_param() -> Any:
    """`granian-rloop` for a parametrised fixture, skipped with the reason when rloop is missing."""
    if importlib.util.find_spec("rloop") is None:  # shown in the -ra summary, never silent
        return pytest.param("granian-rloop", marks=pytest.mark.skip(reason="rloop is not installed here"))
    return "granian-rloop"
