"""Classifying code by where it lives, and formatting captured frames.

Classification is by file name and cached per file, because it runs in the
audit hook for every frame of a step stack: one dict look-up per frame.
"""

from __future__ import annotations

import os
import sysconfig
from enum import IntEnum
from typing import TYPE_CHECKING

from aiocop._internals import LOOP_FRAMES, LOOP_PACKAGES, LoopFrameRole

if TYPE_CHECKING:
    from types import CodeType


class Kind(IntEnum):
    USER = 0
    STDLIB = 1
    LOOP = 2
    AIOCOP = 3
    IMPORTLIB = 4


_AIOCOP_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _stdlib_dirs() -> tuple[str, ...]:
    # In a virtual environment "stdlib" is the base interpreter's library,
    # which is where the stdlib's code objects point.
    stdlib = sysconfig.get_paths()["stdlib"]
    return tuple({os.path.join(stdlib, ""), os.path.join(os.path.realpath(stdlib), "")})


_STDLIB_DIRS = _stdlib_dirs()
_THIRD_PARTY_MARKERS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)
_LOOP_MARKERS = tuple(os.sep + pkg + os.sep for pkg in LOOP_PACKAGES)

# filename -> Kind; and for loop files, function name -> role.
_file_kinds: dict[str, Kind] = {}
_loop_roles: dict[str, dict[str, LoopFrameRole]] = {}


def classify(filename: str) -> Kind:
    """Classify a code object's file name (cached)."""
    kind = _file_kinds.get(filename)
    if kind is None:
        kind = _classify(filename)
        _file_kinds[filename] = kind
    return kind


def _classify(filename: str) -> Kind:
    if filename.startswith(_AIOCOP_DIR):
        return Kind.AIOCOP
    if filename.startswith("<frozen importlib"):
        return Kind.IMPORTLIB
    if filename.startswith("<frozen "):
        return Kind.STDLIB
    if any(marker in filename for marker in _LOOP_MARKERS):
        roles = {f.function: f.role for f in LOOP_FRAMES if filename.endswith(os.sep + f.package + os.sep + f.file)}
        if roles:
            _loop_roles[filename] = roles
        return Kind.LOOP
    if filename.startswith(_STDLIB_DIRS) and not any(m in filename for m in _THIRD_PARTY_MARKERS):
        return Kind.STDLIB
    return Kind.USER


def loop_role(code: CodeType) -> LoopFrameRole | None:
    """The step-bounding role of a loop function, if it has one."""
    roles = _loop_roles.get(code.co_filename)
    return None if roles is None else roles.get(code.co_name)


def is_internal(filename: str) -> bool:
    """Whether code in this file is the stdlib, an event loop or aiocop (never "the user's line")."""
    return classify(filename) != Kind.USER


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
