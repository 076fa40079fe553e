"""Registered slow-task callbacks and context providers (1.x API)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from aiocop._events import SlowTaskEvent

SlowTaskCallback = Callable[[SlowTaskEvent], None]
ContextProvider = Callable[[], "dict[str, Any] | None"]

logger = logging.getLogger("aiocop")

# Replaced, never mutated, so a delivery iterating over them is unaffected by
# a callback that (un)registers callbacks.
_callbacks: tuple[SlowTaskCallback, ...] = ()
_providers: tuple[ContextProvider, ...] = ()


def _check_callable(value: object, what: str) -> None:
    if not callable(value):
        raise TypeError(f"{what} must be callable, not {type(value).__name__}: {value!r}")


def register_slow_task_callback(callback: SlowTaskCallback) -> None:
    """Call `callback(event)` for every `SlowTaskEvent` (registering twice is a no-op)."""
    global _callbacks
    _check_callable(callback, "callback")
    if callback not in _callbacks:
        _callbacks = (*_callbacks, callback)


def unregister_slow_task_callback(callback: SlowTaskCallback) -> None:
    """Stop calling a callback registered with `register_slow_task_callback`."""
    global _callbacks
    _callbacks = tuple(c for c in _callbacks if c != callback)


def registered() -> tuple[SlowTaskCallback, ...]:
    """The registered slow-task callbacks, in registration order."""
    return _callbacks


def clear_slow_task_callbacks() -> None:
    """Unregister every slow-task callback."""
    global _callbacks
    _callbacks = ()


def register_context_provider(provider: ContextProvider) -> None:
    """Add a function whose returned dict is merged into `SlowTaskEvent.context`.

    Providers run when the event is delivered, inside a copy of the step's
    context (contextvars as they were at the step's first blocking call), so
    a provider reading the current tracing span or request id sees the
    offending request's.
    """
    global _providers
    _check_callable(provider, "context provider")
    if provider not in _providers:
        _providers = (*_providers, provider)


def unregister_context_provider(provider: ContextProvider) -> None:
    """Remove a context provider."""
    global _providers
    _providers = tuple(p for p in _providers if p != provider)


def clear_context_providers() -> None:
    """Remove every context provider."""
    global _providers
    _providers = ()


def _name(func: object) -> str:
    return getattr(func, "__qualname__", None) or repr(func)


def capture_context() -> dict[str, Any]:
    context: dict[str, Any] = {}
    for provider in _providers:
        try:
            value = provider()
            if value is not None:
                context.update(value)
        except Exception:
            logger.exception("aiocop: context provider %s raised (ignored)", _name(provider))
    return context


def invoke_callbacks(event: SlowTaskEvent) -> None:
    for callback in _callbacks:
        try:
            callback(event)
        except Exception:
            logger.exception("aiocop: slow-task callback %s raised (ignored)", _name(callback))
