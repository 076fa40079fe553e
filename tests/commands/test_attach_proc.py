"""What the OS says a thread of another process waits on (aiocop/_commands/attach/proc.py), read defensively.

`attach` says it when the target's main thread is blocked in C and runs none
of aiocop's code; the end-to-end case is in tests/commands/test_attach.py (3.14+).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import threading
import time

import pytest

from aiocop._commands.attach import proc as _attach_proc
from aiocop._commands.attach.proc import ThreadWait, python_stack, syscall_name, thread_wait

linux = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads Linux's /proc")


@linux
def test_a_thread_waiting_for_a_lock_is_seen_in_futex() -> None:
    lock = threading.Lock()
    lock.acquire()
    tid: list[int] = []

    def wait() -> None:
        tid.append(threading.get_native_id())
        lock.acquire()  # waits until the test releases it

    thread = threading.Thread(target=wait)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while True:  # until the thread is inside the wait (its state says so)
            seen = thread_wait(os.getpid(), tid[0]) if tid else None
            if seen is not None and seen.state == "S" and seen.syscall:
                break
            assert time.monotonic() < deadline, seen
            time.sleep(0.01)
    finally:
        lock.release()
        thread.join()
    if os.uname().machine in ("x86_64", "aarch64"):
        assert seen.syscall == "futex", seen
        assert "in the system call futex, usually a lock, condition or event wait" in seen.describe()
    assert seen.describe().startswith("sleeping (state S)")


@linux
def test_a_process_asleep_in_c_is_seen_in_its_sleep() -> None:
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert sleeper.stdout is not None and sleeper.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 10
        while (seen := thread_wait(sleeper.pid, sleeper.pid)).state != "S":
            assert time.monotonic() < deadline, seen
            time.sleep(0.01)
        if os.uname().machine in ("x86_64", "aarch64") and seen.syscall:  # (syscall needs the right to trace it)
            # time.sleep() waits in select() before 3.11
            assert seen.syscall in ("clock_nanosleep", "nanosleep", "pselect6", "select"), seen
            if seen.syscall.endswith("nanosleep"):  # (a select() with no descriptors is, to the OS, a wait on I/O)
                assert not seen.in_io_wait
        stack = python_stack(sleeper.pid)
        if sys.version_info >= (3, 14):
            assert stack == ["<string>:1 in <module>"], stack
        else:
            assert stack == []  # no reader of another process's Python stack before 3.14
    finally:
        sleeper.kill()
        sleeper.communicate()


def test_a_process_that_is_gone_or_not_python_says_nothing() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert thread_wait(gone.pid, gone.pid) == ThreadWait(gone.pid, "", "", "")
    assert thread_wait(gone.pid, gone.pid).describe() == ""
    assert python_stack(gone.pid) == []
    other = subprocess.Popen(["sleep", "30"])
    try:
        assert python_stack(other.pid) == []  # not Python: its memory holds no interpreter to read
    finally:
        other.kill()
        other.wait()


@pytest.mark.parametrize(
    ("stat", "syscall", "wchan", "expected"),
    [
        ("", "", "", ThreadWait(1, "", "", "")),  # absent, unreadable
        ("1 (a) b) S 0 0", "202 0x1 0x2", "futex_wait_queue", ThreadWait(1, "S", "futex", "futex_wait_queue")),
        ("1 (x) R 0", "running", "0", ThreadWait(1, "R", "", "")),
        ("1 (x) D 0", "-1 0x7ff 0x7ff", "\\x1b[2J", ThreadWait(1, "D", "", "")),  # an escape is no kernel symbol
        ("1 (x) Sleeping 0", "9999999999 0", "x" * 500, ThreadWait(1, "", "", "")),  # nothing a kernel writes
        ("garbage without a paren", "abc", "do_nanosleep", ThreadWait(1, "", "", "do_nanosleep")),
    ],
)
def test_what_proc_says_is_read_defensively(
    monkeypatch: pytest.MonkeyPatch, stat: str, syscall: str, wchan: str, expected: ThreadWait
) -> None:
    files = {"stat": stat, "syscall": syscall, "wchan": wchan}
    monkeypatch.setattr(_attach_proc, "_read", lambda path: files[path.rpartition("/")[2]])
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")  # as proc.py reads it
    assert thread_wait(1, 1) == expected
    assert "\x1b" not in expected.describe()


@linux
def test_a_proc_file_is_read_without_blocking_and_within_a_limit(tmp_path: os.PathLike[str]) -> None:
    fifo = os.path.join(tmp_path, "fifo")
    os.mkfifo(fifo)
    assert _attach_proc._read(fifo) == ""  # nobody writes: read at once, nothing
    big = os.path.join(tmp_path, "big")
    with open(big, "wb") as out:
        out.write(b"\x1b[31m" + b"a" * 100_000)
    text = _attach_proc._read(big)
    assert len(text) <= 4096 + 8 and text.startswith("\\x1b[31m")
    assert _attach_proc._read("/nonexistent/\0") == ""


def test_syscall_numbers_by_machine() -> None:
    assert syscall_name(202, "x86_64") == "futex"
    assert syscall_name(98, "aarch64") == "futex"
    assert syscall_name(232, "x86_64") == "epoll_wait"
    assert syscall_name(5000, "x86_64") == "number 5000"
    assert syscall_name(202, "sparc64") == "number 202"  # a table aiocop does not have: the number
    assert ThreadWait(1, "S", "epoll_wait", "").in_io_wait
