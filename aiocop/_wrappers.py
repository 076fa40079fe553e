"""Thin wrappers that raise audit events for blocking stdlib calls that have none.

What is wrapped is data (`PATCH_TARGETS`); how a kind of call decides that it
can really block is one small factory per kind. Every wrapper is a hot path
for the whole application, on every thread: it first checks, as cheaply as
possible, whether the call can block and whether this thread is running an
event loop, and otherwise calls the original at once. Events are only raised
on threads that run an event loop.
"""

from __future__ import annotations

import _thread
import functools
import importlib
import logging
import os
import select
import sys
import threading
from asyncio import _get_running_loop as get_running_loop
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from aiocop import _typepatch

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

logger = logging.getLogger("aiocop")

Kind = Literal[
    "path",
    "call",
    "sleep",
    "socket",
    "fd_read",
    "fd_write",
    "select",
    "poll",
    "lock_acquire",
    "lock_enter",
    "event_wait",
    "condition_wait",
    "queue_get",
    "queue_put",
]


@dataclass(frozen=True, slots=True)
class PatchTarget:
    """A stdlib callable aiocop wraps, and the audit event the wrapper raises."""

    owner: str  # module, or module:Class for a class attribute
    attr: str
    event: str
    kind: Kind
    until: tuple[int, int] | None = None  # not patched from this Python version on
    label: str = ""  # the name users know it by, when the owner is an implementation detail

    @property
    def name(self) -> str:
        return self.label or f"{self.owner.replace(':', '.')}.{self.attr}"


_SOCKET_METHODS = ("accept", "send", "sendall", "recv", "recv_into", "recvfrom", "recvfrom_into", "recvmsg")

PATCH_TARGETS: tuple[PatchTarget, ...] = (
    PatchTarget("os", "stat", "os.stat", "path"),
    PatchTarget("os", "lstat", "os.lstat", "path"),
    PatchTarget("os", "access", "os.access", "path"),
    PatchTarget("os", "statvfs", "os.statvfs", "path"),
    PatchTarget("os", "readlink", "os.readlink", "path"),
    PatchTarget("os", "getcwd", "os.getcwd", "call"),
    PatchTarget("os", "sendfile", "os.sendfile", "call"),
    PatchTarget("os", "read", "os.read", "fd_read"),
    PatchTarget("os", "write", "os.write", "fd_write"),
    PatchTarget("time", "sleep", "time.sleep", "sleep", until=(3, 13)),  # native event from 3.13
    *(PatchTarget("socket:socket", m, f"socket.socket.{m}", "socket") for m in _SOCKET_METHODS),
    PatchTarget("ssl:SSLSocket", "read", "ssl.SSLSocket.read", "socket"),
    PatchTarget("ssl:SSLSocket", "write", "ssl.SSLSocket.write", "socket"),
    PatchTarget("select", "select", "select.select", "select"),
    PatchTarget("aiocop._wrappers:PollType", "poll", "select.poll", "poll", label="select.poll().poll"),
    PatchTarget(
        "_thread:LockType", "acquire", "threading.Lock.acquire", "lock_acquire", label="threading.Lock.acquire"
    ),
    PatchTarget(
        "_thread:LockType", "__enter__", "threading.Lock.acquire", "lock_enter", label="threading.Lock.__enter__"
    ),
    PatchTarget("_thread:RLock", "acquire", "threading.Lock.acquire", "lock_acquire", label="threading.RLock.acquire"),
    PatchTarget(
        "_thread:RLock", "__enter__", "threading.Lock.acquire", "lock_enter", label="threading.RLock.__enter__"
    ),
    PatchTarget("threading:Event", "wait", "threading.Event.wait", "event_wait"),
    PatchTarget("threading:Condition", "wait", "threading.Condition.wait", "condition_wait"),
    PatchTarget("queue:Queue", "get", "queue.Queue.get", "queue_get"),
    PatchTarget("queue:Queue", "put", "queue.Queue.put", "queue_put"),
)

PollType: type | None = type(select.poll()) if hasattr(select, "poll") else None

_audit = sys.audit


def _may_wait(timeout: Any) -> bool:
    # None waits forever; anything that is not a positive number is left to
    # the original call (which waits not at all, or raises its own error).
    if timeout is None:
        return True
    try:
        return bool(timeout > 0)
    except TypeError:
        return False


def _path(original: Callable[..., Any], event: str) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if get_running_loop() is not None:
            _audit(event, args[0] if args else kwargs.get("path"))
        return original(*args, **kwargs)

    return wrapper


def _call(original: Callable[..., Any], event: str) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if get_running_loop() is not None:
            _audit(event, *args)
        return original(*args, **kwargs)

    return wrapper


def _sleep(original: Callable[..., Any], event: str) -> Callable[..., Any]:
    def wrapper(secs: float) -> None:
        if get_running_loop() is not None and _may_wait(secs):
            _audit(event, secs)
        return original(secs)  # type: ignore[no-any-return]

    return wrapper


def _socket(original: Callable[..., Any], event: str) -> Callable[..., Any]:
    # Non-blocking sockets (timeout 0.0), the event loops' own, are the common
    # case: test that first.
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self.gettimeout() != 0.0 and get_running_loop() is not None:
            _audit(event, self)
        return original(self, *args, **kwargs)

    return wrapper


def _fd_blocking(fd: Any) -> bool:
    try:
        return os.get_blocking(fd)
    except (OSError, TypeError, ValueError):
        return False  # the call itself will raise the right error


def _fd_read(original: Callable[..., Any], event: str) -> Callable[..., Any]:
    def wrapper(fd: int, length: int, /) -> bytes:
        if get_running_loop() is not None and _fd_blocking(fd):
            _audit(event, fd, length)
        return original(fd, length)  # type: ignore[no-any-return]

    return wrapper


def _fd_write(original: Callable[..., Any], event: str) -> Callable[..., Any]:
    def wrapper(fd: int, data: Any, /) -> int:
        if get_running_loop() is not None and _fd_blocking(fd):
            try:
                size = len(data)
            except TypeError:  # not a buffer: os.write raises its own error below
                size = None
            _audit(event, fd, size)
        return original(fd, data)  # type: ignore[no-any-return]

    return wrapper


def _select(original: Callable[..., Any], event: str) -> Callable[..., Any]:
    def wrapper(rlist: Any, wlist: Any, xlist: Any, timeout: float | None = None, /) -> Any:
        if _may_wait(timeout) and get_running_loop() is not None:
            _audit(event, timeout)
        return original(rlist, wlist, xlist, timeout)

    return wrapper


def _poll(original: Callable[..., Any], event: str) -> Callable[..., Any]:
    def wrapper(self: Any, timeout: float | None = None, /) -> Any:
        if timeout != 0 and get_running_loop() is not None:
            _audit(event, timeout)
        return original(self, timeout)

    return wrapper


def _lock_acquire(original: Callable[..., Any], event: str) -> Callable[..., Any]:
    # Try without blocking first: a free lock is taken at once and never
    # reported; only a lock held elsewhere raises the event before waiting.
    def wrapper(self: Any, blocking: bool = True, timeout: float = -1) -> bool:
        if not blocking or timeout == 0 or get_running_loop() is None:
            return original(self, blocking, timeout)  # type: ignore[no-any-return]
        if timeout != -1 and not (isinstance(timeout, (int, float)) and 0 < timeout <= threading.TIMEOUT_MAX):
            return original(self, blocking, timeout)  # type: ignore[no-any-return] # its own error
        if original(self, False):
            return True
        _audit(event, timeout)
        return original(self, True, timeout)  # type: ignore[no-any-return]

    return wrapper


# The C acquire of each lock type, taken before aiocop wraps it: `with lock:`
# tries it without blocking (as the C __enter__ would acquire, never through
# a subclass's acquire) before reporting a wait.
_C_ACQUIRE: dict[type, Callable[..., Any]] = {
    cls: vars(cls)["acquire"] for cls in (_thread.LockType, _thread.RLock) if "acquire" in vars(cls)
}


def _c_acquire(lock: Any) -> Callable[..., Any]:
    acquire = _C_ACQUIRE.get(type(lock))
    if acquire is None:  # a subclass: the C type it derives from
        acquire = next(_C_ACQUIRE[cls] for cls in type(lock).__mro__ if cls in _C_ACQUIRE)
    return acquire


def _lock_enter(original: Callable[..., Any], event: str) -> Callable[..., Any]:
    def wrapper(self: Any) -> bool:
        if get_running_loop() is None:
            return original(self)  # type: ignore[no-any-return]
        if _c_acquire(self)(self, False):
            return True
        _audit(event, None)
        return original(self)  # type: ignore[no-any-return]

    return wrapper


def _event_wait(original: Callable[..., Any], event: str) -> Callable[..., Any]:
    def wrapper(self: Any, timeout: float | None = None) -> bool:
        if _may_wait(timeout) and not self.is_set() and get_running_loop() is not None:
            _audit(event, timeout)
        return original(self, timeout)  # type: ignore[no-any-return]

    return wrapper


def _condition_wait(original: Callable[..., Any], event: str) -> Callable[..., Any]:
    def wrapper(self: Any, timeout: float | None = None) -> bool:
        if _may_wait(timeout) and get_running_loop() is not None:
            _audit(event, timeout)
        return original(self, timeout)  # type: ignore[no-any-return]

    return wrapper


def _queue_get(original: Callable[..., Any], event: str) -> Callable[..., Any]:
    def wrapper(self: Any, block: bool = True, timeout: float | None = None) -> Any:
        if block and _may_wait(timeout) and not self._qsize() and get_running_loop() is not None:
            _audit(event, timeout)
        return original(self, block, timeout)

    return wrapper


def _queue_put(original: Callable[..., Any], event: str) -> Callable[..., Any]:
    def wrapper(self: Any, item: Any, block: bool = True, timeout: float | None = None) -> None:
        if block and _may_wait(timeout) and 0 < self.maxsize <= self._qsize() and get_running_loop() is not None:
            _audit(event, timeout)
        return original(self, item, block, timeout)  # type: ignore[no-any-return]

    return wrapper


_FACTORIES: dict[str, Callable[[Callable[..., Any], str], Callable[..., Any]]] = {
    "path": _path,
    "call": _call,
    "sleep": _sleep,
    "socket": _socket,
    "fd_read": _fd_read,
    "fd_write": _fd_write,
    "select": _select,
    "poll": _poll,
    "lock_acquire": _lock_acquire,
    "lock_enter": _lock_enter,
    "event_wait": _event_wait,
    "condition_wait": _condition_wait,
    "queue_get": _queue_get,
    "queue_put": _queue_put,
}


@dataclass
class _Patch:
    target: PatchTarget
    owner: Any
    original: Any
    own_attr: bool  # the attribute was in the owner's own dict (not inherited)
    wrapper: Any


_applied: list[_Patch] = []


def _resolve_owner(owner: str) -> Any:
    module_name, _, class_name = owner.partition(":")
    obj: Any = importlib.import_module(module_name)
    return getattr(obj, class_name) if class_name else obj


def patch_audit_functions(exclude: Iterable[str] = ()) -> None:
    """Wrap blocking stdlib functions that raise no audit event of their own.

    Called by `start_blocking_io_detection()`; call it yourself only to
    exclude some targets (names as in `get_patched_functions()`). Calling it
    again re-applies the patches with the new exclusions; `stop()` restores
    every original.

    Args:
        exclude: Targets not to wrap, e.g. `["threading.Lock.acquire"]`.
    """
    if isinstance(exclude, str):
        raise TypeError("exclude must be a collection of target names, not a string")
    try:
        excluded = set(exclude)
    except TypeError:
        raise TypeError(f"exclude must be a collection of target names, not {type(exclude).__name__}") from None
    if not all(isinstance(name, str) for name in excluded):
        raise TypeError(f"exclude must hold target names (strings), not {sorted(map(repr, excluded))}")
    unknown = excluded - {t.name for t in PATCH_TARGETS}
    if unknown:
        raise ValueError(f"unknown patch target(s) {sorted(unknown)}; see aiocop.get_patched_functions()")
    unpatch_audit_functions()
    for target in PATCH_TARGETS:
        if target.name in excluded or (target.until is not None and sys.version_info >= target.until):
            continue
        try:
            owner = _resolve_owner(target.owner)
            if owner is None or not hasattr(owner, target.attr):
                continue  # not on this platform
            original = getattr(owner, target.attr)
            own_attr = target.attr in vars(owner)
            wrapper = functools.wraps(original)(_FACTORIES[target.kind](original, target.event))
            _typepatch.set_type_attr(owner, target.attr, wrapper) if isinstance(owner, type) else setattr(
                owner, target.attr, wrapper
            )
        except Exception:
            logger.warning("aiocop: could not wrap %s; it will not be detected", target.name, exc_info=True)
            continue
        _applied.append(_Patch(target, owner, original, own_attr, wrapper))


def unpatch_audit_functions() -> None:
    """Restore every function `patch_audit_functions` wrapped."""
    left: list[str] = []  # replaced by another tool since: not ours to restore
    while _applied:
        patch = _applied.pop()
        owner, attr = patch.owner, patch.target.attr
        if getattr(owner, attr, None) is not patch.wrapper:
            left.append(patch.target.name)
            continue
        if isinstance(owner, type):
            if patch.own_attr:
                _typepatch.set_type_attr(owner, attr, patch.original)
            else:
                _typepatch.del_type_attr(owner, attr)
        else:
            setattr(owner, attr, patch.original)
    if left:
        # One line, however many: another tool (blockbuster, an APM agent)
        # usually puts back all of its own functions at once.
        logger.warning(
            "aiocop: %d wrapped function(s) were replaced by another tool since aiocop wrapped them, and are "
            "left as that tool set them: %s",
            len(left),
            ", ".join(sorted(left)),
        )


def get_patched_functions() -> list[str]:
    """The stdlib callables currently wrapped by aiocop, e.g. `"os.stat"`."""
    return [p.target.name for p in _applied]
