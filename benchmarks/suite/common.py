"""Running child processes, summarising repeated measurements, describing the machine."""

from __future__ import annotations

import datetime
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CHILDREN = ROOT / "benchmarks" / "children"
HOST = "127.0.0.1"
OPTIONAL_LOOPS = ("uvloop", "rloop", "veloxloop")


def child_env(**extra: str) -> dict[str, str]:
    # A fixed hash seed for every child, baseline or not: string hashing and
    # dict layouts then differ less from one process to the next.
    env = {**os.environ, "PYTHONHASHSEED": "0", **extra}
    env.pop("PYTHONDEVMODE", None)
    env.pop("PYTHONASYNCIODEBUG", None)
    return env


def spawn(command: list[str], cpu: int | None = None, **kwargs: Any) -> subprocess.Popen[str]:
    """Start a process, pinned to one CPU if `cpu` is given (what it starts later inherits that)."""
    process = subprocess.Popen(command, text=True, cwd=ROOT, **kwargs)
    if cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(process.pid, {cpu})
    return process


def run(command: list[str], timeout: float, cpu: int | None = None, env: dict[str, str] | None = None) -> str:
    """Run to completion; its stdout, or an error with the end of its stderr."""
    process = spawn(command, cpu, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited with {process.returncode}:\n{err[-3000:]}")
    return out


def run_child(script: str, *args: object, timeout: float = 600, cpu: int | None = None) -> dict[str, Any]:
    """Run `children/<script>` with this interpreter; its last stdout line is a JSON object."""
    command = [sys.executable, str(CHILDREN / script), *map(str, args)]
    return last_json(run(command, timeout, cpu, env=child_env()), command)


def last_json(text: str, what: object) -> dict[str, Any]:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            result: dict[str, Any] = json.loads(line)
            return result
    raise RuntimeError(f"no JSON result from {what}:\n{text[-3000:]}")


def summary(values: list[float]) -> dict[str, Any]:
    """Median and spread of repeated measurements, keeping the raw values."""
    return {
        "median": statistics.median(values),
        "stdev": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
        "n": len(values),
        "values": values,
    }


def available_loops() -> list[str]:
    return ["asyncio", *(name for name in OPTIONAL_LOOPS if importlib.util.find_spec(name) is not None)]


def pin_cpus(enabled: bool) -> tuple[int | None, int | None]:
    """CPUs for a server and its load generator: two different ones when there are two."""
    if not enabled or not hasattr(os, "sched_getaffinity"):
        return None, None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None, None
    return cpus[0], cpus[1]


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def wrk_version() -> str | None:
    wrk = shutil.which("wrk")
    if wrk is None:
        return None
    done = subprocess.run([wrk, "--version"], capture_output=True, text=True, check=False)
    first = (done.stdout or done.stderr).strip().splitlines()
    return first[0].partition(" Copyright")[0] if first else "wrk"


def machine() -> dict[str, Any]:
    libraries = ("aiocop", "uvloop", "rloop", "veloxloop", "granian", "uvicorn", "httptools", "matplotlib")
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu_model": _cpu_model(),
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "libraries": {name: _version(name) for name in libraries},
        "wrk": wrk_version(),
        "load_average_at_start": load_average(),
    }


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
