"""How often rloop's two-thread close race fails, with and without aiocop (issue 31).

Two threads each run `asyncio.Runner(loop_factory=rloop.new_event_loop)`
with one task that meets the other thread at a `threading.Barrier` and then
blocks in `time.sleep(0.02)`; a round is the two runs, and a run fails when
its Runner raises (rloop 0.5: `RuntimeError: Cannot close a running event
loop`, after an `OSError: [Errno 9]` in its self-pipe set-up). Each batch of
rounds is a separate process: `baseline` never imports aiocop, `aiocop` calls
`start_blocking_io_detection()` and `detect_slow_tasks(threshold_ms=10)`;
`detection` and `watchdog` are one of the two only; `before` is `aiocop`
with the aiocop package found under `--before PATH` (another checkout, to
compare a change with what it replaces). Three modes take aiocop apart (they
patch its private watchdog, for this measurement only): `nowatchdog` is
`aiocop` without the watchdog's thread, `emptylooks` keeps the thread waking
every 2 ms but has it look at nothing, `slowlooks` has it look every 50 ms.
`workaround` is `aiocop` on the docs' `SelfPipeFixedRLoop`
(examples/rloop_self_pipe.py), rloop's loop with its self-pipe closed once.
Batches alternate (A B A B ...) so that the machine's load weighs on every
mode alike. The rate depends on the machine's load far more than on aiocop
(0.2-4 % here, for the baseline): compare modes of one invocation only. `p`
is the two-sided exact test of "fails as often as the baseline" (given the
two modes' failures together, how they split between them).

    python benchmarks/rloop_close_race.py [--runs 1000] [--batch 200] [--modes baseline,aiocop] [--before PATH]

The cause (see docs/how-to/loops.md, rloop section): rloop 0.5 closes its
self-pipe's two descriptors in Rust, then drops the Python socket objects
that still own the same numbers, which close them again. If another thread
creates a descriptor in between (the other loop's next run creating its own
self-pipe), that second close closes the other thread's new descriptor. aiocop used to
make this up to five times as frequent (it woke its watchdog at every loop
start). What is left of its part is the watchdog thread's looks, every 2 to 4
ms while loops run (the `nowatchdog`, `emptylooks` and `slowlooks` modes show
it); the counts are in the docs' table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

CHILD = r"""
import asyncio, json, sys, threading, time
mode, rounds = sys.argv[1], int(sys.argv[2])
if mode == "before":
    sys.path.insert(0, sys.argv[3])
    import aiocop
    assert aiocop.__file__.startswith(sys.argv[3]), aiocop.__file__
if mode != "baseline":
    import aiocop
    from aiocop._stalls import watchdog as _watchdog
    from aiocop._stalls import settings as _settings

    def patch(owner, name, value):  # a private name that has gone must fail the mode, not pass unpatched
        if not hasattr(owner, name):
            sys.exit(f"{mode}: aiocop._stalls.watchdog has no {name} any more: update this mode")
        setattr(owner, name, value)

    if mode == "nowatchdog":  # all of aiocop but the watchdog's thread
        patch(_watchdog.Watchdog, "_spawn", lambda self: None)
    elif mode == "emptylooks":  # the thread wakes every 2 ms, takes the GIL, and looks at nothing
        patch(_watchdog.Watchdog, "poll", lambda self: (True, True))
    elif mode == "slowlooks":  # looks every 50 ms (stalls shorter than that go unseen)
        patch(_settings.sampling, "busy_poll_ms", 50.0)
        patch(_watchdog, "_FAST_IDLE_S", 0.05)
    if mode != "watchdog":
        aiocop.start_blocking_io_detection()
    if mode != "detection":
        aiocop.detect_slow_tasks(threshold_ms=10)
import rloop
factory = rloop.new_event_loop
if mode == "workaround":  # aiocop, and the docs' workaround for rloop's double close
    sys.path.insert(0, sys.argv[4])
    from rloop_self_pipe import SelfPipeFixedRLoop as factory

async def meet(barrier):
    barrier.wait()
    time.sleep(0.02)

def run(barrier, errors):
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(meet(barrier))
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")

errors = []
for _ in range(rounds):
    barrier = threading.Barrier(2, timeout=10)
    threads = [threading.Thread(target=run, args=(barrier, errors)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
print(json.dumps({"runs": 2 * rounds, "errors": errors}))
"""

MODES = ("baseline", "aiocop", "detection", "watchdog", "nowatchdog", "emptylooks", "slowlooks", "workaround", "before")
EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "examples")


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (0.0, 0.0)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def same_rate_p(k: int, n: int, k0: int, n0: int) -> float:
    """Two-sided exact p of `k` failures in `n` runs against `k0` in `n0`, if both rates were one.

    Given the k + k0 failures, each is one of this mode's with probability
    n / (n + n0): the binomial test of how they split (exact, conditional).
    """
    total = k + k0
    if total == 0:
        return 1.0
    share = n / (n + n0)
    probs = [math.comb(total, i) * share**i * (1 - share) ** (total - i) for i in range(total + 1)]
    observed = probs[k]
    return min(1.0, sum(p for p in probs if p <= observed * (1 + 1e-9)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1000, help="runs per mode (two per round)")
    parser.add_argument("--batch", type=int, default=200, help="runs per process")
    parser.add_argument("--modes", default="baseline,aiocop", help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--before", default="", help="for the `before` mode: a directory holding an aiocop package")
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        parser.error(f"--modes: unknown {unknown} (choose from {', '.join(MODES)})")
    if args.runs < 2 or args.batch < 2:
        parser.error("--runs and --batch must be at least 2")
    before = os.path.abspath(args.before) if args.before else ""
    if ("before" in modes) != bool(before) or (
        before and not os.path.isfile(os.path.join(before, "aiocop", "__init__.py"))
    ):
        parser.error(
            "--before PATH (a directory with an aiocop package in it) goes with the `before` mode, and only with it"
        )
    totals = {m: {"runs": 0, "failures": 0, "kinds": {}} for m in modes}
    started = time.perf_counter()
    while any(t["runs"] < args.runs for t in totals.values()):
        for mode in modes:
            total = totals[mode]
            rounds = max(1, min(args.batch, args.runs - total["runs"]) // 2)
            if total["runs"] >= args.runs:
                continue
            out = subprocess.run(
                [sys.executable, "-c", CHILD, mode, str(rounds), before, EXAMPLES],
                capture_output=True,
                text=True,
                check=False,
            )
            if out.returncode != 0:
                sys.exit(f"mode {mode}: its process failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
            result = json.loads(out.stdout.strip().splitlines()[-1])
            total["runs"] += result["runs"]
            total["failures"] += len(result["errors"])
            for error in result["errors"]:
                total["kinds"][error] = total["kinds"].get(error, 0) + 1
            print(f"  {mode}: {len(result['errors'])} / {result['runs']}", file=sys.stderr, flush=True)
    print(f"Python {sys.version.split()[0]}, {time.perf_counter() - started:.0f} s")
    print(f"{'mode':10} {'runs':>6} {'failed':>6} {'rate':>7}  95% interval    vs baseline")
    base = totals.get("baseline")
    for mode, total in totals.items():
        low, high = wilson(total["failures"], total["runs"])
        rate = total["failures"] / total["runs"]
        versus = ""
        if base is not None and mode != "baseline":
            ratio = rate / (base["failures"] / base["runs"]) if base["failures"] else math.inf
            p = same_rate_p(total["failures"], total["runs"], base["failures"], base["runs"])
            versus = f"{ratio:.2f}x, p={p:.3f}"
        print(f"{mode:10} {total['runs']:6} {total['failures']:6} {rate:7.2%}  {low:.2%}-{high:.2%}  {versus}")
        for kind, count in sorted(total["kinds"].items(), key=lambda kv: -kv[1]):
            print(f"{'':10} {count:6} x {kind}")


if __name__ == "__main__":
    main()
