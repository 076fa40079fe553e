"""Where the time of a detected blocking call goes: a breakdown of the per-task cost.

    python benchmarks/blocking_breakdown.py [--loop uvloop] [--scenario stat] [--tasks 20000] [--rounds 5]

An analysis aid for the "task with one blocking call" target, not part of
the suite's figures. Each variant runs in its own process, alternating over
rounds (medians reported), like run_benchmark.py:

- `baseline`: no aiocop;
- `inert`: detection started, then `aiocop.deactivate()`: the wrappers run
  and raise their audit event, the hook exits at its first dict miss;
- `capture`: detection active with no callback registered: the delivery
  claims each step but builds no event: the hook's slow path and the
  delivery's bookkeeping;
- `full`: detection active with a counting callback, as in the suite.

The differences give the cost of each layer. A last process runs `full`
with timers around aiocop's internal functions (which makes it slower; only
its split is used) and counts the audit events raised per task. Each timer
is inclusive: `_deliver` includes `invoke_callbacks`, `flush` both. It patches
private names of aiocop, so it follows the code of the day: if they are
renamed, update the names in INSTRUMENTED.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

VARIANTS = ("baseline", "inert", "capture", "full")
# (module, attribute): the internals timed in the instrumented run, outermost first.
INSTRUMENTED = (
    ("_interception.hook", "_capture"),
    ("_reporting.delivery", "_claim"),
    ("_reporting.delivery", "_deliver"),
    ("_model.callbacks", "invoke_callbacks"),
)
BATCH = 1000


async def _stat() -> None:
    os.stat(".")
    await asyncio.sleep(0)


async def _getcwd() -> None:
    os.getcwd()
    await asyncio.sleep(0)


SCENARIOS = {"stat": _stat, "getcwd": _getcwd}


def _setup(variant: str, counter: list[int]) -> None:
    if variant == "baseline":
        return
    import aiocop
    from aiocop._reporting import delivery as _delivery

    aiocop.start_blocking_io_detection(trace_depth=5)
    aiocop.register_slow_task_callback(lambda event: counter.__setitem__(0, counter[0] + 1))
    if variant == "inert":
        aiocop.deactivate()
    elif variant == "capture":
        # No callback: the delivery claims each step and builds no event.
        aiocop.clear_slow_task_callbacks()
        claim = _delivery._claim

        def count_claimed(batch: Any) -> Any:
            claimed = claim(batch)
            counter[0] += len(claimed)
            return claimed

        _delivery._claim = count_claimed


def _instrument() -> dict[str, list[int]]:
    import importlib

    from aiocop._interception import hook as _hook
    from aiocop._reporting import delivery as _delivery
    from aiocop._reporting.sink import SINK

    totals: dict[str, list[int]] = {}
    clock = time.perf_counter_ns

    def timed(name: str, func: Any) -> Any:
        acc = totals.setdefault(name, [0, 0])

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            try:
                return func(*args, **kwargs)
            finally:
                acc[0] += clock() - t0
                acc[1] += 1

        return wrapper

    for module_name, attribute in INSTRUMENTED:
        module = importlib.import_module(f"aiocop.{module_name}")
        setattr(module, attribute, timed(f"{module_name}.{attribute}", getattr(module, attribute)))
    # The hook's sink, its delivery timed (the hook binds the sink's callables as the sink is installed).
    _hook.install_sink(dataclasses.replace(SINK, deliver=timed("_delivery.flush", _delivery.flush)))
    return totals


def child(variant: str, loop_name: str, scenario: str, tasks: int, reps: int, instrumented: bool) -> None:
    counter = [0]
    _setup(variant, counter)
    body = SCENARIOS[scenario]
    audit_events: collections.Counter[str] = collections.Counter()

    async def run() -> float:
        t0 = time.perf_counter()
        for _ in range(0, tasks, BATCH):
            await asyncio.gather(*(body() for _ in range(BATCH)))
        return time.perf_counter() - t0

    if loop_name == "asyncio":
        loop = asyncio.new_event_loop()
    else:
        import importlib

        loop = importlib.import_module(loop_name).new_event_loop()
    loop.run_until_complete(run())  # warm-up
    totals = _instrument() if instrumented else {}
    if instrumented:
        # Added last, so it runs after aiocop's hook: counts every audit event of the timed run.
        sys.addaudithook(lambda event, args: audit_events.update((event,)))
    best = float("inf")
    best_totals: dict[str, list[int]] = {}
    for _ in range(reps):  # the fastest repetition: the least disturbed by other processes
        for acc in totals.values():
            acc[:] = [0, 0]
        counter[0] = 0
        audit_events.clear()
        elapsed = loop.run_until_complete(run())
        loop.run_until_complete(asyncio.sleep(0.01))
        if elapsed < best:
            best, best_totals = elapsed, {name: list(acc) for name, acc in totals.items()}
    loop.close()
    split = {
        name: {"us_per_task": ns / 1000 / tasks, "calls_per_task": n / tasks} for name, (ns, n) in best_totals.items()
    }
    result = {
        "us_per_task": best / tasks * 1e6,
        "delivered": counter[0],
        "audit_events_per_task": {name: n / tasks for name, n in audit_events.most_common()},
        "split": split,
    }
    print(json.dumps(result))


def run_child(variant: str, args: argparse.Namespace, instrumented: bool = False) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", variant, "--loop", args.loop, "--scenario", args.scenario]
    command += ["--tasks", str(args.tasks), "--reps", str(args.reps)] + (["--instrumented"] if instrumented else [])
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    out = subprocess.run(command, capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loop", default="uvloop")
    parser.add_argument("--scenario", default="stat", choices=sorted(SCENARIOS))
    parser.add_argument("--tasks", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=3, help="repetitions per process; the fastest counts")
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--instrumented", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.loop, args.scenario, args.tasks, args.reps, args.instrumented)
        return
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(args.rounds):
        for variant in VARIANTS:
            times[variant].append(run_child(variant, args)["us_per_task"])
    med = {v: statistics.median(t) for v, t in times.items()}
    print(
        f"{args.scenario} on {args.loop}: {args.rounds} alternating rounds of {args.tasks} tasks,"
        f" fastest of {args.reps} per process (median µs/task)"
    )
    labels = [
        ("baseline", "no aiocop", None),
        ("inert", "+ wrapper and audit-hook dispatch (detection deactivated)", "baseline"),
        ("capture", "+ the hook's slow path and the delivery's bookkeeping (no event built)", "inert"),
        ("full", "+ building the event and running a counting callback", "capture"),
    ]
    for variant, label, previous in labels:
        extra = "" if previous is None else f"  (+{med[variant] - med[previous]:6.2f})"
        print(f"  {variant:9} {med[variant]:7.2f}{extra}  {label}")
    print(f"  total extra: {med['full'] - med['baseline']:.2f} µs/task")
    detail = run_child("full", args, instrumented=True)
    events = ", ".join(f"{name} {n:g}" for name, n in detail["audit_events_per_task"].items())
    print(f"instrumented run (each timer adds its own cost): audit events per task: {events}")
    for name, entry in detail["split"].items():
        per = entry["calls_per_task"]
        calls = f"{per:.2f} calls/task" if per >= 0.01 else f"{per * 1000:.1f} calls/1000 tasks"
        print(f"  {name:28} {entry['us_per_task']:6.2f} µs/task  ({calls})")


if __name__ == "__main__":
    main()
