"""The system-call guard: a detected call asks the kernel for no more than blockbuster's does.

Beside the instruction counts (tests/test_cost_guard.py), what a detected
`os.stat` costs in system calls and thread hand-offs (`futex`), counted by
strace per task (`benchmarks/syscalls.py`): N tasks each making one detected
call on asyncio and on uvloop, aiocop's detection and watchdog on with a
callback that reads each event, against the same tasks with blockbuster on
and with neither. System calls do not move with the machine's load, so the
bound is tight: per task, of every name, no more than the larger of
blockbuster's and the untouched loop's (the call's own), plus SLACK; and as
much for all of them together.

Any CPython (each version's own calls are compared with blockbuster's on that
version: on 3.10 and 3.11 asyncio's look-up of the running loop is a getpid()
system call). Without strace it skips, unless AIOCOP_REQUIRE_STRACE is set, as
in CI (`.ci/run` installs strace).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import scripts

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "syscalls.py"
TASKS = 1000
# Per task: a system call made once per region or per batch of 200 tasks
# counts 0.005; a call made by one task in ten would be 0.1.
SLACK = 0.05


syscalls = scripts.load("benchmarks/syscalls.py")


def test_the_regions_of_the_attempt_kept_are_the_ones_counted() -> None:
    # Two attempts at the regions (a look of the watchdog fell in the first):
    # six markers, five regions between them; the child said the kept
    # attempt began at marker 4.
    lines = ["100 getppid() = 1"]
    for calls in (1, 9, 9, 1, 2):  # attempt 1's N and 2N, the gap, attempt 2's N and 2N
        lines += ["100 newfstatat(AT_FDCWD, ...) = 0"] * calls + ["100 getppid() = 1"]
    regions = syscalls.parse("\n".join([*lines, "100 exit_group(0) = ?"]))
    assert [r["newfstatat"] for r in regions] == [1, 9, 9, 1, 2]
    one, two = syscalls.kept_regions(regions, 4, "aiocop on uvloop")
    assert (one["newfstatat"], two["newfstatat"]) == (1, 2)
    with pytest.raises(SystemExit, match="5 marked regions in the trace, the kept ones from marker 5"):
        syscalls.kept_regions(regions, 5, "aiocop on uvloop")


def test_a_trace_is_split_at_the_markers_and_each_thread_counted_apart() -> None:
    trace = "\n".join(
        [
            "100 getpid()                        = 100",
            "100 getppid()                       = 1",
            "100 newfstatat(AT_FDCWD, ...) = 0",
            "101 futex(0x7f, FUTEX_WAIT_BITSET_PRIVATE, 0, NULL <unfinished ...>",
            "100 futex(0x7f, FUTEX_WAKE_PRIVATE, 1) = 1",
            "101 <... futex resumed>)            = 0",
            "100 getppid()                       = 1",
            "100 newfstatat(AT_FDCWD, ...) = 0",
            "100 newfstatat(AT_FDCWD, ...) = 0",
            "100 getppid()                       = 1",
            "100 exit_group(0)                   = ?",
        ]
    )
    one, two = syscalls.parse(trace)
    assert one == {"newfstatat": 1, "futex": 1, "futex, other threads": 1}
    assert two == {"newfstatat": 2}


def test_a_call_over_blockbuster_s_is_named_with_its_figure() -> None:
    by_mode = {
        "baseline": {"newfstatat": 1.0, "getpid": 0.01},
        "blockbuster": {"getpid": 1.0},
        "aiocop": {"newfstatat": 1.0, "getpid": 2.0, "futex": 0.04},
    }
    assert syscalls.over_blockbuster(by_mode, SLACK) == [
        "getpid: 2.000 per task, over 1.050",
        "all system calls: 3.040 per task, over 2.050",
    ]
    by_mode["aiocop"]["getpid"] = 1.0
    assert syscalls.over_blockbuster(by_mode, SLACK) == []


def _skip_reason() -> str | None:
    if not sys.platform.startswith("linux"):
        return "strace is Linux's"
    if shutil.which("strace") is None:
        if os.environ.get("AIOCOP_REQUIRE_STRACE"):
            pytest.fail("AIOCOP_REQUIRE_STRACE is set, but strace is not installed")
        return "strace is not installed (Debian: apt-get install strace)"
    # A container may forbid ptrace: strace is there and cannot trace.
    probe = subprocess.run(["strace", "-qq", "-o", os.devnull, "true"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        if os.environ.get("AIOCOP_REQUIRE_STRACE"):
            pytest.fail(f"AIOCOP_REQUIRE_STRACE is set, but strace cannot trace here: {probe.stderr.strip()}")
        return f"strace cannot trace here: {probe.stderr.strip()}"
    if importlib.util.find_spec("blockbuster") is None or importlib.util.find_spec("uvloop") is None:
        return "blockbuster and uvloop are the comparison's (pip install -e '.[dev]')"
    return None


@pytest.mark.timeout(300)  # six traced processes of a few seconds each: minutes on a busy machine
def test_a_detected_call_makes_no_more_system_calls_than_blockbuster_s() -> None:
    reason = _skip_reason()
    if reason is not None:
        pytest.skip(reason)
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--json", "--tasks", str(TASKS)],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout)
    assert set(figures) == {"asyncio", "uvloop"}
    over = {loop: syscalls.over_blockbuster(by_mode, SLACK) for loop, by_mode in figures.items()}
    table = syscalls.markdown(figures)
    assert not any(over.values()), f"over blockbuster's system calls: {over}\n{table}"
