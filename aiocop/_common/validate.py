"""Argument checks for the public API.

Each check names the argument it rejects, so that a mistake in a set-up call
fails there, with a message saying which argument and why, rather than deep
inside detection or, worse, as a silently ignored setting. `bool` is never
accepted as a number here (`True` is an `int` to Python, not to a user).
"""

from __future__ import annotations

import difflib
import inspect
import math
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """`" (did you mean 'os.stat'?)"` for the closest of `candidates` to a mistyped `name`, or `""`."""
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _type_name(value: object) -> str:
    return type(value).__name__


def check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, not {_type_name(value)}: {value!r}")
    return value


def check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {_type_name(value)}: {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, not {value!r}")
    return value


def check_number(name: str, value: object, unit: str, *, allow_zero: bool) -> float:
    """A finite real number, > 0 (or >= 0 with `allow_zero`), as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of {unit}, not {_type_name(value)}: {value!r}")
    number = float(value)
    if not math.isfinite(number) or number < 0 or (number == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be {bound} (a finite number of {unit}), not {value!r}")
    return number


def check_ms(name: str, value: object, maximum: float | None = None) -> float:
    number = check_number(name, value, "milliseconds", allow_zero=False)
    if maximum is not None and number > maximum:
        raise ValueError(f"{name} must be at most {maximum:g} milliseconds, not {value!r}")
    return number


def check_name(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, not {_type_name(value)}: {value!r}")
    if not value:
        raise ValueError(f"{name} must be a non-empty string")
    return value


def _kind_of_function(value: object) -> str | None:
    """What makes `value` unusable as a plain callback: its call runs nothing by itself."""
    # The function itself, or the __call__ of a callable object's class.
    for candidate in (value, inspect.getattr_static(type(value), "__call__", None)):
        if inspect.iscoroutinefunction(candidate):
            return "an async function: calling it makes a coroutine that nothing would await"
        if inspect.isasyncgenfunction(candidate):
            return "an async generator function: calling it runs none of its code"
        if inspect.isgeneratorfunction(candidate):
            return "a generator function: calling it runs none of its code"
    return None


def check_callable(name: str, value: object, args: int, *, plain: bool = True) -> None:
    """`value` must be callable with `args` positional arguments (when its signature can be read).

    `plain`: and not an async or generator function (aiocop calls it, and uses what it returns).
    """
    if not callable(value):
        raise TypeError(f"{name} must be callable, not {_type_name(value)}: {value!r}")
    kind = _kind_of_function(value) if plain else None
    if kind is not None:
        raise TypeError(
            f"{name} must be a plain function, but {value!r} is {kind}; aiocop calls it synchronously "
            "(to do async work, schedule it from a plain function, e.g. with loop.create_task)"
        )
    try:
        signature = inspect.signature(value)
    except (TypeError, ValueError):  # some builtins have no readable signature: trust them
        return
    dummies: list[Any] = [None] * args
    try:
        signature.bind(*dummies)
    except TypeError:
        takes = "no argument" if args == 0 else f"{args} positional argument{'s' if args > 1 else ''}"
        raise TypeError(f"{name} must be callable with {takes}, but {value!r} has the signature {signature}") from None


def check_decorated(scope: str, func: F) -> F:
    """What a scope used as a decorator is given must be a function (a common slip: a missing `()`)."""
    if not callable(func):
        raise TypeError(f"{scope} decorates a function or coroutine function, not {_type_name(func)}: {func!r}")
    return func
