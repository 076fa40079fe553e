"""How often rloop's two-thread close race fails, with and without aiocop (issue 31).

Two threads each run `asyncio.Runner(loop_factory=rloop.new_event_loop)`
with one task that meets the other thread at a `threading.Barrier` and then
blocks in `time.sleep()` for `--block-ms` (20 ms, the issue's case; plus a
random 0 to `--jitter-ms` per round, the same in every mode); a round is the
two runs, and a run fails when its Runner raises (rloop 0.5: `RuntimeError:
Cannot close a running event loop`, after an `OSError: [Errno 9]` in its
self-pipe set-up). Each batch of rounds is a separate process: `baseline`
never imports aiocop, `aiocop` calls `start_blocking_io_detection()` and
`detect_slow_tasks(threshold_ms=10)`; `detection` and `watchdog` are one of
the two only; `before` is `aiocop` with the aiocop package found under
`--before PATH` (another checkout, to compare a change with what it
replaces). The modes that take aiocop apart patch its private watchdog, for
this measurement only: `nowatchdog` is `aiocop` without the watchdog's
thread, `emptylooks` keeps the thread waking every 2 ms but has it look at
nothing, `slowlooks` has it look every 50 ms, `nobeats` sends loops no
heartbeat, `gapsleep` has it sleep, while no loop is registered, until a
loop's start wakes it, and `where` times its looks against rloop's self-pipe
tear-downs and set-ups (printed after the table: how often a look fell in
the race's window, and how many loops aiocop knew running then). `ticker`
is no aiocop at all, and a thread of the program's own that wakes every
2 ms and does nothing. `workaround` is `aiocop` on the docs'
`SelfPipeFixedRLoop` (examples/rloop_self_pipe.py), rloop's loop with its
self-pipe closed once. Batches alternate (A B A B ...) so that the
machine's load weighs on every mode alike. The rate depends on the
machine's load far more than on aiocop (0.2-4 % here, for the baseline):
compare modes of one invocation only. `p` is the two-sided exact test of
"fails as often as the baseline" (given the two modes' failures together,
how they split between them).

    python benchmarks/rloop_close_race.py [--runs 1000] [--batch 200] [--modes baseline,aiocop]
        [--block-ms 20] [--jitter-ms 0] [--before PATH]

The cause (see docs/how-to/loops.md, rloop section): rloop 0.5 closes its
self-pipe's two descriptors in Rust, then drops the Python socket objects
that still own the same numbers, which close them again. If another thread
creates a descriptor in between (the other loop's next run creating its own
self-pipe), that second close closes the other thread's new descriptor.
What is left of aiocop's part is its watchdog thread taking the GIL every 2
to 4 ms while loops run: without it aiocop fails no more often than the
baseline, and a thread of the program's own that only wakes every 2 ms
(`ticker`) raises the rate too; the counts are in the docs' table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from typing import Any

CHILD = r"""
import asyncio, json, random, sys, threading, time
mode, rounds = sys.argv[1], int(sys.argv[2])
if mode == "before":
    sys.path.insert(0, sys.argv[3])
    import aiocop
    assert aiocop.__file__.startswith(sys.argv[3]), aiocop.__file__
if mode not in ("baseline", "ticker"):
    import aiocop
    from aiocop._stalls import watchdog as _watchdog
    from aiocop._stalls import settings as _settings

    def patch(owner, name, value):  # a private name that has gone must fail the mode, not pass unpatched
        if not hasattr(owner, name):
            where = getattr(owner, "__module__", None) or owner.__name__
            sys.exit(f"{mode}: {where} has no {name} any more: update this mode")
        setattr(owner, name, value)

    if mode == "nowatchdog":  # all of aiocop but the watchdog's thread
        patch(_watchdog.Watchdog, "_spawn", lambda self: None)
    elif mode == "emptylooks":  # the thread wakes every 2 ms, takes the GIL, and looks at nothing
        patch(_watchdog.Watchdog, "poll", lambda self: (True, True))
    elif mode == "slowlooks":  # looks every 50 ms (stalls shorter than that go unseen)
        patch(_settings.sampling, "busy_poll_ms", 50.0)
        patch(_watchdog, "_FAST_IDLE_S", 0.05)
    elif mode == "nobeats":  # looks as usual, but sends loops no heartbeat (call_soon_threadsafe)
        patch(_watchdog, "_send_heartbeat", lambda watch, now: None)
    elif mode == "gapsleep":  # no look while no loop is registered: asleep until a loop's start wakes it
        from aiocop._interception import loops as _loops
        next_interval = _watchdog.Watchdog._next_interval
        gaps = []

        def gap_interval(self, busy, active):
            interval = next_interval(self, busy, active)
            long, self._sleeping_long = self._sleeping_long, True  # (first: a start from here on wakes it)
            if not _loops.watches and not _loops.retired:
                gaps.append(interval)
                return -1  # no timeout
            self._sleeping_long = long
            return interval

        patch(_watchdog.Watchdog, "_next_interval", gap_interval)
        patch(_watchdog.watchdog, "_sleeping_long", False)  # (what a loop's start reads to wake it)
        patch(_loops, "retired", _loops.retired)
    if mode != "watchdog":
        aiocop.start_blocking_io_detection()
    if mode != "detection":
        aiocop.detect_slow_tasks(threshold_ms=10)
if mode == "ticker":  # no aiocop: a thread of the application's own that wakes every 2 ms and does nothing
    def tick():
        while True:
            time.sleep(0.002)
    threading.Thread(target=tick, daemon=True).start()
import rloop
factory = rloop.new_event_loop
marks = []  # where: (what, began, ended, loops registered), per round
if mode == "where":  # aiocop, timing its looks and rloop's self-pipe set-ups and tear-downs
    import rloop.loop as _rloop_loop
    from aiocop._interception import loops as _loops

    def timed(what, call):
        def timed_call(*args):
            began, registered = time.perf_counter(), len(_loops.watches)
            try:
                return call(*args)
            finally:
                # (and whether a loop was still known running, or stopped and not
                # yet taken in, as the look ended and chose its sleep)
                marks.append((what, began, time.perf_counter(), registered, bool(_loops.watches or _loops.retired)))
        return timed_call

    patch(_watchdog.Watchdog, "poll", timed("look", _watchdog.Watchdog.poll))
    patch(_rloop_loop.RLoop, "_ssock_start", timed("open", _rloop_loop.RLoop._ssock_start))
    patch(_rloop_loop.RLoop, "_ssock_stop", timed("close", _rloop_loop.RLoop._ssock_stop))
where = {
    "rounds": 0,
    "rounds looked at": 0,
    "failed": 0,
    "failed looked at": 0,
    "looks by loops registered": {},
    "looks with none, chosen by a look that saw one": 0,
}
if mode == "workaround":  # aiocop, and the docs' workaround for rloop's double close
    sys.path.insert(0, sys.argv[4])
    from rloop_self_pipe import SelfPipeFixedRLoop as factory

block_s, jitter_s = float(sys.argv[5]) / 1000, float(sys.argv[6]) / 1000
spread = random.Random(sys.argv[7])

async def meet(barrier, blocked):
    barrier.wait()
    time.sleep(blocked)

def run(barrier, blocked, errors):
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(meet(barrier, blocked))
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")

errors = []
for _ in range(rounds):
    barrier = threading.Barrier(2, timeout=10)
    blocked = block_s + spread.uniform(0.0, jitter_s)  # the same in both threads: they stop in step
    failed_before = len(errors)
    threads = [threading.Thread(target=run, args=(barrier, blocked, errors)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if mode == "where":
        # The race's window: from the first tear-down of a self-pipe (after
        # the tasks' block) to the end of the last set-up that could meet
        # it (a later run's, in either thread); a look after that cannot
        # have made a set-up fail.
        closes = [m[1] for m in marks if m[0] == "close"]
        opens = [m[2] for m in marks if m[0] == "open" and closes and m[2] > min(closes)]
        window = (min(closes), max(opens)) if closes and opens else (0.0, 0.0)
        every = [m for m in marks if m[0] == "look"]
        looks = [m for m in every if m[1] <= window[1] and m[2] >= window[0]]
        for before, look in zip(every, every[1:]):
            # A look in the window, while no loop was known running, that the
            # look before it chose while one was (or had just stopped).
            if look in looks and not look[3] and before[4]:
                where["looks with none, chosen by a look that saw one"] += 1
        failed = len(errors) > failed_before
        where["rounds"] += 1
        where["rounds looked at"] += bool(looks)
        where["failed"] += failed
        where["failed looked at"] += failed and bool(looks)
        for look in looks:
            key = str(look[3])
            where["looks by loops registered"][key] = where["looks by loops registered"].get(key, 0) + 1
        marks.clear()
# (gapsleep: how often the mode did what it says, slept in a gap with no loop)
note = f"{len(gaps)} untimed sleeps" if mode == "gapsleep" else ""
print(json.dumps({"runs": 2 * rounds, "errors": errors, "note": note, "where": where if mode == "where" else None}))
"""

MODES = (
    "baseline",
    "aiocop",
    "detection",
    "watchdog",
    "nowatchdog",
    "emptylooks",
    "slowlooks",
    "gapsleep",
    "nobeats",
    "ticker",
    "where",
    "workaround",
    "before",
)
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
    # In logs: pooled counts run to thousands, whose binomial coefficients overflow a float.
    log_share, log_rest = math.log(share), math.log1p(-share)
    log_all = math.lgamma(total + 1)
    log_probs = [
        log_all - math.lgamma(i + 1) - math.lgamma(total - i + 1) + i * log_share + (total - i) * log_rest
        for i in range(total + 1)
    ]
    observed = log_probs[k]
    p = sum(math.exp(lp) for lp in log_probs if lp <= observed + 1e-9)
    return 1.0 if p > 1.0 - 1e-9 else p  # (every split as likely as the one seen, but for rounding)


def parse_args() -> tuple[argparse.Namespace, list[str], str]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1000, help="runs per mode (two per round)")
    parser.add_argument("--batch", type=int, default=200, help="runs per process")
    parser.add_argument("--modes", default="baseline,aiocop", help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--block-ms", type=float, default=20.0, help="how long each task blocks (ms)")
    parser.add_argument(
        "--jitter-ms", type=float, default=0.0, help="add to each round's block a random 0 to this many ms"
    )
    parser.add_argument("--before", default="", help="for the `before` mode: a directory holding an aiocop package")
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        parser.error(f"--modes: unknown {unknown} (choose from {', '.join(MODES)})")
    if args.runs < 2 or args.batch < 2:
        parser.error("--runs and --batch must be at least 2")
    if not (0.0 <= args.block_ms <= 10_000.0 and 0.0 <= args.jitter_ms <= 10_000.0):
        parser.error("--block-ms and --jitter-ms must be between 0 and 10000")
    before = os.path.abspath(args.before) if args.before else ""
    if ("before" in modes) != bool(before) or (
        before and not os.path.isfile(os.path.join(before, "aiocop", "__init__.py"))
    ):
        parser.error(
            "--before PATH (a directory with an aiocop package in it) goes with the `before` mode, and only with it"
        )
    return args, modes, before


def run_batch(args: argparse.Namespace, mode: str, rounds: int, before: str, seed: int) -> dict[str, Any]:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            mode,
            str(rounds),
            before,
            EXAMPLES,
            str(args.block_ms),
            str(args.jitter_ms),
            str(seed),  # each batch's own spread of blocks, the same for every mode
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        sys.exit(f"mode {mode}: its process failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def add_where(where: dict[str, Any], found: dict[str, Any]) -> None:
    for key, value in found.items():
        if isinstance(value, dict):
            counts = where.setdefault(key, {})
            for loops, count in value.items():
                counts[loops] = counts.get(loops, 0) + count
        else:
            where[key] = where.get(key, 0) + value


def main() -> None:
    args, modes, before = parse_args()
    totals: dict[str, dict[str, Any]] = {m: {"runs": 0, "failures": 0, "kinds": {}} for m in modes}
    where: dict[str, Any] = {}
    started = time.perf_counter()
    while any(t["runs"] < args.runs for t in totals.values()):
        for mode in modes:
            total = totals[mode]
            if total["runs"] >= args.runs:
                continue
            rounds = max(1, min(args.batch, args.runs - total["runs"]) // 2)
            result = run_batch(args, mode, rounds, before, total["runs"])
            total["runs"] += result["runs"]
            total["failures"] += len(result["errors"])
            for error in result["errors"]:
                total["kinds"][error] = total["kinds"].get(error, 0) + 1
            add_where(where, result.get("where") or {})
            note = f" ({result['note']})" if result.get("note") else ""
            print(f"  {mode}: {len(result['errors'])} / {result['runs']}{note}", file=sys.stderr, flush=True)
    print(f"Python {sys.version.split()[0]}, {time.perf_counter() - started:.0f} s")
    print_table(totals)
    if where:
        print_where(where)


def print_table(totals: dict[str, dict[str, Any]]) -> None:
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


def print_where(where: dict[str, Any]) -> None:
    # The `where` mode: whether a look of the watchdog overlapped the race's
    # window (from the first self-pipe torn down after the block to the
    # last set up), in
    # failed rounds and in the others, and how many loops aiocop knew
    # running as each such look began (0: the watchdog looked while none ran).
    failed, failed_looked = where["failed"], where["failed looked at"]
    other, other_looked = where["rounds"] - failed, where["rounds looked at"] - failed_looked
    print("where: rounds with a look of the watchdog in the window (first self-pipe torn down to last set up)")
    print(f"  failed rounds: {failed_looked} of {failed};  other rounds: {other_looked} of {other}")
    looked, unlooked = failed_looked + other_looked, failed - failed_looked + other - other_looked
    if looked and unlooked:
        print(
            f"  a round with a look in its window failed {failed_looked / looked:.2%} of the time,"
            f" one without {(failed - failed_looked) / unlooked:.2%}"
        )
    by = ", ".join(f"{loops}: {count}" for loops, count in sorted(where["looks by loops registered"].items()))
    print(f"  looks in windows, by loops registered as each began: {by}")
    chosen = where["looks with none, chosen by a look that saw one"]
    print(f"  of those with none, chosen by the look before while it saw a loop running or just stopped: {chosen}")


if __name__ == "__main__":
    main()
