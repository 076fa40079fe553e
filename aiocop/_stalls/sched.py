"""What Linux tells of the watchdog thread's own scheduling: why a look came late.

A look that comes long after the watchdog asked for the GIL was kept out by
one of three things: its thread waited for a CPU (a busy machine), the
process was stopped (SIGSTOP, a debugger), or another thread held the GIL.
Only the last says anything about a loop's step (`timing.held_from`). The
thread's `/proc/thread-self/schedstat` tells them apart: the time it ran, the
time it waited for a CPU, and how many times it was given one. While it
waits for the GIL it wakes every switch interval to ask again (CPython's
`take_gil`), and a stopped process does not wake at all.

Read with os.pread on a file opened once (no audit event, no allocation
beyond the bytes read). Off Linux, or where the file cannot be read, nothing
is told (`Own.since` gives None) and the caller decides without it.

A loop thread's files tell, at a stall's samples, whether a thread whose CPU
clock stood still was waiting (for I/O, a lock, the GIL) or only kept off
the CPUs by a busy machine (`queued`, and `runnable` where it was kept off
through the whole gap): a pure-Python spin starved by other processes is
still working.

May import: aiocop._common.
"""

from __future__ import annotations

import contextlib
import os
import sys

_PATH = "/proc/thread-self/schedstat"


class Own:
    """The watchdog thread's schedstat, read at the end of a look and at the start of the next.

    Made on the thread it describes (the file is that of the thread that
    opens it).
    """

    __slots__ = ("_base", "_fd")

    def __init__(self) -> None:
        self._fd = -1
        # A thread's counts start at zero: made first thing on the watchdog's
        # new thread, this measures its first look from the thread's start
        # (which a loop's first step, holding the GIL, may have kept waiting).
        self._base: tuple[float, float, int] | None = (0.0, 0.0, 0)
        if sys.platform != "linux":
            return
        try:
            self._fd = os.open(_PATH, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            self._fd = -1

    def _read(self) -> tuple[float, float, int] | None:
        if self._fd < 0:
            return None
        try:
            ran, waited, slices = os.pread(self._fd, 128, 0).split()[:3]
            return int(ran) / 1e9, int(waited) / 1e9, int(slices)
        except (OSError, ValueError):
            self.close()
            return None

    def mark(self) -> None:
        """The look ends: what the next one is told is measured from here."""
        self._base = self._read()

    def since(self) -> tuple[float, int] | None:
        """Since `mark`: seconds this thread ran or waited for a CPU, and how many times it was given one.

        None: not told (off Linux, the file unreadable, or no mark yet).
        """
        base, now = self._base, self._read()
        if base is None or now is None:
            return None
        return (now[0] - base[0]) + (now[1] - base[1]), now[2] - base[2]

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)


def _task_file(native_id: int, name: str, size: int) -> bytes | None:
    # The start of /proc/self/task/<native_id>/<name> (None: off Linux, the
    # thread gone, the file unreadable). Opened for each read: called at a
    # stall's samples only, not at every look.
    if sys.platform != "linux":
        return None
    try:
        fd = os.open(f"/proc/self/task/{native_id}/{name}", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        return os.pread(fd, size, 0)
    except OSError:
        return None
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)


def queued(native_id: int) -> tuple[float, int] | None:
    """Seconds thread `native_id` has spent runnable but waiting for a CPU, and the times it was given one.

    Both since the thread began. None: not told (off Linux, the thread gone,
    the file unreadable).
    """
    text = _task_file(native_id, "schedstat", 128)
    if text is None:
        return None
    try:
        _ran, waited, slices = text.split()[:3]
        return int(waited) / 1e9, int(slices)
    except ValueError:  # (also too few fields to unpack)
        return None


def runnable(native_id: int) -> bool | None:
    """Whether thread `native_id` of this process is runnable now (running, or waiting for a CPU).

    None: not told (off Linux, the thread gone, the file unreadable). Its
    state is the field after the command's name in brackets, which may hold
    any character: read from the last closing bracket. Called at a stall's
    samples only, where its CPU clock stood still.
    """
    text = _task_file(native_id, "stat", 512)
    if text is None:
        return None
    close = text.rfind(b")")
    state = text[close + 1 :].split()[:1] if close >= 0 else []
    return state == [b"R"] if state else None
