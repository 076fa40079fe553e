"""When a step began and ended, from the watchdog's looks and the loop thread's CPU clock.

A look sees a step or does not; between two looks, the loop thread's CPU
clock tells how much it ran. `Step` holds what the looks saw of one step and
turns it into a start and an end: for a CPU-bound step to within the clock's
resolution, for a wait to the middle of the gap between two looks (or to when
the loop woke, where the loop or its tripwire tells). The helpers below say
what a loop did between looks: woke, came back from a step, stayed idle.

May import: aiocop._common, aiocop._interception.loops (types only), and settings and attribution
of aiocop._stalls.
"""

from __future__ import annotations

import sys
from collections import deque
from operator import itemgetter
from typing import TYPE_CHECKING

from aiocop._common.clock import monotonic, perf_counter
from aiocop._stalls.attribution import Stall
from aiocop._stalls.settings import sampling
from aiocop._stalls.state import state_of

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import CodeType, FrameType

    from aiocop._interception.loops import LoopWatch
    from aiocop._stalls.attribution import Sampled, StalledTask

# A step whose thread gets at least this share of a CPU is working, not waiting.
CPU_BOUND_RATE = 0.1
# A step's end timed by the CPU clock to within this of the next look
# touches it: its thread ran through the gap (`Step._tail`).
_CLOCK_SLACK_S = 1e-6


class Step:
    """The step a loop was running at the last poll, and what the watchdog saw of it."""

    __slots__ = (
        "after_other",
        "began",
        "cpu_first",
        "cpu_last",
        "cpu_prev",
        "ended",
        "hang_next",
        "hangs",
        "held",
        "hung_s",
        "ident",
        "merged",
        "next_sample",
        "paused_s",
        "root",
        "sample_cpu",
        "sample_queued",
        "sample_s",
        "sample_t",
        "samples",
        "stalled",
        "t_first",
        "t_last",
        "t_prev",
        "task",
        "waiting",
        "weighed_t",
        "woke",
    )

    def __init__(
        self, ident: object, root: FrameType, now: float, prev: float, cpu: float | None, cpu_prev: float | None
    ) -> None:
        self.ident = ident
        self.root = root
        self.t_prev = prev  # last poll that did not see this step
        self.t_first = now  # first poll that did
        self.t_last = now  # latest poll that did
        self.cpu_prev = cpu_prev
        self.cpu_first = cpu
        self.cpu_last = cpu
        # Stack -> times sampled. Plain dicts: a busy loop on asyncio makes a
        # Step at nearly every poll, and a Counter costs µs to make.
        self.samples: dict[tuple[tuple[CodeType, int], ...], int] = {}
        self.waiting: dict[tuple[tuple[CodeType, int], ...], int] = {}  # samples taken while idle on CPU
        # Stack -> the loop time its samples stand for (s), and up to when the
        # step's time is given to a sample (0: none yet; `stacks.sample`).
        self.sample_s: dict[tuple[tuple[CodeType, int], ...], float] = {}
        self.weighed_t = 0.0
        self.sample_t = now
        self.sample_cpu = cpu
        # Its thread's wait for a CPU, and the times it was given one, at the last sample (sched.queued).
        self.sample_queued: tuple[float, int] | None = None
        self.next_sample = 0.0
        self.stalled = False
        self.merged = False  # its io event took it over
        self.task: StalledTask | None = None  # whose step it is, seen when it stalled
        # t_prev is when the loop woke from waiting for I/O and timers, not a
        # look: what it ran since then (cpu_first - cpu_prev) came before this step.
        self.woke = False
        # The look before the first sighting (t_prev) saw another step of
        # the loop's: the CPU its thread used between the two looks is that
        # step's tail, maybe whole steps no look saw, and this one's head, in
        # shares the clock cannot tell (`_head`).
        self.after_other = False
        self.hangs = 0  # hang reports made of it while it ran
        self.hung_s = 0.0  # how long it had run at its latest hang report: its final length is no less
        # How long the process was stopped (SIGSTOP, a frozen container) while
        # it ran, as the watchdog saw it (Watchdog._paused): not the loop's
        # doing, so no part of a hang.
        self.paused_s = 0.0
        self.hang_next = 0.0  # its age (s) at the next hang report; 0: hang_after_ms from the config
        # When it began and ended, where the loop's thread told it (the
        # probe's tick notes both); 0: estimated from the looks.
        self.began = 0.0
        self.ended = 0.0
        # When it began holding the GIL in the C call that the look that first
        # saw it waited on (`held_from`); 0: no such look.
        self.held = 0.0

    def cpu_rate(self) -> float:
        """The share of a CPU the loop thread got while this step ran (0 when waiting).

        A CPU-bound step runs at 1.0 alone, and at less while other threads
        compete for the GIL: the clock-based estimates below divide by it.
        Between two sightings; for a step seen once, only where the look that
        saw it waited on its hold (`held`): over the hold, which ran on a CPU.
        """
        if self.cpu_first is None or self.cpu_last is None:
            return 0.0
        if self.t_last > self.t_first:
            return min(1.0, max(0.0, (self.cpu_last - self.cpu_first) / (self.t_last - self.t_first)))
        # Seen once, by the late look a C call's hold kept out: the step can
        # hold the GIL again right after (the call's result freed: 15-20 % of
        # a sorted() of millions of ints), while that look's own reads let go
        # of it, and the next look, on time after them, finds the step over.
        # With no rate its end was the middle of that gap, 5-13 ms early
        # (uvloop, 3.12: sorted timed 6-9 % short, one round in four).
        if not self.held or self.cpu_prev is None or self.t_first <= self.held:
            return 0.0
        return min(1.0, max(0.0, (self.cpu_first - self.cpu_prev) / (self.t_first - self.held)))

    def cpu_bound(self) -> bool:
        return self.cpu_rate() >= CPU_BOUND_RATE

    def start(self) -> float:
        """Best estimate of when the step began."""
        if self.began:
            return self.began
        if self.held:
            return self.held
        head = self._head()
        if head is not None:
            began, told = head
            # Where the clock does not tell this step's share of the gap,
            # no earlier than its middle.
            return began if told else max(began, (self.t_prev + self.t_first) / 2.0)
        if self.woke and self.cpu_first is not None and self.cpu_prev is not None:
            # A wait that began soon after the loop woke (a server's first
            # request after a quiet spell): the loop ran this much since.
            return min(self.t_first, self.t_prev + (self.cpu_first - self.cpu_prev))
        return (self.t_prev + self.t_first) / 2.0

    def known_since(self) -> float:
        """The earliest moment the step is known, not guessed, to have been running.

        The first poll that saw it, or earlier when the thread's CPU clock
        shows it was already working before that poll, on this step alone
        (`_head`). Deciding that a step is a stall rests on this; the guesses
        of `start()` only time it.
        """
        if self.began or self.held:
            return self.start()
        head = self._head()
        if head is not None:
            return head[0] if head[1] else self.t_first
        if self.woke and self.cpu_first is not None and self.cpu_prev is not None:
            return self.start()
        return self.t_first

    def _head(self) -> tuple[float, bool] | None:
        # A CPU-bound step's start by its thread's CPU clock: the CPU used
        # since the last look that did not see it, at the step's own pace,
        # before the first sighting (plus any time the watchdog itself held
        # the GIL meanwhile); and whether that CPU was this step's alone: not
        # after another step (`after_other`). Counted as this step's, the
        # steps before it were: a task making 12 ms steps back to back, at a
        # 30 ms threshold, was a stall of 36 to 70 ms a dozen times in 160
        # steps, more on a busy machine, whose looks come further apart.
        rate = self.cpu_rate()
        if rate < CPU_BOUND_RATE or self.cpu_first is None or self.cpu_prev is None:
            return None
        began = self.t_first - (self.cpu_first - self.cpu_prev) / rate - _paused(self.t_prev, self.t_first)
        return max(self.t_prev, began), not self.after_other

    def end(self, now: float, cpu: float | None, *, by_other: bool = False, sure: bool = False) -> float:
        """Best estimate of when the step ended, seen gone at `now`.

        `by_other`: seen gone into another step; `sure`: what the thread ran
        since the last look was this step's, whatever the clock says.
        """
        if self.ended:
            return self.ended
        middle = (self.t_last + now) / 2.0
        tail = self._tail(now, cpu)
        if tail is None:
            return middle
        ended, told = tail
        return ended if sure or (told and not by_other) else min(ended, middle)

    def known_end(self, now: float, cpu: float | None, *, by_other: bool = False, sure: bool = False) -> float:
        """The latest moment the step is known, not guessed, to have been running; seen gone at `now`.

        Found over in another step (`by_other`), the last look that saw it:
        the gap after it is shared with that step (`after_other`). Found
        over with the loop idle, its end (`end`).
        """
        return self.t_last if by_other and not self.ended else self.end(now, cpu, sure=sure)

    def ran_through(self, now: float, cpu: float | None) -> bool:
        """Whether its thread's CPU clock, at the step's pace, fills the whole gap from its last sighting to `now`."""
        tail = self._tail(now, cpu)
        return tail is not None and not tail[1]

    def _tail(self, now: float, cpu: float | None) -> tuple[float, bool] | None:
        # A CPU-bound step's end by its thread's CPU clock since the last
        # look that saw it, and whether that CPU was its alone: not where the
        # thread ran through the whole gap, maybe into the next steps, up to
        # a look that found the loop between two (not waiting: a C loop
        # hands the GIL over as it polls between steps). Then the middle of
        # the gap, as for a step found over in another.
        rate = self.cpu_rate()
        if rate < CPU_BOUND_RATE or cpu is None or self.cpu_last is None:
            return None
        ended = self.t_last + (cpu - self.cpu_last) / rate + _paused(self.t_last, now)
        return min(now, max(self.t_last, ended)), ended < now - _CLOCK_SLACK_S


# A look at least this many GIL switch intervals later than the watchdog asked
# for the GIL, while one loop thread ran and no other thread did, was kept out
# by that thread holding the GIL in one C call (`held_from`).
HELD_LATE_SWITCHES = 3
# Where the watchdog's thread cannot tell why it was late (off Linux: `sched`),
# that thread's CPU clock must also have advanced by this share of the delay
# (below it: a paused process, or a machine that starved every thread alike).
# A busy machine gives a thread holding the GIL less than this (7 % with
# eight threads wanting two cores), so where the watchdog's thread can tell,
# three other tests replace it:
HELD_SHARE = CPU_BOUND_RATE
# ... the watchdog waited for the GIL (neither running nor waiting for a CPU)
# for HELD_LATE_SWITCHES switch intervals, woke at least once every
# HELD_WAKE_SWITCHES of them to ask again (a stopped process does not wake),
# and the loop's thread ran HELD_RAN_SWITCHES of them after the watchdog
# asked (Python code hands the GIL over within one; a loop busy at its last
# look may have run up to the ask: `held_from`'s busy_since_seen) ...
HELD_WAKE_SWITCHES = 4
HELD_RAN_SWITCHES = 3
# ... and, always, the rest of the process used no more than this share of
# what the loop's thread did, plus HELD_SLACK_S (idle threads' wake-ups, the
# skew between the two clocks read; the watchdog's own CPU is not counted:
# watchdog._others_cpu). More: another thread ran Python code meanwhile,
# sharing the GIL with the loop's, and either may have kept the watchdog out.
HELD_OTHERS = 0.25
HELD_SLACK_S = 0.002


# ... and at most this many times per switch interval: a thread waiting for a
# GIL that one C call holds wakes once per switch interval (take_gil's timed
# wait); woken more often, the GIL changed hands meanwhile (a loop thread that
# lets go of it and takes it back at every iteration, uvloop's short steps,
# starves the waiter without holding it: 130-154 wakes in 260-300 ms, a false
# 50 ms stall, against 62 in 309 ms for a held sum()).
HELD_MAX_WAKES = 1.5


def held_from(
    asked: float,
    now: float,
    seen: float,
    cpu_seen: float | None,
    cpu: float | None,
    others: float | None,
    kept: tuple[float, int] | None = None,
    *,
    busy_since_seen: bool = False,
) -> float:
    """When the loop's thread began holding the GIL in one C call that ended just before the look at `now` (0: none).

    The watchdog asked for the GIL at `asked` (its sleep's planned end, or
    the tripwire's wake-up) and got it at `now`. While Python code runs, the
    eval loop hands the GIL over within a switch interval of being asked
    (every call's return, loop's jump and function's entry checks), so a look
    this late while the loop's thread ran (its CPU clock, at `cpu_seen` at the
    loop's last look at `seen`, is at `cpu`) and nothing else of the process
    did (`others`: the process's CPU since the last look, less the loop
    thread's and the watchdog's own) was kept out by one C call of that thread's, which has just
    returned to the frame the look sees, unless the watchdog's own thread was
    kept from a CPU or the process was stopped: `kept` (`sched.Own.since`)
    says how long the watchdog's thread ran or waited for a CPU since its last
    look ended, and how many times it got one (None: not told; the loop
    thread's share of the delay decides instead). The hold began as the
    thread's CPU clock says (on a quiet machine), and no later than the
    watchdog asked, when the thread got less than a whole CPU; never before
    the loop's last look (nor, the caller sees to it, before the loop woke
    for the step).

    `busy_since_seen`: the loop was in a step at its last look, so its thread
    may have used all the CPU it could before the watchdog asked (`asked -
    seen`), Python code included; only what it used beyond that counts
    towards the CPU a hold needs (HELD_RAN_SWITCHES). A loop seen with no
    step may have been waiting, and when it woke is not known here: the
    whole of `ran` counts (a look between two steps of a busy loop and one
    after a step's tail, the loop waiting again, look alike: see
    docs/concepts/watchdog.md, "Its limits").
    """
    late = now - asked
    switch = sys.getswitchinterval()
    if cpu is None or cpu_seen is None or others is None or late < HELD_LATE_SWITCHES * switch:
        return 0.0
    ran = cpu - cpu_seen
    if others > HELD_OTHERS * ran + HELD_SLACK_S:
        return 0.0
    if kept is None:
        if ran < HELD_SHARE * late:
            return 0.0
    else:
        busy, slices = kept
        blocked = late - busy  # waiting for the GIL (or stopped)
        if (
            blocked < HELD_LATE_SWITCHES * switch
            or slices * HELD_WAKE_SWITCHES * switch < blocked
            or slices > HELD_MAX_WAKES * blocked / switch + 2
            or ran - (max(asked - seen, 0.0) if busy_since_seen else 0.0) < HELD_RAN_SWITCHES * switch
        ):
            return 0.0
    return max(min(now - ran, asked), seen)


def stopped_for(late: float, kept: Callable[[], tuple[float, int] | None]) -> float:
    """How long the process was stopped before a look `late` seconds past its due time (0: not stopped, or not told).

    `kept` gives what the watchdog's thread was told of its own scheduling
    since its last look (`sched.Own.since`: seconds it ran or waited for a
    CPU, and how many times it was given one), read only for a late look.
    Stopped: blocked (neither running nor waiting for a CPU) for three switch
    intervals, without waking once every four switch intervals as it does
    while it waits for the GIL (`held_from`'s test, turned round).
    """
    switch = sys.getswitchinterval()
    if late < HELD_LATE_SWITCHES * switch:
        return 0.0
    told = kept()
    if told is None:
        return 0.0
    busy, slices = told
    blocked = late - busy
    if blocked < HELD_LATE_SWITCHES * switch or slices * HELD_WAKE_SWITCHES * switch >= blocked:
        return 0.0
    return blocked


def stall_of(step: Step, start: float, end: float, watch: LoopWatch) -> Stall:
    # Most common first; each with the loop time its samples stand for.
    # (Copied before use: on the loop's thread, `_finish` may run while the
    # watchdog's adds a sample. A sample added between the two copies is in
    # the times only: a stack's time may take in one sample more than its
    # count, and a stack new then is left out.)
    counts, weighed = dict(step.samples), dict(step.sample_s)
    samples = [
        (stack, count, weighed.get(stack, 0.0))
        for stack, count in sorted(counts.items(), key=itemgetter(1), reverse=True)
    ]
    top_waiting = bool(samples) and step.waiting.get(samples[0][0], 0) * 2 >= samples[0][1]
    return Stall(
        watch,
        start,
        end,
        samples,
        not (step.cpu_bound() or step.held),  # (a hold ran on a CPU, though seen once)
        step.root,
        top_waiting,
        step.task,
        step.ident,
        step.t_last,
        step.hangs,
        step.hung_s,
    )


def held_tick(
    watch: LoopWatch, began: tuple[float, float], ended: float, cpu: float, code: CodeType, ident: object
) -> Stall:
    """The probe's tick `ident` (`stacks.step_of`) that held the loop from `began` (time, CPU clock) to `ended`.

    Told by the tick itself as it ends, seen by no look, so its ends are
    exact; what it was doing is not known, beyond the code it called
    (`code`: named as the call site).
    """
    waiting = (cpu - began[1]) < CPU_BOUND_RATE * (ended - began[0])
    sampled: list[Sampled] = [(((code, 0),), 1, ended - began[0])]
    return Stall(watch, began[0], ended, sampled, waiting, None, waiting, ident=ident, seen_until=ended)


# Garbage collections run by the watchdog thread itself: while one runs it
# holds the GIL, and a loop thread that wants it back waits without using CPU,
# which the CPU-clock estimates above must not read as the step having ended.
# Noted by the watchdog's gc callback (its own thread's collections only).
_pauses: deque[tuple[float, float]] = deque(maxlen=32)
_gc_started = 0.0


def note_gc(phase: str) -> None:
    """A garbage collection by the watchdog's own thread started or stopped (`phase` as gc.callbacks say)."""
    global _gc_started
    if phase == "start":
        _gc_started = perf_counter()
    elif _gc_started:
        _pauses.append((_gc_started, perf_counter()))
        _gc_started = 0.0


def _paused(a: float, b: float) -> float:
    """Time the watchdog spent collecting garbage between `a` and `b`."""
    return sum(max(0.0, min(b, end) - max(a, start)) for start, end in list(_pauses))


def moved(before: float | None, after: float | None, probe_cpu: float) -> bool:
    """Whether an idle loop's thread did anything between two looks, besides the loop-delay probe's ticks.

    The probe wakes an idle loop ten times a second: taken for activity, it
    kept the watchdog looking every few milliseconds for ever, six times its
    idle cost. The looks themselves still happen on any change of the CPU
    clock (`_all_quiet`): a step that starts right after a tick is seen.
    """
    if before is None or after is None:
        return True
    return after - before > probe_cpu


def all_quiet(watches: dict[int, LoopWatch]) -> bool:
    # The cheap look: an idle loop's thread uses no CPU, so if no loop thread's
    # CPU clock moved since the last look, nothing can have started (even a
    # step that went straight into a wait used some CPU to get there).
    # (A loop in aiocop's own callback, the probe's tick, is looked at too:
    # one that waits on a lock uses no CPU, and may be holding the loop.)
    for watch in watches.values():
        state = state_of(watch)
        if state.step is not None or state.own or state.idle_cpu is None or watch.cpu_time() != state.idle_cpu:
            return False
    now = perf_counter()
    for watch in watches.values():
        state_of(watch).idle_t = now  # still idle: a step starting from here began after now
    return True


def remember_idle(watch: LoopWatch, now: float, cpu: float | None, before: float) -> None:
    """A look at `now` saw the loop idle, its thread's CPU clock at `cpu`; the look before it was at `before`."""
    state = state_of(watch)
    if cpu is None or state.idle_cpu is None:
        state.last_ran = None  # (first seen idle: when its wait began is not known)
    elif cpu != state.idle_cpu:
        state.last_ran = (before, now)  # it ran since the last look, and waits again
    state.idle_t = now
    state.idle_cpu = cpu


def last_other(watch: LoopWatch, step: Step | None, came_back: bool, now: float) -> tuple[float, float | None]:
    # The last moment this loop was known to be doing something else than
    # the new step: the heartbeat's run, the previous step's last poll, or
    # the last idle poll.
    state = state_of(watch)
    if came_back:
        return state.beat_done, step.cpu_last if step is not None else None
    if step is not None:
        return step.t_last, step.cpu_last
    if state.idle_t:
        return state.idle_t, state.idle_cpu
    return now - sampling.idle_s(), None


def woke_at(ident: object, idle_since: float, now: float) -> float:
    """When an asyncio loop, idle at `idle_since`, woke to run the step of dispatch frame `ident` (0: not known).

    The loop's iteration (`BaseEventLoop._run_once`) notes the time right
    after its select returns, in a local. The watchdog looks at an idle loop
    only every `idle_interval_ms`, so the first step after a quiet spell is
    first seen up to that late: this bounds when it began. Loops written in C
    keep that time out of reach.
    """
    run_once = getattr(ident, "f_back", None)
    if run_once is None or run_once.f_code.co_name != "_run_once":
        return 0.0
    if run_once.f_globals.get("__name__") != "asyncio.base_events":
        return 0.0
    try:
        noted = run_once.f_locals.get("end_time")  # loop.time() + clock resolution
    except Exception:  # a frame's locals, read from another thread: never let it break a look
        return 0.0
    if not isinstance(noted, float):
        return 0.0
    woke = noted + _MONOTONIC_TO_PERF
    return woke if idle_since < woke <= now else 0.0


def last_seen(watch: LoopWatch) -> tuple[float, float | None]:
    # The last look that saw this loop (idle, or in a step), and its thread's CPU clock then.
    state = state_of(watch)
    step = state.step
    if step is not None and step.t_last > state.idle_t:
        return step.t_last, step.cpu_last
    return state.idle_t, state.idle_cpu


def tripped_at(watch: LoopWatch, idle_since: float, now: float) -> float:
    """When the loop, idle at `idle_since`, woke, as its tripwire saw it (0: not since; see _tripwire)."""
    tripped = state_of(watch).tripped
    return tripped if idle_since < tripped <= now else 0.0


# loop.time() is time.monotonic(); the watchdog's clock is perf_counter (the
# same clock on Linux; measured once for the others).
_MONOTONIC_TO_PERF = perf_counter() - monotonic()


def loop_came_back(watch: LoopWatch, now: float) -> bool:
    # The heartbeat sent while this root frame was running has run by the
    # look's snapshot at `now`: the loop iterated since, so what the snapshot
    # saw is a later step of the same task. Run after the snapshot, while the
    # look's reads let go of the GIL, it says nothing of that frame: taken
    # for a new step, a step held by a C call was cut where the late look
    # first saw it (sorted, 17-29 % short; pydantic's 27 % on uvloop). It is
    # kept for the next look.
    state = state_of(watch)
    done = state.beat_done
    if state.beat_posted and state.beat_posted <= done <= now:
        state.beat_posted = 0.0
        return True
    return False
