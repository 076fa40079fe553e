"""ASGI middleware that watches a sample of requests.

```python
from aiocop.asgi import AiocopMiddleware

app = AiocopMiddleware(app, sample_rate=0.1)
```

Each HTTP request or WebSocket connection is either sampled or not, once, when
it arrives. The decision is scoped to the request through context variables
(`aiocop.monitored`), not made by switching detection on and off for the whole
process: a sampled request is always reported, together with every task and
callback it starts, and an unsampled one is never reported, however the two
interleave on the loop. Events of sampled requests carry the request in
`SlowTaskEvent.context`:

| key | value |
| --- | --- |
| `http_method` | `"GET"`, `"POST"`, ...; `"WEBSOCKET"` for a WebSocket connection |
| `http_path` | the ASGI `path` (no query string) |
| `request_id` | the request id header's value, or a generated id (32 hex digits) |

Added in 2.0.
"""

from __future__ import annotations

import asyncio
import logging
import numbers
import os
import re
from collections.abc import Awaitable, Callable, MutableMapping
from contextvars import ContextVar
from random import random as _random  # the module's generator: reseeded in each forked worker
from typing import Any, NamedTuple

from aiocop._api import configured, monitored
from aiocop._common.validate import check_callable
from aiocop._model import callbacks as _callbacks
from aiocop._model import state as _state

__all__ = [
    "ASGIApp",
    "AiocopMiddleware",
    "Message",
    "Receive",
    "RequestInfo",
    "Sampler",
    "Scope",
    "Send",
    "current_request",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
Sampler = Callable[[Scope], "bool | None"]
"""Decides whether to watch a request: `True`, `False`, or `None` to leave it to `sample_rate`."""

logger = logging.getLogger("aiocop")

# A client-supplied id is cut to this length: it is copied into every event
# of the request, and from there into logs.
MAX_REQUEST_ID_CHARS = 200
# RFC 9110 token: what an HTTP field name may be made of.
_FIELD_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# Logged with a traceback at most this many times per middleware: a sampler
# that always raises must not flood the logs, one line per request.
_MAX_SAMPLER_ERRORS_LOGGED = 3


class RequestInfo(NamedTuple):
    """The sampled request being handled, as attached to its events.

    A named tuple: one is made per sampled request, and a frozen dataclass
    costs three times as much to make.

    Attributes:
        method: The HTTP method, or `"WEBSOCKET"` for a WebSocket connection.
        path: The ASGI `path` (without the query string).
        request_id: The request id header's value, or a generated id.
    """

    method: str
    path: str
    request_id: str

    def as_context(self) -> dict[str, str]:
        """The keys added to `SlowTaskEvent.context`."""
        return {"http_method": self.method, "http_path": self.path, "request_id": self.request_id}


_current: ContextVar[RequestInfo | None] = ContextVar("aiocop_asgi_request", default=None)


def current_request() -> RequestInfo | None:
    """The sampled request this code is running for, or `None`.

    `None` outside requests and in unsampled ones. Tasks started by a request
    inherit it. Handy to log the same request id as aiocop's events.
    """
    return _current.get()


def _request_context() -> dict[str, str] | None:
    # The context provider: run inside the offending step, at its first
    # blocking call (a stall's: at delivery, in a copy of the step's
    # context), so it sees that step's request.
    info = _current.get()
    return None if info is None else info.as_context()


def _check_sample_rate(sample_rate: object) -> float:
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, numbers.Real):
        raise TypeError(
            f"sample_rate must be a real number from 0.0 to 1.0, not {type(sample_rate).__name__}: {sample_rate!r}"
        )
    rate = float(sample_rate)
    if not 0.0 <= rate <= 1.0:  # also rejects NaN
        raise ValueError(f"sample_rate must be from 0.0 to 1.0, not {sample_rate!r}")
    return rate


def _check_header(request_id_header: object) -> bytes | None:
    if request_id_header is None:
        return None
    if not isinstance(request_id_header, str):
        raise TypeError(
            f"request_id_header must be a header name (str) or None, "
            f"not {type(request_id_header).__name__}: {request_id_header!r}"
        )
    if not _FIELD_NAME.fullmatch(request_id_header):
        raise ValueError(f"request_id_header must be a non-empty HTTP header name, not {request_id_header!r}")
    # ASGI servers give header names in lower case.
    return request_id_header.lower().encode("ascii")


class AiocopMiddleware:
    """Watch a sample of an ASGI application's requests for blocking calls.

    Wraps any ASGI 3 application (Starlette, FastAPI, Litestar, Quart, ...).
    HTTP requests and WebSocket connections are sampled when they arrive;
    lifespan and other scopes pass through untouched. Detection itself is
    started separately, with `aiocop.start_blocking_io_detection()`, in the
    process that serves the requests; the first request logs a warning if it
    was not.

    ```python
    def sampler(scope):
        if scope["path"].startswith("/admin"):
            return True  # always watched
        if scope["path"] == "/health":
            return False  # never watched
        return None  # left to sample_rate

    app = AiocopMiddleware(app, sample_rate=0.05, sampler=sampler)
    ```

    Args:
        app: The ASGI application to wrap.
        sample_rate: Fraction of requests to watch, from `0.0` (none) to `1.0`
            (all). Drawn with `random.random()` per request. Default:
            `sample_rate` in `[tool.aiocop]` if `aiocop.configure()` read
            one, else `1.0`.
        sampler: Called with the request's scope: returns `True` to watch the
            request, `False` not to, or `None` to leave it to `sample_rate`. If
            it raises, the request is served unwatched and the error logged.
        request_id_header: Header whose value identifies the request in its
            events (cut to 200 characters); requests without it get a generated
            id. `None` to always generate one.

    Raises:
        TypeError: An argument of the wrong type.
        ValueError: `sample_rate` outside 0.0 to 1.0, or an invalid header name.
    """

    __slots__ = ("_first_request", "_header", "_rate", "_sampler", "_sampler_errors", "app")

    def __init__(
        self,
        app: ASGIApp,
        *,
        sample_rate: float | None = None,
        sampler: Sampler | None = None,
        request_id_header: str | None = "x-request-id",
    ) -> None:
        if not callable(app):
            raise TypeError(f"app must be an ASGI application (a callable), not {type(app).__name__}: {app!r}")
        check_callable("app (an ASGI 3 application: app(scope, receive, send))", app, 3, plain=False)
        if sampler is not None and not callable(sampler):
            raise TypeError(f"sampler must be callable or None, not {type(sampler).__name__}: {sampler!r}")
        if sampler is not None:
            check_callable("sampler", sampler, 1)
        self.app = app
        if sample_rate is None:
            # As `[tool.aiocop]` says, if aiocop.configure() read it; else every request.
            project = configured()
            sample_rate = project.sample_rate if project is not None and project.sample_rate is not None else 1.0
        self._rate = _check_sample_rate(sample_rate)
        self._sampler = sampler
        self._header = _check_header(request_id_header)
        self._first_request = True
        self._sampler_errors = 0

    @property
    def sample_rate(self) -> float:
        """The fraction of requests watched when the sampler does not decide."""
        return self._rate

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.app!r}, sample_rate={self._rate!r}, sampler={self._sampler!r})"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope.get("type")
        if (
            (kind != "http" and kind != "websocket")  # noqa: PLR1714 - two compares beat building a set, per request
            # Already decided for this request: sampled by an outer
            # AiocopMiddleware, or left unwatched by one (or by the
            # application's own monitored(enabled=False)). Deciding again
            # would change the rate, or the request id, of nested apps.
            or _current.get() is not None
            or not _state.monitored.get()
        ):
            await self.app(scope, receive, send)
            return
        if self._first_request:
            self._first_request = False
            _warn_if_not_set_up()
        if not self._sampled(scope):
            # The fast path, most requests in production: nothing read from
            # the request, and the cheapest form of monitored(enabled=False):
            # the variable alone, where the scope would keep no per-task
            # record for the watchdog either (a fifth of the scope's cost).
            unwatched = _state.monitored.set(False)
            if _needs_task_record():
                _state.monitored.reset(unwatched)
                with monitored(enabled=False):
                    await self.app(scope, receive, send)
                return
            try:
                await self.app(scope, receive, send)
            finally:
                _state.monitored.reset(unwatched)
            return
        info = RequestInfo(
            scope.get("method", "GET") if kind == "http" else "WEBSOCKET",
            scope.get("path", ""),
            self._request_id(scope),
        )
        # Registered here rather than once at start-up, so that it comes back
        # if someone clears the providers (a test's teardown, say): a tuple
        # scan, on sampled requests only.
        if _request_context not in _callbacks.providers:
            _callbacks.register_context_provider(_request_context)
        # The context is monitored already (checked above): only the request
        # needs setting, for the provider and the tasks the request starts.
        current = _current.set(info)
        try:
            await self.app(scope, receive, send)
        finally:
            _current.reset(current)

    def _sampled(self, scope: Scope) -> bool:
        sampler = self._sampler
        if sampler is not None:
            try:
                decision = sampler(scope)
                if decision is not None:
                    return bool(decision)
            except Exception:
                self._sampler_failed()
                return False
        rate = self._rate
        # 1.0 and 0.0 are exact without drawing a number.
        return rate == 1.0 or (rate > 0.0 and _random() < rate)

    def _sampler_failed(self) -> None:
        self._sampler_errors += 1
        if self._sampler_errors <= _MAX_SAMPLER_ERRORS_LOGGED:
            more = " (further errors are not logged)" if self._sampler_errors == _MAX_SAMPLER_ERRORS_LOGGED else ""
            # Formatting the traceback reads source files: aiocop's doing, not the application's.
            with monitored(enabled=False):
                logger.exception(
                    "aiocop: the sampler %r raised; the request is served unwatched%s", self._sampler, more
                )

    def _request_id(self, scope: Scope) -> str:
        header = self._header
        if header is not None:
            try:
                for name, value in scope.get("headers") or ():
                    if name.lower() == header:
                        text: str = value.decode("latin-1").strip()
                        if text:
                            return text[:MAX_REQUEST_ID_CHARS]
                        break
            except (AttributeError, TypeError, ValueError):
                pass  # headers not as ASGI specifies: fall back to an id of our own
        # As random as uuid4().hex, at a sixth of the cost; from os.urandom,
        # so ids differ across forked workers whatever the app does with `random`.
        return os.urandom(16).hex()


def _needs_task_record() -> bool:
    # After monitored is set to False: would monitored(enabled=False) keep a record here?
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no asyncio loop (an ASGI server on trio, say): leave it to monitored()
        return True
    return task is not None and _state.needs_task_record(task, False)


def _warn_if_not_set_up() -> None:
    if not _state.started:
        logger.warning(
            "aiocop: AiocopMiddleware got its first request, but blocking-call detection is not running "
            "in this process (pid %d), so no request will be reported. Call "
            "aiocop.start_blocking_io_detection() in the module that defines the app, or at lifespan "
            "start-up, so that each server worker process starts it.",
            os.getpid(),
        )
    elif not _callbacks.listening():
        logger.warning(
            "aiocop: AiocopMiddleware got its first request, but no slow-task callback is registered "
            "in this process (pid %d), so events go nowhere. Register one with "
            "aiocop.register_slow_task_callback() or aiocop.detect_slow_tasks(on_slow_task=...).",
            os.getpid(),
        )
