"""A real Prometheus server scrapes a multi-worker app instrumented with AiocopInstrumentor.

The app is examples/opentelemetry/fleet_app.py, served by uvicorn and by
Granian with several worker processes; each worker serves its own /metrics
(OpenTelemetry's Prometheus exporter) and lists it in a folder Prometheus
watches (`file_sd_configs`). Requests go out with httpx (clean, blocking and
stalling ones); then Prometheus' HTTP API is queried: the counts per call site
summed over the workers equal what the workers themselves report and what was
sent, and the loop-delay histogram holds the stalls. The PromQL queries of
docs/how-to/prometheus.md run here too.

Needs the `prometheus` binary (Debian's package; `.ci/run` installs it). Without
it the tests skip, saying so, unless AIOCOP_REQUIRE_PROMETHEUS is set, as in CI.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.asgi_servers import HOST, free_port

ROOT = Path(__file__).resolve().parents[2]
APP_DIR = ROOT / "examples" / "opentelemetry"
APP_FILE = "examples/opentelemetry/fleet_app.py"  # code.file.path: relative to the working directory
WORKERS = 3
BLOCKING, STALLING, CLEAN = 24, 6, 24
PROMETHEUS = shutil.which("prometheus") or next(
    (p for p in ("/usr/bin/prometheus", "/usr/local/bin/prometheus") if os.path.exists(p)), None
)

if PROMETHEUS is None:
    if os.environ.get("AIOCOP_REQUIRE_PROMETHEUS"):
        raise RuntimeError("AIOCOP_REQUIRE_PROMETHEUS is set, but no prometheus binary was found")
    pytestmark = pytest.mark.skip(reason="no prometheus binary here (Debian: apt-get install prometheus)")


def line_of(marker: str) -> str:
    lines = (ROOT / APP_FILE).read_text().splitlines()
    return str(next(i for i, text in enumerate(lines, 1) if marker in text))


# A fleet test takes about 50 s on a busy machine, 30 s of it the hang it
# checks, by design (HANG_S): pytest's 60 s did not fit it. Its own timeout
# leaves room for a busy machine, and every wait of the test stops at a
# deadline FLEET_WAITS_S after it began, before pytest's timeout, so that the
# wait that ran out says what it waited for; what is left covers the stops
# (the server's 15 s, Prometheus' 10 s) and a check under way at the deadline
# (httpx's 5 s).
FLEET_TIMEOUT_S = 300
FLEET_WAITS_S = 240
_waits_end = [float("inf")]  # the running test's deadline for every wait (monotonic clock)


def wait_until(what: str, check: Any, timeout: float = 60.0) -> Any:
    started = time.monotonic()
    deadline = min(started + timeout, _waits_end[0])
    while True:
        with contextlib.suppress(httpx.TransportError):
            result = check()
            if result:
                return result
        if time.monotonic() > deadline:
            spent = " (the test's time for its waits is spent)" if deadline == _waits_end[0] else ""
            raise AssertionError(f"timed out after {time.monotonic() - started:.0f} s waiting for {what}{spent}")
        time.sleep(0.2)


def time_left() -> float:
    """Seconds until the running test's deadline for its waits (at least 1)."""
    return max(1.0, _waits_end[0] - time.monotonic())


@pytest.fixture
def waits_deadline() -> Any:
    _waits_end[0] = time.monotonic() + FLEET_WAITS_S
    yield
    _waits_end[0] = float("inf")


class Prometheus:
    """A Prometheus server on 127.0.0.1 scraping every target listed in `targets`, every second."""

    def __init__(self, workdir: Path, targets: Path, rules: str | None = None) -> None:
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        config = workdir / "prometheus.yml"
        rule_files = ""
        if rules is not None:
            (workdir / "rules.yml").write_text(rules)
            rule_files = f"rule_files: ['{workdir / 'rules.yml'}']\n"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            + rule_files
            + "scrape_configs:\n  - job_name: fleet-demo\n    file_sd_configs:\n"
            f"      - files: ['{targets}/*.json']\n        refresh_interval: 1s\n"
        )
        self.log = workdir / "prometheus.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [
                    str(PROMETHEUS),
                    f"--config.file={config}",
                    f"--storage.tsdb.path={workdir / 'data'}",
                    f"--web.listen-address={HOST}:{self.port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.client = httpx.Client(base_url=self.url, trust_env=False, timeout=5.0)
        wait_until("Prometheus to be ready", lambda: self._alive() and self.client.get("/-/ready").status_code == 200)

    def _alive(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"prometheus exited with {self.process.returncode}:\n{self.log.read_text()}")
        return True

    def query(self, promql: str) -> list[dict[str, Any]]:
        self._alive()
        answer = self.client.get("/api/v1/query", params={"query": promql}).json()
        assert answer["status"] == "success", answer
        return answer["data"]["result"]  # type: ignore[no-any-return]

    def value(self, promql: str) -> float | None:
        result = self.query(promql)
        return float(result[0]["value"][1]) if result else None

    def alerts(self, name: str) -> list[dict[str, Any]]:
        self._alive()
        active = self.client.get("/api/v1/alerts").json()["data"]["alerts"]
        return [alert for alert in active if alert["labels"].get("alertname") == name]

    def healthy_targets(self) -> int:
        active = self.client.get("/api/v1/targets").json()["data"]["activeTargets"]
        return sum(1 for target in active if target["health"] == "up")

    def stop(self) -> None:
        self.client.close()
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def docs_alert_rule() -> str:
    """The alert rule file of docs/how-to/prometheus.md, as written there."""
    page = (ROOT / "docs" / "how-to" / "prometheus.md").read_text(encoding="utf-8")
    return page.split("<!-- alert rule -->", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]


def docs_commands() -> list[str]:
    """The commands of docs/how-to/prometheus.md, as written there."""
    page = (ROOT / "docs" / "how-to" / "prometheus.md").read_text(encoding="utf-8")
    block = page.split("<!-- commands -->", 1)[1].split("```console\n", 1)[1].split("```", 1)[0]
    return [line.strip() for line in block.splitlines() if line.strip()]


def server_command(command: str, targets: Path, port: int) -> tuple[list[str], dict[str, str]]:
    """A command of the page as run here: its folder of targets, this many workers, on a free port."""
    assignment, tool, *args = command.split()
    name, _, _ = assignment.partition("=")
    args[args.index("--workers") + 1] = str(WORKERS)
    args += ["--host", HOST, "--port", str(port), "--log-level", "warning"]
    return [sys.executable, "-m", tool, *args], {name: str(targets)}


def worker_totals(targets: Path) -> dict[str, float]:
    """What each worker's own /metrics says, summed over the workers, per series of interest."""
    totals: dict[str, float] = {}
    for listing in targets.glob("*.json"):
        address = __import__("json").loads(listing.read_text())[0]["targets"][0]
        text = httpx.get(f"http://{address}/metrics", trust_env=False, timeout=5.0).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "aiocop_blocking_calls_total":
                    key = f"calls:{sample.labels['code_line_number']}"
                elif sample.name == "aiocop_stalls_total":
                    key = f"stalls:{sample.labels['code_line_number']}"
                elif sample.name == "asyncio_eventloop_delay_seconds_bucket" and sample.labels["le"] in (
                    "0.05",
                    "+Inf",
                ):
                    key = f"delay_le_{sample.labels['le']}"
                else:
                    continue
                totals[key] = totals.get(key, 0.0) + sample.value
    return totals


async def until_every_worker(url: str, path: str) -> tuple[int, set[int]]:
    """Requests to `path` until every worker has served one (the kernel spreads them): how many, and who."""
    served: set[int] = set()
    sent = 0
    async with httpx.AsyncClient(base_url=url, trust_env=False, timeout=30.0) as client:
        while len(served) < WORKERS:
            assert sent < 500, f"{len(served)} of {WORKERS} workers served {sent} requests"
            # Concurrent, so that a busy worker is not always the one the kernel wakes, and each on a
            # new connection (a kept-alive one stays with its worker).
            headers = {"Connection": "close"}
            responses = await asyncio.gather(*(client.get(path, headers=headers) for _ in range(WORKERS)))
            sent += len(responses)
            for response in responses:
                response.raise_for_status()
                served.add(int(response.json()["pid"]))
    return sent, served


async def drive(url: str, blocking: int, stalling: int, clean: int) -> set[int]:
    """The requests, interleaved and a few at a time; the worker processes that served them."""
    paths = ["/blocking"] * blocking + ["/stalling"] * stalling + ["/clean"] * clean
    order = paths[::2] + paths[1::2]
    served: set[int] = set()
    limit = asyncio.Semaphore(6)
    async with httpx.AsyncClient(base_url=url, trust_env=False, timeout=30.0) as client:

        async def one(path: str) -> None:
            async with limit:
                response = await client.get(path)
                response.raise_for_status()
                served.add(response.json()["pid"])

        await asyncio.gather(*(one(path) for path in order))
    return served


def test_the_page_shows_both_servers() -> None:
    assert [command.split()[1] for command in docs_commands()] == ["uvicorn", "granian"]


@pytest.mark.timeout(FLEET_TIMEOUT_S)  # see FLEET_WAITS_S
@pytest.mark.parametrize("command", docs_commands(), ids=lambda command: command.split()[1])
@pytest.mark.usefixtures("waits_deadline")
def test_prometheus_sums_the_workers_of_a_fleet(command: str, tmp_path: Path) -> None:
    targets = tmp_path / "targets"
    targets.mkdir()
    prometheus = Prometheus(tmp_path, targets, rules=docs_alert_rule())
    port = free_port()
    log = tmp_path / "server.log"
    argv, env = server_command(command, targets, port)
    kind = argv[2]
    with log.open("wb") as out:
        server = subprocess.Popen(
            argv,
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        url = f"http://{HOST}:{port}"

        def ready() -> bool:
            if server.poll() is not None:
                raise RuntimeError(f"{kind} exited with {server.returncode}:\n{log.read_text()}")
            return (
                len(list(targets.glob("*.json"))) == WORKERS and httpx.get(f"{url}/clean", trust_env=False).is_success
            )

        wait_until(f"{WORKERS} {kind} workers", ready)
        wait_until("Prometheus to scrape every worker", lambda: prometheus.healthy_targets() == WORKERS)

        blocking_line, stall_line = line_of("FLEET-BLOCKING"), line_of("FLEET-STALL")
        body_line = str(int(stall_line) + 1)
        calls_query = (
            f'sum(aiocop_blocking_calls_total{{job="fleet-demo", code_file_path="{APP_FILE}", '
            f'code_line_number="{blocking_line}", code_function_name="blocking", aiocop_event="os.stat"}})'
        )
        # The spinning loop's line, or its body's (where a sample finds the frame varies across versions).
        stalls_query = (
            f'sum(aiocop_stalls_total{{code_line_number=~"{stall_line}|{body_line}", code_function_name="stalling"}})'
        )
        # First a blocking and a stalling request served by every worker, scraped: each worker's series
        # exists before the rest arrive, so that the dashboards' increase() and rate() see them arrive.
        warm_blocking, served = asyncio.run(until_every_worker(url, "/blocking"))
        warm_stalling, served_stalls = asyncio.run(until_every_worker(url, "/stalling"))
        try:
            wait_until(
                "Prometheus to see every worker's first calls and stalls",
                lambda: (
                    prometheus.value(calls_query) == warm_blocking and prometheus.value(stalls_query) == warm_stalling
                ),
            )
        except AssertionError as error:
            raise AssertionError(
                f"{error}: {warm_blocking} calls and {warm_stalling} stalls sent; Prometheus has "
                f"{prometheus.value(calls_query)} and {prometheus.value(stalls_query)}, "
                f"the workers say {worker_totals(targets)}"
            ) from None
        blocking, stalling = max(BLOCKING, warm_blocking + 1), max(STALLING, warm_stalling + 1)
        served |= served_stalls | asyncio.run(drive(url, blocking - warm_blocking, stalling - warm_stalling, CLEAN))

        # What the workers report, once every stall's report is in (the watchdog's, just after each).
        try:
            reported = wait_until(
                "the workers to report every call and stall",
                lambda: (
                    (t := worker_totals(targets))
                    and t.get(f"calls:{blocking_line}") == blocking
                    and t.get(f"stalls:{stall_line}", 0) + t.get(f"stalls:{body_line}", 0) == stalling
                    and t
                ),
                timeout=30,
            )
        except AssertionError as error:
            raise AssertionError(f"{error}; the workers say {worker_totals(targets)}") from None
        # Prometheus' sums over the workers, once a scrape has taken them all.
        wait_until(
            "Prometheus to hold the workers' totals",
            lambda: prometheus.value(calls_query) == blocking and prometheus.value(stalls_query) == stalling,
            timeout=30,
        )
        assert prometheus.value(calls_query) == reported[f"calls:{blocking_line}"] == blocking
        stalls_reported = reported.get(f"stalls:{stall_line}", 0) + reported.get(f"stalls:{body_line}", 0)
        assert prometheus.value(stalls_query) == stalls_reported == stalling
        # The histogram: the probe's healthy delays under 50 ms, the stalls (250 ms each) above.
        above = (
            'sum(asyncio_eventloop_delay_seconds_bucket{le="+Inf"}) '
            '- sum(asyncio_eventloop_delay_seconds_bucket{le="0.05"})'
        )
        # Every stall, and any probe that a busy machine held up as long (no stall explains it: recorded too).
        wait_until("the stalls in the delay histogram", lambda: (prometheus.value(above) or 0) >= stalling, timeout=30)
        assert reported["delay_le_+Inf"] - reported["delay_le_0.05"] >= stalling
        assert (prometheus.value('sum(asyncio_eventloop_delay_seconds_bucket{le="0.05"})') or 0) > 0  # the probe's

        # The dashboards' queries of docs/how-to/prometheus.md.
        # (increase() and rate() need two scrapes of a series: they answer a second or two later.)
        top = wait_until("an answer to the top call sites query", lambda: prometheus.query(TOP_SITES), timeout=30)
        assert top[0]["metric"]["code_function_name"] == "blocking"
        assert top[0]["metric"]["code_line_number"] == blocking_line
        # increase() counts what came after each worker's first scraped value of its series.
        assert float(top[0]["value"][1]) > 0
        p99 = wait_until("an answer to the p99 query", lambda: prometheus.query(P99_DELAY), timeout=30)
        assert [r["metric"]["job"] for r in p99] == ["fleet-demo"]
        for query in OTHER_QUERIES:
            assert wait_until(f"an answer to {query}", lambda query=query: prometheus.query(query), timeout=30)
        hung = check_a_hang(prometheus, url)
        print(
            f"\n{kind}: {len(served)} of {WORKERS} workers served {blocking} blocking requests ({warm_blocking} "
            f"first, to warm every worker), {stalling} stalling ({warm_stalling} first), {CLEAN} clean"
        )
        print(f"{TOP_SITES}\n  -> {[(r['metric'], r['value'][1]) for r in top]}")
        print(f"{P99_DELAY}\n  -> {[(r['metric'], r['value'][1]) for r in p99]}")
        print(f"during a hang: {hung}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        prometheus.stop()


HANG_S = 30  # the alert (> 5 s blocked) fires in 6-8 s on a quiet machine: a busy one has the rest


def check_a_hang(prometheus: Prometheus, url: str) -> dict[str, Any]:
    """A request hangs a worker's loop: Prometheus sees the blocked-time gauge rise and the alert fire, during it."""
    result: list[Any] = []

    def request() -> None:
        with contextlib.suppress(httpx.TransportError):
            result.append(httpx.get(f"{url}/hang", params={"seconds": HANG_S}, trust_env=False, timeout=HANG_S * 2))

    hanging = threading.Thread(target=request)
    hanging.start()
    try:
        # The gauge, read on each scrape from the hung worker's exporter thread, while its loop is stuck.
        blocked = wait_until(
            "the blocked-time gauge above 1 s",
            lambda: (value := prometheus.value("max(aiocop_loop_blocked_seconds)")) is not None and value > 1 and value,
            timeout=HANG_S,
        )
        firing = wait_until(
            "the alert to fire",
            lambda: [a for a in prometheus.alerts("EventLoopBlocked") if a["state"] == "firing"],
            timeout=HANG_S,
        )
        assert hanging.is_alive(), "the hang ended before Prometheus saw it"
        labels = firing[0]["labels"]
        assert labels["job"] == "fleet-demo" and labels["severity"] == "page"
        # The hang report (hang_after_ms, 5 s by default), counted once at the line the worker is stuck on.
        hangs_query = (
            f'sum(aiocop_hangs_total{{code_function_name="hang", code_line_number="{line_of("FLEET-HANG")}"}})'
        )
        hangs = wait_until("the hang to be counted", lambda: prometheus.value(hangs_query) == 1, timeout=HANG_S)
    finally:
        hanging.join(min(HANG_S * 3, time_left()))  # the request gives up after HANG_S * 2 anyway
    assert not hanging.is_alive(), f"the hung request had not returned when the test's waits ran out ({HANG_S} s hang)"
    assert result and result[0].is_success
    return {"max(aiocop_loop_blocked_seconds)": blocked, "alert": labels, "aiocop_hangs_total": hangs}


def docs_queries() -> list[str]:
    """The PromQL queries of docs/how-to/prometheus.md, in page order."""
    page = (ROOT / "docs" / "how-to" / "prometheus.md").read_text(encoding="utf-8")
    blocks = [block.split("```", 1)[0] for block in page.split("```promql\n")[1:]]
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


TOP_SITES, P99_DELAY, *OTHER_QUERIES = docs_queries()
