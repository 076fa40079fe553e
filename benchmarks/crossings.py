"""How often one event's path crosses aiocop's parts: a measure of the wiring, not of speed.

    python benchmarks/crossings.py [--case stat|stall|both] [--loop asyncio|uvloop]

aiocop's private code is a few parts (`aiocop._interception`, `aiocop._stalls`,
`aiocop._reporting`, ...; tests/test_layers.py lists them). Following one event
from where aiocop first sees it to the user's callback, each time the code
running moves from one part to another is a crossing, calls and returns alike;
a crossing into a part the path has already been in is a return. Fewer of both
make a path easier to follow. Two paths, each from a process of its own:

- `stat`: one `os.stat` in a task, from the wrapper's first line to the call
  of the callback registered with `register_slow_task_callback` (the loop's
  thread: where both happen);
- `stall`: one step that spins past the threshold, on each thread, inside
  each call into `aiocop._reporting` from another part (the watchdog hands
  the stall over there; the loop's thread hands over the step as it ends),
  from the step's start to the callback, the caller's part counted as the
  call goes in and as it returns. The looks that find the stall are left out:
  they repeat at the watchdog's pace, so their count says how long the stall
  was, not how it is wired.

Python functions only (`sys.setprofile`'s call and return events); code outside
aiocop (the standard library, the callback) changes nothing. It uses only the
public API, so it runs on any commit since the parts were made (issue 27), for
a before and after of a change in the wiring.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from types import FrameType

# Subpackages of aiocop and private modules at its top are parts; every public module is one part, "public".
_PUBLIC = "aiocop (public)"


def part_of(module: object) -> str | None:
    """The part a module belongs to, None outside aiocop."""
    if not isinstance(module, str) or not (module == "aiocop" or module.startswith("aiocop.")):
        return None
    pieces = module.split(".")
    if len(pieces) > 1 and pieces[1].startswith("_") and pieces[1] != "__main__":
        return f"aiocop.{pieces[1]}"
    return _PUBLIC


class PathRecorder:
    """The parts each thread's aiocop code runs in, in order, from a start to a stop; repeats collapsed.

    With a `root` part, a thread records only inside calls into that part from outside it (from the caller's
    part, in, to the caller's part, out): the stall's hand-over to its report, without the watchdog's looks
    around it.
    """

    def __init__(self, root: str | None = None, *, functions: bool = False) -> None:
        self.recording = False
        self.root = root
        self.functions = functions
        self.where: dict[int, list[str]] = {}
        self.parts: dict[int, list[str]] = {}
        self._depth: dict[int, int] = {}

    def start(self) -> None:
        self.recording = True

    def stop(self) -> None:
        self.recording = False

    def _add(self, thread: int, frame: FrameType | None) -> None:
        if frame is None:
            return
        part = part_of(frame.f_globals.get("__name__"))
        if part is None:
            return
        path = self.parts.setdefault(thread, [])
        if not path or path[-1] != part:
            path.append(part)
            if self.functions:
                code = frame.f_code
                self.where.setdefault(thread, []).append(f"{code.co_filename.rsplit('aiocop/', 1)[-1]}:{code.co_name}")

    def profile(self, frame: FrameType, event: str, arg: object) -> None:
        if not self.recording or event not in ("call", "return"):
            return
        thread = threading.get_ident()
        if self.root is None:
            # After a call the callee runs; after a return, its caller.
            self._add(thread, frame if event == "call" else frame.f_back)
            return
        depth = self._depth.get(thread, 0)
        if event == "call":
            if depth == 0 and part_of(frame.f_globals.get("__name__")) == self.root:
                self._add(thread, frame.f_back)
                depth = 1
            elif depth:
                depth += 1
            else:
                return
            self._add(thread, frame)
        elif depth:
            depth -= 1
            self._add(thread, frame.f_back)
        self._depth[thread] = depth


def count(path: list[str]) -> dict[str, Any]:
    seen: set[str] = set()
    returns = 0
    for part in path:
        if part in seen:
            returns += 1
        seen.add(part)
    return {"crossings": max(len(path) - 1, 0), "returns": returns, "path": path}


def _run_case(case: str, loop_name: str, functions: bool) -> dict[str, Any]:
    import aiocop

    recorder = PathRecorder(root="aiocop._reporting" if case == "stall" else None, functions=functions)
    delivered = threading.Event()

    def on_event(event: object) -> None:
        # Only the event of the path measured: a stall of the set-up (a machine that starves the process)
        # comes before the recording starts.
        if recorder.recording:
            recorder.stop()
            delivered.set()

    if loop_name == "uvloop":
        import uvloop

        loop = uvloop.new_event_loop()
    else:
        loop = asyncio.new_event_loop()

    if case == "stat":
        aiocop.start_blocking_io_detection(trace_depth=5)
        aiocop.register_slow_task_callback(on_event)

        async def task() -> None:
            threading.setprofile(recorder.profile)
            sys.setprofile(recorder.profile)
            recorder.start()
            os.stat(".")
            await asyncio.sleep(0)
            sys.setprofile(None)

    else:
        aiocop.detect_slow_tasks(threshold_ms=30, on_slow_task=on_event)
        # Every thread started from now on records too: the watchdog's and the delivery's.
        threading.setprofile(recorder.profile)

        async def task() -> None:
            sys.setprofile(recorder.profile)
            await asyncio.sleep(0.3)  # the watchdog's start-up looks are over
            armed = time.monotonic() + 0.15
            recorder.start()
            while time.monotonic() < armed:
                pass
            await asyncio.sleep(0.2)
            sys.setprofile(None)

    async def main() -> None:
        await asyncio.get_running_loop().create_task(task())
        await asyncio.get_running_loop().run_in_executor(None, delivered.wait, 10)

    try:
        loop.run_until_complete(main())
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
        loop.close()
        aiocop.stop()
    if not delivered.is_set():
        raise SystemExit(f"{case}: the callback was never called")
    threads = [dict(count(path), where=recorder.where.get(ident, [])) for ident, path in recorder.parts.items() if path]
    return {"case": case, "loop": loop_name, "threads": threads}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=("stat", "stall", "both"), default="both")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument("--json", action="store_true", help="one JSON line per case")
    parser.add_argument("--functions", action="store_true", help="name the function each crossing enters")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_run_case(args.case, args.loop, args.functions)))
        return
    for case in ("stat", "stall") if args.case == "both" else (args.case,):
        command = [sys.executable, __file__, "--child", "--case", case, "--loop", args.loop]
        command += ["--functions"] if args.functions else []
        output = subprocess.run(command, check=True, capture_output=True, text=True, timeout=120).stdout
        result = json.loads(output.strip().splitlines()[-1])
        if args.json:
            print(json.dumps(result))
            continue
        for number, thread in enumerate(result["threads"], 1):
            print(
                f"{case} ({args.loop}), thread {number}: {thread['crossings']} crossings, {thread['returns']} returns"
            )
            print("    " + " -> ".join(thread["where"] or [part.removeprefix("aiocop.") for part in thread["path"]]))


if __name__ == "__main__":
    main()
