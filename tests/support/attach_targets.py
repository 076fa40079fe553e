"""Programs for tests/commands/test_attach.py to attach to: `python tests/support/attach_targets.py KIND`.

None of them imports aiocop unless its kind says so. Each prints `ready` once
its loop runs; each line marked `# ATTACH-...` is one the report must name.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import tempfile
import time
import types
from typing import Any


async def handler(n: int) -> None:
    os.stat("/")  # ATTACH-STAT
    if n % 5 == 0:
        spin(0.1)  # ATTACH-STALL-CALLER


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:  # ATTACH-STALL
        pass


def _ended(seconds: float | None, began: float, since: list[float]) -> bool:
    # "exits": `seconds` after attach's aiocop arrived (or a minute after the
    # start, if it never does), not after the start: on a starved machine
    # attach itself can take longer than that to start (seen in CI, 3.14).
    if seconds is None:
        return False
    now = time.monotonic()
    if not since and ("aiocop" in sys.modules or now - began > 60):
        since.append(now)
    return bool(since) and now - since[0] >= seconds


async def serve(seconds: float | None) -> None:
    print("awake" if sys.argv[1] == "asleep" else "ready", flush=True)
    began = time.monotonic()
    since: list[float] = []
    n = 0
    tasks = set()
    while not _ended(seconds, began, since):
        n += 1
        task = asyncio.get_running_loop().create_task(handler(n))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        await asyncio.sleep(0.05)


async def hung_in_python() -> None:
    """A request handler stuck in an endless pure-Python loop: the loop's thread reaches safe points."""
    print("ready", flush=True)
    await asyncio.sleep(0)
    n = 0
    while n >= 0:  # ATTACH-HANG-PYTHON
        n += 1


async def blocked_in_c() -> None:
    """A handler waiting for a lock another thread holds for ever: the main thread, in C, runs no Python code."""
    import threading

    lock = threading.Lock()
    lock.acquire()  # held, and never released
    print("ready", flush=True)
    await asyncio.sleep(0)
    lock.acquire()  # ATTACH-BLOCKED-IN-C


async def idle() -> None:
    """A loop with nothing to do, and no timer: its main thread waits in the selector until something comes."""
    print("ready", flush=True)
    await asyncio.Event().wait()  # ATTACH-IDLE


# Terminal escapes a hostile target puts in what it sends back: set the window title, clear the screen, red.
ESCAPES = "\x1b]0;owned\x07\x1b[2J\x1b[31m\u202e"


def hostile(mode: str) -> None:
    """A target whose `aiocop` is a fake that answers an attach as `mode` says (tests/commands/test_attach.py)."""
    package = types.ModuleType("aiocop")
    package.__path__ = []
    agent = types.ModuleType("aiocop._commands.attach.agent")
    if mode != "old-agent":  # an aiocop whose agent does not speak this protocol
        agent.run = lambda settings: answer(settings, mode)  # type: ignore[attr-defined]
    sys.modules["aiocop"] = package
    if mode != "unrelated-aiocop":  # another package named aiocop, without an agent
        commands = types.ModuleType("aiocop._commands")
        commands.__path__ = []
        attach = types.ModuleType("aiocop._commands.attach")
        attach.__path__ = []
        attach.agent = agent  # type: ignore[attr-defined]
        commands.attach = attach  # type: ignore[attr-defined]
        package._commands = commands  # type: ignore[attr-defined]
        sys.modules["aiocop._commands"] = commands
        sys.modules["aiocop._commands.attach"] = attach
        sys.modules["aiocop._commands.attach.agent"] = agent


def answer(settings: dict[str, Any], mode: str) -> None:
    folder, nonce = settings["folder"], settings["nonce"]

    def put(name: str, data: str | bytes) -> None:  # whole, as the real agent writes: the test is of content
        with open(os.path.join(folder, name + ".partial"), "wb") as out:
            out.write(data.encode() if isinstance(data, str) else data)
        os.replace(os.path.join(folder, name + ".partial"), os.path.join(folder, name))

    def signed(document: dict[str, Any]) -> str:
        return json.dumps({**document, "nonce": nonce})

    row = {
        "call_site": "app.py:1:f",
        "event": "os.stat",
        "events": {"os.stat": 1},
        "count": 1,
        "steps": 1,
        "total_ms": 1.0,
        "worst_ms": 1.0,
        "step_shared": False,
        "impact": "low",
        "example_trace": "app.py:1:f",
    }
    report: dict[str, Any] = {
        "pid": os.getpid(),
        "python": "3.14.0",
        "aiocop": "6.6.6",
        "seconds": 1.0,
        "threshold_ms": 30.0,
        "already_running": False,
        "loops": 1,
        "events": 1,
        "dropped_calls": 0,
        "worst_impact": "low",
        "call_sites": [row],
    }
    if mode == "status-escapes":
        put("status.json", signed({"state": "error", "error": f"it failed{ESCAPES}"}))
        return
    if mode == "status-not-an-object":
        put("status.json", "[1, 2]")
        return
    put("status.json", signed({"state": "started", "already_running": False, "threshold_ms": 30.0}))
    text = signed(report)
    elsewhere = os.path.join(tempfile.mkdtemp(prefix=f"aiocop-test-hostile-{os.getpid()}-"), "report.json")
    with open(elsewhere, "w") as out:
        out.write(text)
    if mode == "escapes":
        row["call_site"] = f"app.py:1:{ESCAPES}f"
        row["events"] = {f"os.stat{ESCAPES}": 1}
        report["python"] = f"3.14{ESCAPES}"
        text = signed(report)
    elif mode == "wrong-type":
        row["count"] = "7"
        text = signed(report)
    elif mode == "missing-key":
        del report["events"]
        text = signed(report)
    elif mode == "deep":
        text = "[" * 100_000 + "]" * 100_000
    elif mode == "huge":
        row["example_trace"] = "x" * (17 << 20)
        text = signed(report)
    elif mode == "nan":
        text = signed(report).replace('"seconds": 1.0', '"seconds": NaN')
    elif mode == "infinite":
        text = signed(report).replace('"seconds": 1.0', '"seconds": 1e999')
    elif mode == "no-nonce":
        text = json.dumps(report)
    elif mode == "markup":  # a well-formed report whose every string is markup and terminal escapes
        evil = f"</script><script>alert(1)</script>{ESCAPES}"
        frame = [f"/srv/{evil}.py", 1, evil]
        row["call_site"] = f"app.py:1:{evil}"
        report["hangs"] = [
            {
                "elapsed_ms": 6000.0, "hang_reports": 1, "task": evil, "thread": evil, "loop": evil,
                "culprit": evil, "call_site": evil, "context": {evil: evil}, "blocker": evil,
                "blocker_trace": evil, "stack": [[*frame, evil]], "trace": evil, "ended_after_ms": None,
            }
        ]  # fmt: skip
        call = {"event": evil, "app_site": evil, "entry_point": evil, "source": evil, "trace": evil}
        report["timeline"] = {
            "steps": [
                {
                    "id": 0, "t0": 1.0, "t1": 2.0, "elapsed_ms": 1.0, "reason": evil, "impact": "low", "site": evil,
                    "task": evil, "thread": evil, "loop": evil, "culprit": evil, "context": {evil: evil},
                    "rows": [0], "calls": [{**call, "frames": [frame], "app_frame": 0}],
                    "samples": [{"count": 1, "trace": evil, "app_site": evil, "frames": [frame], "app_frame": 0}],
                    "dropped_calls": 0,
                }
            ],
            "steps_dropped": 0,
            "duration_ms": 1000.0,
        }  # fmt: skip
        text = signed(report)
    elif mode == "bad-hang":
        report["hangs"] = [{"elapsed_ms": "forever"}]
        text = signed(report)
    elif mode == "another-pid":
        report["pid"] = 1
        text = signed(report)
    if mode == "hardlink":  # a file from elsewhere, right even to the nonce: its second link is refused
        os.link(elsewhere, os.path.join(folder, "report.json"))
    elif mode == "symlink":
        os.symlink(elsewhere, os.path.join(folder, "report.json"))
    elif mode == "fifo":
        os.mkfifo(os.path.join(folder, "report.json"))
    else:
        put("report.json", text)
        if mode == "another-owner":
            os.chown(os.path.join(folder, "report.json"), 65534, 65534)
    put("status.json", signed({"state": "done"}))


def _sleep_until_woken(seconds: float) -> None:
    # A long C call with no safe point (signal.sigtimedwait: no handler, no
    # Python code runs until it returns) that a test ends with SIGUSR1 once
    # its attach has given up, however long the attach took to start on a
    # busy machine: a fixed sleep raced it (time.sleep cannot be cut short
    # without a handler that raises, and a pending attach script then runs
    # first and takes the exception).
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    signal.sigtimedwait({signal.SIGUSR1}, seconds)


def main() -> None:
    kind = sys.argv[1]
    if kind == "hostile":
        hostile(sys.argv[2])
    seen: list[object] = []
    sys.modules["__main__"].seen = seen  # type: ignore[attr-defined]
    if kind in ("with-aiocop", "imported-aiocop", "watchdog-only", "interception-only"):
        import aiocop

        if kind == "with-aiocop":  # aiocop running, with its own callback
            aiocop.start_blocking_io_detection()
            aiocop.detect_slow_tasks(threshold_ms=40, on_slow_task=seen.append)
        elif kind == "watchdog-only":  # stalls only, without samples
            aiocop.detect_slow_tasks(threshold_ms=50, on_slow_task=seen.append, cpu_sampling=False)
        elif kind == "interception-only":
            aiocop.start_blocking_io_detection(trace_depth=7)
            aiocop.register_slow_task_callback(seen.append)
    if kind == "asleep":  # the main thread in a long C call before its loop runs: no safe point (until SIGUSR1)
        print("ready", flush=True)
        _sleep_until_woken(float(sys.argv[2]))
    if kind == "hung-in-python":
        asyncio.run(hung_in_python())
    elif kind == "blocked-in-c":
        asyncio.run(blocked_in_c())
    elif kind == "idle":
        asyncio.run(idle())
    else:
        asyncio.run(serve(float(sys.argv[2]) if kind == "exits" else None))


if __name__ == "__main__":
    main()
