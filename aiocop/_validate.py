"""Argument checks for the public API.

Each check names the argument it rejects, so that a mistake in a set-up call
fails there, with a message saying which argument and why, rather than deep
inside detection or, worse, as a silently ignored setting. `bool` is never
accepted as a number here (`True` is an `int` to Python, not to a user).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


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


def check_ms(name: str, value: object) -> float:
    return check_number(name, value, "milliseconds", allow_zero=False)


def check_name(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, not {_type_name(value)}: {value!r}")
    if not value:
        raise ValueError(f"{name} must be a non-empty string")
    return value


def check_callable(name: str, value: object, args: int) -> None:
    """`value` must be callable with `args` positional arguments (when its signature can be read)."""
    if not callable(value):
        raise TypeError(f"{name} must be callable, not {_type_name(value)}: {value!r}")
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
