"""A context variable scope usable as a context manager and as a decorator.

`contextlib.ContextDecorator` cannot be used for coroutine functions: it would
set the variable around the creation of the coroutine, not around its run.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, Generic, TypeVar

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

# What the scopes entered in the current context need to leave them: the
# innermost entry, as [token, what `_on_enter` returned, the token of the
# entry's own setting of this variable], None when no scope is entered.
# Kept in the context rather than in the instance: one instance (a
# module-level `QUIET = aiocop.monitored(enabled=False)`, a decorated
# coroutine function) may be entered by several tasks at once, and each must
# leave its own entry. The entries form a linked stack through their own
# tokens: resetting one restores the entry outside it (entering and leaving
# make one small list, not a copy of the stack), and leaving the outermost
# takes the variable out of the context again (a task that entered a scope
# keeps nothing of it, and makes no token, as setting the variable would).
# A list, not a tuple: its own token exists only once it is set.
Entry = list[Any]
entered: ContextVar[Entry | None] = ContextVar("aiocop_entered_scopes", default=None)


class ContextVarScope(Generic[T]):
    """Sets a context variable on enter and restores it on exit; re-entrant, and shareable between tasks."""

    # Whether a subclass runs code on enter or exit: a scope without (an
    # allow_blocking scope, often entered per request) skips two calls.
    _hooks = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._hooks = cls._on_enter is not ContextVarScope._on_enter or cls._on_exit is not ContextVarScope._on_exit

    def __init__(self, var: ContextVar[T]) -> None:
        self._var = var

    def _value(self) -> T:
        raise NotImplementedError  # pragma: no cover - every subclass defines it

    def _on_enter(self) -> object:
        """Run on enter, once the variable is set; its result is given to `_on_exit`."""
        return None

    def _on_exit(self, entered: Any) -> None:
        """Run on exit, once the variable is reset."""

    def __enter__(self) -> ContextVarScope[T]:
        token = self._var.set(self._value())
        entry: Entry = [token, self._on_enter() if self._hooks else None, None]
        entry[2] = entered.set(entry)
        return self

    def __exit__(self, exc_type: object = None, exc: object = None, traceback: object = None) -> None:
        entry = entered.get()
        try:
            if entry is None:
                raise ValueError("no scope entered in this context")
            # The innermost entry: this scope's, unless scopes are left out of
            # order, which only tasks sharing one context do (veloxloop copies
            # no context into its tasks). Leaving the innermost first still
            # restores everything once all are left.
            token, on_enter, own = entry
            self._var.reset(token)  # ValueError if entered in another context (a task's copy)
        except ValueError:
            # Left where it was not entered: in another task, or never
            # entered. Nothing is changed.
            raise RuntimeError(
                f"{type(self).__name__} scope left where it was not entered: leave each scope in the task "
                "(and the block) that entered it, innermost first"
            ) from None
        entered.reset(own)  # the same context as `token`'s, whose reset worked
        if self._hooks:
            self._on_exit(on_enter)

    def __call__(self, func: F) -> F:
        if inspect.isasyncgenfunction(func):
            return self._wrap_async_generator(func)
        if inspect.isgeneratorfunction(func):
            return self._wrap_generator(func)
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

    # A generator runs a little each time it is resumed, in the context of
    # whoever resumes it: the scope is entered around each resumption and left
    # before each value is handed out, so it never leaks into the consumer.

    def _wrap_generator(self, func: F) -> F:
        @functools.wraps(func)
        def generator_wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                inner = func(*args, **kwargs)
            resume: Callable[[], Any] = inner.__next__
            while True:
                try:
                    with self:
                        item = resume()
                except StopIteration as stop:
                    return stop.value
                try:
                    sent = yield item
                except GeneratorExit:
                    with self:
                        inner.close()
                    raise
                except BaseException as error:
                    resume = functools.partial(inner.throw, error)
                else:
                    resume = functools.partial(inner.send, sent)

        return generator_wrapper  # type: ignore[return-value]

    def _wrap_async_generator(self, func: F) -> F:
        @functools.wraps(func)
        async def async_generator_wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                inner = func(*args, **kwargs)
            resume: Callable[[], Any] = inner.__anext__
            while True:
                try:
                    with self:
                        item = await resume()
                except StopAsyncIteration:
                    return
                try:
                    sent = yield item
                except GeneratorExit:
                    with self:
                        await inner.aclose()
                    raise
                except BaseException as error:
                    resume = functools.partial(inner.athrow, error)
                else:
                    resume = functools.partial(inner.asend, sent)

        return async_generator_wrapper  # type: ignore[return-value]
