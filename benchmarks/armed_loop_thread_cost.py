"""What an armed idle loop costs the other threads' Python code (issue 29's tripwire).

After half a second of quiet the watchdog arms each idle loop to wake it as
the loop wakes. Up to Python 3.11 that was, and is, a profile function on the
loop's own thread. On 3.12+ `sys.setprofile` is built on `sys.monitoring`
and instruments the code of the whole interpreter: while one loop was armed,
every other thread ran two to four times slower. Since then, on 3.12+, an
asyncio loop is armed by wrapping its selector's `select`, and a loop
written in C is not armed (looked at more often instead).

Two scenarios, each in its own process, `baseline` (no aiocop) and `aiocop`
alternating (A B A B ...), medians with their spread:

- `executor`: an idle loop awaits CPU work handed to its default executor
  (the recommended way to keep a loop responsive); the executor thread's
  rate of `fib(18)` calls over 1.5 s, once the loop has been idle (armed) for 1 s.
- `twoloops`: one idle loop in a thread (armed), and a busy loop in the main
  thread serving pure-Python "requests"; the busy loop's requests/s over 3 s.

    python benchmarks/armed_loop_thread_cost.py [--rounds 5] [--scenario executor twoloops] [--loop asyncio|uvloop]

`--loop` picks the idle loop's kind (uvloop: a loop written in C).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

CHILD = r"""
import asyncio, sys, threading, time
mode, scenario, loop_name = sys.argv[1], sys.argv[2], sys.argv[3]
if mode == "aiocop":
    import aiocop
    aiocop.start_blocking_io_detection()
    aiocop.detect_slow_tasks(threshold_ms=30)

def new_loop():
    if loop_name == "uvloop":
        import uvloop
        return uvloop.new_event_loop()
    return asyncio.new_event_loop()

def armed():
    if mode != "aiocop":
        return "-"
    from aiocop._interception import loops
    return str(any(w.watchdog.armed for w in loops.watches.values()))

def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)

def job():
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 1.0:  # the loop idles meanwhile: armed after half a second
        fib(18)
    state = armed()
    n, t1 = 0, time.perf_counter()
    while time.perf_counter() - t1 < 1.5:
        fib(18)
        n += 1
    return n / (time.perf_counter() - t1), state

def work(n):  # a request handler's pure-Python work
    return sum(len(str(i)) for i in range(n))

async def handler():
    work(200)
    await asyncio.sleep(0)

async def serve():
    await asyncio.sleep(1.0)  # the idle loop is armed by then
    state = armed()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 3.0:
        await asyncio.gather(*(handler() for _ in range(50)))
        n += 50
    return n / (time.perf_counter() - t0), state

if scenario == "executor":
    loop = new_loop()
    async def main():
        return await asyncio.get_running_loop().run_in_executor(None, job)
    rate, state = loop.run_until_complete(main())
    loop.close()
else:
    idle = new_loop()
    threading.Thread(target=idle.run_forever, name="idle-loop", daemon=True).start()
    rate, state = asyncio.run(serve())
print(rate, state)
"""

UNITS = {"executor": "fib(18)/s in the executor thread", "twoloops": "requests/s on the busy loop"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--scenario", nargs="+", choices=tuple(UNITS), default=list(UNITS))
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    args = parser.parse_args()
    print(f"Python {sys.version.split()[0]}, idle loop: {args.loop}")
    for scenario in args.scenario:
        results: dict[str, list[float]] = {"baseline": [], "aiocop": []}
        states: set[str] = set()
        for _ in range(args.rounds):
            for mode, values in results.items():
                out = subprocess.run(
                    [sys.executable, "-c", CHILD, mode, scenario, args.loop],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                rate, state = out.stdout.split()
                values.append(float(rate))
                if mode == "aiocop":
                    states.add(state)
        base = statistics.median(results["baseline"])
        for mode, values in results.items():
            median = statistics.median(values)
            note = f", idle loop armed: {'/'.join(sorted(states))}" if mode == "aiocop" else ""
            print(
                f"{scenario:9} {mode:8} {UNITS[scenario]}: median {median:8.0f} ({median / base:5.2f}x baseline; "
                f"min {min(values):.0f}, max {max(values):.0f}){note}"
            )


if __name__ == "__main__":
    main()
