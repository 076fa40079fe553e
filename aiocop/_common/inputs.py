"""Files aiocop reads but did not write: `pyproject.toml` tables and baselines, read as untrusted input.

Such a file may be anything its path leads to: a FIFO (whose `open()` waits
for a writer forever), `/dev/zero` (endless), a file of gigabytes, or one
planted by another local user in a shared folder above the project. Each is
opened without blocking, checked to be a regular file, and read up to a
limit.

One rule of trust for every file aiocop reads, found by searching or named
(a flag, `AIOCOP_CONFIG`, `baseline =`), as git's for a repository
(`safe.directory`): the file must belong to you or to root and be writable
by nobody else, and a symbolic link on the way to it (its last component)
must belong to you or to root too. Anything else is refused, with an error
naming the file, why, and the override: `AIOCOP_TRUST`, the paths you trust
anyway (files, or folders for every file under them; `*` for all), separated
as in `PATH`. Never ignored with a warning: a configuration left out
silently changes what a run checks (a CI gate's `fail_on` gone).
"""

from __future__ import annotations

import os
import reprlib
import stat
from typing import TextIO

from aiocop._common.escape import printable

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


TRUST_VAR = "AIOCOP_TRUST"


class UntrustedError(InputError):
    """A file another user could have written or planted: refused. The message says why, and the override."""


def read_file(path: str, limit: int) -> bytes:
    """The bytes of a trusted regular file of at most `limit` bytes (raises OSError, InputError).

    Trust is checked once the file is known to be a regular one (raises
    `UntrustedError`), before its size: another user's file is refused,
    unless `AIOCOP_TRUST` names it.
    """
    if "\0" in path:  # os.open would raise ValueError, not OSError
        raise InputError("a file name cannot hold a NUL character")
    link = os.lstat(path)  # the path's own entry: a link planted in a shared folder, to a file of yours
    fd = os.open(path, _OPEN_FLAGS)
    try:
        status = os.fstat(fd)  # of what was opened: no window for a swap after a check
        if not stat.S_ISREG(status.st_mode):
            kind = next((name for test, name in _KINDS if test(status.st_mode)), "not a regular file")
            raise InputError(f"it is {kind}, not a regular file")
        reason = untrusted(status) or (untrusted(link, link=True) if stat.S_ISLNK(link.st_mode) else None)
        if reason is not None and not trusted_anyway(path):
            raise UntrustedError(
                f"{reason}: a file aiocop reads must be yours or root's and writable by nobody else "
                f"(set {TRUST_VAR}={printable(os.path.abspath(path))} if you trust it)"
            )
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


def untrusted(status: os.stat_result, *, link: bool = False) -> str | None:
    """Why a file must not be read (None: it may); `link`: `status` is a symbolic link's own.

    Another user's file, or one anyone can write, may have been planted to
    steer this run (a `pyproject.toml` in a shared parent such as `/tmp`), or
    changed since its owner wrote it. A link's mode says nothing (always
    0777): only its owner counts.
    """
    if not hasattr(os, "geteuid"):  # Windows: no owners to compare with
        return None
    me = os.geteuid()
    what = "it is a symbolic link that" if link else "it"
    if status.st_uid not in (me, 0):
        return f"{what} belongs to another user (uid {status.st_uid}; you are uid {me})"
    if not link and status.st_mode & stat.S_IWOTH:
        return "anyone can write it"
    return None


def trusted_anyway(path: str) -> bool:
    """Whether `AIOCOP_TRUST` names `path`, a folder above it, or `*` (every file)."""
    value = os.environ.get(TRUST_VAR, "")
    if not value:
        return False
    full = os.path.abspath(path)
    for entry in value.split(os.pathsep):
        if entry == "*":
            return True
        if entry and (full == os.path.abspath(entry) or full.startswith(os.path.join(os.path.abspath(entry), ""))):
            return True
    return False


_repr = reprlib.Repr()
_repr.maxstring = 80
_repr.maxother = 80
_repr.maxlist = _repr.maxdict = _repr.maxtuple = 6
_repr.maxlevel = 3


def shown(value: object) -> str:
    """`repr(value)`, shortened: what a message quotes of a value read from a file (which may be huge)."""
    return _repr.repr(value)
