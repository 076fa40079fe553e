"""Reading a loop thread's stack: which step it is in, and what a sample of it holds.

The walk stops at the same edges as the audit hook's (`_interception.frames`):
the frame that dispatches a step on a loop written in Python, the one that
called into a loop written in C, or a core frame of the loop (idle, between
steps). A sample is the step's frames, innermost first, as (code, last
instruction) pairs: cheap to take and to count, turned into lines only when
a stall is reported.

May import: aiocop._interception, aiocop._model, aiocop._stalls.settings, aiocop._stalls.timing.
"""

from __future__ import annotations

import dis
from typing import TYPE_CHECKING

from aiocop._interception import frames as _frames
from aiocop._interception.frames import MAX_WALK, Kind
from aiocop._interception.internals import TRIO_RUN_MODULE  # trio's dispatch frame runs its own work too (below)
from aiocop._model import state as _state
from aiocop._stalls.settings import sampling
from aiocop._stalls.state import state_of
from aiocop._stalls.timing import CPU_BOUND_RATE

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import CodeType, FrameType

    from aiocop._interception.loops import LoopWatch
    from aiocop._stalls.timing import Step


def step_of(frame: FrameType, watch: LoopWatch, now: float) -> tuple[object, FrameType, FrameType] | None:
    """`(identity, root frame, innermost frame)` of the step the thread is in at `now`, or None if idle.

    The walk stops at the same edges as the audit hook's: a dispatch frame of
    a loop written in Python, the frame that called into a loop written in
    C, or a core frame of the loop (idle, between steps). aiocop's own steps
    are none of the loop's (`_is_own`).
    """
    base = watch.base_frame
    innermost = frame
    root: FrameType | None = None
    outer: FrameType | None = None  # the outermost frame that is not the loop's own (trio's dispatch: see below)
    f: FrameType | None = frame
    walked = 0
    while f is not None and walked < MAX_WALK:
        walked += 1
        kind = _frames.frame_kind(f)
        if kind == Kind.LOOP:
            module = f.f_globals.get("__name__")
            roles = _frames.LOOP_ROLES.get(module)  # type: ignore[arg-type]
            if roles is not None:
                role = roles.get(f.f_code.co_name)
                if role == "core":
                    return None
                if role == "dispatch":
                    if root is None or _is_own(root, watch, now):
                        return None
                    # trio runs its own work under this frame too, outside any
                    # task's step (I/O events, deadlines, its system tasks, the
                    # instruments), and aiocop's through it (a delivery at a
                    # step's end, the entry queue's run of the watchdog's
                    # callbacks): a step of the application's has a frame of
                    # its own above trio's, and is aiocop's if the outermost is.
                    if module == TRIO_RUN_MODULE and (
                        outer is None or outer.f_globals.get("__name__") in _OWN_STEP_MODULES
                    ):
                        return None
                    # asyncio's Handle._run is a new frame for every callback and
                    # task step: the best step identity there is. (A trio task's
                    # steps share its coroutine's frame, as a C loop's do: the
                    # heartbeat tells them apart.)
                    return (f if module == "asyncio.events" else root), root, innermost
        else:
            outer = f
        if f is base:
            return (root, root, innermost) if root is not None and not _is_own(root, watch, now) else None
        root = f
        f = f.f_back
    return None  # no edge found: the loop is not running on this thread any more


def _is_own(root: FrameType, watch: LoopWatch, now: float) -> bool:
    # aiocop's own step: a delivery running the slow-task callbacks, or the
    # watchdog's heartbeat. A slow callback is not the application's stall
    # (aiocop warns about it once, see _callbacks); reported, its report would
    # run the callback again, and stall again, for ever. A step whose
    # outermost frame is one of aiocop's decorators (`@raise_on_violations`
    # on a task's coroutine) is the application's.
    if in_tick(root):
        return not tick_held(watch, now)
    return root.f_globals.get("__name__") in _OWN_STEP_MODULES


def tick_held(watch: LoopWatch, now: float) -> bool:
    """Whether the loop-delay probe's tick under way had held the loop for `arm_after` (or the threshold) at `now`.

    A tick is aiocop's own step while it is short, as it should be (a
    histogram's `record`): a look that lands in one sees the loop idle. A
    tick that waits (on its metrics SDK's lock, held by an exporter) or
    works for longer holds the loop as any step would, and is one: a stall,
    or a hang, of aiocop's making, timed from the tick's start.
    """
    started = state_of(watch).probe_started
    return started is not None and now - started[0] >= tick_grace_s()


def tick_grace_s() -> float:
    """How long a tick is aiocop's own step: `arm_after`, or the threshold if that is sooner."""
    return min(sampling.arm_after_s(), _state.config.threshold_ms / 1000.0)


def in_tick(root: FrameType) -> bool:
    """Whether `root` is the loop-delay probe's tick."""
    return root.f_globals.get("__name__") == _PROBE_MODULE


# The loop-delay probe's tick (see `tick_held`). Always taken for a step, a
# look that landed in one looked every 4 ms for half a second after, one idle
# spell in twenty with the test suite running beside it (ticks take longer then).
_PROBE_MODULE = "aiocop._stalls.probe"

_OWN_STEP_MODULES = frozenset(
    {
        "aiocop._interception.trio_runs",  # a trio step's delivery, run by trio at the step's end
        "aiocop._reporting.delivery",
        "aiocop._model.callbacks",
        "aiocop._stalls.watchdog",  # its heartbeat
        "aiocop._stalls.discovery",  # its probe registering a loop
        "aiocop._stalls.tripwire",
    }
)


def entering(frame: FrameType) -> bool:
    """Whether `frame` stands at its entry or where it resumes (a `RESUME`; before 3.11, its start or a yield).

    There the eval loop checks for a waiting thread before the frame has run
    anything: the GIL held until then was held before the frame ran (by the
    loop, on one written in C), not by a call of the frame's.
    """
    lasti = frame.f_lasti
    if lasti < 0:
        return True
    code = frame.f_code.co_code
    return lasti < len(code) and code[lasti] in _ENTRY_OPS


_ENTRY_OPS = frozenset(
    dis.opmap[name] for name in ("RESUME", "YIELD_VALUE", "YIELD_FROM", "GEN_START") if name in dis.opmap
)


def stack_of(innermost: FrameType, root: FrameType) -> tuple[tuple[CodeType, int], ...]:
    """The step's frames from `innermost` up to its `root`, innermost first: a sample, not yet counted.

    Walked while the look holds the GIL it took the snapshot under: each
    frame's last instruction is read now, and a frame the loop's thread has
    returned from since keeps the one it returned at, under callers that
    have moved on (`Watchdog._poll_one` walks before any read that lets go).
    """
    frames: list[tuple[CodeType, int]] = []
    f: FrameType | None = innermost
    while f is not None and len(frames) < sampling.trace_depth:
        if _frames.frame_kind(f) != Kind.AIOCOP:
            frames.append((f.f_code, f.f_lasti))
        if f is root:
            break
        f = f.f_back
    if not frames:
        # Nothing but aiocop's frames: the probe's tick, held in a `record`
        # written in C. Named by the innermost, the probe's call of it.
        frames.append((innermost.f_code, innermost.f_lasti))
    return tuple(frames)


# A thread's share of a CPU between two samples below which its wait for a
# CPU is read (`sample`): on a quiet machine a spinning loop thread has it
# all, and is not read.
_WHOLE_CPU = 0.9


def full(step: Step) -> bool:
    """Whether `step` has all the samples it keeps."""
    return sum(step.samples.values()) >= sampling.max_samples_per_slice


def weigh_hold(step: Step, stack: tuple[tuple[CodeType, int], ...], now: float) -> None:
    """Weigh a late look's `stack` past the cap (`full`): the C call it waited on held the loop since the look before.

    Dropped as a sample beyond the cap, a 2.4 s `json.dumps` after 320 ms
    of Python code left the flame graphs only the Python code's stacks
    (review). Counted once where it is new, as a sample; no more stacks than
    twice the cap are kept, whatever a step's length.
    """
    weighed = step.sample_s
    if stack in weighed or len(weighed) < 2 * sampling.max_samples_per_slice:
        step.samples.setdefault(stack, 1)
        weighed[stack] = weighed.get(stack, 0.0) + max(0.0, now - (step.weighed_t or step.known_since()))
    step.weighed_t = now


def sample(
    step: Step,
    stack: tuple[tuple[CodeType, int], ...],
    now: float,
    cpu: float | None,
    queued: Callable[[], tuple[float, int] | None] | None = None,
    runnable: Callable[[], bool | None] | None = None,
) -> None:
    """Count `stack` (`stack_of`), taken at `now`, as one of `step`'s samples, waiting or working.

    `queued` reads how long its thread has waited for a CPU so far, and how
    many times it was given one (sched.queued); `runnable`, whether it is
    runnable now (sched.runnable). Called only where the CPU clock says the
    thread had less than a whole CPU.

    The sample stands for the loop time since the sample before (for the
    step's first, since the step is known to have run: `Step.known_since`),
    which `step.sample_s` adds up per stack. The looks come at a steady
    pace while Python code runs, so this weighs stacks as their counts do;
    not where one C call held the GIL: the watchdog's thread, kept out, looks
    once at its end, and that late look's stack stands for the whole hold,
    not for one look's worth of it (the flame graphs draw stacks by it:
    _reporting/flame.py).
    """
    step.samples[stack] = step.samples.get(stack, 0) + 1
    weighed = step.sample_s
    weighed[stack] = weighed.get(stack, 0.0) + max(0.0, now - (step.weighed_t or step.known_since()))
    step.weighed_t = now
    # Waiting or working at this sample: did the thread's CPU clock move
    # since the previous one (or since the step was first seen)? Time it
    # spent runnable but kept off the CPUs by other processes (`queued`)
    # counts as working: a spin on a busy machine is no wait. Read only
    # where the thread had less than a whole CPU: the read lets go of the
    # GIL, and a loop thread spinning in Python takes it and keeps it a
    # switch interval (5 ms) before the watchdog can end its look, and again
    # before the next: read at every sample, the looks around a 45 ms stall
    # among 12 ms steps came 8 to 30 ms apart on a quiet machine, and half
    # such stalls were missed (87.5 % of them seen without the read, 34 %
    # with it, in one run). Read also where the clock moved less than a
    # whole CPU's worth, so that the next sample has a reading to count from
    # (a starved spin's samples alternate between the two). A sample with no
    # earlier reading is told by the clock.
    told: tuple[float, int] | None = None
    if cpu is not None and step.sample_cpu is not None and now > step.sample_t:
        gap = now - step.sample_t
        worked = cpu - step.sample_cpu
        if worked < _WHOLE_CPU * gap and queued is not None:
            told = queued()
        before = step.sample_queued
        if worked < CPU_BOUND_RATE * gap and told is not None and before is not None:
            worked += told[0] - before[0]
            # Linux adds a wait for a CPU to the queued time only as the
            # thread gets one: a thread never given a CPU through the whole
            # gap shows neither. Blocked (a wait) or runnable all along but
            # kept off the CPUs (a starved spin: every sample of three read
            # "waiting" with six `yes` processes beside them): its state now
            # says which. Not where it was given a CPU meanwhile: a thread
            # waiting for the GIL wakes every switch interval to ask, and is
            # made runnable by this very read letting go of the GIL.
            if worked < CPU_BOUND_RATE * gap and told[1] == before[1] and runnable is not None and runnable():
                worked = gap
        if worked < CPU_BOUND_RATE * gap:
            step.waiting[stack] = step.waiting.get(stack, 0) + 1
    step.sample_t, step.sample_cpu, step.sample_queued = now, cpu, told
