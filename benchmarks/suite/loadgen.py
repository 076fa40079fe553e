"""The HTTP load generator: wrk when it is installed, else children/http_client.py."""

from __future__ import annotations

import math
import shutil
from typing import Any

from suite.common import CHILDREN, HOST, last_json, run, run_child

WRK_SCRIPT = CHILDREN / "wrk_report.lua"


def choose(requested: str) -> str:
    """`wrk` or `python`; `auto` is wrk when it is on PATH."""
    if requested == "auto":
        return "wrk" if shutil.which("wrk") else "python"
    if requested == "wrk" and not shutil.which("wrk"):
        raise SystemExit("--loadgen wrk: wrk is not installed (apt-get install wrk), use --loadgen python")
    return requested


def http_load(generator: str, port: int, connections: int, duration: float, cpu: int | None) -> dict[str, Any]:
    """Load the server for `duration` seconds: requests/s and latency."""
    if generator == "python":
        return run_child("http_client.py", port, connections, 0, duration, cpu=cpu, timeout=duration + 60)
    return _wrk(port, connections, duration, cpu)


def _wrk(port: int, connections: int, seconds: float, cpu: int | None) -> dict[str, Any]:
    # wrk takes whole seconds; one thread, as the server has one worker.
    command = [
        *("wrk", "-t1", f"-c{connections}", f"-d{max(1, math.ceil(seconds))}s", "--timeout", "5s"),
        *("-s", str(WRK_SCRIPT), f"http://{HOST}:{port}/"),
    ]
    result = last_json(run(command, timeout=seconds + 60, cpu=cpu), command)
    result.update(connections=connections, generator="wrk")
    return result
