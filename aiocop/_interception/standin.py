"""What stands in for a wrapped callable, and stays the same object wherever the program keeps it.

A builtin's stand-in (`BuiltinLike`) is called as the builtin is, never bound
as a method, pickled by reference and shown with the builtin's repr; a
method's is the wrapper function itself, dressed as the method. Each is kept
for the life of the process (`kept_objects`): `stop()` makes it call the
original at once (`pass_through`), and the next start makes it the wrapper
again, so that `os.stat` kept in a class attribute, a dataclass default or a
`from os import stat` is the object the module holds, and detected again.
"""

from __future__ import annotations

import contextlib
import functools
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable


class BuiltinLike(staticmethod):  # type: ignore[type-arg]
    """The stand-in for a builtin function: called as it is, never bound, pickled and copied as the original.

    A builtin is not a descriptor: `sleep = time.sleep` in a class body stays
    the very same object, read from the class or an instance (a dataclass
    default, a strategy kept as a class attribute). A Python function would
    become a method there (and be given `self`), and a plain staticmethod
    would hand out the function it holds; this one hands out itself. A
    staticmethod is called directly (in C, with no frame of its own). Its
    name, qualified name, module and docstring come from the wrapped function,
    which has the original's.

    What it calls can be switched in place: to the original when detection
    stops (a kept stand-in then costs one C call more than the builtin, and
    detects nothing), and back to a wrapper when it starts again, so that
    `os.stat` is one object for the life of the process.
    """

    # Weak references to it work, as to a builtin.
    __slots__ = ("__weakref__",)
    _reference: str  # "module:name" it was patched under, in the instance's own __dict__ (staticmethods have one)
    _original: Any  # the builtin it stands for (same __dict__)

    def __get__(self, instance: object, owner: type | None = None) -> BuiltinLike:
        return self  # as a builtin, which is no descriptor: stored in a class, read back the same

    @property
    def original(self) -> Any:
        return self._original

    # The name as a property of the type too (not only in the instance's
    # dict), where CPython looks for it in `repr(weakref.ref(os.stat))`.
    # Writing it (staticmethod's __init__ copies the wrapped function's) changes nothing.
    @property
    def __name__(self) -> str:
        return self._original.__name__  # type: ignore[no-any-return]

    @__name__.setter
    def __name__(self, value: str) -> None:
        pass

    @property
    def __self__(self) -> Any:
        return self._original.__self__  # a builtin's module (posix for os.stat)

    def calls(self, target: Callable[..., Any]) -> None:
        """Call `target` from now on (a wrapper, or the original itself)."""
        staticmethod.__init__(self, target)  # replaces the callable in place (CPython's sm_init)

    def __reduce__(self) -> tuple[Any, ...]:
        # By reference to the name it was patched under ("os:stat"): it
        # unpickles anywhere, aiocop or not, to whatever that name holds there
        # (the original, or this stand-in where aiocop runs), as the builtin
        # itself would.
        import pkgutil  # noqa: PLC0415 - only when pickled

        return (pkgutil.resolve_name, (self._reference,))

    def __copy__(self) -> BuiltinLike:
        return self  # functions are atomic to `copy`

    def __deepcopy__(self, memo: dict[int, Any]) -> BuiltinLike:
        return self

    def __repr__(self) -> str:
        return repr(self._original)


def _pass_through_code() -> types.CodeType:
    original: Callable[..., Any] = print
    event = ""

    # What a kept method wrapper runs once detection stops: the original, at
    # once. Its free variables are every wrapper's (`event`, `original`), so
    # that this code can replace a wrapper's own in place (`__code__`).
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        event  # noqa: B018 - a free variable like every wrapper's, though unused
        return original(*args, **kwargs)

    return wrapper.__code__


PASS_THROUGH = _pass_through_code()

# One stand-in per patched name for the life of the process: started again,
# aiocop puts the same objects back, so that whatever the program kept of them
# (a class attribute, a dataclass default, `from os import stat`) is the
# object `os.stat` is, and detected again. Keyed by the target's owner and
# attribute; each entry the original it stands for, the stand-in (a
# BuiltinLike, or a method wrapper) and the wrapper's own code.
kept_objects: dict[tuple[str, str], tuple[Any, Any, types.CodeType | None]] = {}


def without_annotations(original: Any, wrapper: Callable[..., Any]) -> None:
    # A builtin or C method has no annotations (typing.get_type_hints gives
    # {}); the wrappers' own are strings naming aiocop's imports, which no
    # resolver outside this module can resolve.
    if not hasattr(original, "__annotations__"):
        wrapper.__annotations__ = {}


def dress(key: tuple[str, str], original: Any, wrapper: Callable[..., Any], owner: Any) -> Any:
    """`wrapper` dressed as `original`, as `owner` will hold it under `key` (the one kept from an earlier start)."""
    functools.wraps(original)(wrapper)
    without_annotations(original, wrapper)
    if hasattr(original, "__text_signature__"):  # what inspect.signature reads of a builtin
        wrapper.__text_signature__ = original.__text_signature__  # type: ignore[attr-defined]
    kept = kept_objects.get(key)
    if isinstance(owner, type) or isinstance(original, types.FunctionType):
        # A method: a function binds like the C method it replaces. A C
        # method has no module of its own; a function always has the
        # attribute, so None says the same (and pickle, finding None, looks
        # the qualified name up in every module: the owner's holds the wrapper).
        if isinstance(owner, type) and not hasattr(original, "__module__"):
            wrapper.__module__ = None  # type: ignore[assignment]
        if kept is not None and kept[0] is original and take_code(kept[1], wrapper):
            return kept[1]
        kept_objects[key] = (original, wrapper, wrapper.__code__)
        return wrapper
    if kept is not None and kept[0] is original:
        stand_in = kept[1]
    else:
        stand_in = BuiltinLike(wrapper)
        stand_in._reference = f"{owner.__name__}:{original.__name__}"
        stand_in._original = original
        # What typing.get_type_hints reads ({}, as for the builtin): in the
        # instance's own dict, above the annotations of this class's body
        # (which 3.14's staticmethod no longer hides with the function's).
        stand_in.__annotations__ = {}
        if hasattr(original, "__text_signature__"):
            stand_in.__text_signature__ = original.__text_signature__  # type: ignore[attr-defined] # its own __dict__
        kept_objects[key] = (original, stand_in, None)
    stand_in.calls(wrapper)
    return stand_in


def take_code(kept: Any, wrapper: Any) -> bool:
    # The kept function becomes the new wrapper if their closures name the
    # same variables in the same order (a cell is bound by position).
    closure = kept.__closure__
    if closure is None or kept.__code__.co_freevars != wrapper.__code__.co_freevars:
        return False
    try:
        kept.__code__ = wrapper.__code__  # an `object.__setattr__` audit event, which a sandbox may refuse
        kept.__defaults__ = wrapper.__defaults__
    except Exception:
        return False  # a new wrapper then, as on the first start
    for cell, new in zip(closure, wrapper.__closure__, strict=True):
        cell.cell_contents = new.cell_contents
    return True


def pass_through(wrapper: Any, original: Any) -> None:
    """`wrapper`, once taken off its owner, calls `original` at once, wherever the program kept it."""
    if isinstance(wrapper, BuiltinLike):
        wrapper.calls(original)
    elif isinstance(wrapper, types.FunctionType) and wrapper.__code__.co_freevars == PASS_THROUGH.co_freevars:
        with contextlib.suppress(Exception):  # refused by an audit hook: the wrapper stays, and still works
            wrapper.__code__ = PASS_THROUGH
