"""CPU cost of the stall watchdog in an idle process.

Each run is a separate process with an event loop waiting for I/O for
`--seconds`; the baseline never imports aiocop. Runs alternate (A B A B ...)
and the script prints each side's CPU time as a share of one core.

    python benchmarks/watchdog_idle_cost.py [--seconds 10] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

CHILD = r"""
import asyncio, resource, sys, time
mode, seconds = sys.argv[1], float(sys.argv[2])
if mode == "aiocop":
    import aiocop
    aiocop.start_blocking_io_detection()
    aiocop.detect_slow_tasks(threshold_ms=30)
async def main():
    await asyncio.sleep(0.2)  # start-up done
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    await asyncio.sleep(seconds)
    r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    print(cpu / (t1 - t0) * 100)
asyncio.run(main())
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    results: dict[str, list[float]] = {"baseline": [], "aiocop": []}
    for _ in range(args.rounds):
        for mode, values in results.items():
            out = subprocess.run(
                [sys.executable, "-c", CHILD, mode, str(args.seconds)], capture_output=True, text=True, check=True
            )
            values.append(float(out.stdout))
    for mode, values in results.items():
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        print(f"{mode:9} idle CPU: median {statistics.median(values):.3f} % of a core (± {spread:.3f}), runs {values}")


if __name__ == "__main__":
    main()
