"""False stalls from short steps back to back, and recall of a long one among them.

Tasks make CPU-bound steps (a spin of `--step-ms`) separated by
`await asyncio.sleep(0)` (trio: `trio.lowlevel.checkpoint()`), so the loop
never waits; every fifth step of the first task spins `--long-ms` instead
(0: none). Each step's own wall-clock length is measured, so a step that a
busy machine stretched past the threshold counts as a true stall. Per task,
the reports up to its number of true stalls are hits, the rest false.

Between two looks the watchdog knows only how much CPU the loop's thread
used, not which steps used it: counted as all one step's, back-to-back
steps of 12 ms were reported as stalls of 36 to 70 ms at the 30 ms threshold.

Each round is a fresh process; with `--baseline-tree PATH` (another checkout
of aiocop) the rounds alternate between it and this one, in one run:

    python benchmarks/back_to_back_steps.py --loop asyncio --rounds 6 [--baseline-tree /tmp/old]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def child(args: argparse.Namespace) -> None:
    import aiocop

    events: list[tuple[str | None, float]] = []
    aiocop.start_blocking_io_detection()
    aiocop.detect_slow_tasks(
        threshold_ms=args.threshold_ms, on_slow_task=lambda e: events.append((e.task_name, e.elapsed_ms))
    )
    true: dict[str, int] = {}

    def step(name: str, i: int) -> None:
        long = name == "W0" and args.long_ms > 0 and i % 5 == 4
        t0 = time.perf_counter()
        spin((args.long_ms if long else args.step_ms) / 1000.0)
        if (time.perf_counter() - t0) * 1000.0 >= args.threshold_ms:
            true[name] = true.get(name, 0) + 1

    if args.loop == "trio":
        import trio

        async def trio_worker(name: str) -> None:
            for i in range(args.steps):
                step(name, i)
                await trio.lowlevel.checkpoint()

        async def trio_main() -> None:
            async with trio.open_nursery() as nursery:
                for n in range(args.tasks):
                    nursery.start_soon(trio_worker, f"W{n}", name=f"W{n}")

        trio.run(trio_main)
    else:
        import asyncio

        async def worker(name: str) -> None:
            for i in range(args.steps):
                step(name, i)
                await asyncio.sleep(0)

        async def main() -> None:
            await asyncio.gather(*(asyncio.create_task(worker(f"W{n}"), name=f"W{n}") for n in range(args.tasks)))

        if args.loop == "uvloop":
            import uvloop

            uvloop.run(main())
        else:
            asyncio.run(main())
    time.sleep(0.3)  # (the last step's report)
    print(json.dumps({"events": events, "true": true}))


def score(result: dict[str, Any]) -> tuple[int, int, int]:
    """(true stalls, hits, false reports) of one round."""
    reported: dict[str, int] = {}
    for name, _elapsed in result["events"]:
        reported[str(name)] = reported.get(str(name), 0) + 1
    true: dict[str, int] = result["true"]
    hits = sum(min(n, true.get(name, 0)) for name, n in reported.items())
    false = sum(max(0, n - true.get(name, 0)) for name, n in reported.items())
    return sum(true.values()), hits, false


def run_round(args: argparse.Namespace, tree: Path) -> tuple[int, int, int]:
    command = [sys.executable, __file__, "--child", "--loop", args.loop]
    for flag in ("threshold_ms", "step_ms", "long_ms", "tasks", "steps"):
        command += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise SystemExit(f"a round failed ({tree}):\n{done.stderr[-2000:]}")
    return score(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loop", choices=("asyncio", "uvloop", "trio"), default="asyncio")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threshold-ms", type=float, default=30.0)
    parser.add_argument("--step-ms", type=float, default=12.0)
    parser.add_argument("--long-ms", type=float, default=45.0)
    parser.add_argument("--tasks", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--baseline-tree", type=Path, help="another checkout of aiocop, run in alternate rounds")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rounds < 1 or args.tasks < 1 or args.steps < 1 or args.threshold_ms <= 0 or args.step_ms < 0:
        parser.error("--rounds, --tasks and --steps must be at least 1, --threshold-ms above 0, --step-ms not negative")
    if args.baseline_tree is not None and not (args.baseline_tree / "aiocop" / "__init__.py").is_file():
        parser.error(f"--baseline-tree {args.baseline_tree}: no aiocop package there")
    if args.child:
        child(args)
        return
    trees = {"this tree": HERE.parent}
    if args.baseline_tree is not None:
        trees["baseline"] = args.baseline_tree.resolve()
    rounds: dict[str, list[tuple[int, int, int]]] = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            rounds[name].append(run_round(args, tree))
    print(
        f"{args.loop}, {args.tasks} tasks x {args.steps} steps of {args.step_ms:g} ms"
        f" (every 5th of W0: {args.long_ms:g} ms), threshold {args.threshold_ms:g} ms, {args.rounds} rounds,"
        f" load average {os.getloadavg()[0]:.1f}"
    )
    for name, got in rounds.items():
        true, hits, false = (sum(r[i] for r in got) for i in range(3))
        per_round = statistics.median(r[2] for r in got)
        print(
            f"  {name:10} true stalls {true:4}  reported {hits:4} ({100.0 * hits / max(true, 1):5.1f} %)"
            f"  false {false:4} (median {per_round:g} a round, max {max(r[2] for r in got)})"
        )


if __name__ == "__main__":
    main()
