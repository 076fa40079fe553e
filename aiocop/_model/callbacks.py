"""Registered slow-task callbacks and context providers (1.x API)."""

from __future__ import annotations

import logging
import threading
from asyncio import _get_running_loop as get_running_loop
from collections.abc import Callable
from typing import Any

from aiocop._common.clock import perf_counter
from aiocop._common.validate import check_callable
from aiocop._model import state as _state
from aiocop._model.events import SlowTaskEvent

SlowTaskCallback = Callable[[SlowTaskEvent], None]
"""A function called with each `SlowTaskEvent` (`register_slow_task_callback`)."""
ContextProvider = Callable[[], "dict[str, Any] | None"]
"""A function whose dict is merged into `SlowTaskEvent.context` (`register_context_provider`)."""

logger = logging.getLogger("aiocop")

# Replaced, never mutated, so a delivery iterating over them is unaffected by
# a callback that (un)registers callbacks.
_callbacks: tuple[SlowTaskCallback, ...] = ()
providers: tuple[ContextProvider, ...] = ()
"""The registered context providers, in order. Read, never assigned, outside this module: the hook, delivery
and hang reports call `capture_context()` only when there is a provider; `aiocop.asgi` registers its request
provider again when it is gone."""
# aiocop's own listeners (the OpenTelemetry instrumentor's metrics): told of
# every event after the application's callbacks, in the same context, but
# neither listed by registered() nor removed by clear_slow_task_callbacks(),
# which belong to the application (1.x test suites clear callbacks between
# tests: the metrics must not stop with them).
_observers: tuple[SlowTaskCallback, ...] = ()
# Everyone told of an event: the callbacks, then the observers.
_listeners: tuple[SlowTaskCallback, ...] = ()


def _update_listeners() -> None:
    global _listeners
    _listeners = (*_callbacks, *_observers)


# Told of each blocking call as it is made, on the loop's thread, inside the
# call's own context (the OpenTelemetry span events: the span current at the
# call may have ended by the time the step's event is delivered). Called with
# the hook's raw record (`_hook.Record`), while the hook ignores the
# observer's own calls.
CallObserver = Callable[[Any], None]
call_observers: tuple[CallObserver, ...] = ()
"""The call observers (`add_call_observer`). Read (never assigned) by the audit hook, which tells them of a
recorded call only if there is one: a truth test of this tuple on the hot path, no call."""


def add_call_observer(observer: CallObserver) -> None:
    global call_observers
    if observer not in call_observers:
        call_observers = (*call_observers, observer)


def remove_call_observer(observer: CallObserver) -> None:
    global call_observers
    call_observers = tuple(o for o in call_observers if o != observer)


def observe_call(record: Any) -> None:
    for observer in call_observers:
        try:
            observer(record)
        except Exception as error:
            _contain(error, observer, "call observer")


def listening() -> bool:
    """Whether anyone (a callback or an observer) is told of events: if not, none is built."""
    return bool(_listeners)


def add_observer(observer: SlowTaskCallback) -> None:
    """Tell `observer` of every event, as a callback, without registering it as one (aiocop's own sinks)."""
    global _observers
    if observer not in _observers:
        _observers = (*_observers, observer)
    _update_listeners()


def remove_observer(observer: SlowTaskCallback) -> None:
    global _observers
    _observers = tuple(o for o in _observers if o != observer)
    _update_listeners()


def register_slow_task_callback(callback: SlowTaskCallback) -> None:
    """Call `callback(event)` for every `SlowTaskEvent` (registering twice is a no-op)."""
    global _callbacks
    check_callable("callback", callback, 1)
    if callback not in _callbacks:
        _callbacks = (*_callbacks, callback)
    _update_listeners()


def unregister_slow_task_callback(callback: SlowTaskCallback) -> None:
    """Stop calling a callback registered with `register_slow_task_callback`."""
    global _callbacks
    _callbacks = tuple(c for c in _callbacks if c != callback)
    _update_listeners()
    _forget_removed()


def registered() -> tuple[SlowTaskCallback, ...]:
    """The registered slow-task callbacks, in registration order."""
    return _callbacks


def clear_slow_task_callbacks() -> None:
    """Unregister every slow-task callback."""
    global _callbacks
    _callbacks = ()
    _update_listeners()
    _forget_removed()


def register_context_provider(provider: ContextProvider) -> None:
    """Add a function whose returned dict is merged into `SlowTaskEvent.context`.

    Providers run when the event is delivered, inside a copy of the step's
    context (contextvars as they were at the step's first blocking call), so
    a provider reading the current tracing span or request id sees the
    offending request's.
    """
    global providers
    check_callable("provider", provider, 0)
    if provider not in providers:
        providers = (*providers, provider)


def unregister_context_provider(provider: ContextProvider) -> None:
    """Remove a context provider."""
    global providers
    providers = tuple(p for p in providers if p != provider)
    _forget_removed()


def clear_context_providers() -> None:
    """Remove every context provider."""
    global providers
    providers = ()
    _forget_removed()


def _name(func: object) -> str:
    return getattr(func, "__qualname__", None) or repr(func)


# Callbacks and providers whose failure (or slowness) has been logged: each is
# logged once, with its traceback; a callback that fails on every event must
# not flood the logs. Compared by identity (some callables are not hashable).
_logged: list[tuple[str, object]] = []


def _first_time(what: str, func: object) -> bool:
    if any(kind == what and f is func for kind, f in _logged):
        return False
    _logged.append((what, func))
    return True


def _forget_removed() -> None:
    # Registered again later, a callback is logged afresh.
    registered = (*_listeners, *providers)
    _logged[:] = [(kind, f) for kind, f in _logged if any(f is r for r in registered)]


def _warn_slow(func: object, what: str, elapsed_ms: float) -> None:
    if get_running_loop() is not None and _first_time("slow", func):
        logger.warning(
            "aiocop: %s %s ran for %.0f ms on the event loop's thread, holding the loop (aiocop runs it there "
            "after each offending step); make it faster, or deliver events off the loop with "
            "aiocop.start_blocking_io_detection(delivery='thread'). Logged once.",
            what,
            _name(func),
            elapsed_ms,
        )


# Each provider and callback is timed (to warn about a slow one), with the
# comparison inline: these loops run once per event, on the loop's thread.


# What a callback or provider raises never harms the application or the
# delivery: an exception is logged (once per callback) and ignored, and so is
# SystemExit (a callback is not the program). KeyboardInterrupt on the main
# thread is most likely the user's Ctrl-C arriving while a callback ran: the
# event still reaches every other callback, then the interrupt goes on, as it
# would have without aiocop. Elsewhere only the callback can have raised it,
# and it is contained like the rest.


def _contain(error: BaseException, func: object, what: str) -> KeyboardInterrupt | None:
    """Log what `func` raised; the KeyboardInterrupt to raise once the delivery is done, if any."""
    if isinstance(error, KeyboardInterrupt) and threading.current_thread() is threading.main_thread():
        return error
    if _first_time("error", func):
        logger.error(
            "aiocop: %s %s raised %s (ignored; its later errors are not logged)",
            what,
            _name(func),
            type(error).__name__,
            exc_info=error,
        )
    return None


def capture_context() -> dict[str, Any]:
    context: dict[str, Any] = {}
    interrupted: KeyboardInterrupt | None = None
    for provider in providers:
        start = perf_counter()
        try:
            value = provider()
            if value is not None:
                context.update(value)
        except BaseException as error:
            interrupted = _contain(error, provider, "context provider") or interrupted
        elapsed_ms = (perf_counter() - start) * 1000.0
        if elapsed_ms >= _state.config.threshold_ms:
            _warn_slow(provider, "context provider", elapsed_ms)
    if interrupted is not None:
        raise interrupted
    return context


def invoke_callbacks(event: SlowTaskEvent) -> None:
    interrupted: KeyboardInterrupt | None = None
    start = perf_counter()  # one clock read per callback: each one's end is the next one's start
    for callback in _listeners:
        try:
            callback(event)
        except BaseException as error:
            interrupted = _contain(error, callback, "slow-task callback") or interrupted
        end = perf_counter()
        elapsed_ms = (end - start) * 1000.0
        start = end
        if elapsed_ms >= _state.config.threshold_ms:
            _warn_slow(callback, "slow-task callback", elapsed_ms)
            start = perf_counter()  # the warning's logging is not the next callback's time
    if interrupted is not None:
        raise interrupted
