"""Instructions per task, counted by valgrind: a cost figure that load on the machine cannot move.

    python benchmarks/instructions.py [--loop uvloop] [--scenarios stat deep stat2 pure] [--tasks 3000]

Timings on a shared machine move with everything else that runs on it; the
number of instructions the CPU executes for a task does not. Each figure
here runs the same program twice under `valgrind --tool=cachegrind` (no cache
simulation), once with the tasks and once without, and divides the
difference by the number of tasks, so start-up and set-up cancel out. Modes:

- `baseline`: aiocop never imported;
- `inert`: detection started, then `aiocop.deactivate()`: the wrappers and
  the audit hook's first look only;
- `full`: detection on, every event delivered to a counting callback with
  a 5-frame trace (as in the suite's per-task section).

Scenarios: `pure` (`await asyncio.sleep(0)`), `stat` (one `os.stat` per task),
`stat2` (two in one step: the second one's cost is a call's without the
step's), `deep` (one `os.stat` three coroutine frames down), `allowed` (one
`os.stat` matched by an allow rule on the calling module: never reported)
and `harmless` (one `os.stat` made by `linecache` to record a traceback, as a
debug-mode loop does for every callback: a known-harmless internal). For the
last two, `full` minus `baseline` is what an allowed or harmless call costs.

`--floor` adds a column: the same `stat` tasks under `floor_detector.py`, the
least a pure-Python detector can do for a detected call and its delivered
event (a yardstick: it leaves out most of what a detector needs to be right;
see that file). Only the `stat` scenario has a floor.

`--audit-cost` measures instead what one audit event costs, the floor
under every detected call: a `frame.f_code` read and a `sys._getframe()`
call (each raises an audit event; aiocop makes both for every detected
call, on top of the call's own), without aiocop and with its hook
installed.

Instructions are not time: a cache miss or a system call costs far more than
an instruction. But they follow the Python-level work closely, and the
difference of two versions of aiocop shows to the hundred instructions. On
the machine of docs/benchmarks.md, about 8 000 instructions take one µs.
Needs valgrind (`apt-get install valgrind`); the run takes a few minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import traceback

MODES = ("baseline", "inert", "full")
SCENARIOS = ("pure", "stat", "stat2", "deep", "allowed", "harmless")
BATCH = 500


async def _pure() -> None:
    await asyncio.sleep(0)


async def _stat() -> None:
    os.stat(".")
    await asyncio.sleep(0)


async def _stat2() -> None:
    os.stat(".")
    os.stat(".")
    await asyncio.sleep(0)


async def _allowed() -> None:
    os.stat(".")  # matched by an allow rule on this module (modes inert and full)
    await asyncio.sleep(0)


async def _harmless() -> None:
    # linecache stats this file to format the frame: a known-harmless
    # internal (source lines read to record a traceback), as a debug-mode
    # loop does for every callback it schedules.
    traceback.extract_stack(limit=1)
    await asyncio.sleep(0)


async def _deep() -> None:
    await _deep1()


async def _deep1() -> None:
    await _deep2()


async def _deep2() -> None:
    os.stat(".")
    await asyncio.sleep(0)


BODIES = {
    "pure": _pure,
    "stat": _stat,
    "stat2": _stat2,
    "deep": _deep,
    "allowed": _allowed,
    "harmless": _harmless,
}
# Scenarios whose calls are never reported: no event is delivered.
SILENT = frozenset({"pure", "allowed", "harmless"})


def child(mode: str, scenario: str, loop_name: str, tasks: int) -> None:
    delivered = [0]
    if mode == "floor":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import floor_detector

        floor_detector.install()
        floor_detector.callbacks.append(lambda event: delivered.__setitem__(0, delivered[0] + 1))
    elif mode != "baseline":
        import aiocop

        aiocop.start_blocking_io_detection(trace_depth=5)
        aiocop.register_slow_task_callback(lambda event: delivered.__setitem__(0, delivered[0] + 1))
        if scenario == "allowed":
            aiocop.add_allow_rule("os.stat", module=__name__)
        if mode == "inert":
            aiocop.deactivate()
    body = BODIES[scenario]

    async def run(count: int) -> None:
        for _ in range(0, count, BATCH):
            await asyncio.gather(*(body() for _ in range(BATCH)))
        await asyncio.sleep(0)  # the last batch's delivery

    if loop_name == "asyncio":
        loop = asyncio.new_event_loop()
    else:
        import importlib

        loop = importlib.import_module(loop_name).new_event_loop()
    loop.run_until_complete(run(2 * BATCH))  # warm-up: caches, lazy imports, specialisation
    delivered[0] = 0
    loop.run_until_complete(run(tasks))
    loop.close()
    expected = tasks if mode in ("full", "floor") and scenario not in SILENT else 0
    if delivered[0] != expected:
        sys.exit(f"{mode}/{scenario}: {delivered[0]} events delivered, expected {expected}")


def audit_child(mode: str, what: str, count: int) -> None:
    if mode != "baseline":
        import aiocop

        aiocop.start_blocking_io_detection()
    frame = sys._getframe()
    getframe = sys._getframe
    if what == "f_code":
        for _ in range(count):
            frame.f_code  # noqa: B018 - the read is the point
    else:
        for _ in range(count):
            getframe()


def _instructions(mode: str, scenario: str, loop_name: str, tasks: int) -> int:
    command = [
        "valgrind",
        "--tool=cachegrind",
        "--cache-sim=no",
        "--cachegrind-out-file=/dev/null",
        sys.executable,
        __file__,
        "--child",
        mode,
        scenario,
        loop_name,
        str(tasks),
    ]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    out = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        sys.exit(f"valgrind run failed ({' '.join(command)}):\n{out.stderr[-2000:]}")
    match = re.search(r"I\s+refs:\s+([\d,]+)", out.stderr)
    if match is None:
        sys.exit(f"no instruction count in valgrind's output:\n{out.stderr[-2000:]}")
    return int(match.group(1).replace(",", ""))


def per_task(mode: str, scenario: str, loop_name: str, tasks: int) -> float:
    """Instructions per task: (run with `tasks` tasks - run with none) / tasks."""
    return (_instructions(mode, scenario, loop_name, tasks) - _instructions(mode, scenario, loop_name, 0)) / tasks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loop", default="uvloop")
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--floor", action="store_true", help="add the floor_detector.py column (stat only)")
    parser.add_argument("--audit-cost", action="store_true", help="the cost of one audit event instead")
    parser.add_argument("--child", nargs=4, metavar=("MODE", "SCENARIO", "LOOP", "TASKS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, scenario, loop_name, tasks = args.child
        if loop_name == "-":
            audit_child(mode, scenario, int(tasks))
        else:
            child(mode, scenario, loop_name, int(tasks))
        return
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (apt-get install valgrind)")
    if args.tasks < BATCH or args.tasks % BATCH:
        sys.exit(f"--tasks must be a positive multiple of {BATCH}")
    if args.audit_cost:
        print(f"instructions per audited operation, Python {sys.version.split()[0]} (valgrind)")
        for what in ("f_code", "getframe"):
            base, hooked = (per_task(mode, what, "-", 100_000) for mode in ("baseline", "inert"))
            label = "frame.f_code" if what == "f_code" else "sys._getframe()"
            extra = hooked - base
            print(f"{label:16} without aiocop {base:6.0f}, with its hook installed {hooked:6.0f} ({extra:+.0f})")
        return
    print(f"instructions per task on {args.loop}, Python {sys.version.split()[0]} ({args.tasks} tasks, valgrind)")
    columns = (*MODES, "floor") if args.floor else MODES
    print(f"{'scenario':9} {'baseline':>10}" + "".join(f" {mode:>16}" for mode in columns[1:]))
    for scenario in args.scenarios:
        modes = columns if scenario == "stat" else MODES
        counts = {mode: per_task(mode, scenario, args.loop, args.tasks) for mode in modes}
        base = counts["baseline"]
        cells = [f"{base:10.0f}"] + [f"{counts[m]:9.0f} {f'({counts[m] - base:+.0f})':>9}" for m in modes[1:]]
        print(f"{scenario:9} " + " ".join(cells))


if __name__ == "__main__":
    main()
