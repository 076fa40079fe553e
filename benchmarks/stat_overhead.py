"""Quick microbenchmark: the cost of aiocop on a task, against an untouched loop.

Each measurement runs in its own process; the baseline process never imports
aiocop. Runs alternate (A B A B ...) and the script prints medians and spread
of the per-task time. The full suite, with these scenarios and more, is
`run_benchmark.py`; this script stays as a quick look at two of them.

    python benchmarks/stat_overhead.py [--rounds 7] [--tasks 20000] [--loop uvloop] [--watchdog]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = r"""
import asyncio, json, os, sys, time
mode, scenario, loop_name, tasks = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
delivered = [0]
if mode.startswith("aiocop"):
    import aiocop
    aiocop.start_blocking_io_detection(trace_depth=5)
    aiocop.register_slow_task_callback(lambda event: delivered.__setitem__(0, delivered[0] + 1))
    if mode == "aiocop+watchdog":
        aiocop.detect_slow_tasks(threshold_ms=30)

async def pure():
    await asyncio.sleep(0)

async def stat():
    os.stat(".")
    await asyncio.sleep(0)

async def main():
    body = {"pure": pure, "stat": stat}[scenario]
    await asyncio.gather(*(body() for _ in range(1000)))  # warm-up
    delivered[0] = 0
    t0 = time.perf_counter()
    for start in range(0, tasks, 1000):
        await asyncio.gather(*(body() for _ in range(1000)))
    return time.perf_counter() - t0

if loop_name == "uvloop":
    import uvloop
    loop = uvloop.new_event_loop()
else:
    loop = asyncio.new_event_loop()
elapsed = loop.run_until_complete(main())
loop.run_until_complete(asyncio.sleep(0.01))  # let the last deliveries run
print(json.dumps({"us_per_task": elapsed / tasks * 1e6, "delivered": delivered[0]}))
"""


def measure(mode: str, scenario: str, loop: str, tasks: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode, scenario, loop, str(tasks)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tasks", type=int, default=20000)
    parser.add_argument("--loop", default="asyncio", choices=["asyncio", "uvloop"])
    parser.add_argument("--watchdog", action="store_true", help="also run the stall watchdog (detect_slow_tasks)")
    args = parser.parse_args()
    mode = "aiocop+watchdog" if args.watchdog else "aiocop"
    print(f"{mode}: {args.rounds} alternating rounds of {args.tasks} tasks; median ± stdev")
    print(f"{'scenario':8} {'loop':8} {'baseline us/task':>18} {'aiocop us/task':>16} {'extra us/task':>14}  delivered")
    for scenario in ("pure", "stat"):
        base, watched, delivered = [], [], []
        for _ in range(args.rounds):
            base.append(measure("baseline", scenario, args.loop, args.tasks)["us_per_task"])
            result = measure(mode, scenario, args.loop, args.tasks)
            watched.append(result["us_per_task"])
            delivered.append(result["delivered"])
        extra = [w - b for w, b in zip(watched, base, strict=True)]
        expected = args.tasks if scenario == "stat" else 0
        if any(d != expected for d in delivered):
            sys.exit(f"{scenario}: expected {expected} delivered events per run, got {delivered}")
        print(
            f"{scenario:8} {args.loop:8} {statistics.median(base):10.3f} ±{statistics.stdev(base):5.3f}"
            f" {statistics.median(watched):9.3f} ±{statistics.stdev(watched):5.3f}"
            f" {statistics.median(extra):8.3f} ±{statistics.stdev(extra):5.3f}  {expected}/run"
        )


if __name__ == "__main__":
    main()
