"""Classifying frames by the module they run in, and formatting captured frames.

Classification runs in the audit hook for every frame of a step's stack, so
it is keyed by the frame's module name (read from `frame.f_globals`) and
cached. It deliberately avoids `frame.f_code`: reading it raises an
`object.__getattr__` audit event, which costs a full round through every
audit hook of the process.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from enum import IntEnum
from typing import TYPE_CHECKING, Any

from aiocop._interception.internals import IMPORT_SYSTEM_MODULES, LOOP_FRAMES, LOOP_PACKAGES, LoopFrameRole

if TYPE_CHECKING:
    from types import FrameType


class Kind(IntEnum):
    """Whose code a frame runs (`frame_kind`): the user's, the stdlib's, a loop's, aiocop's, the import system's.

    Not wrappers.WrapperKind, which wrapper a patched call gets.
    """

    USER = 0
    STDLIB = 1
    LOOP = 2
    AIOCOP = 3
    IMPORTLIB = 4


def _stdlib_dirs() -> tuple[str, ...]:
    # In a virtual environment "stdlib" is the base interpreter's library,
    # which is where the stdlib's modules live.
    stdlib = sysconfig.get_paths()["stdlib"]
    return tuple({os.path.join(stdlib, ""), os.path.join(os.path.realpath(stdlib), "")})


_STDLIB_DIRS = _stdlib_dirs()
_STDLIB_NAMES: frozenset[str] = frozenset(getattr(sys, "stdlib_module_names", ()))
_THIRD_PARTY_MARKERS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)
_LOOP_TOP_LEVEL = frozenset(LOOP_PACKAGES)

# How far up a thread's stack a walk looking for a step (its edge, its task's frame, its loop's
# dispatch) goes before giving up: the audit hook's from a blocking call (`hook`), the watchdog's
# from a sample (`_stalls.stacks`) and its discovery of loops (`_stalls.discovery`), so that all
# see the same steps.
MAX_WALK = 256

# module name -> its Kind as a plain int; and, for the few loop modules that
# bound steps, function name -> role. Plain ints, not the enum's members: the
# hook's walks compare and test each frame's kind, and the interpreter's fast
# paths for that take exact ints only (an IntEnum member goes through the
# generic rich comparison and truth test, about 100 instructions each; equal
# values, so every comparison decides as before). Bounded: templating engines
# and exec() make modules without end, and a cache that grew with each would
# be a leak; when full it starts again (a miss costs a few µs, once per module).
MAX_CACHED_MODULES = 4096
_module_kinds: dict[object, int] = {}
LOOP_ROLES: dict[str, dict[str, LoopFrameRole]] = {}
for _frame in LOOP_FRAMES:
    LOOP_ROLES.setdefault(_frame.module, {})[_frame.function] = _frame.role


def is_step_edge(frame: FrameType, module: object) -> bool:
    """Whether a frame of an event loop written in Python bounds steps (dispatches or runs them)."""
    roles = LOOP_ROLES.get(module) if isinstance(module, str) else None
    return roles is not None and frame.f_code.co_name in roles


# module name -> whether a module of the user's kind is the application's own
# (not a third-party package's, installed under site-packages): where a
# report says which line of the application led to a call a library made.
_app_modules: dict[object, bool] = {}


def is_app(frame: FrameType) -> bool:
    """Whether a frame of the user's kind is the application's own code, not an installed library's (cached)."""
    module_globals = frame.f_globals
    name = module_globals.get("__name__")
    app = _app_modules.get(name)
    if app is None:
        file = module_globals.get("__file__")
        app = not isinstance(file, str) or is_app_file(file)
        if len(_app_modules) >= MAX_CACHED_MODULES:
            _app_modules.clear()
        _app_modules[name] = app
    return app


# Path prefixes the configuration says are the application's own code (even
# installed under site-packages) or not (vendored code), absolute.
_app_paths: tuple[str, ...] = ()
_library_paths: tuple[str, ...] = ()


def set_app_paths(app: tuple[str, ...], library: tuple[str, ...]) -> None:
    """Say which path prefixes are the application's own code and which are not (`app_paths`, `library_paths`)."""
    global _app_paths, _library_paths
    _app_paths, _library_paths = tuple(app), tuple(library)
    _app_modules.clear()


def is_app_file(filename: str) -> bool:
    """Whether code from this file (not the stdlib's or a loop's) is the application's own.

    The longest configured prefix that matches decides; without one, code
    under site-packages is a library's and anything else the application's.
    """
    if _app_paths or _library_paths:
        app = max((len(p) for p in _app_paths if filename.startswith(p)), default=-1)
        library = max((len(p) for p in _library_paths if filename.startswith(p)), default=-1)
        if app != library:
            return app > library
    return not is_library_file(filename)


def frame_kind(frame: FrameType) -> int:
    """Classify a frame by its module (cached per module name): a `Kind`'s value."""
    module_globals = frame.f_globals
    name = module_globals.get("__name__")
    if type(name) is not str:
        # exec()/eval() with bare globals, or a `__name__` that is not a plain
        # string: unhashable (a list) it would raise here, and a str subclass
        # could run the application's code in a dict lookup.
        return Kind.USER
    kind = _module_kinds.get(name)
    if kind is None:
        kind = int(_classify(name, module_globals))
        if len(_module_kinds) >= MAX_CACHED_MODULES:
            _module_kinds.clear()
        _module_kinds[name] = kind
    return kind


def _classify(name: object, module_globals: dict[str, Any]) -> Kind:
    if not isinstance(name, str):
        return Kind.USER  # exec()/eval() with bare globals
    top = name.partition(".")[0]
    if top == "aiocop":
        return Kind.AIOCOP
    if name in IMPORT_SYSTEM_MODULES:
        return Kind.IMPORTLIB
    if top in _LOOP_TOP_LEVEL:
        return Kind.LOOP
    file = module_globals.get("__file__")
    if isinstance(file, str) and not file.startswith("<"):
        if file.startswith(_STDLIB_DIRS) and not any(m in file for m in _THIRD_PARTY_MARKERS):
            return Kind.STDLIB
        return Kind.USER
    return Kind.STDLIB if top in _STDLIB_NAMES else Kind.USER


_file_internal: dict[str, bool] = {}


def is_library_file(filename: str) -> bool:
    """Whether a file belongs to an installed third-party package (under site-packages)."""
    return any(marker in filename for marker in _THIRD_PARTY_MARKERS)


def is_internal_file(filename: str) -> bool:
    """Whether code from this file is the stdlib, an event loop or aiocop (cached)."""
    internal = _file_internal.get(filename)
    if internal is None:
        internal = (
            filename.startswith(("<frozen ", _AIOCOP_DIR))
            or any(os.sep + pkg + os.sep in filename for pkg in LOOP_PACKAGES)
            or (filename.startswith(_STDLIB_DIRS) and not any(m in filename for m in _THIRD_PARTY_MARKERS))
        )
        _file_internal[filename] = internal
    return internal


# The package's folder: this module is one level down (aiocop/_interception/).
_AIOCOP_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


_CWD = os.getcwd() + os.sep


def short_path(filename: str) -> str:
    """A readable path: relative to site-packages, the stdlib or the working directory."""
    for marker in _THIRD_PARTY_MARKERS:
        if marker in filename:
            return filename.split(marker, 1)[1]
    for prefix in _STDLIB_DIRS:
        if filename.startswith(prefix):
            return filename[len(prefix) :]
    if filename.startswith(_CWD):
        return filename[len(_CWD) :]
    return filename


def format_frame(frame: tuple[str, int, str]) -> str:
    """Format a `(filename, lineno, function)` frame as `path:line:function`."""
    filename, lineno, function = frame
    return f"{short_path(filename)}:{lineno}:{function}"
