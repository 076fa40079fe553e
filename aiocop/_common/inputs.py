"""Files aiocop reads but did not write: `pyproject.toml` tables and baselines, read as untrusted input.

Such a file may be anything its path leads to: a FIFO (whose `open()` waits
for a writer forever), `/dev/zero` (endless), a file of gigabytes, or one
planted by another local user in a shared folder above the project. Each is
opened without blocking, checked to be a regular file, and read up to a
limit; a file found by searching (not named by the user) must also belong
to the user or to root and be writable by nobody else, as git asks of a
repository (`safe.directory`).
"""

from __future__ import annotations

import os
import reprlib
import stat
from typing import TextIO

_OPEN_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NONBLOCK", 0)  # a FIFO opens at once instead of waiting for a writer
    | getattr(os, "O_NOCTTY", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_BINARY", 0)
)
_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class InputError(ValueError):
    """A file that is not one aiocop reads: not a regular file, or too large. The message says which."""


class UntrustedError(InputError):
    """A file found by searching that another user could have planted: ignored, with a warning."""


def read_file(path: str, limit: int, *, found: bool = False) -> bytes:
    """The bytes of a regular file of at most `limit` bytes (raises OSError, InputError).

    `found`: the file was found by searching, not named by the user: it must
    also be trusted (raises `UntrustedError`, checked first: a planted file is
    ignored whatever it is).
    """
    if "\0" in path:  # os.open would raise ValueError, not OSError
        raise InputError("a file name cannot hold a NUL character")
    fd = os.open(path, _OPEN_FLAGS)
    try:
        status = os.fstat(fd)  # of what was opened: no window for a swap after a check
        reason = untrusted(status) if found else None
        if reason is not None:
            raise UntrustedError(reason)
        if not stat.S_ISREG(status.st_mode):
            kind = next((name for test, name in _KINDS if test(status.st_mode)), "not a regular file")
            raise InputError(f"it is {kind}, not a regular file")
        if status.st_size > limit:
            raise InputError(f"it is {status.st_size} bytes, more than the {limit} aiocop reads")
        chunks: list[bytes] = []
        size = 0
        while size <= limit:  # the size fstat gave may have grown since (or be wrong, as in /proc)
            chunk = os.read(fd, min(65536, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise InputError(f"it is more than the {limit} bytes aiocop reads")
        return b"".join(chunks)
    finally:
        os.close(fd)


def open_for_writing(path: str) -> TextIO:
    """`open(path, "w")`, except that a FIFO nobody reads is an OSError (ENXIO) at once, not a wait for ever."""
    nonblocking = getattr(os, "O_NONBLOCK", 0)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | nonblocking | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        if nonblocking:
            os.set_blocking(fd, True)  # opened: now write as usual (a pipe with a reader may fill up)
        return open(fd, "w", encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise


def untrusted(status: os.stat_result) -> str | None:
    """Why a file found by searching must not be read (None: it may).

    Another user's file, or one anyone can write, may have been planted to
    steer this run (a `pyproject.toml` in a shared parent such as `/tmp`).
    """
    if not hasattr(os, "geteuid"):  # Windows: no owners to compare with
        return None
    me = os.geteuid()
    if status.st_uid not in (me, 0):
        return f"it belongs to another user (uid {status.st_uid}; you are uid {me})"
    if status.st_mode & stat.S_IWOTH:
        return "anyone can write it"
    return None


_repr = reprlib.Repr()
_repr.maxstring = 80
_repr.maxother = 80
_repr.maxlist = _repr.maxdict = _repr.maxtuple = 6
_repr.maxlevel = 3


def shown(value: object) -> str:
    """`repr(value)`, shortened: what a message quotes of a value read from a file (which may be huge)."""
    return _repr.repr(value)
