"""A context variable scope usable as a context manager and as a decorator.

`contextlib.ContextDecorator` cannot be used for coroutine functions: it would
set the variable around the creation of the coroutine, not around its run.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from contextvars import ContextVar, Token

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


class ContextVarScope(Generic[T]):
    """Sets a context variable on enter and restores it on exit; re-entrant."""

    def __init__(self, var: ContextVar[T]) -> None:
        self._var = var
        self._tokens: list[Token[T]] = []

    def _value(self) -> T:
        raise NotImplementedError  # pragma: no cover - every subclass defines it

    def __enter__(self) -> ContextVarScope[T]:
        self._tokens.append(self._var.set(self._value()))
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._var.reset(self._tokens.pop())

    def __call__(self, func: F) -> F:
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                with self._fresh():
                    return await func(*args, **kwargs)

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self._fresh():
                return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    def _fresh(self) -> ContextVarScope[T]:
        # A decorated function may run concurrently in several tasks: give each
        # call its own token stack rather than sharing this instance's.
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone._clear_stacks()
        return clone

    def _clear_stacks(self) -> None:
        """Give this instance empty per-entry stacks (subclasses add theirs)."""
        self._tokens = []
