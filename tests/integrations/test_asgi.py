"""aiocop.asgi: per-request sampling, in process and under real servers.

The first part calls the middleware directly as an ASGI application on
asyncio and uvloop. The second serves `tests/support/asgi_app.py` (and the example
`examples/asgi_app.py`) with uvicorn and Granian in subprocesses, sends real
requests with httpx, and reads what the server process reported.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
import re
import time
from typing import TYPE_CHECKING, Any

import httpx
import pytest

import aiocop
from aiocop import asgi
from aiocop.asgi import AiocopMiddleware, current_request
from tests.conftest import Collector, run_on
from tests.stalls.test_watchdog import only_event, timed_stall, watchdog  # noqa: F401 - fixture
from tests.support import stalls
from tests.support.asgi_servers import BLOCKED_PREFIX, ROOT, Server, mentioning, new_id, rloop_param

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator
    from pathlib import Path

    from aiocop.asgi import ASGIApp, Message, Receive, Scope, Send

NOWHERE = "/nonexistent-aiocop-asgi/"  # os.path.exists() of it: a blocking os.stat naming the request
RESPONSE: list[dict[str, Any]] = [
    {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]},
    {"type": "http.response.body", "body": b"done"},
]


@pytest.fixture(params=["asyncio", "uvloop"])
def loop_name(request: pytest.FixtureRequest) -> str:
    """The middleware is loop-agnostic; the loops ASGI servers run it on."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(autouse=True)
def _no_leftover_provider() -> Iterator[None]:
    # Sampled requests register the middleware's context provider; tests
    # without the detector fixture must not leave it behind for other modules.
    yield
    aiocop.unregister_context_provider(asgi._request_context)


# --- in process ---------------------------------------------------------------


def http_scope(path: str, method: str = "GET", headers: dict[str, str] | None = None, kind: str = "http") -> Scope:
    scope: Scope = {
        "type": kind,
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "scheme": "http" if kind == "http" else "ws",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()],
    }
    if kind == "http":
        scope["method"] = method
    return scope


async def call(
    app: ASGIApp, path: str = "/", method: str = "GET", headers: dict[str, str] | None = None, kind: str = "http"
) -> list[Message]:
    """One request through an ASGI app; returns the messages it sent."""
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(http_scope(path, method, headers, kind), receive, send)
    return sent


def endpoint(work: Callable[[Scope], Awaitable[None]]) -> ASGIApp:
    """An ASGI app that does `work(scope)`, then answers RESPONSE."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await work(scope)
        for message in RESPONSE:
            await send(dict(message))

    return app


def block(what: str) -> None:
    os.path.exists(NOWHERE + what)  # BLOCKS


async def blocks_twice(scope: Scope) -> None:
    # Two steps, each with one blocking call: concurrent requests interleave.
    await asyncio.sleep(0)
    block(scope["path"])
    await asyncio.sleep(0)
    block(scope["path"])
    await asyncio.sleep(0)


async def blocks_once(scope: Scope) -> None:
    await asyncio.sleep(0)
    block(scope["path"])


async def does_it_right(scope: Scope) -> None:
    await asyncio.sleep(0)
    await asyncio.to_thread(block, scope["path"])  # in a thread: not the loop's problem
    await asyncio.sleep(0)


def context_of(path: str, request_id: str, method: str = "GET") -> dict[str, str]:
    return {"http_method": method, "http_path": path, "request_id": request_id}


def blocked(event: aiocop.SlowTaskEvent) -> list[str]:
    """What an event's blocking calls were about (the request path given to `block`)."""
    return [call["args"].removeprefix(NOWHERE) for call in event.blocking_events]


def by_path(scope: Scope) -> bool | None:
    path: str = scope["path"]
    return True if path.startswith("/s/") else False if path.startswith("/u/") else None


def test_sampled_request_is_reported_with_its_method_path_and_id(
    detector: Collector, loop_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = AiocopMiddleware(endpoint(blocks_once))
    with caplog.at_level(logging.WARNING, logger="aiocop"):
        sent = run_on(loop_name, call(app, "/items/7", method="POST", headers={"X-Request-ID": "req-1"}))
    assert sent == RESPONSE  # the response is the application's, untouched
    [event] = detector.events
    assert event.context == context_of("/items/7", "req-1", method="POST")
    assert blocked(event) == ["/items/7"]
    assert "test_asgi.py" in event.call_site and event.call_site.endswith(":block")  # not the middleware
    assert caplog.records == []  # set up properly: no warning


@pytest.fixture(params=["auto", "monitored"])
def unwatched_form(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Unsampled requests set the context variable alone when the watchdog can
    read their task's context (3.12+), else use monitored(): test both forms."""
    if request.param == "monitored":
        monkeypatch.setattr(asgi, "_needs_task_record", lambda: True)
    return request.param  # type: ignore[no-any-return]


@pytest.mark.usefixtures("unwatched_form")
def test_unsampled_request_is_not_reported(detector: Collector, loop_name: str) -> None:
    app = AiocopMiddleware(endpoint(blocks_once), sample_rate=0.0)
    assert run_on(loop_name, call(app, "/items/7", headers={"x-request-id": "req-1"})) == RESPONSE
    assert detector.events == []


def test_clean_sampled_request_is_not_reported(detector: Collector, loop_name: str) -> None:
    # Without a request id header: generating one must not be a blocking call either.
    app = AiocopMiddleware(endpoint(does_it_right))
    assert run_on(loop_name, call(app, "/clean")) == RESPONSE
    assert detector.events == []


@pytest.mark.usefixtures("unwatched_form")
def test_concurrent_requests_report_exactly_the_sampled_ones(detector: Collector, loop_name: str) -> None:
    app = AiocopMiddleware(endpoint(blocks_twice), sample_rate=0.0, sampler=by_path)
    paths = [f"/s/{i}" if i % 3 == 0 else f"/u/{i}" for i in range(30)]

    async def main() -> None:
        await asyncio.gather(*(call(app, path, headers={"x-request-id": f"id{path}"}) for path in paths))

    run_on(loop_name, main())
    sampled = [path for path in paths if path.startswith("/s/")]
    # Each event names its own request, twice per sampled request (one per step).
    assert sorted((blocked(e), e.context["http_path"], e.context["request_id"]) for e in detector.events) == sorted(
        ([path], path, f"id{path}") for path in sampled * 2
    )


@pytest.mark.usefixtures("unwatched_form")
def test_tasks_and_callbacks_started_by_a_request_inherit_its_sampling(detector: Collector, loop_name: str) -> None:
    async def spawns(scope: Scope) -> None:
        path = scope["path"]
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def callback() -> None:
            block(path + "/callback")
            done.set_result(None)

        async def child() -> None:
            await asyncio.sleep(0)
            block(path + "/task")

        loop.call_soon(callback)
        await asyncio.create_task(child())
        await done

    app = AiocopMiddleware(endpoint(spawns), sample_rate=0.0, sampler=by_path)

    async def main() -> None:
        await asyncio.gather(call(app, "/s/1", headers={"x-request-id": "a"}), call(app, "/u/2"))

    run_on(loop_name, main())
    assert sorted((blocked(e), e.context) for e in detector.events) == [
        (["/s/1/callback"], context_of("/s/1", "a")),
        (["/s/1/task"], context_of("/s/1", "a")),
    ]


def test_same_callback_of_two_requests_in_one_iteration_keeps_each_request(detector: Collector, loop_name: str) -> None:
    def callback(path: str) -> None:
        block(path)

    async def schedules(scope: Scope) -> None:
        # Both requests reach this in the same loop iteration: the two runs of
        # `callback` follow each other in the next one.
        asyncio.get_running_loop().call_soon(callback, scope["path"])
        await asyncio.sleep(0.01)

    app = AiocopMiddleware(endpoint(schedules))

    async def main() -> None:
        await asyncio.gather(*(call(app, path, headers={"x-request-id": path}) for path in ("/a", "/b")))

    run_on(loop_name, main())
    assert sorted((blocked(e), e.context["request_id"]) for e in detector.events) == [(["/a"], "/a"), (["/b"], "/b")]


def test_websocket_connections_are_sampled_too(detector: Collector, loop_name: str) -> None:
    app = AiocopMiddleware(endpoint(blocks_once))
    run_on(loop_name, call(app, "/ws", kind="websocket", headers={"x-request-id": "w"}))
    assert [e.context for e in detector.events] == [context_of("/ws", "w", method="WEBSOCKET")]


@pytest.mark.parametrize("kind", ["lifespan", "custom-extension"])
def test_other_scopes_pass_through_untouched(detector: Collector, loop_name: str, kind: str) -> None:
    seen: list[tuple[object, ...]] = []
    asked: list[Scope] = []

    async def downstream(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append((scope, receive, send, aiocop.is_monitored(), current_request()))

    def sampler(scope: Scope) -> bool:
        asked.append(scope)
        return True

    async def receive() -> Message:
        return {"type": "lifespan.startup"}

    async def send(message: Message) -> None:
        pass

    scope: Scope = {"type": kind, "asgi": {"version": "3.0"}}
    run_on(loop_name, AiocopMiddleware(downstream, sampler=sampler)(scope, receive, send))
    assert len(seen) == 1
    assert seen[0][0] is scope and seen[0][1] is receive and seen[0][2] is send
    assert seen[0][3:] == (True, None)  # neither sampled nor unsampled: as if the middleware were not there
    assert scope == {"type": kind, "asgi": {"version": "3.0"}}
    assert asked == []


def test_application_errors_propagate_and_the_scope_is_restored(detector: Collector, loop_name: str) -> None:
    error = ValueError("handler failed")

    async def fails(scope: Scope) -> None:
        block("/boom")
        raise error

    async def main() -> tuple[bool, object]:
        with pytest.raises(ValueError, match="handler failed") as raised:
            await call(AiocopMiddleware(endpoint(fails), sample_rate=0.0), "/boom")
        assert raised.value is error
        return aiocop.is_monitored(), current_request()

    assert run_on(loop_name, main()) == (True, None)
    assert detector.events == []


@pytest.mark.parametrize(
    ("outer", "inner_rate", "reported"),
    [
        pytest.param(1.0, 0.0, True, id="outer-sampled"),
        pytest.param(0.0, 1.0, False, id="outer-unsampled"),
        pytest.param("monitored(False)", 1.0, False, id="app-unmonitored"),
    ],
)
def test_an_outer_decision_is_kept(
    detector: Collector, loop_name: str, outer: object, inner_rate: float, reported: bool
) -> None:
    inner = AiocopMiddleware(endpoint(blocks_once), sample_rate=inner_rate)
    if isinstance(outer, float):
        app: ASGIApp = AiocopMiddleware(inner, sample_rate=outer)
    else:

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            with aiocop.monitored(enabled=False):
                await inner(scope, receive, send)

    run_on(loop_name, call(app, "/nested", headers={"x-request-id": "outer-id"}))
    assert [e.context for e in detector.events] == ([context_of("/nested", "outer-id")] if reported else [])


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"sample_rate": 1.5}, ValueError, r"sample_rate must be from 0\.0 to 1\.0, not 1\.5"),
        ({"sample_rate": -0.1}, ValueError, "sample_rate must be from"),
        ({"sample_rate": math.nan}, ValueError, "sample_rate must be from"),
        ({"sample_rate": "0.5"}, TypeError, "sample_rate must be a real number from 0.0 to 1.0, not str"),
        ({"sample_rate": True}, TypeError, "sample_rate must be a real number"),
        ({"sampler": 0.5}, TypeError, "sampler must be callable or None, not float"),
        ({"request_id_header": ""}, ValueError, "request_id_header must be a non-empty HTTP header name"),
        ({"request_id_header": "x request id"}, ValueError, "request_id_header must be a non-empty HTTP header name"),
        ({"request_id_header": b"x-request-id"}, TypeError, "request_id_header must be a header name"),
        ({"app": None}, TypeError, "app must be an ASGI application"),
    ],
)
def test_bad_arguments_are_rejected_by_name(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    arguments: dict[str, Any] = {"app": endpoint(blocks_once), **kwargs}
    with pytest.raises(error, match=match):
        AiocopMiddleware(**arguments)


def test_valid_arguments_are_kept() -> None:
    app = endpoint(blocks_once)
    middleware = AiocopMiddleware(app, sample_rate=1, request_id_header="X-Correlation-ID")
    assert middleware.app is app
    assert middleware.sample_rate == 1.0 and isinstance(middleware.sample_rate, float)
    assert "sample_rate=1.0" in repr(middleware)


def test_first_request_warns_once_when_detection_is_not_running(
    loop_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    assert not aiocop.is_monitoring_active()
    app = AiocopMiddleware(endpoint(blocks_once))

    async def main() -> None:
        for _ in range(3):
            assert await call(app, "/x") == RESPONSE  # served all the same

    with caplog.at_level(logging.WARNING, logger="aiocop"):
        run_on(loop_name, main())
    [record] = caplog.records
    assert record.name == "aiocop" and record.levelno == logging.WARNING
    assert "detection is not running" in record.getMessage()
    assert "aiocop.start_blocking_io_detection()" in record.getMessage()


def test_first_request_warns_when_no_callback_is_registered(
    detector: Collector, loop_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    aiocop.clear_slow_task_callbacks()
    with caplog.at_level(logging.WARNING, logger="aiocop"):
        run_on(loop_name, call(AiocopMiddleware(endpoint(blocks_once)), "/x"))
    [record] = caplog.records
    assert "no slow-task callback is registered" in record.getMessage()


def sampled_flags(loop_name: str, app_kwargs: dict[str, Any], count: int) -> list[bool]:
    """Send `count` requests one after another; which ones were sampled."""
    flags: list[bool] = []

    async def downstream(scope: Scope, receive: Receive, send: Send) -> None:
        flags.append(current_request() is not None)

    app = AiocopMiddleware(downstream, **app_kwargs)

    async def main() -> None:
        for _ in range(count):
            await call(app, "/x")

    run_on(loop_name, main())
    return flags


@pytest.mark.parametrize("rate", [0.0, 1.0, 0, 1])
def test_rates_0_and_1_are_exact(detector: Collector, loop_name: str, rate: float) -> None:
    assert sampled_flags(loop_name, {"sample_rate": rate}, 300) == [bool(rate)] * 300


def test_rate_0_samples_nothing_even_on_a_zero_draw(
    detector: Collector, loop_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(asgi, "_random", lambda: 0.0)  # random() can return 0.0; `<=` would sample it
    assert sampled_flags(loop_name, {"sample_rate": 0.0}, 5) == [False] * 5
    assert sampled_flags(loop_name, {"sample_rate": 1e-9}, 5) == [True] * 5


@pytest.fixture
def seeded_random() -> Iterator[None]:
    state = random.getstate()
    yield
    random.setstate(state)


@pytest.mark.usefixtures("seeded_random")
def test_fractional_rate_draws_one_number_per_request(detector: Collector, loop_name: str) -> None:
    random.seed(2024)
    expected = [random.random() < 0.3 for _ in range(200)]
    random.seed(2024)
    assert sampled_flags(loop_name, {"sample_rate": 0.3}, 200) == expected
    assert 30 < sum(expected) < 90  # a fraction of the requests, neither none nor all


@pytest.mark.parametrize(
    ("decision", "rate", "sampled"),
    [(True, 0.0, True), (False, 1.0, False), (None, 0.0, False), (None, 1.0, True), (1, 0.0, True), ("", 1.0, False)],
)
def test_sampler_decides_and_none_defers_to_the_rate(
    detector: Collector, loop_name: str, decision: object, rate: float, sampled: bool
) -> None:
    asked: list[str] = []

    def sampler(scope: Scope) -> Any:
        asked.append(scope["path"])
        return decision

    assert sampled_flags(loop_name, {"sample_rate": rate, "sampler": sampler}, 3) == [sampled] * 3
    assert asked == ["/x"] * 3


def test_a_raising_sampler_is_contained(detector: Collector, loop_name: str, caplog: pytest.LogCaptureFixture) -> None:
    def sampler(scope: Scope) -> bool:
        raise KeyError("no such route")

    app = AiocopMiddleware(endpoint(blocks_once), sampler=sampler)

    async def main() -> list[list[Message]]:
        return [await call(app, f"/r{i}") for i in range(5)]

    with caplog.at_level(logging.ERROR, logger="aiocop"):
        assert run_on(loop_name, main()) == [RESPONSE] * 5  # every request served
    assert detector.events == []  # unwatched
    assert len(caplog.records) == 3 and all(r.exc_info for r in caplog.records)  # not once per request
    assert "no such route" in caplog.text and "further errors are not logged" in caplog.records[-1].getMessage()


def request_ids(loop_name: str, headers: list[dict[str, str]], **kwargs: Any) -> list[str]:
    seen: list[str] = []

    async def downstream(scope: Scope, receive: Receive, send: Send) -> None:
        info = current_request()
        assert info is not None
        seen.append(info.request_id)

    app = AiocopMiddleware(downstream, **kwargs)

    async def main() -> None:
        for h in headers:
            await call(app, "/x", headers=h)

    run_on(loop_name, main())
    return seen


def test_request_id_comes_from_the_configured_header(detector: Collector, loop_name: str) -> None:
    headers = [{"X-Correlation-ID": "  corr-1 "}, {"x-request-id": "ignored", "X-Correlation-Id": "corr-2"}]
    assert request_ids(loop_name, headers, request_id_header="X-Correlation-ID") == ["corr-1", "corr-2"]


def test_request_id_is_generated_when_absent_empty_or_not_wanted(detector: Collector, loop_name: str) -> None:
    ids = request_ids(loop_name, [{}, {"x-request-id": "  "}, {}])
    ids += request_ids(loop_name, [{"x-request-id": "from-client"}], request_id_header=None)
    assert all(re.fullmatch("[0-9a-f]{32}", i) for i in ids), ids
    assert len(set(ids)) == 4


def test_long_request_ids_are_cut(detector: Collector, loop_name: str) -> None:
    [request_id] = request_ids(loop_name, [{"x-request-id": "a" * 5000}])
    assert request_id == "a" * asgi.MAX_REQUEST_ID_CHARS


def test_current_request_outside_any_request_is_none() -> None:
    assert current_request() is None


@pytest.mark.usefixtures("unwatched_form")
@pytest.mark.parametrize("sampled", [True, False])
def test_stalls_follow_the_request_sampling(
    watchdog: Collector,  # noqa: F811 - the fixture
    loop_name: str,
    sampled: bool,
) -> None:
    async def stalls_once(scope: Scope) -> None:
        await timed_stall(stalls.spin)

    app = AiocopMiddleware(endpoint(stalls_once), sample_rate=float(sampled))
    run_on(loop_name, call(app, "/stall", headers={"x-request-id": "st"}))
    if sampled:
        assert only_event(watchdog).reason == "cpu_blocking"
    else:
        time.sleep(0.05)  # as only_event: stalls are reported shortly after they end
        assert watchdog.events == []


def test_stall_in_the_last_step_of_a_request_follows_its_sampling(
    watchdog: Collector,  # noqa: F811 - the fixture
    loop_name: str,
) -> None:
    async def computes_then_answers(scope: Scope) -> None:
        await asyncio.sleep(0.02)  # let the watchdog see the loop idle first
        stalls.spin(0.1)  # then the response: sent without suspending, and the request task ends

    async def main() -> None:
        app = AiocopMiddleware(endpoint(computes_then_answers), sample_rate=0.0, sampler=by_path)
        for path in ("/s/compute", "/u/compute"):
            await asyncio.create_task(call(app, path, headers={"x-request-id": path}))  # a task per request
        await asyncio.sleep(0.02)

    run_on(loop_name, main())
    events = watchdog.settle(1)
    keys = context_of("/s/compute", "/s/compute")
    assert [(e.task_name is not None, e.context) for e in events] == [(True, keys)]


def test_unsampled_stall_in_a_task_marked_watched_is_not_reported(
    watchdog: Collector,  # noqa: F811 - the fixture
    loop_name: str,
) -> None:
    # monitored() records the task as watched, and the watchdog goes by that
    # record before the task's context: the unsampled request must override it.
    async def stalls_once(scope: Scope) -> None:
        await timed_stall(stalls.spin)

    async def main() -> None:
        with aiocop.monitored():
            await call(AiocopMiddleware(endpoint(stalls_once), sample_rate=0.0), "/stall")

    run_on(loop_name, main())
    time.sleep(0.05)  # as only_event: stalls are reported shortly after they end
    assert watchdog.events == []


def test_stall_events_carry_the_request(
    watchdog: Collector,  # noqa: F811 - the fixture
    loop_name: str,
) -> None:
    # On every version: 3.10 and 3.11 have no Task.get_context(), and the
    # watchdog reads the task's context where the garbage collector sees it.
    async def stalls_once(scope: Scope) -> None:
        await timed_stall(stalls.spin)

    run_on(loop_name, call(AiocopMiddleware(endpoint(stalls_once)), "/stall", headers={"x-request-id": "st"}))
    assert only_event(watchdog).context == context_of("/stall", "st")


# --- under real servers ---------------------------------------------------------


@pytest.fixture(scope="module", params=["uvicorn", "granian", rloop_param()])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """tests/support/asgi_app.py served by one server, shared by the module's tests."""
    kind: str = request.param
    served = Server(kind, "tests.support.asgi_app:app", ROOT, tmp_path_factory.mktemp(kind), {})
    try:
        served.wait_until_ready("/ready")
        yield served
    finally:
        served.stop()


@pytest.fixture
def client(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, trust_env=False, timeout=10.0) as http:
        yield http


def line_of_block() -> str:
    source = (ROOT / "tests" / "support" / "asgi_app.py").read_text(encoding="utf-8").splitlines()
    return f"tests/support/asgi_app.py:{next(i for i, text in enumerate(source, 1) if '# BLOCKS' in text)}:block"


def test_server_reports_a_sampled_blocking_request(server: Server, client: httpx.Client) -> None:
    request_id = new_id("sampled")
    response = client.get("/sampled/block", headers={"x-request-id": request_id})
    assert response.json() == {"watched": True, "request_id": request_id}
    [event] = mentioning(server.wait_for(request_id), request_id)
    assert event["context"] == {"http_method": "GET", "http_path": "/sampled/block", "request_id": request_id}
    assert [(c["event"], c["args"]) for c in event["blocking_calls"]] == [("os.stat", BLOCKED_PREFIX + request_id)]
    assert event["call_site"].endswith(line_of_block())


def test_server_does_not_report_unsampled_or_clean_requests(server: Server, client: httpx.Client) -> None:
    unsampled, clean, spawned = new_id("unsampled"), new_id("clean"), new_id("unsampled-spawn")
    assert client.get("/unsampled/block", headers={"x-request-id": unsampled}).json()["watched"] is False
    assert client.get("/sampled/clean", headers={"x-request-id": clean}).json()["watched"] is True
    assert client.get("/unsampled/spawn", headers={"x-request-id": spawned}).json()["watched"] is False
    events = server.settle(client)
    assert mentioning(events, unsampled) == []
    assert mentioning(events, clean) == []
    assert mentioning(events, spawned) == []


def test_server_generates_a_request_id_when_the_client_sends_none(server: Server, client: httpx.Client) -> None:
    body = client.get("/sampled/block").json()
    assert body["watched"] is True and re.fullmatch("[0-9a-f]{32}", body["request_id"]), body
    events = server.wait_for(body["request_id"])
    assert [e["context"]["http_path"] for e in mentioning(events, body["request_id"])] == ["/sampled/block"]


def test_server_reports_exactly_the_sampled_requests_of_a_concurrent_burst(
    server: Server, client: httpx.Client
) -> None:
    burst = new_id("burst")
    routes = ["/sampled/block", "/unsampled/block", "/sampled/clean", "/sampled/spawn", "/unsampled/spawn"]
    requests = [(f"{burst}-{i}", routes[i % len(routes)]) for i in range(40)]

    async def send_all() -> list[dict[str, Any]]:
        async with httpx.AsyncClient(base_url=server.url, trust_env=False, timeout=10.0) as http:
            responses = await asyncio.gather(*(http.get(p, headers={"x-request-id": i}) for i, p in requests))
        return [r.json() for r in responses]

    bodies = asyncio.run(send_all())
    assert [b["watched"] for b in bodies] == [p.startswith("/sampled/") for _, p in requests]
    events = mentioning(server.settle(client), burst)
    expected = sorted((i, p) for i, p in requests if p in ("/sampled/block", "/sampled/spawn"))
    assert sorted((e["context"]["request_id"], e["context"]["http_path"]) for e in events) == expected
    for event in events:  # each event is its own request's, not a neighbour's
        assert [c["args"] for c in event["blocking_calls"]] == [BLOCKED_PREFIX + event["context"]["request_id"]]


@pytest.mark.parametrize("kind", ["uvicorn", "granian"])
def test_the_documented_example_runs_under_each_server(kind: str, tmp_path: Path) -> None:
    served = Server(kind, "asgi_app:app", ROOT / "examples", tmp_path, {"AIOCOP_SAMPLE_RATE": "1.0"})
    try:
        served.wait_until_ready("/")
        with httpx.Client(base_url=served.url, trust_env=False, timeout=10.0) as http:
            assert http.get("/health").text == "ok"
            assert http.get("/").text == "hello"
            assert http.get("/report", headers={"x-request-id": "ex-report"}).text.startswith('"""A plain ASGI')
            assert http.get("/admin/stats", headers={"x-request-id": "ex-admin"}).text == "{}"
        logged = served.wait_for_logged("ex-admin")
    finally:
        served.stop()
    requests = [e for e in logged if e["calls"] and "http_path" in e]
    assert sorted((e["http_path"], e["request_id"], e["calls"][0].split("(")[0]) for e in requests) == [
        ("/admin/stats", "ex-admin", "time.sleep"),
        ("/report", "ex-report", "open"),
    ]
    # /health blocks on every probe, but is never sampled: not even an event without a request.
    assert [e for e in logged if "asgi_app.py" in e["call_site"] and "http_path" not in e] == []
