"""A context variable scope usable as a context manager and as a decorator.

`contextlib.ContextDecorator` cannot be used for coroutine functions: it would
set the variable around the creation of the coroutine, not around its run.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from contextvars import ContextVar, Token
from typing import Any, Generic, TypeVar

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

# What the scopes entered in the current context need to leave them (the
# token, and what `_on_enter` returned), innermost last. Kept in the context
# rather than in the instance: one instance (a module-level
# `QUIET = aiocop.monitored(enabled=False)`, a decorated coroutine function)
# may be entered by several tasks at once, and each must leave its own entry.
_entered: ContextVar[tuple[tuple[Token[Any], object], ...]] = ContextVar("aiocop_entered_scopes", default=())


class ContextVarScope(Generic[T]):
    """Sets a context variable on enter and restores it on exit; re-entrant, and shareable between tasks."""

    def __init__(self, var: ContextVar[T]) -> None:
        self._var = var

    def _value(self) -> T:
        raise NotImplementedError  # pragma: no cover - every subclass defines it

    def _on_enter(self) -> object:
        """Run on enter, once the variable is set; its result is given to `_on_exit`."""
        return None

    def _on_exit(self, entered: Any) -> None:
        """Run on exit, before the variable is reset."""

    def __enter__(self) -> ContextVarScope[T]:
        token = self._var.set(self._value())
        _entered.set((*_entered.get(), (token, self._on_enter())))
        return self

    def __exit__(self, *exc_info: object) -> None:
        *outer, (token, entered) = _entered.get()
        _entered.set(tuple(outer))
        self._on_exit(entered)
        self._var.reset(token)

    def __call__(self, func: F) -> F:
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                with self:
                    return await func(*args, **kwargs)

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]
