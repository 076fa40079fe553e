"""What the OS says a thread of another process is doing, for `attach` when the target runs none of its code.

`sys.remote_exec` runs aiocop's script when the target's main thread next
reaches Python code. A main thread blocked in a C call (`time.sleep`, a
lock's `acquire()`, a `recv()` with no timeout) never does: the attach cannot
run, and the one thing left to say is what the thread is waiting on. Linux
says it in `/proc/PID/task/TID/`: `stat` (the state: sleeping, in
uninterruptible I/O, stopped), `syscall` (the system call it is blocked in,
and its arguments) and `wchan` (the kernel function it waits in).

Those files belong to the target: they may be absent (not Linux, a kernel
without them, a process gone), unreadable (`syscall` needs the right to
trace it), "0" or "running", or anything a future kernel writes. Each is
read by descriptor, without blocking, up to a small limit, and only
printable text of it is shown; a file that cannot be read is left out.
The target's Python stack, read from outside (`_remote_debugging`,
CPython 3.14's reader behind `python -m asyncio ps`), is added where it can be
read; its strings are the target's memory and are made printable too.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from typing import Any

from aiocop._common.escape import printable

_MAX_READ = 4096
_MAX_STACK = 30
_STATES = {
    "R": "running",
    "S": "sleeping",
    "D": "in uninterruptible sleep (usually disk or network file system I/O)",
    "T": "stopped (by a signal)",
    "t": "stopped by a debugger",
    "Z": "a zombie",
    "X": "dead",
    "I": "idle",
}
# System call numbers of the waits a blocked thread is found in: x86-64's, and
# the generic table arm64 and RISC-V use. A number not listed is shown as a number.
_SYSCALLS = {
    "x86_64": {
        0: "read", 1: "write", 7: "poll", 17: "pread64", 19: "readv", 23: "select", 34: "pause", 35: "nanosleep",
        42: "connect", 43: "accept", 44: "sendto", 45: "recvfrom", 46: "sendmsg", 47: "recvmsg", 61: "wait4",
        72: "fcntl", 73: "flock", 130: "rt_sigsuspend", 128: "rt_sigtimedwait", 202: "futex",
        230: "clock_nanosleep", 232: "epoll_wait", 247: "waitid", 270: "pselect6", 271: "ppoll",
        281: "epoll_pwait", 288: "accept4", 299: "recvmmsg", 441: "epoll_pwait2", 449: "futex_waitv",
    },
    "generic": {
        22: "epoll_pwait", 25: "fcntl", 32: "flock", 63: "read", 64: "write", 65: "readv", 67: "pread64",
        72: "pselect6", 73: "ppoll", 95: "waitid", 98: "futex", 101: "nanosleep", 115: "clock_nanosleep",
        133: "rt_sigsuspend", 137: "rt_sigtimedwait", 202: "accept", 203: "connect", 206: "sendto",
        207: "recvfrom", 211: "sendmsg", 212: "recvmsg", 242: "accept4", 243: "recvmmsg", 260: "wait4",
        441: "epoll_pwait2", 449: "futex_waitv",
    },
}  # fmt: skip
_GENERIC_MACHINES = ("aarch64", "arm64", "riscv64", "loongarch64")
# What a wait in each system call usually is, in Python's terms.
IO_WAITS = frozenset(("epoll_wait", "epoll_pwait", "epoll_pwait2", "poll", "ppoll", "select", "pselect6"))
_MEANINGS = {
    "futex": "a lock, condition or event wait (threading.Lock.acquire, Event.wait, Thread.join, queue.Queue.get)",
    "futex_waitv": "a lock, condition or event wait",
    "nanosleep": "a sleep (time.sleep)",
    "clock_nanosleep": "a sleep (time.sleep)",
    "read": "reading a socket, pipe, terminal or file (recv, read, input)",
    "readv": "reading a socket, pipe or file",
    "pread64": "reading a file",
    "recvfrom": "reading a socket (socket.recv)",
    "recvmsg": "reading a socket (socket.recv)",
    "recvmmsg": "reading a socket",
    "write": "writing to a socket, pipe or terminal that is full (send, write, print)",
    "sendto": "writing to a socket that is full (socket.send)",
    "sendmsg": "writing to a socket that is full (socket.sendall)",
    "connect": "connecting a socket (socket.connect)",
    "accept": "waiting for a connection (socket.accept)",
    "accept4": "waiting for a connection (socket.accept)",
    "wait4": "waiting for a child process (subprocess, os.waitpid)",
    "waitid": "waiting for a child process (subprocess, os.waitpid)",
    "flock": "a file lock (fcntl.flock)",
    "fcntl": "a file lock (fcntl.lockf), or another fcntl call",
    "pause": "waiting for a signal (signal.pause)",
    "rt_sigsuspend": "waiting for a signal (signal.pause, sigsuspend)",
    "rt_sigtimedwait": "waiting for a signal (signal.sigwait)",
    **dict.fromkeys(IO_WAITS, "waiting for I/O (an event loop's selector with nothing to do, or select/poll)"),
}


@dataclass(frozen=True)
class ThreadWait:
    """What `/proc` says of one thread: each part empty where it could not be read."""

    tid: int
    state: str  # the one-letter state of `stat`, or ""
    syscall: str  # the system call's name (or number), "" if not in one or unreadable
    wchan: str  # the kernel function it waits in, or ""

    @property
    def in_io_wait(self) -> bool:
        """Blocked waiting for I/O readiness: an idle event loop's selector looks like this."""
        return self.syscall in IO_WAITS

    def describe(self) -> str:
        """One sentence: the state, the call, what that call usually is; `""` if nothing could be read."""
        parts = []
        if self.state:
            parts.append(f"{_STATES.get(self.state, 'in an unknown state')} (state {self.state})")
        if self.syscall:
            meaning = _MEANINGS.get(self.syscall)
            parts.append(f"in the system call {self.syscall}" + (f", usually {meaning}" if meaning else ""))
        if self.wchan:
            parts.append(f"waiting in the kernel's {self.wchan}")
        return ", ".join(parts)


def _read(path: str) -> str:
    """The printable text of a small /proc file, or `""` (absent, unreadable, anything else)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except (OSError, ValueError):
        return ""
    try:
        data = os.read(fd, _MAX_READ)
    except OSError:
        return ""
    finally:
        os.close(fd)
    return printable(data.decode("ascii", "replace")).strip()


def syscall_name(number: int, machine: str | None = None) -> str:
    machine = machine or platform.machine()
    table = _SYSCALLS["x86_64"] if machine in ("x86_64", "amd64") else None
    if table is None and machine in _GENERIC_MACHINES:
        table = _SYSCALLS["generic"]
    return (table or {}).get(number, f"number {number}")


def thread_wait(pid: int, tid: int) -> ThreadWait:
    """What the OS says thread `tid` of process `pid` is doing (its main thread: `tid == pid`)."""
    base = f"/proc/{pid}/task/{tid}"
    stat = _read(f"{base}/stat")
    # The state follows the command name, which may hold anything, ")" too: after the last ")".
    fields = stat.rpartition(")")[2].split()
    state = fields[0] if fields and len(fields[0]) == 1 and fields[0].isalpha() else ""
    # "NR arg1 ... sp pc" while blocked in a call; "running", or "-1 sp pc" (not in a call), otherwise.
    words = _read(f"{base}/syscall").split()
    syscall = ""
    if words and words[0].isdigit() and len(words[0]) < 6:
        syscall = syscall_name(int(words[0]))
    wchan = _read(f"{base}/wchan")
    if wchan == "0" or not wchan.replace("_", "").replace(".", "").isalnum() or len(wchan) > 100:
        wchan = ""
    return ThreadWait(tid, state, syscall, wchan)


def python_stack(pid: int) -> list[str]:
    """The main thread's Python stack, innermost first (`file:line in function`), read from outside; [] if not.

    With CPython 3.14's `_remote_debugging` (private: any failure, or an
    answer of another shape, gives []). It reads the target's memory without
    running anything there, so it works while the main thread is blocked.
    """
    try:
        import _remote_debugging  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415 - 3.14+, private
    except ImportError:
        return []
    try:
        found = _remote_debugging.RemoteUnwinder(pid).get_stack_trace()  # the main thread's only
        # 3.15 puts the threads in one InterpreterInfo per interpreter: the main interpreter's main thread.
        threads = list(found[0].threads) if hasattr(found[0], "threads") else list(found)
        main = next((t for t in threads if getattr(t, "thread_id", None) == pid), threads[0])
        return _frames_of(main)
    except Exception:  # another process's memory, through a private API: anything may fail, or change shape
        return []


def _frames_of(thread: Any) -> list[str]:
    # ThreadInfo(thread_id, frame_info=[FrameInfo(filename, lineno or location.lineno, funcname)]),
    # or, as 3.14's docstring describes it, (thread_id, [(function, filename, line)]).
    frames = thread.frame_info if hasattr(thread, "frame_info") else thread[1]
    lines = []
    for frame in list(frames)[:_MAX_STACK]:
        if hasattr(frame, "filename"):
            file, function = frame.filename, frame.funcname
            line = frame.lineno if hasattr(frame, "lineno") else frame.location.lineno
        else:
            function, file, line = frame
        lines.append(printable(f"{file}:{line} in {function}")[:500])
    return lines
