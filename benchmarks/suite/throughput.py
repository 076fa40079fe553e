"""Section 3: requests/s of real servers, aiocop on against a baseline server that never imported it.

ASGI: hello_app.py (1 KB, no blocking call) under Granian and uvicorn, one
worker each, on uvloop, loaded by wrk (or the fallback client). TCP echo:
1 KB messages over asyncio streams and over an `asyncio.Protocol`, on uvloop.
Each run starts a fresh server; runs alternate between modes (A B C A B C ...)
for several rounds, and each mode's figure is its ratio to the baseline of
the same round. The server and the load generator are pinned to different
CPUs when there are two.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from suite import loadgen, servers
from suite.common import progress, run_child, summary

if TYPE_CHECKING:
    from collections.abc import Callable

BASELINE = "baseline"
MIDDLEWARE = "aiocop+middleware"


@dataclass(frozen=True)
class Settings:
    servers: tuple[str, ...]
    asgi_modes: tuple[str, ...]  # the first is the baseline
    echo_kinds: tuple[str, ...]
    echo_modes: tuple[str, ...]
    echo_loop: str
    rounds: int
    warmup: float
    duration: float
    http_connections: int
    echo_connections: int
    generator: str
    server_cpu: int | None
    client_cpu: int | None


def run_asgi(settings: Settings) -> dict[str, Any]:
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for round_no in range(settings.rounds):
        for server in settings.servers:
            for mode in settings.asgi_modes:
                progress(f"  asgi: round {round_no + 1}/{settings.rounds} {server} {mode}")
                runs.setdefault(server, {}).setdefault(mode, []).append(_asgi_once(settings, server, mode))
    return {
        "settings": {**_public(settings), "uvicorn_http": servers.uvicorn_http()},
        "servers": {server: _compare(by_mode, settings.asgi_modes) for server, by_mode in runs.items()},
    }


def _asgi_once(settings: Settings, server: str, mode: str) -> dict[str, Any]:
    with servers.asgi_server(server, mode, settings.server_cpu) as running:

        def load(seconds: float) -> dict[str, Any]:
            return loadgen.http_load(
                settings.generator, running.port, settings.http_connections, seconds, settings.client_cpu
            )

        result = _measured(running.pid, settings, load)
        status = json.loads(servers.http_get(running.port, "/aiocop-probe", timeout=10)[1])
    result["server_status"] = status
    result["check"] = _check_asgi(mode, status)
    return result


def _measured(pid: int, settings: Settings, load: Callable[[float], dict[str, Any]]) -> dict[str, Any]:
    """A warm-up load, then the measured one, with the server's CPU time spent on it."""
    if settings.warmup > 0:
        load(settings.warmup)
    before = servers.tree_cpu_seconds(pid)
    result = load(settings.duration)
    after = servers.tree_cpu_seconds(pid)
    if before is not None and after is not None and result["requests"]:
        result["server_cpu_us_per_request"] = (after - before) / result["requests"] * 1e6
        result["server_cpu_share"] = (after - before) / (result["duration_us"] / 1e6)
    return result


def _check_asgi(mode: str, status: dict[str, Any]) -> str | None:
    """Why the server was not in the state `mode` promises, or `None`."""
    if not str(status["loop"]).startswith("uvloop"):
        return f"served on {status['loop']}, not uvloop"
    if mode == BASELINE:
        return "the baseline server imported aiocop" if status["aiocop_imported"] else None
    if not status["probe_delivered"]:
        return "the probe's blocking call was not delivered"
    if status["probe_problem"]:
        return str(status["probe_problem"])
    context = status["probe_context"] or {}
    if mode == MIDDLEWARE and context.get("http_path") != "/aiocop-probe":
        return f"the middleware did not tag the event with the request: {context}"
    return None


def run_echo(settings: Settings) -> dict[str, Any]:
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for round_no in range(settings.rounds):
        for kind in settings.echo_kinds:
            for mode in settings.echo_modes:
                progress(f"  echo: round {round_no + 1}/{settings.rounds} {kind} {mode}")
                runs.setdefault(kind, {}).setdefault(mode, []).append(_echo_once(settings, kind, mode))
    return {
        "settings": _public(settings),
        "kinds": {kind: _compare(by_mode, settings.echo_modes) for kind, by_mode in runs.items()},
    }


def _echo_once(settings: Settings, kind: str, mode: str) -> dict[str, Any]:
    with servers.echo_server(mode, kind, settings.echo_loop, settings.server_cpu) as running:

        def load(seconds: float) -> dict[str, Any]:
            return run_child(
                "echo_client.py",
                running.port,
                settings.echo_connections,
                0,
                seconds,
                1024,
                cpu=settings.client_cpu,
                timeout=seconds + 60,
            )

        result = _measured(running.pid, settings, load)
    ready = running.ready
    result["server_status"] = ready
    problem = None
    if not str(ready["loop"]).startswith(settings.echo_loop):
        problem = f"served on {ready['loop']}"
    elif mode == BASELINE and ready["aiocop_imported"]:
        problem = "the baseline server imported aiocop"
    elif mode != BASELINE and (not ready["probe_delivered"] or ready["probe_problem"]):
        problem = f"probe: {ready['probe_problem'] or 'not delivered'}"
    result["check"] = problem
    return result


def crosscheck(settings: Settings) -> dict[str, Any]:
    """The fallback client against wrk, on the same baseline server (only where wrk exists)."""
    out: dict[str, Any] = {}
    for server in settings.servers:
        progress(f"  load generators: {server} baseline, wrk then python")
        with servers.asgi_server(server, BASELINE, settings.server_cpu) as running:
            by: dict[str, Any] = {}
            for generator in ("wrk", "python"):

                def load(seconds: float, generator: str = generator) -> dict[str, Any]:
                    return loadgen.http_load(
                        generator, running.port, settings.http_connections, seconds, settings.client_cpu
                    )

                by[generator] = _measured(running.pid, settings, load)
        by["python_to_wrk_rps"] = by["python"]["rps"] / by["wrk"]["rps"]
        out[server] = by
    return out


def _compare(by_mode: dict[str, list[dict[str, Any]]], modes: tuple[str, ...]) -> dict[str, Any]:
    base = by_mode[modes[0]]
    out: dict[str, Any] = {}
    for mode in modes:
        runs = by_mode[mode]
        entry: dict[str, Any] = {
            "rps": summary([r["rps"] for r in runs]),
            "mean_us": summary([r["mean_us"] for r in runs]),
            "p99_us": summary([r["p99_us"] for r in runs]),
            "errors": sum(r["errors"] for r in runs),
            "problems": sorted({r["check"] for r in runs if r["check"]}),
            "checks_ok": all(r["check"] is None for r in runs),
            "runs": runs,
        }
        cpu = [r.get("server_cpu_us_per_request") for r in runs]
        if all(c is not None for c in cpu):
            entry["server_cpu_us_per_request"] = summary(cpu)
            entry["server_cpu_share"] = summary([r["server_cpu_share"] for r in runs])
        if mode != modes[0]:
            entry["ratio_to_baseline"] = summary([r["rps"] / b["rps"] for r, b in zip(runs, base, strict=True)])
            entry["ratio_of_medians"] = entry["rps"]["median"] / statistics.median(b["rps"] for b in base)
            if "server_cpu_us_per_request" in entry:
                # Requests/s one fully used core would give, relative to the baseline's: baseline CPU per
                # request over this mode's, paired by round.
                entry["cpu_ratio_to_baseline"] = summary(
                    [
                        b["server_cpu_us_per_request"] / r["server_cpu_us_per_request"]
                        for r, b in zip(runs, base, strict=True)
                    ]
                )
        out[mode] = entry
    return out


def _public(settings: Settings) -> dict[str, Any]:
    return dict(settings.__dict__)
