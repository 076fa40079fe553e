"""Instructions per task, counted by valgrind: a cost figure that load on the machine cannot move.

    python benchmarks/instructions.py [--loop uvloop] [--scenarios stat deep stat2 pure] [--tasks 3000]
    python benchmarks/instructions.py --loop trio --scenarios pure stat stat2 [--watchdog]
    python benchmarks/instructions.py --table | --markdown | --docs | --json [--with-blockbuster]

`--table` measures the cost table of issue 26 (each call kind on asyncio
and uvloop, allowed and harmless calls, an `allow_blocking` scope entered
per task, `AiocopInstrumentor` on, a task that never blocks; detection and
the watchdog on) and checks it against `benchmarks/budgets.toml`: non-zero
exit, naming each scenario over its budget with its figure. `--markdown`
adds blockbuster's column and prints the table of docs/benchmarks.md;
`--docs` writes it there; `--json` prints the figures (what
tests/test_cost_guard.py, the CI cost guard, reads); `--from-json FILE`
renders an earlier `--json` run's figures instead of measuring. CPython 3.12
only: instruction counts differ between versions.

Timings on a shared machine move with everything else that runs on it; the
number of instructions the CPU executes for a task does not. Each figure
here runs the same program twice under `valgrind --tool=cachegrind` (no cache
simulation), once with the tasks and once without, and divides the
difference by the number of tasks, so start-up and set-up cancel out. Modes:

- `baseline`: aiocop never imported;
- `inert`: detection started, then `aiocop.deactivate()`: the wrappers and
  the audit hook's first look only;
- `full`: detection on, every event delivered to a counting callback with
  a 5-frame trace (as in the suite's per-task section);
- `watchdog` (with `--watchdog`): `full` with the stall watchdog on too, as
  `--table` runs it (a threshold no step reaches, looks far apart): what the
  watchdog asks of each step on the loop's thread.

`--loop trio` runs `pure`, `stat` and `stat2` as trio tasks (a checkpoint for
`asyncio.sleep(0)`, 500 at a time in a nursery).

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

`--profile SCENARIO` shows where one scenario's instructions go, per
Python function (callgrind with `python -X perf`; see `profile`).

`--audit-cost` measures instead what one audit event costs, the floor
under every detected call: a `frame.f_code` read and a `sys._getframe()`
call (each raises an audit event; aiocop makes both for every detected
call, on top of the call's own), without aiocop and with its hook
installed; what a free `threading.Lock` taken with `with` on a loop's
thread costs once aiocop wraps the lock type (aiocop's own locks included);
the same `f_code` read under the cheapest audit hook there is (a C
function, `{}.get`): what any hook costs, however written; and a scope made,
entered and left per task, the least a context-variable scope can be
(value set, token reset) against `aiocop.allow_blocking("os.stat")`.

Instructions are not time: a cache miss or a system call costs far more than
an instruction. But they follow the Python-level work closely, and the
difference of two versions of aiocop shows to the hundred instructions. On
the machine of docs/benchmarks.md, about 8 000 instructions take one µs.
Needs valgrind (`apt-get install valgrind`); the run takes a few minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import traceback
from typing import TYPE_CHECKING, Any, NamedTuple

# benchmarks/quiet_watchdog.py, beside this file: run as a script, its directory is first on sys.path; the tests
# load it with tests/support/scripts.py, which puts that directory last.
import quiet_watchdog

if TYPE_CHECKING:
    from collections.abc import Callable

MODES = ("baseline", "inert", "full")
SCENARIOS = ("pure", "stat", "stat2", "deep", "allowed", "harmless")
BATCH = 500


async def _pure() -> None:
    await asyncio.sleep(0)


async def _stat() -> None:
    try:  # noqa: SIM105 - contextlib.suppress would add its own cost to each task measured
        os.stat(".")
    except CAUGHT:
        pass
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


async def _getcwd() -> None:
    try:  # noqa: SIM105 - contextlib.suppress would add its own cost to each task measured
        os.getcwd()
    except CAUGHT:
        pass
    await asyncio.sleep(0)


async def _file_read() -> None:
    try:
        with open(__file__, encoding="utf-8") as f:
            f.read(100)
    except CAUGHT:
        pass
    await asyncio.sleep(0)


async def _handler() -> None:
    # The suite's "realistic handler" (children/pertask_child.py) with its
    # 1 ms sleeps made sleep(0): a timer's wake-ups would follow the clock,
    # and valgrind's slowdown would move them. Two light blocking calls in
    # one step: one event with two calls. Each call is caught on its own so
    # that blockbuster, which raises at the first, still sees the second.
    await asyncio.sleep(0)
    try:  # noqa: SIM105 - contextlib.suppress would add its own cost to each task measured
        os.path.exists(".")
    except CAUGHT:
        pass
    try:  # noqa: SIM105 - contextlib.suppress would add its own cost to each task measured
        os.getcwd()
    except CAUGHT:
        pass
    await asyncio.sleep(0)


async def _allow_scope() -> None:
    # The scope entered per task, as a handler that allows one call would.
    with SCOPE("os.stat"):
        os.stat(".")
    await asyncio.sleep(0)


# What a blockbuster run catches (its BlockingError, raised at the call);
# nothing elsewhere (`except ():` catches nothing and costs nothing).
CAUGHT: type[BaseException] | tuple[type[BaseException], ...] = ()
SCOPE: Any = None  # aiocop.allow_blocking, set by the table's child when aiocop is on


BODIES = {
    "pure": _pure,
    "stat": _stat,
    "stat2": _stat2,
    "deep": _deep,
    "allowed": _allowed,
    "harmless": _harmless,
    "getcwd": _getcwd,
    "file_read": _file_read,
    "handler": _handler,
    "allow_scope": _allow_scope,
}
# Scenarios whose calls are never reported: no event is delivered.
SILENT = frozenset({"pure", "allowed", "harmless"})


# `--loop trio`: the same tasks on trio's run loop (issue 41), a checkpoint where asyncio's sleep(0).
async def _trio_pure() -> None:
    await TRIO_CHECKPOINT()


async def _trio_stat() -> None:
    os.stat(".")
    await TRIO_CHECKPOINT()


async def _trio_stat2() -> None:
    os.stat(".")
    os.stat(".")
    await TRIO_CHECKPOINT()


TRIO_CHECKPOINT: Any = None  # trio.lowlevel.checkpoint, set by a trio child
TRIO_BODIES = {"pure": _trio_pure, "stat": _trio_stat, "stat2": _trio_stat2}


def _trio_runner(scenario: str) -> Callable[[int], None]:
    # Runs `count` tasks of the scenario, BATCH at a time in a nursery, in one trio.run each time.
    global TRIO_CHECKPOINT
    import trio

    TRIO_CHECKPOINT = trio.lowlevel.checkpoint
    body = TRIO_BODIES.get(scenario)
    if body is None:
        sys.exit(f"--loop trio measures {', '.join(TRIO_BODIES)}, not {scenario}")

    async def run(count: int) -> None:
        for _ in range(0, count, BATCH):
            async with trio.open_nursery() as nursery:
                for _ in range(BATCH):
                    nursery.start_soon(body)

    return lambda count: trio.run(run, count)


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
        if mode == "watchdog":
            aiocop.detect_slow_tasks(threshold_ms=WATCHDOG_THRESHOLD_MS)
            quiet_watchdog.watch_slowly()
    body = BODIES[scenario]

    async def run(count: int) -> None:
        for _ in range(0, count, BATCH):
            await asyncio.gather(*(body() for _ in range(BATCH)))
        await asyncio.sleep(0)  # the last batch's delivery

    if loop_name == "trio":
        run_trio = _trio_runner(scenario)
        run_trio(2 * BATCH)  # warm-up, as below
        delivered[0] = 0
        run_trio(tasks)
    else:
        if loop_name == "asyncio":
            loop = asyncio.new_event_loop()
        else:
            import importlib

            loop = importlib.import_module(loop_name).new_event_loop()
        loop.run_until_complete(run(2 * BATCH))  # warm-up: caches, lazy imports, specialisation
        delivered[0] = 0
        loop.run_until_complete(run(tasks))
        loop.close()
    expected = tasks if mode in ("full", "watchdog", "floor") and scenario not in SILENT else 0
    if delivered[0] != expected:
        sys.exit(f"{mode}/{scenario}: {delivered[0]} events delivered, expected {expected}")


class _MinimalScope:
    # The least a context-variable scope can be: its value set on enter, reset
    # from its token on exit (no check, no cache, not shareable between tasks).
    __slots__ = ("token", "value")

    def __init__(self, value: object) -> None:
        self.value = value

    def __enter__(self) -> None:
        self.token = _SCOPE_VAR.set(self.value)

    def __exit__(self, *exc_info: object) -> None:
        _SCOPE_VAR.reset(self.token)


_SCOPE_VAR: Any = None  # a ContextVar, made by audit_child


def _scopes(what: str, count: int, entering: bool) -> None:
    # A scope made and entered per task, in a context of its own as a task's:
    # `entering` false counts the loop alone (the figure is the difference).
    import contextvars

    global _SCOPE_VAR
    _SCOPE_VAR = contextvars.ContextVar("scope", default=())

    def run() -> None:
        if not entering:
            for _ in range(count):
                pass
        elif what == "scope_min":
            for _ in range(count):
                with _MinimalScope(("os.stat",)):
                    pass
        else:
            import aiocop

            allow = aiocop.allow_blocking
            for _ in range(count):
                with allow("os.stat"):
                    pass

    contextvars.copy_context().run(run)


def audit_child(mode: str, what: str, count: int) -> None:
    if what in ("scope_min", "scope_aiocop"):
        if what == "scope_aiocop":
            import aiocop

            aiocop.start_blocking_io_detection()
        _scopes(what, count, entering=mode != "baseline")
        return
    if what == "f_code_c_hook":
        if mode != "baseline":
            # The least any audit hook can cost: a C function that looks the
            # event up and returns (aiocop's hook is a Python function).
            sys.addaudithook({}.get)  # type: ignore[arg-type]  # dict.get(event, args): overloaded, takes both
        what = "f_code"
    elif mode != "baseline":
        import aiocop

        aiocop.start_blocking_io_detection()
    frame = sys._getframe()
    getframe = sys._getframe
    if what == "lock":
        # `with lock:` on a loop's thread, as aiocop's own code takes its
        # locks while delivering: wrapped, it goes through aiocop's Python
        # wrapper of `_thread.lock.__enter__` (issue 26).
        lock = threading.Lock()

        async def take() -> None:
            for _ in range(count):
                with lock:
                    pass

        asyncio.run(take())
        return
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


# --- The cost table: the scenarios of issue 26, their budgets and targets ---------------------------------------------
#
# Each figure is the loop thread's instructions per task with aiocop (or
# blockbuster) on, minus the same in a process that never imported either.
# One valgrind process per mode and loop runs every scenario of that loop:
# callgrind dumps its counters at each marker (`os.getppid()`, which nothing
# else here calls), and a scenario's figure is (its 2N-task region - its
# N-task region) / N, so start-up, warm-up and each region's fixed cost
# cancel. Only the loop thread counts (`--separate-threads`): the watchdog
# polls from its own thread at a rate set by the clock, which valgrind's
# slowdown moves (benchmarks/watchdog_busy_cost.py measures that thread).


class Row(NamedTuple):
    key: str  # the budgets file's name for it
    label: str
    scenario: str
    loop: str
    mode: str  # "aiocop" (detection + watchdog, as users run them) or "otel" (and AiocopInstrumentor)


TABLE_MODES = ("baseline", "aiocop", "otel", "blockbuster", "floor")
TABLE = (
    Row("stat-uvloop", "`os.stat`", "stat", "uvloop", "aiocop"),
    Row("stat-asyncio", "`os.stat`", "stat", "asyncio", "aiocop"),
    Row("getcwd-uvloop", "`os.getcwd`", "getcwd", "uvloop", "aiocop"),
    Row("getcwd-asyncio", "`os.getcwd`", "getcwd", "asyncio", "aiocop"),
    Row("file_read-uvloop", "file read (`open` + `read`)", "file_read", "uvloop", "aiocop"),
    Row("file_read-asyncio", "file read (`open` + `read`)", "file_read", "asyncio", "aiocop"),
    Row("handler-uvloop", "handler (two light blocking calls)", "handler", "uvloop", "aiocop"),
    Row("handler-asyncio", "handler (two light blocking calls)", "handler", "asyncio", "aiocop"),
    Row("pure-uvloop", "a task that never blocks", "pure", "uvloop", "aiocop"),
    Row("pure-asyncio", "a task that never blocks", "pure", "asyncio", "aiocop"),
    Row("allowed-uvloop", "`os.stat` allowed by a global rule", "allowed", "uvloop", "aiocop"),
    Row(
        "allow_scope-uvloop",
        '`os.stat` in `with aiocop.allow_blocking("os.stat")` entered per task',
        "allow_scope",
        "uvloop",
        "aiocop",
    ),
    Row(
        "harmless-uvloop",
        "a known-harmless call (linecache's `os.stat` under `traceback`)",
        "harmless",
        "uvloop",
        "aiocop",
    ),
    Row("otel-stat-uvloop", "`os.stat` with `AiocopInstrumentor` on", "stat", "uvloop", "otel"),
)
# Scenarios blockbuster can be compared on: a call it detects (and raises for).
BLOCKBUSTER_SCENARIOS = ("stat", "getcwd", "file_read", "handler", "pure")
# The watchdog's threshold in the table's runs: far above any step, even at
# valgrind's speed (50-100 times slower), so that no stall is ever reported;
# the loop thread's work per step does not depend on it.
WATCHDOG_THRESHOLD_MS = 60_000
TABLE_TASKS = 400
TABLE_BATCH = 200
BUDGETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "budgets.toml")
DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "benchmarks.md")
DOCS_START = "<!-- instructions: written by `instructions.py --docs`, do not edit by hand -->"
DOCS_END = "<!-- end of instructions -->"


def _set_up_aiocop1(loop: asyncio.AbstractEventLoop, counted: list[int]) -> None:
    # aiocop 1.2.1 from PyPI (its directory first on PYTHONPATH, see
    # --with-aiocop1), set up as its README says; detect_slow_tasks() patches
    # the loop it is called in.
    import aiocop

    if not aiocop.__version__.startswith("1."):
        sys.exit(f"mode aiocop1 imported aiocop {aiocop.__version__} from {aiocop.__file__}, not 1.x")
    aiocop.patch_audit_functions()
    aiocop.start_blocking_io_detection(trace_depth=5)

    async def set_up() -> None:
        aiocop.detect_slow_tasks(
            threshold_ms=WATCHDOG_THRESHOLD_MS,
            on_slow_task=lambda event: counted.__setitem__(0, counted[0] + 1),
            cpu_sampling=False,
        )
        aiocop.activate()

    loop.run_until_complete(set_up())


def _check_delivered(mode: str, loop_name: str, scenario: str, delivered: int, calls: int, ours: bool) -> None:
    if mode == "aiocop1":
        # 1.x reports what it sees; the table leaves out a scenario it missed events of.
        print(f"delivered {scenario} {delivered} of {calls if scenario not in SILENT else 0}")
        return
    expected = calls if ours and scenario not in SILENT | {"allow_scope"} else 0
    if delivered != expected:
        sys.exit(f"{mode}/{scenario} on {loop_name}: {delivered} events delivered, expected {expected}")


def _set_up_table_mode(mode: str, counted: list[int]) -> Any:
    """Switch on what `mode` measures in a table child; aiocop's module when it is aiocop's mode, else None."""
    global CAUGHT, SCOPE
    aiocop: Any = None
    if mode == "blockbuster":
        from blockbuster import BlockBuster, BlockingError

        CAUGHT = BlockingError
        BlockBuster().activate()  # no scanned modules: every blocking call in a loop raises
    elif mode in ("aiocop", "otel"):
        import aiocop

        aiocop.start_blocking_io_detection(trace_depth=5)
        aiocop.register_slow_task_callback(lambda event: counted.__setitem__(0, counted[0] + 1))
        aiocop.detect_slow_tasks(threshold_ms=WATCHDOG_THRESHOLD_MS)
        quiet_watchdog.watch_slowly()
        SCOPE = aiocop.allow_blocking
        if mode == "otel":
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.metrics.export import InMemoryMetricReader

            from aiocop.opentelemetry import AiocopInstrumentor

            # Its loop-delay probe ticks on the loop every probe_interval_ms
            # of the clock: as many ticks in a region as its length in
            # seconds, which valgrind and the load set (+2 % on a loaded
            # machine). A per-second cost, like the watchdog's looks: its
            # probe is kept, with its work at each event, but ticks no
            # more inside the regions.
            AiocopInstrumentor().instrument(
                meter_provider=MeterProvider(metric_readers=[InMemoryMetricReader()]),
                probe_interval_ms=quiet_watchdog.LOOK_S * 1000.0,
            )
    elif mode == "floor":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import floor_detector

        floor_detector.install()
        floor_detector.callbacks.append(lambda event: counted.__setitem__(0, counted[0] + 1))
    elif mode not in ("baseline", "aiocop1"):
        sys.exit(f"unknown mode {mode!r}")
    return aiocop


def table_child(mode: str, loop_name: str, tasks: int, scenarios: list[str]) -> None:
    counted = [0]
    aiocop = _set_up_table_mode(mode, counted)

    async def run(body: Any, count: int) -> None:
        for _ in range(0, count, TABLE_BATCH):
            await asyncio.gather(*(body() for _ in range(TABLE_BATCH)))
        await asyncio.sleep(0)  # the last batch's delivery

    markers = quiet_watchdog.Markers()

    async def scenario_run(scenario: str, body: Any) -> None:
        # One run of the loop per scenario: a loop's start can wake the
        # watchdog, whose look must fall outside the regions.
        await run(body, 2 * TABLE_BATCH)  # warm-up: caches, lazy imports, specialisation

        async def regions() -> None:
            markers.mark()  # callgrind dumps at each marker
            await run(body, tasks)
            markers.mark()
            await run(body, 2 * tasks)
            markers.mark()

        await quiet_watchdog.counted(
            scenario,
            f"{mode}/{scenario} on {loop_name}",
            aiocop is not None,
            markers,
            regions,
            lambda: counted.__setitem__(0, 0),
        )

    loop = asyncio.new_event_loop() if loop_name == "asyncio" else __import__(loop_name).new_event_loop()
    if mode == "aiocop1":
        _set_up_aiocop1(loop, counted)
    if os.environ.get(_CUE):
        # Under callgrind started with its instrumentation off (`_regions`):
        # the start-up ran at native speed, uncounted; it goes on once on.
        print(_READY, flush=True)
        sys.stdin.readline()
    for scenario in scenarios:
        body = BODIES[scenario]
        if aiocop is None and scenario in ("allowed", "allow_scope"):
            body = _stat  # the same call, with no aiocop to allow it
        rule = aiocop.add_allow_rule("os.stat", module=__name__) if aiocop and scenario == "allowed" else None
        loop.run_until_complete(scenario_run(scenario, body))
        if rule is not None:
            aiocop.remove_allow_rule(rule)
        _check_delivered(mode, loop_name, scenario, counted[0], 3 * tasks, aiocop is not None or mode == "floor")
    loop.close()


# The table child's cue that its start-up is done, and the variable that asks for it.
_CUE = "AIOCOP_BENCH_INSTRUMENT_ON_CUE"
_READY = "ready to be counted"


def _run_counted(command: list[str], env: dict[str, str], cwd: str) -> subprocess.CompletedProcess[str]:
    """Run the table child under callgrind, its instrumentation switched on once the child has started.

    Python's start-up and the imports (aiocop, uvloop, OpenTelemetry) were
    about half of each valgrind process's CPU under instrumentation, which
    no figure uses: the child runs them at native speed, says it is ready,
    and waits while `callgrind_control` switches the instrumentation on.
    With the same hash seed the counts are the same to within tens of
    instructions in hundreds of millions.
    """
    with subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd
    ) as child:
        assert child.stdout is not None
        cue = child.stdout.readline()
        if cue.strip() == _READY:
            switched = subprocess.run(
                ["callgrind_control", "--instr=on", str(child.pid)],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            if switched.returncode != 0 or "OK" not in switched.stdout:
                child.kill()
                child.communicate()
                sys.exit(f"callgrind_control could not switch instrumentation on: {switched.stdout}{switched.stderr}")
        stdout, stderr = child.communicate(input="\n", timeout=1200)
    return subprocess.CompletedProcess(command, child.returncode, cue + stdout, stderr)


def _regions(mode: str, loop_name: str, scenarios: list[str], tasks: int, path: str | None = None) -> dict[str, float]:
    """Instructions per task of each scenario, loop thread only, in one valgrind process.

    `path`: a directory put first on PYTHONPATH (mode aiocop1: where aiocop 1.2.1 is installed). A
    scenario whose events 1.x did not all deliver is left out of the result.
    """
    with tempfile.TemporaryDirectory() as out:
        command = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            "--dump-before=getppid",
            "--separate-threads=yes",
            f"--callgrind-out-file={out}/cg",
            sys.executable,
            __file__,
            "--table-child",
            mode,
            loop_name,
            str(tasks),
            *scenarios,
        ]
        env = {**os.environ, "PYTHONHASHSEED": "0", _CUE: "1"}
        if path is not None:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (path, env.get("PYTHONPATH")) if p)
        done = _run_counted(command, env, out)
        if done.returncode != 0:
            sys.exit(f"valgrind run failed ({' '.join(command)}):\n{done.stderr[-3000:]}")
        parts: dict[int, int] = {}
        for name in os.listdir(out):
            match = re.fullmatch(r"cg\.(\d+)-01", name)  # dump number, thread 1 (the loop's, the main thread)
            if match is None:
                continue
            with open(os.path.join(out, name), encoding="utf-8") as f:
                totals = re.search(r"^totals:\s+(\d+)", f.read(), re.MULTILINE)
            if totals is None:
                sys.exit(f"no totals in callgrind's {name}")
            parts[int(match.group(1))] = int(totals.group(1))
    firsts = quiet_watchdog.kept(done.stdout, scenarios)
    if sorted(parts) != list(range(1, len(parts) + 1)) or any(first + 2 not in parts for first in firsts.values()):
        sys.exit(f"callgrind dumps {sorted(parts)} do not hold the kept regions (first markers {firsts})")
    if not all(parts.values()):
        sys.exit(f"callgrind counted nothing in some regions (was its instrumentation switched on?): {parts}")
    missed = set()
    for line in done.stdout.splitlines():  # mode aiocop1: what 1.x delivered
        match = re.fullmatch(r"delivered (\w+) (\d+) of (\d+)", line)
        if match is not None and match.group(2) != match.group(3):
            missed.add(match.group(1))
    # Dump k is made at marker k: what ran since marker k - 1. The kept
    # attempt's N tasks ran between its first marker and the next, its 2N
    # between those next two.
    return {s: (parts[firsts[s] + 2] - parts[firsts[s] + 1]) / tasks for s in scenarios if s not in missed}


def profile(
    mode: str, loop_name: str, scenario: str, tasks: int = TABLE_TASKS, top: int = 25
) -> list[tuple[float, str]]:
    """Where a scenario's instructions go, per Python function: inclusive instructions per task.

    The table's program for one scenario, under callgrind with `python -X
    perf`: CPython then enters each Python function through a trampoline of
    its own, listed in /tmp/perf-PID.map, whose inclusive count callgrind
    reports. With the trampolines, Python-to-Python calls are no longer
    inlined by the interpreter: counts run about a third higher than the
    table's, and compare with each other, not with it.
    """
    if shutil.which("callgrind_annotate") is None:
        sys.exit("callgrind_annotate is not installed (it comes with valgrind)")
    with tempfile.TemporaryDirectory() as out:
        command = [
            "valgrind",
            "--tool=callgrind",
            "--dump-before=getppid",
            "--separate-threads=yes",
            f"--callgrind-out-file={out}/cg",
            sys.executable,
            "-X",
            "perf",
            __file__,
            "--table-child",
            mode,
            loop_name,
            str(tasks),
            scenario,
        ]
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=False, cwd=out)
        if done.returncode != 0:
            sys.exit(f"valgrind run failed ({' '.join(command)}):\n{done.stderr[-3000:]}")
        pid = re.search(r"==(\d+)==", done.stderr)
        perf_map = f"/tmp/perf-{pid.group(1)}.map" if pid else ""
        if not os.path.exists(perf_map):
            sys.exit(f"no perf map {perf_map!r}: this Python has no perf trampolines (CPython 3.12+ on Linux)")
        names: dict[int, str] = {}
        with open(perf_map, encoding="utf-8") as f:
            for line in f:
                address, _, name = line.rstrip("\n").split(" ", 2)
                names[int(address, 16)] = name.removeprefix("py::")
        os.remove(perf_map)

        def inclusive(dump: str) -> dict[str, int]:
            annotated = subprocess.run(
                ["callgrind_annotate", "--inclusive=yes", "--threshold=100", os.path.join(out, dump)],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            counts: dict[str, int] = {}
            for match in re.finditer(r"^\s*([\d,]+) \([^)]*\)\s+\?\?\?:0x([0-9a-f]+) ", annotated, re.MULTILINE):
                name = names.get(int(match.group(2), 16))
                if name is not None:
                    counts[name] = counts.get(name, 0) + int(match.group(1).replace(",", ""))
            return counts

        # The 2N-task region minus the N-task one, as the table's figures.
        first = quiet_watchdog.kept(done.stdout, [scenario])[scenario]
        small, large = inclusive(f"cg.{first + 1}-01"), inclusive(f"cg.{first + 2}-01")
    rows = sorted(((large.get(k, 0) - small.get(k, 0)) / tasks, k) for k in set(small) | set(large))
    return sorted(rows, reverse=True)[:top]


def print_profile(mode: str, loop_name: str, scenario: str) -> None:
    print(f"{scenario} on {loop_name}, mode {mode}: inclusive instructions per task, per Python function (-X perf)")
    for count, name in profile(mode, loop_name, scenario):
        print(f"{count:10.0f}  {name}")


def table(
    loops: tuple[str, ...], blockbuster: bool, tasks: int = TABLE_TASKS, aiocop1: str | None = None
) -> dict[str, dict[str, float]]:
    """Per row key: `aiocop` (extra instructions per task) and, where compared, `blockbuster`, `aiocop1`, `floor`.

    `aiocop1`: a directory holding aiocop 1.2.1 (`pip install --no-deps --target DIR aiocop==1.2.1`);
    its column has the call kinds 1.x reported every event of. The valgrind processes run side by
    side, one per core: each counts its own loop thread's instructions, which sharing the machine
    does not change.
    """
    rows = [row for row in TABLE if row.loop in loops]
    figures: dict[str, dict[str, float]] = {row.key: {} for row in rows}
    jobs: dict[tuple[str, str], tuple[list[str], str | None]] = {}
    for loop_name in loops:
        mine = [row for row in rows if row.loop == loop_name]
        scenarios = sorted({row.scenario for row in mine}, key=list(BODIES).index)
        jobs["baseline", loop_name] = (scenarios, None)
        for mode in ("aiocop", "otel"):
            wanted = sorted({row.scenario for row in mine if row.mode == mode}, key=list(BODIES).index)
            if wanted:
                jobs[mode, loop_name] = (wanted, None)
        compared = [s for s in scenarios if s in BLOCKBUSTER_SCENARIOS]
        if blockbuster:
            jobs["blockbuster", loop_name] = (compared, None)
        if aiocop1 is not None:
            jobs["aiocop1", loop_name] = (compared, aiocop1)
        if loop_name == "uvloop" and "stat" in scenarios:
            # The yardstick (floor_detector.py) beside aiocop's `os.stat`: the
            # cost guard checks it costs something and less than aiocop.
            jobs["floor", loop_name] = (["stat"], None)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
        running = {
            job: pool.submit(_regions, job[0], job[1], wanted, tasks, path) for job, (wanted, path) in jobs.items()
        }
        counts = {job: future.result() for job, future in running.items()}
    column = {mode: mode for mode in ("blockbuster", "aiocop1", "floor")} | {"aiocop": "aiocop", "otel": "aiocop"}
    for (mode, loop_name), measured in counts.items():
        if mode == "baseline":
            continue
        base = counts["baseline", loop_name]
        for row in rows:
            if row.loop != loop_name or row.scenario not in measured:
                continue
            # aiocop's own rows by their mode; the others' columns beside the plain aiocop rows.
            if (mode in ("aiocop", "otel") and row.mode == mode) or (
                mode not in ("aiocop", "otel") and row.mode == "aiocop"
            ):
                figures[row.key][column[mode]] = measured[row.scenario] - base[row.scenario]
    return figures


def load_budgets(path: str = BUDGETS) -> dict[str, dict[str, float]]:
    """The budgets file: row key -> {"budget", "target", ...}, checked."""
    import tomllib

    with open(path, "rb") as f:
        data = tomllib.load(f)
    rows = data.get("scenario")
    if not isinstance(rows, dict):
        sys.exit(f"{path}: no [scenario.<name>] tables")
    known = {row.key for row in TABLE}
    for key, row in rows.items():
        if key not in known:
            sys.exit(f"{path}: unknown scenario {key!r}; known: {', '.join(sorted(known))}")
        for field in ("budget", "target"):
            if not isinstance(row.get(field), int | float) or row[field] < 0:
                sys.exit(f"{path}: scenario {key!r} needs a non-negative number {field} =, got {row.get(field)!r}")
        if not isinstance(row.get("measured"), int | float):
            sys.exit(f"{path}: scenario {key!r} needs measured = (the figure its budget was set from)")
    missing = known - set(rows)
    if missing:
        sys.exit(f"{path}: no budget for {', '.join(sorted(missing))}")
    return rows


def _k(value: float | None) -> str:
    if value is None:
        return "—"
    return "0.0 k" if abs(value) < 50 else f"{value / 1000:+.1f} k"


def markdown(figures: dict[str, dict[str, float]], budgets: dict[str, dict[str, float]]) -> str:
    lines = [
        "| scenario | loop | aiocop now | budget (CI fails above) | target | blockbuster 1.5 | aiocop 1.2.1 |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in TABLE:
        if row.key not in figures:
            continue
        got, budget = figures[row.key], budgets[row.key]
        now = got.get("aiocop")
        mark = f"**{_k(now)}**" if now is not None and now > budget["target"] else _k(now)
        target = "—" if not budget["target"] else f"≤ {budget['target'] / 1000:.1f} k"
        lines.append(
            f"| {row.label} | {row.loop} | {mark} | {budget['budget'] / 1000:.1f} k | {target} "
            f"| {_k(got.get('blockbuster'))} | {_k(got.get('aiocop1'))} |"
        )
    return "\n".join(lines)


def write_docs(text: str, path: str = DOCS) -> None:
    with open(path, encoding="utf-8") as f:
        page = f.read()
    if DOCS_START not in page or DOCS_END not in page:
        sys.exit(f"{path}: the markers {DOCS_START!r} and {DOCS_END!r} are missing")
    before, _, rest = page.partition(DOCS_START)
    after = rest.partition(DOCS_END)[2]
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"{before}{DOCS_START}\n\n{text}\n\n{DOCS_END}{after}")


def run_table(args: argparse.Namespace) -> None:
    if sys.implementation.name != "cpython" or sys.version_info[:2] != (3, 12):
        sys.exit("the budgets are CPython 3.12's instruction counts: run the table on CPython 3.12")
    budgets = load_budgets()
    loops = tuple(args.table_loops)
    if args.from_json:
        with open(args.from_json, encoding="utf-8") as f:
            figures = json.load(f)  # a --json run's, with blockbuster's column if it was measured
    else:
        figures = table(
            loops,
            blockbuster=args.markdown or args.docs or args.with_blockbuster,
            tasks=args.tasks_table,
            aiocop1=args.with_aiocop1,
        )
    if args.json:
        print(json.dumps(figures, indent=1, sort_keys=True))
        return
    text = markdown(figures, budgets)
    print(text)
    if args.docs:
        write_docs(text)
    over = over_budget(figures, budgets)
    if over:
        sys.exit("over budget:\n" + "\n".join(over))


def over_budget(figures: dict[str, dict[str, float]], budgets: dict[str, dict[str, float]]) -> list[str]:
    """Each scenario whose figure is over its budget, with the figure: what the cost guard fails on."""
    return [
        f"{key}: {fig['aiocop']:+.0f} instructions per task, over its budget of {budgets[key]['budget']:.0f}"
        f" (target {budgets[key]['target']:.0f})"
        for key, fig in figures.items()
        if fig["aiocop"] > budgets[key]["budget"]
    ]


def audit_cost() -> None:
    """Print what one audited operation costs (`--audit-cost`)."""
    print(f"instructions per audited operation, Python {sys.version.split()[0]} (valgrind)")
    for what in ("f_code", "getframe", "lock"):
        base, hooked = (per_task(mode, what, "-", 100_000) for mode in ("baseline", "inert"))
        label = {"f_code": "frame.f_code", "getframe": "sys._getframe()", "lock": "with lock: (loop)"}[what]
        extra = hooked - base
        print(f"{label:16} without aiocop {base:6.0f}, with its hook installed {hooked:6.0f} ({extra:+.0f})")
    base, hooked = (per_task(mode, "f_code_c_hook", "-", 100_000) for mode in ("baseline", "inert"))
    print(f"{'frame.f_code':16} with the cheapest hook there is (C, {{}}.get): {hooked - base:+.0f}")
    for what, label in (("scope_min", "a minimal ContextVar scope"), ("scope_aiocop", "aiocop.allow_blocking")):
        base, entered = (per_task(mode, what, "-", 20_000) for mode in ("baseline", "inert"))
        print(f"{label} made, entered and left: {entered - base:+.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loop", default="uvloop")
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--floor", action="store_true", help="add the floor_detector.py column (stat only)")
    parser.add_argument(
        "--watchdog",
        action="store_true",
        help="add a column: full, with the stall watchdog on (its looks an hour apart)",
    )
    parser.add_argument(
        "--profile",
        metavar="SCENARIO",
        choices=list(BODIES),
        help="where one scenario's instructions go, per Python function (--loop; --profile-mode aiocop|otel|baseline)",
    )
    parser.add_argument("--profile-mode", default="aiocop", choices=("aiocop", "otel", "baseline"))
    parser.add_argument("--audit-cost", action="store_true", help="the cost of one audit event instead")
    parser.add_argument("--table", action="store_true", help="the cost table of issue 26 against budgets.toml")
    parser.add_argument("--markdown", action="store_true", help="the table in Markdown, with blockbuster's column")
    parser.add_argument("--docs", action="store_true", help="--markdown, and write it into docs/benchmarks.md")
    parser.add_argument("--json", action="store_true", help="the table's figures as JSON (for the cost guard)")
    parser.add_argument("--from-json", metavar="FILE", help="render the figures of an earlier --json run instead")
    parser.add_argument("--with-blockbuster", action="store_true", help="--json: measure blockbuster's column too")
    parser.add_argument(
        "--with-aiocop1",
        metavar="DIR",
        help="add aiocop 1.2.1's column, from DIR (pip install --no-deps --target DIR aiocop==1.2.1)",
    )
    parser.add_argument("--table-loops", nargs="+", choices=("uvloop", "asyncio"), default=["uvloop", "asyncio"])
    parser.add_argument("--tasks-table", type=int, default=TABLE_TASKS, help=argparse.SUPPRESS)
    parser.add_argument("--table-child", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--child", nargs=4, metavar=("MODE", "SCENARIO", "LOOP", "TASKS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, scenario, loop_name, tasks = args.child
        if loop_name == "-":
            audit_child(mode, scenario, int(tasks))
        else:
            child(mode, scenario, loop_name, int(tasks))
        return
    if args.table_child:
        mode, loop_name, tasks, *scenarios = args.table_child
        table_child(mode, loop_name, int(tasks), scenarios)
        return
    if (args.table or args.markdown or args.docs or args.json) and args.from_json:
        run_table(args)
        return
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (apt-get install valgrind)")
    if args.table or args.markdown or args.docs or args.json:
        run_table(args)
        return
    if args.profile:
        print_profile(args.profile_mode, args.loop, args.profile)
        return
    if args.tasks < BATCH or args.tasks % BATCH:
        sys.exit(f"--tasks must be a positive multiple of {BATCH}")
    if args.audit_cost:
        audit_cost()
        return
    run_scenarios(args)


def run_scenarios(args: argparse.Namespace) -> None:
    print(f"instructions per task on {args.loop}, Python {sys.version.split()[0]} ({args.tasks} tasks, valgrind)")
    plain = (*MODES, "watchdog") if args.watchdog else MODES
    columns = (*plain, "floor") if args.floor else plain
    print(f"{'scenario':9} {'baseline':>10}" + "".join(f" {mode:>16}" for mode in columns[1:]))
    for scenario in args.scenarios:
        modes = columns if scenario == "stat" else plain
        counts = {mode: per_task(mode, scenario, args.loop, args.tasks) for mode in modes}
        base = counts["baseline"]
        cells = [f"{base:10.0f}"] + [f"{counts[m]:9.0f} {f'({counts[m] - base:+.0f})':>9}" for m in modes[1:]]
        print(f"{scenario:9} " + " ".join(cells))


if __name__ == "__main__":
    main()
