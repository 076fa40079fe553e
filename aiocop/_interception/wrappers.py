"""Thin wrappers that raise audit events for blocking stdlib calls that have none.

What is wrapped is data (`PATCH_TARGETS`); how a kind of call decides that it
can really block is one small factory per kind. Every wrapper is a hot path
for the whole application, on every thread: it first checks, as cheaply as
possible, whether the call can block and whether this thread is running an
event loop, and otherwise calls the original at once. Events are only raised
on threads that run an event loop.

A wrapper must be indistinguishable from what it replaces: it hands its event
to aiocop's hook directly (other audit hooks see only what CPython raises), it
is dressed as the original and stays the same object wherever it is kept
(`_standin`), and it joins every `os.supports_*` set its original is in.
"""

from __future__ import annotations

import _thread
import importlib
import importlib.util
import logging
import os
import select
import socket as _socket_module
import sys
import threading
from asyncio import _get_running_loop
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from aiocop._interception import reload as _reload
from aiocop._interception import rules as _rules
from aiocop._interception import standin as _standin
from aiocop._interception import typepatch as _typepatch

if TYPE_CHECKING:
    import types
    from collections.abc import Callable, Iterable

logger = logging.getLogger("aiocop")

# pytest leaves the frames of this module out of the tracebacks it shows: a
# call through a wrapper fails at the caller's line, as without aiocop. A
# module global, read by pytest only when it formats a traceback: the
# wrappers pay nothing for it.
__tracebackhide__ = True

# Which wrapper a PatchTarget gets: how that kind of call decides it can really block (one factory each, in
# _FACTORIES). Not frames.Kind, whose code a frame is.
WrapperKind = Literal[
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
    "ssl_files",
    "import_module",
]


@dataclass(frozen=True, slots=True)
class PatchTarget:
    """A stdlib callable aiocop wraps, and the audit event the wrapper raises."""

    owner: str  # module, or module:Class for a class attribute
    attr: str
    event: str
    kind: WrapperKind
    label: str = ""  # the name users know it by, when the owner is an implementation detail

    @property
    def name(self) -> str:
        return self.label or f"{self.owner.replace(':', '.')}.{self.attr}"

    @property
    def until(self) -> tuple[int, int] | None:
        """Not patched from this Python version on: CPython raises the event itself (its rule's `native_since`)."""
        return _rules.NATIVE_SINCE.get(self.event)


# SSLContext's methods that read certificate and key files in OpenSSL (ssl.create_default_context() calls
# one); load_dh_params opens its file with CPython's own fopen, which raises the `open` event.
_SSL_LOADERS = ("load_verify_locations", "load_cert_chain", "set_default_verify_paths")
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
    PatchTarget("time", "sleep", "time.sleep", "sleep"),  # native event from 3.13 (its rule's native_since)
    *(PatchTarget("socket:socket", m, f"socket.socket.{m}", "socket") for m in _SOCKET_METHODS),
    PatchTarget("ssl:SSLSocket", "read", "ssl.SSLSocket.read", "socket"),
    PatchTarget("ssl:SSLSocket", "write", "ssl.SSLSocket.write", "socket"),
    # send() writes through the SSL object, not write(); sendall() calls send() per chunk (one report: the outer).
    PatchTarget("ssl:SSLSocket", "send", "ssl.SSLSocket.write", "socket", label="ssl.SSLSocket.send"),
    PatchTarget("ssl:SSLSocket", "sendall", "ssl.SSLSocket.write", "socket", label="ssl.SSLSocket.sendall"),
    PatchTarget("ssl:SSLSocket", "do_handshake", "ssl.SSLSocket.do_handshake", "socket"),
    # On the C base class, where the methods live (and where pickle finds them by their qualified name).
    *(
        PatchTarget("_ssl:_SSLContext", m, f"ssl.SSLContext.{m}", "ssl_files", label=f"ssl.SSLContext.{m}")
        for m in _SSL_LOADERS
    ),
    PatchTarget("ssl", "get_default_verify_paths", "ssl.get_default_verify_paths", "call"),
    # The import statement's event is raised by the C import; importlib's own path raises none.
    PatchTarget("importlib", "import_module", "importlib.import_module", "import_module"),
    PatchTarget("select", "select", "select.select", "select"),
    PatchTarget(f"{__name__}:PollType", "poll", "select.poll", "poll", label="select.poll().poll"),
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


def _no_hook(event: str, args: tuple[Any, ...], loop: object = None) -> None:
    pass


# aiocop's audit hook, called directly by the wrappers rather than through
# sys.audit: the events they raise are aiocop's own business, and other audit
# hooks (a sandbox denying os.*) must see exactly what CPython raises. Handed
# over by the hook (use_audit_hook) when it is installed; until then there is
# no detection for it to do. A direct call adds no frame that sys.audit did not.
# Each wrapper passes the loop its gate found as a third argument (the
# hook's `_loop`): the hook need not look it up again.
_audit_hook: Callable[..., None] = _no_hook


def use_audit_hook(hook: Callable[..., None]) -> None:
    """Make `hook` the function every wrapper calls with its event.

    Called by `hook.install()`, when detection starts: the hook module imports this one (for the globals of
    the wrappers' frames), so this one takes the hook as an argument rather than importing it back.
    """
    global _audit_hook
    _audit_hook = hook


# The wrappers' gate: whether a call may be on an event loop, the hook to judge it. asyncio's C
# function, until the program imports trio (see use_trio).
get_running_loop: Callable[[], object] = _get_running_loop


def use_trio(namespace: Any) -> None:
    """Open the wrappers' gate inside trio tasks too, given trio's run namespace (`trio_runs.run_namespace`).

    Called by the hook as it learns of trio. A program that never imports trio keeps asyncio's C
    function as the gate; one that does pays a Python call per wrapped call off every asyncio loop.
    """
    global get_running_loop
    if namespace is None:
        get_running_loop = _get_running_loop
        return

    def loop_or_trio_task() -> object:
        loop = _get_running_loop()
        return loop if loop is not None else namespace.__dict__.get("task")

    get_running_loop = loop_or_trio_task


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
        loop = get_running_loop()
        if loop is not None:
            # The call's own tuple when the path is all it holds (nearly
            # always): the hook keeps it in its record, no other is made.
            _audit_hook(event, args if len(args) == 1 else (args[0] if args else kwargs.get("path"),), loop)
        return original(*args, **kwargs)

    return wrapper


def _call(original: Callable[..., Any], event: str) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        loop = get_running_loop()
        if loop is not None:
            _audit_hook(event, args, loop)
        return original(*args, **kwargs)

    return wrapper


# The wrappers pass whatever they were given to the original, which alone
# judges it: a call with too few, too many or odd arguments fails exactly as
# it would without aiocop. They read the arguments they need only when the
# call has the usual shape, and never through methods a subclass may override
# (is_set, _qsize, gettimeout): a user's subclass sees no extra call.


def _sleep(original: Callable[..., Any], event: str) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> None:
        if len(args) == 1 and not kwargs and (loop := get_running_loop()) is not None and _may_wait(args[0]):
            _audit_hook(event, args, loop)
        return original(*args, **kwargs)  # type: ignore[no-any-return]

    return wrapper


_socket_gettimeout = _socket_module.socket.gettimeout  # the C method: a subclass's override is not called


def _socket(original: Callable[..., Any], event: str) -> Callable[..., Any]:
    # Non-blocking sockets (timeout 0.0), the event loops' own, are the common
    # case: test that first.
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if (
            isinstance(self, _socket_module.socket)
            and _socket_gettimeout(self) != 0.0
            and (loop := get_running_loop()) is not None
        ):
            _audit_hook(event, (self,), loop)
        return original(self, *args, **kwargs)

    return wrapper


def _fd_blocking(fd: Any) -> bool:
    try:
        return os.get_blocking(fd)
    except (OSError, TypeError, ValueError):
        return False  # the call itself will raise the right error


def _fd_read(original: Callable[..., Any], event: str) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> bytes:
        if len(args) == 2 and not kwargs and (loop := get_running_loop()) is not None and _fd_blocking(args[0]):
            _audit_hook(event, args, loop)
        return original(*args, **kwargs)  # type: ignore[no-any-return]

    return wrapper


def _fd_write(original: Callable[..., Any], event: str) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> int:
        if len(args) == 2 and not kwargs and (loop := get_running_loop()) is not None and _fd_blocking(args[0]):
            try:
                size = len(args[1])
            except TypeError:  # not a buffer: os.write raises its own error below
                size = None
            _audit_hook(event, (args[0], size), loop)
        return original(*args, **kwargs)  # type: ignore[no-any-return]

    return wrapper


def _select(original: Callable[..., Any], event: str) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if len(args) in (3, 4) and not kwargs:
            timeout = args[3] if len(args) == 4 else None
            if _may_wait(timeout) and (loop := get_running_loop()) is not None:
                _audit_hook(event, (timeout,), loop)
        return original(*args, **kwargs)

    return wrapper


def _poll(original: Callable[..., Any], event: str) -> Callable[..., Any]:
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if len(args) <= 1 and not kwargs:
            timeout = args[0] if args else None
            if timeout != 0 and (loop := get_running_loop()) is not None:
                _audit_hook(event, (timeout,), loop)
        return original(self, *args, **kwargs)

    return wrapper


_PLAIN_NUMBERS = (int, float)


def _lock_acquire(original: Callable[..., Any], event: str) -> Callable[..., Any]:
    # Try without blocking first: a free lock is taken at once and never
    # reported; only a lock held elsewhere raises the event before waiting.
    # The original's own parameters (the hottest wrapper: no *args to pack);
    # anything but plain bools and numbers goes to the original as it came.
    def wrapper(self: Any, blocking: Any = True, timeout: Any = -1) -> bool:
        if not blocking or timeout == 0 or (loop := get_running_loop()) is None:
            return original(self, blocking, timeout)  # type: ignore[no-any-return]
        if type(blocking) not in (bool, int) or type(timeout) not in _PLAIN_NUMBERS:
            return original(self, blocking, timeout)  # type: ignore[no-any-return] # its own judgement
        if timeout != -1 and not 0 < timeout <= threading.TIMEOUT_MAX:
            return original(self, blocking, timeout)  # type: ignore[no-any-return] # its own error
        if original(self, False):
            return True
        _audit_hook(event, (timeout,), loop)
        return original(self, True, timeout)  # type: ignore[no-any-return]

    return wrapper


# The C acquire of each lock type, taken before aiocop wraps it: `with lock:`
# tries it without blocking (as the C __enter__ would acquire, never through
# a subclass's acquire) before reporting a wait.
_C_ACQUIRE: dict[type, Callable[..., Any]] = {
    cls: vars(cls)["acquire"] for cls in (_thread.LockType, _thread.RLock) if "acquire" in vars(cls)
}


def _c_acquire(lock: Any) -> Callable[..., Any] | None:
    acquire = _C_ACQUIRE.get(type(lock))
    if acquire is None:  # a subclass: the C type it derives from (None: not a lock, the original says so)
        acquire = next((_C_ACQUIRE[cls] for cls in type(lock).__mro__ if cls in _C_ACQUIRE), None)
    return acquire


def _lock_enter(original: Callable[..., Any], event: str) -> Callable[..., Any]:
    def wrapper(self: Any, *args: Any) -> bool:
        if args or (loop := get_running_loop()) is None:  # `with` gives none (and an empty tuple is free)
            return original(self, *args)  # type: ignore[no-any-return]
        acquire = _c_acquire(self)
        if acquire is None or acquire(self, False):
            return original(self) if acquire is None else True
        _audit_hook(event, (None,), loop)
        return original(self)  # type: ignore[no-any-return]

    return wrapper


def _timeout_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[bool, Any]:
    """(usual shape, timeout) of a `wait(timeout=None)` call."""
    if not kwargs:
        return len(args) <= 1, args[0] if args else None
    return not args and len(kwargs) == 1 and "timeout" in kwargs, kwargs.get("timeout")


def _event_wait(original: Callable[..., Any], event: str) -> Callable[..., Any]:
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> bool:
        usual, timeout = _timeout_of(args, kwargs)
        # The flag Event.is_set reads (a subclass's override is not called); an
        # object with none is no event: the original raises its own error.
        if (
            usual
            and _may_wait(timeout)
            and not getattr(self, "_flag", True)
            and (loop := get_running_loop()) is not None
        ):
            _audit_hook(event, (timeout,), loop)
        return original(self, *args, **kwargs)  # type: ignore[no-any-return]

    return wrapper


def _condition_wait(original: Callable[..., Any], event: str) -> Callable[..., Any]:
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> bool:
        usual, timeout = _timeout_of(args, kwargs)
        if usual and _may_wait(timeout) and (loop := get_running_loop()) is not None:
            _audit_hook(event, (timeout,), loop)
        return original(self, *args, **kwargs)  # type: ignore[no-any-return]

    return wrapper


def _queue_size(q: Any) -> int:
    # Queue's own _qsize (len of its deque): a subclass's override is not
    # called. One that keeps its items elsewhere counts as empty (may wait).
    try:
        return len(q.queue)
    except Exception:
        return 0


def _queue_get(original: Callable[..., Any], event: str) -> Callable[..., Any]:
    def wrapper(self: Any, block: Any = True, timeout: Any = None) -> Any:
        if block and _may_wait(timeout) and not _queue_size(self) and (loop := get_running_loop()) is not None:
            _audit_hook(event, (timeout,), loop)
        return original(self, block, timeout)

    return wrapper


def _queue_put(original: Callable[..., Any], event: str) -> Callable[..., Any]:
    def wrapper(self: Any, item: Any, block: Any = True, timeout: Any = None) -> None:
        if (
            block
            and _may_wait(timeout)
            and 0 < getattr(self, "maxsize", 0) <= _queue_size(self)  # no maxsize: no queue, the original says so
            and (loop := get_running_loop()) is not None
        ):
            _audit_hook(event, (timeout,), loop)
        return original(self, item, block, timeout)  # type: ignore[no-any-return]

    return wrapper


# The parameters of SSLContext's loaders that name a file or folder (a password
# or in-memory `cadata` is never put in an event).
_SSL_FILE_PARAMETERS = ("cafile", "capath", "certfile", "keyfile")


def _ssl_files(original: Callable[..., Any], event: str) -> Callable[..., Any]:
    # OpenSSL reads the files itself: no audit event, no Python-level I/O. The
    # event carries the files named; a load of in-memory `cadata` alone reads
    # no file and is not reported (set_default_verify_paths names none: always).
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if (loop := get_running_loop()) is not None:
            files = tuple(a for a in args[:2] if a is not None)
            if kwargs:
                files += tuple(kwargs[k] for k in _SSL_FILE_PARAMETERS if kwargs.get(k) is not None)
            if files or not (args or kwargs):
                _audit_hook(event, files, loop)
        return original(self, *args, **kwargs)

    return wrapper


def _import_module(original: Callable[..., Any], event: str) -> Callable[..., Any]:
    # As the import statement's event: only for a module not imported yet.
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if args and (loop := get_running_loop()) is not None:
            name = args[0]
            if isinstance(name, str) and name.startswith(".") and not kwargs:
                try:
                    name = importlib.util.resolve_name(name, args[1] if len(args) > 1 else None)
                except (ImportError, ValueError, TypeError, AttributeError):
                    name = None  # the call itself raises the right error
            if isinstance(name, str) and name not in sys.modules and _may_search(name):
                _audit_hook(event, (name,), loop)
        return original(*args, **kwargs)

    return wrapper


_ModuleType = type(sys)


def _may_search(name: str) -> bool:
    """Whether importing `name` (not imported yet) may look for it on disk.

    Not when its parent is an imported module that is no package: the import
    fails at once, before any finder runs (`mock.patch("pkg.mod.Class.attr")`
    tries `pkg.mod.Class` as a module, through `pkgutil.resolve_name`). Only a
    plain module's own `__dict__` is read: no module `__getattr__` runs.
    """
    parent = name.rpartition(".")[0]
    if not parent:
        return True
    module = sys.modules.get(parent)
    return type(module) is not _ModuleType or "__path__" in module.__dict__


_FACTORIES: dict[WrapperKind, Callable[[Callable[..., Any], str], Callable[..., Any]]] = {
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
    "ssl_files": _ssl_files,
    "import_module": _import_module,
}


# The standard library's feature checks (`os.stat in os.supports_follow_symlinks`,
# made by shutil at import and by copystat at each call) must give the same
# answers for a wrapper as for its original.
_FEATURE_SETS = tuple(name for name in dir(os) if name.startswith("supports_"))


def _join_feature_sets(original: Any, wrapper: Any) -> list[set[Any]]:
    joined = []
    for name in _FEATURE_SETS:
        features = getattr(os, name)
        if isinstance(features, set) and original in features and wrapper not in features:
            features.add(wrapper)
            joined.append(features)
    return joined


@dataclass
class _Patch:
    target: PatchTarget
    owner: Any
    original: Any
    own_attr: bool  # the attribute was in the owner's own dict (not inherited)
    wrapper: Any
    feature_sets: list[set[Any]] = field(default_factory=list)  # the os.supports_* sets it joined


_applied: list[_Patch] = []


def _resolve_owner(owner: str) -> Any:
    module_name, _, class_name = owner.partition(":")
    obj: Any = importlib.import_module(module_name)
    return getattr(obj, class_name) if class_name else obj


def patch_audit_functions(exclude: Iterable[str] = ()) -> None:
    """Wrap blocking stdlib functions that raise no audit event of their own.

    Called by `start_blocking_io_detection()`; call it yourself only to
    exclude some targets (names as in `get_patched_functions()`). Calling it
    again with other exclusions re-applies the patches; with the same ones it
    changes nothing and logs a warning, as 1.x did. `stop()` restores every
    original.

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
    if _applied and excluded == _applied_exclusions:
        # As 1.x: the same call again changes nothing (and the patched
        # functions keep their identity); other exclusions re-apply.
        logger.warning("aiocop: patch_audit_functions called more than once with the same exclusions; ignored")
        return
    unpatch_audit_functions()
    _apply(frozenset(excluded))


def _apply(excluded: frozenset[str]) -> None:
    global _applied_exclusions
    _applied_exclusions = excluded
    for target in PATCH_TARGETS:
        if target.name in excluded or (target.until is not None and sys.version_info >= target.until):
            continue
        try:
            owner = _resolve_owner(target.owner)
            if owner is None or not hasattr(owner, target.attr):
                continue  # not on this platform
            original = getattr(owner, target.attr)
            key = (target.owner, target.attr)
            kept = _standin.kept_objects.get(key)
            if kept is not None and original is kept[1]:
                original = kept[0]  # our own stand-in, left there by another tool since: what it stands for
            own_attr = target.attr in vars(owner)
            wrapper = _standin.dress(key, original, _FACTORIES[target.kind](original, target.event), owner)
            _typepatch.set_type_attr(owner, target.attr, wrapper) if isinstance(owner, type) else setattr(
                owner, target.attr, wrapper
            )
        except Exception:
            logger.warning("aiocop: could not wrap %s; it will not be detected", target.name, exc_info=True)
            continue
        feature_sets = _join_feature_sets(original, wrapper) if owner is os else []
        _applied.append(_Patch(target, owner, original, own_attr, wrapper, feature_sets))
    if _applied:
        _reload.install(_after_reload)


def _after_reload(module: types.ModuleType) -> None:
    # importlib.reload() ran a patched module's code again: its functions
    # are the originals again, its classes new ones. Wrap them again, with
    # the same exclusions (the stand-ins kept, so `os.stat` is the object
    # it was before the reload).
    name = getattr(module, "__name__", None)
    if any(p.target.owner.partition(":")[0] == name for p in _applied):
        excluded = _applied_exclusions
        unpatch_audit_functions()
        _apply(excluded)


# The exclusions the patches in force were applied with.
_applied_exclusions: frozenset[str] = frozenset()


def unpatch_audit_functions() -> None:
    """Restore every function `patch_audit_functions` wrapped."""
    _reload.uninstall()
    left: list[str] = []  # replaced by another tool since: not ours to restore
    while _applied:
        patch = _applied.pop()
        _standin.pass_through(patch.wrapper, patch.original)  # wherever the program kept it
        for features in patch.feature_sets:
            features.discard(patch.wrapper)
        owner, attr = patch.owner, patch.target.attr
        now = getattr(owner, attr, None)
        if now is not patch.wrapper:
            if now is not patch.original:  # (the original again: a reload put it back, nothing to do)
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
