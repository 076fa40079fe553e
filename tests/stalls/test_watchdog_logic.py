"""The watchdog's and the hang reporter's decisions, against scripted looks and clocks (issue 36).

The end-to-end tests (test_watchdog.py, test_hangs.py, test_tripwire.py)
run real loops in real time, and a busy machine can delay any look. Here
every input of a decision is given: the stack a look sees (real frames of a
real asyncio iteration, captured once: tests/support/scripted.py), the time of the
look and the loop thread's CPU clock then. Nothing sleeps, no thread runs,
no real clock is read where a decision depends on it: each test passes or
fails the same on any machine, on every Python.

Times are seconds on the watchdog's clock, around 100.0; CPU clocks around
1.0. Durations are compared to a nanosecond.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import inspect
import logging
import sys
import threading
from collections import deque
from types import GeneratorType, SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest

from aiocop._interception import loops as _loops
from aiocop._model import callbacks as _callbacks
from aiocop._model import state as _state
from aiocop._reporting import hangs as _hangs
from aiocop._reporting.sink import SINK
from aiocop._stalls import stacks as _stacks
from aiocop._stalls import timing as _timing
from aiocop._stalls import tripwire as _tripwire
from aiocop._stalls import watchdog as _watchdog
from aiocop._stalls.attribution import Stall, StalledTask, _line
from aiocop._stalls.settings import sampling
from aiocop._stalls.timing import Step
from tests.support.scripted import Frames, StubLoop, asyncio_frames, c_loop_frames, watch_of

if TYPE_CHECKING:
    from collections.abc import Callable, Generator, Iterator
    from types import FrameType

    from typing_extensions import TypeVarTuple, Unpack

    Ts = TypeVarTuple("Ts")  # call_soon_threadsafe's arguments, as typeshed types them

    from tests.support.scripted import ScriptedWatch


def near(value: float) -> Any:
    return pytest.approx(value, abs=1e-9)


class Recorded:
    """What the watchdog handed on: stalls (finished steps) and hang reports (steps still running)."""

    def __init__(self) -> None:
        self.stalls: list[Stall] = []
        # (report number, the step's age at the look, hung_s) for each hang report
        self.hangs: list[tuple[int, float, float]] = []
        # What the loop thread's schedstat tells at a sample: seconds it waited for a CPU, and the times it
        # was given one (None: not told).
        self.queued: tuple[float, int] | None = None
        # And its state: whether it is runnable (None: not told).
        self.runnable: bool | None = None

    def hang(self, watch: object, step: Step, innermost: FrameType, now: float) -> None:
        self.hangs.append((step.hangs, now - step.t_first, step.hung_s))


def use_sink(monkeypatch: pytest.MonkeyPatch, **fields: Any) -> None:
    """The watchdog's sink for one test: the one it has (the process's, if none), with `fields` replaced."""
    monkeypatch.setattr(_watchdog, "_sink", dataclasses.replace(_watchdog._sink or SINK, **fields))


@pytest.fixture
def rec(monkeypatch: pytest.MonkeyPatch) -> Recorded:
    """Settings as the defaults have them (30 ms threshold, arm after 15 ms, hang after 1 s), reports recorded."""
    recorded = Recorded()
    monkeypatch.setattr(_state.config, "threshold_ms", 30.0)
    monkeypatch.setattr(_state.config, "hang_after_ms", 1000.0)
    monkeypatch.setattr(_state, "active", True)
    monkeypatch.setattr(sampling, "arm_after_ms", None)  # half the threshold: 15 ms
    monkeypatch.setattr(sampling, "interval_ms", 10.0)
    monkeypatch.setattr(sampling, "idle_interval_ms", None)  # 100 ms
    monkeypatch.setattr(sampling, "max_samples_per_slice", 32)
    # No garbage collection of the watchdog's thread in the scripted gaps,
    # and loop.time() on the watchdog's clock (both process-wide otherwise).
    monkeypatch.setattr(_timing, "_pauses", deque(maxlen=32))
    monkeypatch.setattr(_timing, "_MONOTONIC_TO_PERF", 0.0)
    # The watchdog's sink: stalls and hangs recorded, no io event to take a stall.
    use_sink(monkeypatch, stall=recorded.stalls.append, attach_to_io=lambda watch, stall: False, hang=recorded.hang)
    monkeypatch.setattr(_watchdog, "_queued", lambda watch: recorded.queued)
    monkeypatch.setattr(_watchdog, "_runnable", lambda watch: recorded.runnable)
    return recorded


class Looks:
    """One loop, looked at by a fresh Watchdog at scripted times (the watchdog's per-loop look, `_poll_one`)."""

    def __init__(self, watch: ScriptedWatch | None = None) -> None:
        self.dog = _watchdog.Watchdog()  # (its thread is never started)
        self.watch = watch if watch is not None else watch_of()

    def at(self, now: float, cpu: float | None, frame: FrameType) -> bool:
        """A look at `now` that sees `frame` on top of the loop's thread, its CPU clock at `cpu`: in a step?"""
        return self.dog._poll_one(self.watch, frame, now, cpu)

    @property
    def step(self) -> Step:
        step = self.watch.watchdog.step
        assert step is not None
        return step


@pytest.fixture
def frames() -> Frames:
    # The iteration noted it woke at -1.0: before any look here (asyncio's note unused unless a test sets it).
    return asyncio_frames(steps=2, end_time=-1.0)


# --- timing.Step: a step's start and end from the looks and the CPU clock ------------------------


def step(t_prev: float, t_first: float, t_last: float, cpu_prev: float, cpu_first: float, cpu_last: float) -> Step:
    s = Step(object(), object(), t_first, t_prev, cpu_first, cpu_prev)  # type: ignore[arg-type]
    s.t_last, s.cpu_last = t_last, cpu_last
    return s


def test_cpu_bound_step_starts_where_the_cpu_clock_says(rec: Recorded) -> None:
    """A CPU-bound step's start is timed from the CPU it used before its first sighting, not guessed.

    Seen first at 100.010 having used 8 ms of CPU since the idle look at
    100.000, at full speed (10 ms of CPU in 10 ms between its two looks):
    it began at 100.002, not at the gap's middle (100.005).
    """
    s = step(100.000, 100.010, 100.020, 1.000, 1.008, 1.018)
    assert s.cpu_rate() == near(1.0)
    assert s.cpu_bound()
    assert s.start() == near(100.002)
    assert s.known_since() == near(100.002)  # known, not guessed: the stall is decided from here


def test_cpu_bound_step_shares_the_cpu(rec: Recorded) -> None:
    """Its thread getting half a CPU (the GIL shared), the CPU it used before is divided by that share.

    4 ms of CPU at half speed is 8 ms of wall time: it began at 100.002.
    """
    s = step(100.000, 100.010, 100.030, 1.000, 1.004, 1.014)
    assert s.cpu_rate() == near(0.5)
    assert s.start() == near(100.002)


def test_cpu_bound_start_never_before_the_last_look_that_did_not_see_it(rec: Recorded) -> None:
    """CPU used before the step (its loop's own work) cannot place its start before the look that saw it idle."""
    s = step(100.000, 100.010, 100.020, 1.000, 1.050, 1.060)
    assert s.start() == near(100.000)


def test_a_step_after_another_is_not_given_the_gap_between_them(rec: Recorded) -> None:
    """The CPU used between the last look at one step and the first at the next is shared by both, in unknown shares.

    Counted as all the new step's (before: a task making 12 ms steps back to
    back, at a 30 ms threshold, was a stall of 36 to 70 ms a dozen times in
    160 steps), it made each step as long as the gaps around it. The new
    step is timed from the gap's middle, or later if it cannot have used the
    gap's CPU by then; it is decided from its first sighting.
    """
    s = step(100.000, 100.020, 100.030, 1.000, 1.020, 1.030)  # the whole gap ran, at full speed
    s.after_other = True
    assert s.start() == near(100.010)
    assert s.known_since() == near(100.020)
    # 4 ms of CPU in the gap: began at 100.016 at the latest.
    late = step(100.000, 100.020, 100.030, 1.000, 1.004, 1.014)
    late.after_other = True
    assert late.start() == near(100.016)
    assert late.known_since() == near(100.020)


def test_a_step_found_over_in_another_keeps_none_of_the_gap_for_sure(rec: Recorded) -> None:
    """Found over at a look that saw another step, a step ends at the gap's middle (at most),
    known only to its last sighting."""
    s = step(100.000, 100.010, 100.020, 1.000, 1.010, 1.020)
    assert s.end(100.040, 1.040, by_other=True) == near(100.030)
    assert s.known_end(100.040, 1.040, by_other=True) == near(100.020)
    # Where it ended well before the look by the clock (2 ms of CPU in 20 ms), that is its end.
    assert s.end(100.040, 1.022, by_other=True) == near(100.022)
    # Found over with the loop idle: as timed (the clock tells its tail unless its thread ran through
    # the whole gap, maybe into the next steps, up to a look that saw the loop between two).
    assert s.known_end(100.040, 1.022) == near(100.022)
    assert s.known_end(100.040, 1.040) == near(100.030)


def test_waiting_step_is_timed_to_the_middle_of_the_gaps(rec: Recorded) -> None:
    """A step that waits (under a tenth of a CPU) shows nothing on the clock: each end is the middle of its gap."""
    s = step(100.000, 100.010, 100.050, 1.000, 1.0001, 1.0002)
    assert not s.cpu_bound()
    assert s.start() == near(100.005)
    assert s.end(100.060, 1.0003) == near(100.055)
    # Decisions rest on the first sighting, not on the guess before it.
    assert s.known_since() == near(100.010)


def test_cpu_bound_rate_boundary(rec: Recorded) -> None:
    """CPU_BOUND_RATE (a tenth of a CPU) is the line between working and waiting."""
    working = step(100.000, 100.010, 100.050, 1.000, 1.000, 1.00401)  # 4.01 ms of CPU in 40 ms
    assert working.cpu_bound()
    assert working.start() == near(100.010)  # (no CPU before the first sighting: began right then)
    waiting = step(100.000, 100.010, 100.050, 1.000, 1.000, 1.00399)
    assert not waiting.cpu_bound()
    assert waiting.start() == near(100.005)


def test_step_seen_once_has_no_rate(rec: Recorded) -> None:
    """One sighting gives no rate (no two looks in the step): timed as a wait, whatever its CPU clock did."""
    s = step(100.000, 100.010, 100.010, 1.000, 1.010, 1.010)
    assert s.cpu_rate() == 0.0
    assert s.start() == near(100.005)
    assert s.known_since() == near(100.010)


def test_step_after_a_quiet_spell_starts_from_when_the_loop_woke(rec: Recorded) -> None:
    """A step first seen long after the loop woke (`woke`: t_prev is the wake-up, not a look).

    The loop woke at 100.300; its thread ran 0.4 ms of CPU before the step
    began, and the step then waited: it began at 100.3004, not at the middle
    of the 100 ms gap, and is known to have run since then.
    """
    s = step(100.300, 100.400, 100.400, 1.000, 1.0004, 1.0004)
    s.woke = True
    assert s.start() == near(100.3004)
    assert s.known_since() == near(100.3004)
    # Without the wake-up, the same looks give the middle of the gap and a sighting.
    s.woke = False
    assert s.start() == near(100.350)
    assert s.known_since() == near(100.400)


def test_woke_start_never_after_the_first_sighting(rec: Recorded) -> None:
    s = step(100.300, 100.400, 100.400, 1.000, 1.200, 1.200)
    s.woke = True
    assert s.start() == near(100.400)


def test_cpu_bound_end_from_the_cpu_clock(rec: Recorded) -> None:
    """A CPU-bound step ends after its last sighting by the CPU its thread used since, at its pace."""
    s = step(100.000, 100.010, 100.050, 1.000, 1.010, 1.050)
    assert s.end(100.060, 1.053) == near(100.053)
    # Its thread ran through the whole gap: maybe into the next steps, up to
    # a look that saw the loop between two (not waiting): the gap's middle.
    assert s.end(100.060, 1.100) == near(100.055)
    assert s.end(100.060, None) == near(100.055)  # no CPU clock: the middle of the gap


def test_ends_told_by_the_loop_thread_win(rec: Recorded) -> None:
    """`began`/`ended` (noted by the probe's tick itself) override every estimate."""
    s = step(100.000, 100.010, 100.050, 1.000, 1.010, 1.050)
    s.began, s.ended = 100.001, 100.0525
    assert s.start() == 100.001
    assert s.known_since() == 100.001
    assert s.end(100.060, 1.053) == 100.0525


def test_watchdog_gc_pause_is_added_to_the_cpu_estimate(rec: Recorded) -> None:
    """While the watchdog's own thread collected garbage (holding the GIL), the loop thread could not run.

    4 ms of that pause inside the gap before the first sighting: the step
    began 4 ms earlier than its CPU alone says. Only the overlap with the gap counts.
    """
    _timing._pauses.append((99.990, 100.006))  # overlaps (100.000, 100.010) by 6 ms
    s = step(100.000, 100.010, 100.020, 1.000, 1.004, 1.014)
    assert s.start() == near(100.000)  # 4 ms of CPU + 6 ms of pause, from 100.010
    _timing._pauses.clear()
    _timing._pauses.append((100.003, 100.005))
    assert s.start() == near(100.004)


def test_note_gc_records_the_watchdog_threads_collections(rec: Recorded, monkeypatch: pytest.MonkeyPatch) -> None:
    readings = iter([100.003, 100.005])
    monkeypatch.setattr(_timing, "perf_counter", lambda: next(readings))
    _timing.note_gc("start")
    _timing.note_gc("stop")
    assert list(_timing._pauses) == [(100.003, 100.005)]
    _timing.note_gc("stop")  # a stop without its start: nothing
    assert len(_timing._pauses) == 1


def test_stall_of_carries_what_the_looks_saw(rec: Recorded) -> None:
    """The stall of a finished step: most frequent sample first, waiting if not CPU-bound, the top
    sample's waiting flag from whether at least half its sightings were idle on the CPU."""
    watch = watch_of()
    s = step(100.000, 100.010, 100.050, 1.000, 1.0001, 1.0002)
    a, b = ((step.__code__, 0),), ((near.__code__, 2),)
    s.samples = {a: 1, b: 4}
    s.sample_s = {a: 0.010, b: 0.040}
    s.waiting = {b: 2}
    s.hangs, s.hung_s = 2, 3.5
    stall = _timing.stall_of(s, 100.005, 100.055, watch)
    assert stall.samples == [(b, 4, 0.040), (a, 1, 0.010)]
    assert stall.waiting and stall.waiting_top
    assert (stall.start, stall.end, stall.seen_until) == (100.005, 100.055, 100.050)
    assert (stall.hang_reports, stall.hung_s) == (2, 3.5)
    s.waiting = {b: 1}
    assert not _timing.stall_of(s, 100.005, 100.055, watch).waiting_top


def test_held_tick_is_waiting_below_a_tenth_of_a_cpu(rec: Recorded) -> None:
    """A probe's tick that held the loop is reported whole, exact ends; waiting if it used < 10% CPU."""
    watch = watch_of()
    code = test_held_tick_is_waiting_below_a_tenth_of_a_cpu.__code__
    waited = _timing.held_tick(watch, (100.0, 1.0), 100.05, 1.004, code, None)
    assert (waited.start, waited.end, waited.waiting, waited.seen_until) == (100.0, 100.05, True, 100.05)
    worked = _timing.held_tick(watch, (100.0, 1.0), 100.05, 1.005, code, None)
    assert not worked.waiting


# --- the helpers: what a loop did between looks ----------------------------------------------------


def test_moved_discounts_the_probes_ticks(rec: Recorded) -> None:
    """An idle loop's CPU moved by no more than its probe ticks told is no activity; unknown clocks are."""
    assert not _timing.moved(1.000, 1.0015, 0.002)
    assert _timing.moved(1.000, 1.0025, 0.002)
    assert _timing.moved(1.000, 1.0015, 0.001)
    assert _timing.moved(None, 1.0, 0.0)
    assert _timing.moved(1.0, None, 0.0)


def test_remember_idle(rec: Recorded) -> None:
    """An idle look notes when and at what CPU; `last_ran` is the gap in which the thread last ran."""
    watch = watch_of()
    _timing.remember_idle(watch, 100.0, 1.0, 99.9)
    assert (watch.watchdog.idle_t, watch.watchdog.idle_cpu, watch.watchdog.last_ran) == (
        100.0,
        1.0,
        None,
    )  # first seen: wait start unknown
    _timing.remember_idle(watch, 100.1, 1.002, 100.0)
    assert watch.watchdog.last_ran == (100.0, 100.1)  # it ran between these looks, and waits again
    _timing.remember_idle(watch, 100.2, 1.002, 100.1)
    assert watch.watchdog.last_ran == (100.0, 100.1)  # still in that wait
    _timing.remember_idle(watch, 100.3, None, 100.2)
    assert watch.watchdog.last_ran is None


def test_last_other(rec: Recorded) -> None:
    """What a new step is timed from: the heartbeat's run, else the previous step's last look, else the idle look."""
    watch = watch_of()
    prev = step(100.0, 100.01, 100.05, 1.0, 1.01, 1.05)
    watch.watchdog.beat_done = 100.052
    assert _timing.last_other(watch, prev, True, 100.06) == (100.052, 1.05)
    assert _timing.last_other(watch, prev, False, 100.06) == (100.05, 1.05)
    watch.watchdog.idle_t, watch.watchdog.idle_cpu = 100.04, 1.04
    assert _timing.last_other(watch, None, False, 100.06) == (100.04, 1.04)
    watch.watchdog.idle_t = 0.0
    assert _timing.last_other(watch, None, False, 100.3) == (near(100.2), None)  # an idle interval back, guessed


def test_last_seen(rec: Recorded) -> None:
    watch = watch_of()
    watch.watchdog.idle_t, watch.watchdog.idle_cpu = 100.0, 1.0
    assert _timing.last_seen(watch) == (100.0, 1.0)
    watch.watchdog.step = step(100.0, 100.01, 100.05, 1.0, 1.01, 1.05)
    assert _timing.last_seen(watch) == (100.05, 1.05)


def test_loop_came_back_once_per_heartbeat(rec: Recorded) -> None:
    """The heartbeat posted in a step has run: the loop iterated. True once, then the heartbeat is spent."""
    watch = watch_of()
    watch.watchdog.beat_posted = 100.01
    assert not _timing.loop_came_back(watch, 100.03)
    watch.watchdog.beat_done = 100.02
    assert _timing.loop_came_back(watch, 100.03)
    assert watch.watchdog.beat_posted == 0.0
    assert not _timing.loop_came_back(watch, 100.03)


def test_loop_came_back_by_the_looks_snapshot_only(rec: Recorded) -> None:
    """A heartbeat run after the look's snapshot (while the look's reads let go of the GIL) says nothing
    of the frame the snapshot saw: no new step at this look, and the heartbeat kept for the next."""
    watch = watch_of()
    watch.watchdog.beat_posted = 100.01
    watch.watchdog.beat_done = 100.0301
    assert not _timing.loop_came_back(watch, 100.03)
    assert watch.watchdog.beat_posted == 100.01
    assert _timing.loop_came_back(watch, 100.04)


def test_tripped_at_window(rec: Recorded) -> None:
    """The tripwire's wake-up counts only inside (idle look, this look]."""
    watch = watch_of()
    watch.watchdog.tripped = 100.3
    assert _timing.tripped_at(watch, 100.0, 100.4) == 100.3
    assert _timing.tripped_at(watch, 100.0, 100.3) == 100.3
    assert _timing.tripped_at(watch, 100.3, 100.4) == 0.0  # before the idle look: an earlier wake-up
    assert _timing.tripped_at(watch, 100.0, 100.2) == 0.0


def test_woke_at_reads_asyncios_note_of_its_wake_up(rec: Recorded) -> None:
    """asyncio's iteration notes `end_time` as its select returns: the dispatch frame's caller holds it."""
    woke = asyncio_frames(steps=1, end_time=100.3)
    ident = woke.steps[0].f_back  # Handle._run, the step's identity
    assert _timing.woke_at(ident, 100.0, 100.4) == near(100.3)
    # Noted before the idle look (a millisecond: the note is loop.time() plus
    # the clock's resolution, which 3.15 adds in a way that lands past 100.3).
    assert _timing.woke_at(ident, 100.301, 100.4) == 0.0
    assert _timing.woke_at(ident, 100.0, 100.2) == 0.0  # after this look: a later iteration's
    # Not asyncio's _run_once (a loop of another kind, a stand-in named alike): not read.
    fake = SimpleNamespace(
        f_back=SimpleNamespace(
            f_code=SimpleNamespace(co_name="_run_once"), f_globals={"__name__": "x"}, f_locals={"end_time": 100.3}
        )
    )
    assert _timing.woke_at(fake, 100.0, 100.4) == 0.0
    assert _timing.woke_at(object(), 100.0, 100.4) == 0.0


def test_all_quiet(rec: Recorded, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cheap look: nothing can have started if no loop thread's CPU clock moved (and none is in a step)."""
    monkeypatch.setattr(_timing, "perf_counter", lambda: 100.5)
    watch = watch_of()
    watch.watchdog.idle_t, watch.watchdog.idle_cpu, watch.cpu_now = 100.0, 1.0, 1.0
    assert _timing.all_quiet({1: watch})
    assert watch.watchdog.idle_t == 100.5  # a step starting after this began after it
    watch.cpu_now = 1.0000001
    assert not _timing.all_quiet({1: watch})
    watch.cpu_now, watch.watchdog.own = 1.0, True  # in the probe's tick: it may be holding the loop
    assert not _timing.all_quiet({1: watch})
    watch.watchdog.own, watch.watchdog.idle_cpu = False, None
    assert not _timing.all_quiet({1: watch})


# --- the watchdog's look (Watchdog._poll_one), scripted ---------------------------------------


def test_look_sequence_cpu_bound_stall(rec: Recorded, frames: Frames) -> None:
    """Idle, a CPU-bound step seen three times, idle: one stall, its ends from the CPU clock.

    Seen at 100.010 with 8 ms of CPU since the idle look: began 100.002.
    At 100.020 (age 18 ms, past arm_after) its task is read and it is
    sampled; at 100.040 (age 38 ms) it is a stall; seen gone at 100.050
    having used 7 ms more: ended 100.047.
    """
    looks = Looks()
    a = frames.steps[0]
    assert not looks.at(100.000, 1.000, frames.idle)
    assert looks.at(100.010, 1.008, a)
    s = looks.step
    assert s.ident is a.f_back and s.root is a  # Handle._run is the identity, the callback the root
    assert s.task is None and not s.samples
    assert looks.at(100.020, 1.018, a)
    assert looks.step is s
    assert isinstance(s.task, StalledTask) and sum(s.samples.values()) == 1
    assert not s.stalled
    assert looks.at(100.040, 1.038, a)
    assert s.stalled and sum(s.samples.values()) == 2
    assert not rec.stalls
    assert not looks.at(100.050, 1.045, frames.idle)
    assert looks.watch.watchdog.step is None
    [stall] = rec.stalls
    assert (stall.start, stall.end) == (near(100.002), near(100.047))
    assert not stall.waiting
    assert stall.ident is a.f_back and stall.seen_until == 100.040
    assert stall.samples == [(((a.f_code, a.f_lasti),), 2, near(0.038))]  # 18 ms from its start, then 20 ms
    assert looks.watch.watchdog.last_ran == (100.040, 100.050)  # it ran since the look before, and waits again
    assert not rec.hangs


def test_look_sequence_waiting_stall(rec: Recorded, frames: Frames) -> None:
    """A step that waits, seen from 100.010 to 100.045 (35 ms from the first sighting): a stall timed by midpoints."""
    looks = Looks()
    a = frames.steps[0]
    looks.at(100.000, 1.000, frames.idle)
    looks.at(100.010, 1.0001, a)
    looks.at(100.030, 1.0001, a)
    assert not looks.step.stalled  # 20 ms since the first sighting
    looks.at(100.045, 1.0001, a)
    assert looks.step.stalled  # 35 ms
    looks.at(100.060, 1.0002, frames.idle)
    [stall] = rec.stalls
    assert (stall.start, stall.end) == (near(100.005), near(100.0525))
    assert stall.waiting


@pytest.mark.parametrize("machine", ["busy", "starved", "quiet", "untold"])
def test_a_spin_kept_off_the_cpus_by_a_busy_machine_is_working_not_waiting(
    rec: Recorded, frames: Frames, machine: str
) -> None:
    """Samples whose CPU clock stood still: waiting, unless the thread spent the time waiting for a CPU.

    A pure-Python spin on a machine whose cores other processes keep busy
    gets no CPU between some samples; its schedstat says it was runnable all
    along (issue 38: the quick start's spin was "waiting" under load). The
    first sample has no earlier reading to compare with: the CPU clock alone.
    """
    looks = Looks()
    a = frames.steps[0]
    looks.at(100.000, 1.000, frames.idle)
    looks.at(100.010, 1.008, a)
    for i, now in enumerate((100.020, 100.031, 100.042, 100.053)):  # sampled from 15 ms after the sighting
        # Busy: 10 of every 11 ms runnable but queued; starved: never given a CPU, runnable all along;
        # quiet: neither running nor queued, and blocked.
        rec.queued = {"busy": (0.010 * i, 40 + i), "starved": (0.001, 40), "quiet": (0.001, 40), "untold": None}[
            machine
        ]
        rec.runnable = {"busy": True, "starved": True, "quiet": False, "untold": None}[machine]
        looks.at(now, 1.008, a)
    looks.at(100.064, 1.009, frames.idle)
    [stall] = rec.stalls
    [(_stack, taken, _seconds)] = stall.samples
    assert taken == 3  # the first waiting by its CPU clock alone (no reading before it), when busy too
    working = machine in ("busy", "starved")
    assert stall.waiting_top is not working
    assert stall.culprit().startswith("waiting") is not working


def test_wait_not_seen_past_the_threshold_is_no_stall(rec: Recorded, frames: Frames) -> None:
    """A wait whose midpoint-timed length is 37.5 ms but that no look saw run for 30 ms is not reported.

    Its ends are guesses: only a sighting `threshold` after the first makes it one.
    """
    looks = Looks()
    a = frames.steps[0]
    looks.at(100.000, 1.000, frames.idle)
    looks.at(100.020, 1.000, a)
    looks.at(100.045, 1.000, a)  # 25 ms after the first sighting
    looks.at(100.050, 1.000, frames.idle)
    assert not rec.stalls


@pytest.mark.parametrize("armed_look", [True, False], ids=["seen-past-arm_after", "not-seen-past-arm_after"])
def test_cpu_bound_step_never_seen_stalled(rec: Recorded, frames: Frames, armed_look: bool) -> None:
    """A CPU-bound step whose clock-timed length reaches the threshold is a stall though no look saw it
    at the threshold: if a look saw it past arm_after (its task read then). Otherwise not reported."""
    looks = Looks()
    a = frames.steps[0]
    looks.at(100.000, 1.000, frames.idle)
    looks.at(100.010, 1.010, a)  # 10 ms of CPU since the idle look: began 100.000
    if armed_look:
        looks.at(100.025, 1.025, a)  # age 25 ms: task read, not yet a stall
    else:
        looks.at(100.012, 1.012, a)  # age 12 ms
    assert not looks.step.stalled
    looks.at(100.040, 1.034, frames.idle)  # ended at 100.034: 34 ms
    if armed_look:
        [stall] = rec.stalls
        assert (stall.start, stall.end) == (near(100.000), near(100.034))
    else:
        assert not rec.stalls


def test_short_cpu_bound_step_is_no_stall(rec: Recorded, frames: Frames) -> None:
    looks = Looks()
    a = frames.steps[0]
    looks.at(100.000, 1.000, frames.idle)
    looks.at(100.010, 1.010, a)
    looks.at(100.025, 1.025, a)
    looks.at(100.040, 1.028, frames.idle)  # ended 100.028: 28 ms
    assert not rec.stalls


def test_next_step_finishes_the_previous(rec: Recorded, frames: Frames) -> None:
    """Two steps back to back: the second's dispatch frame differs; the first is finished as it is seen,
    and the second is timed from the first's last sighting."""
    looks = Looks()
    a, b = frames.steps
    looks.at(100.000, 1.000, frames.idle)
    looks.at(100.010, 1.010, a)
    looks.at(100.050, 1.050, a)
    looks.at(100.060, 1.060, b)
    [stall] = rec.stalls
    # CPU-bound through the gap to b's first sighting: a's tail and b's head
    # shared it, in shares the clock cannot tell; each is given half.
    assert stall.ident is a.f_back and stall.end == near(100.055)
    s = looks.step
    assert s.ident is b.f_back and s.after_other
    assert (s.t_prev, s.cpu_prev) == (100.050, 1.050)


def test_short_steps_back_to_back_are_no_stall(rec: Recorded) -> None:
    """Three CPU-bound steps of 12 ms or less, back to back, looked at 6 and 19 ms apart: none is a stall.

    Each gap between the last look at one step and the first at the next
    used the thread's CPU all through: the first's tail and the next's head,
    in shares the clock cannot tell. Given to both (before), the gaps made a
    stall of 30 ms of the first and 49 ms of the second.
    """
    frames = asyncio_frames(steps=3, end_time=-1.0)
    a, b, c = frames.steps
    looks = Looks()
    looks.at(100.000, 1.000, frames.idle)
    for now, frame in ((100.005, a), (100.011, a), (100.030, b), (100.036, b), (100.060, c), (100.066, c)):
        looks.at(now, 1.000 + (now - 100.000), frame)  # the thread working all along
    looks.at(100.070, 1.070, frames.idle)
    assert rec.stalls == []


def test_a_long_step_between_short_ones_is_a_stall_timed_from_the_gaps_middles(rec: Recorded) -> None:
    """A 45 ms step between two short ones is still a stall: known from its first to its last sighting
    (40 ms), timed from the middle of the gap before it to the middle of the gap after."""
    frames = asyncio_frames(steps=3, end_time=-1.0)
    a, b, c = frames.steps
    looks = Looks()
    looks.at(100.000, 1.000, frames.idle)
    for now, frame in ((100.004, a), (100.008, a), (100.016, b), (100.036, b), (100.056, b), (100.064, c)):
        looks.at(now, 1.000 + (now - 100.000), frame)
    [stall] = rec.stalls
    assert stall.ident is b.f_back
    assert (stall.start, stall.end) == (near(100.012), near(100.060))


@pytest.mark.parametrize("how", ["tripwire", "asyncio"])
def test_first_step_after_a_quiet_spell_is_timed_from_the_wake_up(rec: Recorded, how: str) -> None:
    """The first step after the watchdog slept 400 ms is timed from when the loop woke (its tripwire,
    or asyncio's own note), so a look that comes late still sees it run for 100 ms: a stall at once."""
    frames = asyncio_frames(steps=1, end_time=100.300 if how == "asyncio" else -1.0)
    looks = Looks()
    a = frames.steps[0]
    looks.at(100.000, 1.000, frames.idle)
    if how == "tripwire":
        looks.watch.watchdog.tripped = 100.300
    looks.at(100.400, 1.0004, a)
    s = looks.step
    assert s.woke and s.t_prev == near(100.300)
    assert s.start() == near(100.3004)
    assert s.stalled  # seen once, 99.6 ms after it began


def test_first_step_without_a_wake_up_is_timed_from_its_sighting(rec: Recorded, frames: Frames) -> None:
    looks = Looks()
    looks.at(100.000, 1.000, frames.idle)
    looks.at(100.400, 1.0004, frames.steps[0])
    assert not looks.step.woke and not looks.step.stalled
    assert looks.step.start() == near(100.200)


def test_new_step_disarms_a_tripwire_that_did_not_trip(rec: Recorded, frames: Frames) -> None:
    """A step seen while the loop is still marked armed: the tripwire missed it, is not trusted again."""
    looks = Looks()
    looks.watch.watchdog.armed = True
    looks.at(100.000, 1.000, frames.idle)
    assert looks.watch.watchdog.armed
    looks.at(100.010, 1.001, frames.steps[0])
    assert not looks.watch.watchdog.armed


# --- hangs: the watchdog's decision and the reporter's state machine -------------------------


def hang_script(looks: Looks, frames: Frames, ages: list[float], t0: float = 100.0) -> None:
    """An idle look a quarter second before `t0`, then a waiting step first seen at `t0`, looked at at these ages."""
    a = frames.steps[0]
    looks.at(t0 - 0.25, 1.0, frames.idle)
    for age in [0.0, *ages]:
        looks.at(t0 + age, 1.0, a)


def test_hang_reports_at_hang_after_then_doubling(rec: Recorded, frames: Frames) -> None:
    """Looks every 250 ms for 20 s: reports at ages 1, 2, 4, 8, 16 s (hang_after, then twice as long each time)."""
    looks = Looks()
    hang_script(looks, frames, [k * 0.25 for k in range(1, 81)])
    assert [(n, age) for n, age, _ in rec.hangs] == [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 16.0)]
    # How long it had run at each report, from its start (the middle of 99.75..100.0).
    assert [hung for _, _, hung in rec.hangs] == [near(age + 0.125) for _, age, _ in rec.hangs]
    assert looks.step.hangs == 5 and looks.step.hang_next == 32.0
    assert not rec.stalls  # still running: no stall event yet


def stopped_look(looks: Looks, due: float, now: float, frame: FrameType, kept: tuple[float, int] | None) -> bool:
    # A look due at `due` that came at `now`; `kept`: what the watchdog's thread was told of its own
    # scheduling meanwhile (aiocop._stalls.sched: seconds it ran or waited for a CPU, times it was given one).
    dog = looks.dog
    dog._due, dog._kept, dog._kept_read, dog._pause_read = due, kept, True, False
    try:
        return looks.at(now, 1.0, frame)
    finally:
        dog._due, dog._kept, dog._kept_read, dog._pause_read = 0.0, None, False, False


def test_a_stopped_process_is_no_hung_loop(rec: Recorded, frames: Frames) -> None:
    """Issue 38: a step waiting since 100.0; the process stopped (SIGSTOP, then SIGCONT) 3 s: the look due at
    100.5 comes at 103.5, and the watchdog's thread neither ran nor woke meanwhile (1 ms, given a CPU once).
    Not a hang (hang_after 1 s): the step's age less the 3 s stopped is 0.5 s. It hangs once it has run 1 s
    besides the pause, and its report's time leaves the pause out."""
    looks = Looks()
    a = frames.steps[0]
    looks.at(99.75, 1.0, frames.idle)
    for t in (100.0, 100.25):
        looks.at(t, 1.0, a)
    stopped_look(looks, 100.5, 103.5, a, (0.001, 1))
    assert not rec.hangs and looks.step.paused_s == near(2.999)
    looks.at(103.75, 1.0, a)
    assert not rec.hangs
    looks.at(104.0, 1.0, a)
    assert [(n, age) for n, age, _ in rec.hangs] == [(1, 4.0)]
    assert rec.hangs[0][2] == near(104.0 - 99.875 - 2.999)  # from its start (mid 99.75..100.0), less the pause


@pytest.mark.parametrize(
    "kept",
    [(2.999, 60), (0.001, 600), None],
    ids=["waited-for-a-cpu", "woke-every-switch-interval", "not-told"],
)
def test_a_late_look_that_is_no_stop_leaves_the_hang_as_it_was(
    rec: Recorded, frames: Frames, kept: tuple[float, int] | None
) -> None:
    """The same late look, but the watchdog's thread waited for a CPU (a busy machine), or woke every switch
    interval (waiting for the GIL), or is not told (off Linux): the step's whole age counts, a hang at 103.5."""
    looks = Looks()
    a = frames.steps[0]
    looks.at(99.75, 1.0, frames.idle)
    for t in (100.0, 100.25):
        looks.at(t, 1.0, a)
    stopped_look(looks, 100.5, 103.5, a, kept)
    assert [(n, age) for n, age, _ in rec.hangs] == [(1, 3.5)] and looks.step.paused_s == 0.0


def test_hang_interval_counts_from_a_late_report(rec: Recorded, frames: Frames) -> None:
    """Looks that come late: each next report is due the interval after the late one, never sooner."""
    looks = Looks()
    hang_script(looks, frames, [0.75, 1.25, 2.0, 2.25, 4.0, 4.5, 8.25, 8.5])
    assert [age for _, age, _ in rec.hangs] == [1.25, 2.25, 4.5, 8.5]


def test_hang_interval_capped(rec: Recorded, frames: Frames, monkeypatch: pytest.MonkeyPatch) -> None:
    """The interval stops growing at _HANG_REPEAT_MAX_S (300 s).

    hang_after 100 s: reports at 100, 200, 400, 700, 1000 s.
    """
    monkeypatch.setattr(_state.config, "hang_after_ms", 100_000.0)
    looks = Looks()
    hang_script(looks, frames, [k * 50.0 for k in range(1, 23)])
    assert [age for _, age, _ in rec.hangs] == [100.0, 200.0, 400.0, 700.0, 1000.0]


def test_hung_step_gets_its_stall_once_when_it_ends(rec: Recorded, frames: Frames) -> None:
    """A hang ends: one stall event, carrying its hang reports; no hang report after, none for the next step."""
    looks = Looks()
    hang_script(looks, frames, [k * 0.25 for k in range(1, 13)])  # up to 3 s: reports at 1 and 2 s
    assert len(rec.hangs) == 2
    looks.at(103.25, 1.0, frames.idle)
    [stall] = rec.stalls
    assert (stall.hang_reports, stall.hung_s) == (2, near(2.125))
    assert (stall.start, stall.end) == (near(99.875), near(103.125))
    for k in range(14, 40):  # idle for longer than any interval: nothing more
        looks.at(100.0 + k * 0.25, 1.0, frames.idle)
    looks.dog.finish(looks.watch, 110.0, 1.0)  # the loop stops: nothing left to finish
    assert len(rec.stalls) == 1 and len(rec.hangs) == 2
    # The next step starts its own count.
    b = frames.steps[1]
    for k in range(7):
        looks.at(111.0 + k * 0.25, 1.0, b)
    assert rec.hangs[2][:2] == (1, 1.0)


def test_step_stopped_with_its_loop_reported_once(rec: Recorded, frames: Frames) -> None:
    """The loop stops while its hung step is the last: finished by the stop, not again by the next look."""
    looks = Looks()
    hang_script(looks, frames, [0.5, 1.0, 1.5])
    looks.dog.finish(looks.watch, 101.75, 1.0)
    assert len(rec.stalls) == 1 and rec.stalls[0].hang_reports == 1
    looks.dog._finish(looks.watch, 102.0, 1.0)
    assert len(rec.stalls) == 1


def test_stall_goes_to_its_io_event_once(rec: Recorded, frames: Frames, monkeypatch: pytest.MonkeyPatch) -> None:
    """One report per stall: a stall its step's io event takes (pending, or delivered already) is not reported alone."""
    taken: list[Stall] = []

    def attach_to_io(watch: object, stall: Stall) -> bool:
        taken.append(stall)
        return True

    use_sink(monkeypatch, attach_to_io=attach_to_io)
    looks = Looks()
    hang_script(looks, frames, [0.25])
    looks.at(100.5, 1.0, frames.idle)
    assert len(taken) == 1 and not rec.stalls
    # Its io event delivered before this look: the window covers the stall's middle, the same step.
    b = frames.steps[1]
    hang_script(looks, frames, [0.25], t0=101.0)  # (a's frame again: a new step, the watch was idle)
    looks.watch.watchdog.delivered(looks.step.ident, 100.9, 101.4)
    looks.at(101.5, 1.0, b)
    assert len(taken) == 1 and not rec.stalls


def test_no_hang_reports_when_off(rec: Recorded, frames: Frames, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_state.config, "hang_after_ms", None)
    looks = Looks()
    hang_script(looks, frames, [k * 0.25 for k in range(1, 81)])
    assert not rec.hangs and looks.step.stalled
    looks.at(120.5, 1.0, frames.idle)
    assert rec.stalls[0].hang_reports == 0


def test_step_ending_before_hang_after_is_no_hang(rec: Recorded, frames: Frames) -> None:
    looks = Looks()
    hang_script(looks, frames, [0.25, 0.5, 0.75])
    looks.at(101.0, 1.0, frames.idle)
    assert not rec.hangs and len(rec.stalls) == 1


def test_c_loop_step_needs_its_heartbeat_to_be_a_stall(rec: Recorded) -> None:
    """On a loop written in C a task's steps share their root: a step is proven stuck only by a heartbeat
    posted at its first sighting and not yet run. A loop that is not running gets none: never a stall."""
    base, inner = c_loop_frames()
    loop = StubLoop(running=False)
    looks = Looks(watch_of(loop, base))
    looks.at(100.000, 1.000, base)  # only the frame that called into the loop: idle
    assert looks.watch.watchdog.step is None
    for k in range(1, 12):
        looks.at(100.0 + k * 0.25, 1.0, inner)
    assert looks.step.ident is inner  # the root is the identity
    assert not loop.calls and not looks.step.stalled and not rec.hangs


def test_c_loop_heartbeat_splits_steps_sharing_a_root(rec: Recorded) -> None:
    """The heartbeat ran (the loop iterated) while the same root is seen again: a new step of the same
    task. The first ends no later than the heartbeat's run; the next is timed from it, with a new heartbeat."""
    base, inner = c_loop_frames()
    loop = StubLoop(running=True)
    looks = Looks(watch_of(loop, base))
    looks.at(100.000, 1.000, base)
    looks.at(100.010, 1.010, inner)
    assert len(loop.calls) == 1 and looks.watch.watchdog.beat_posted == 100.010  # posted at the first sighting
    looks.at(100.050, 1.050, inner)
    first = looks.step
    assert first.stalled  # proven: the heartbeat has not run
    looks.watch.watchdog.beat_done = 100.052  # (what the posted callback does on the loop's thread)
    looks.at(100.060, 1.055, inner)
    [stall] = rec.stalls
    assert (stall.start, stall.end) == (near(100.000), near(100.052))  # not 100.055, its CPU estimate
    second = looks.step
    assert second is not first and (second.t_prev, second.cpu_prev) == (100.052, 1.050)
    assert len(loop.calls) == 2 and looks.watch.watchdog.beat_posted == 100.060


def test_c_loop_heartbeat_run_after_a_late_looks_snapshot_leaves_the_held_step_whole(rec: Recorded) -> None:
    """uvloop: the late look sees the held step once (heartbeat posted); the next look, kept out again
    (its result freed), sees the same root at 100.300, and its reads let go of the GIL: the loop's thread
    finishes the step and runs the heartbeat at 100.3003, after the snapshot. Still the same step (taken
    for a new one, the stall was cut at the first sighting, 100.150: 17-29 % short); it ends at the
    heartbeat, as the next look finds the loop idle."""
    base, inner = c_loop_frames()
    loop = StubLoop(running=True)
    looks = Looks(watch_of(loop, base))
    looks.at(100.000, 1.000, base)
    assert late_look(looks, 100.004, 100.150, 1.1495, 0.1500, inner)
    first = looks.step
    assert first.held == near(100.0005) and len(loop.calls) == 1
    looks.watch.watchdog.beat_done = 100.3003  # (run on the loop's thread during this look's reads)
    assert late_look(looks, 100.154, 100.300, 1.2995, 0.1500, inner)
    assert looks.step is first and first.t_last == 100.300
    assert not looks.at(100.305, 1.2996, base)
    [stall] = rec.stalls
    assert (stall.start, stall.end) == (near(100.0005), near(100.3001))


def test_hang_report_content(rec: Recorded, frames: Frames, monkeypatch: pytest.MonkeyPatch) -> None:
    """hangs.report: what a report holds, taken at the look (handed to the reporter thread, stubbed here)."""
    submitted: list[_hangs.Hang] = []
    monkeypatch.setattr(_hangs, "reporter", SimpleNamespace(submit=submitted.append))
    use_sink(monkeypatch, hang=_hangs.report)
    looks = Looks()
    hang_script(looks, frames, [0.5, 1.0])
    [hang] = submitted
    a = frames.steps[0]
    assert hang.number == 1 and hang.elapsed_s == near(1.125) and hang.waiting
    assert hang.stack == ((a.f_code, a.f_lasti),)  # up to the step's root, no further
    assert hang.watch is looks.watch and hang.task is looks.step.task
    assert (hang.blocker, hang.wrapped, hang.provided, hang.found_group) == ("", "", None, False)
    event = _hangs.build_event(hang)
    assert (event.reason, event.ongoing, event.hang_reports) == ("hang", True, 1)
    assert event.elapsed_ms == event.hung_ms == near(1125.0)
    assert event.exceeded_threshold and event.threshold_ms == 30.0
    # Paused (deactivate()): the watchdog still counts it, nothing is reported.
    monkeypatch.setattr(_state, "active", False)
    looks.at(102.0, 1.0, a)
    assert len(submitted) == 1 and looks.step.hangs == 2


def test_hang_context_runs_providers_only_for_a_step_with_no_blocking_call(
    rec: Recorded, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = StalledTask(None, contextvars.Context(), True)
    hang = _hangs.Hang(watch_of(), task, (), False, 1.0, 1, None, False, "", "", "")
    monkeypatch.setattr(_callbacks, "providers", ())
    assert _hangs._context(hang) == {}
    monkeypatch.setattr(_callbacks, "providers", (lambda: {"request": "r1"},))
    assert _hangs._context(hang) == {"request": "r1"}
    hang.provided = {"request": "r0"}
    assert _hangs._context(hang) == {"request": "r0"}  # what they returned at the step's first blocking call


def test_reporter_queue_drops_the_oldest(rec: Recorded) -> None:
    """At most _MAX_QUEUED reports wait: the oldest go first (a later report of a hang is fresher)."""
    reporter = _hangs._Reporter()
    reporter._thread = object()  # type: ignore[assignment]  # (a thread "already running": none is started)
    for n in range(_hangs._MAX_QUEUED + 6):
        reporter.submit(n)  # type: ignore[arg-type]
    assert reporter.dropped == 6
    queued: list[object] = list(reporter._queue)  # the numbers submitted in place of hangs
    assert queued == list(range(6, _hangs._MAX_QUEUED + 6))


def test_reporter_logs_a_stuck_callback_once_per_run(
    rec: Recorded, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    now = [105.0]
    monkeypatch.setattr(_hangs, "perf_counter", lambda: now[0])
    reporter = _hangs._Reporter()
    reporter._thread = object()  # type: ignore[assignment]
    reporter._busy_since = 100.0
    with caplog.at_level(logging.ERROR, logger="aiocop"):
        reporter.submit(0)  # type: ignore[arg-type]  # 5 s: not yet
        now[0] = 110.5
        reporter.submit(1)  # type: ignore[arg-type]
        reporter.submit(2)  # type: ignore[arg-type]
        reporter._busy_since, now[0] = 111.0, 121.5  # the next callback's run, stuck too
        reporter.submit(3)  # type: ignore[arg-type]
    stuck = [r for r in caplog.records if "has been running" in r.getMessage()]
    assert len(stuck) == 2


def test_blocked_by_loop(rec: Recorded, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a metrics exporter reads: a loop's current step counts once it is a stall, until it is reported."""
    monkeypatch.setattr(_hangs, "perf_counter", lambda: 105.0)
    watch = watch_of()
    monkeypatch.setattr(_loops, "watches", {1: watch})
    key = ("tests.support.scripted.StubLoop", watch.thread_name)
    assert _hangs.blocked_by_loop() == {key: 0.0}
    watch.watchdog.step = step(99.0, 100.0, 104.0, 1.0, 1.0, 1.0)
    assert _hangs.blocked_by_loop() == {key: 0.0}  # not a stall (yet)
    watch.watchdog.step.stalled = True
    assert _hangs.blocked_by_loop() == {key: near(5.5)}
    watch.watchdog.step.merged = True
    assert _hangs.blocked_by_loop() == {key: 0.0}


# --- the tripwire's decisions --------------------------------------------------------------------


def test_in_place_and_guards(rec: Recorded) -> None:
    """An armed loop is guarded only once its tripwire is in place and a look has seen it idle since."""
    watch = watch_of()
    assert _tripwire.in_place(watch) and not _tripwire.guards(watch)  # not armed: nothing to wait for
    watch.watchdog.armed = True
    assert not _tripwire.in_place(watch)  # the arming callback has not run yet
    watch.watchdog.tripwire_set = 100.0
    watch.watchdog.idle_t = 99.9
    assert not _tripwire.in_place(watch)  # no idle look since: a step may have begun before it was set
    watch.watchdog.idle_t = 100.0
    assert not _tripwire.in_place(watch)  # (strictly after)
    watch.watchdog.idle_t = 100.1
    assert _tripwire.in_place(watch) and _tripwire.guards(watch)


def test_step_seen_disarms_except_in_aiocops_own_callback(rec: Recorded) -> None:
    watch = watch_of()
    watch.watchdog.armed, watch.watchdog.own = True, True
    _tripwire.step_seen(watch)
    assert watch.watchdog.armed  # the probe's tick: no step of the loop's
    watch.watchdog.own = False
    _tripwire.step_seen(watch)
    assert not watch.watchdog.armed


class ArmableLoop(asyncio.SelectorEventLoop):
    """A real asyncio loop, never run: it reads as running, and thread-safe calls are recorded, not sent."""

    def __init__(self) -> None:
        self.pretend_running = False
        super().__init__()
        self.calls: list[tuple[Any, tuple[Any, ...]]] = []
        self.pretend_running = True

    def is_running(self) -> bool:
        return self.pretend_running

    def call_soon_threadsafe(
        self, callback: Callable[[Unpack[Ts]], object], *args: Unpack[Ts], context: contextvars.Context | None = None
    ) -> Any:
        self.calls.append((callback, args))


@pytest.fixture
def armable(monkeypatch: pytest.MonkeyPatch) -> Iterator[ArmableLoop]:
    loop = ArmableLoop()
    monkeypatch.setattr(_tripwire, "perf_counter", lambda: 200.0)
    monkeypatch.setattr(_tripwire, "thread_time", lambda: 5.0)
    yield loop
    loop.pretend_running = False
    loop.close()


def test_arm_decisions(rec: Recorded, armable: ArmableLoop) -> None:
    """arm(): a loop that can be armed gets one callback; a loop not running, or left unarmable, gets none."""
    watch = watch_of(armable)
    woken: list[int] = []
    assert _tripwire.arm(watch, lambda: woken.append(1))
    assert watch.watchdog.armed and [c for c, _ in armable.calls] == [_tripwire._install]
    assert _tripwire.arm(watch, lambda: None) and len(armable.calls) == 1  # idempotent while armed
    stub = watch_of(StubLoop(running=True))
    # A loop that is not asyncio's (written in C): armed with a profile function up to 3.11, never from 3.12.
    assert _tripwire.can_arm(stub) is _tripwire.PROFILE
    idle = watch_of(StubLoop(running=False))
    assert _tripwire.arm(idle, lambda: None) is _tripwire.PROFILE and not idle.watchdog.armed
    watch.watchdog.unarmable = True
    assert not _tripwire.can_arm(watch)


def _apps_callback() -> None:
    pass


@pytest.mark.parametrize(
    "pending",
    ["nothing", "own-ready", "own-timer-due", "app-timer-later", "app-ready", "app-timer-due", "cancelled-app-ready"],
)
def test_select_tripwire(rec: Recorded, armable: ArmableLoop, monkeypatch: pytest.MonkeyPatch, pending: str) -> None:
    """3.12+ (and any asyncio loop): the selector's select, wrapped, trips only when what the loop will
    run next is the application's: a ready callback or a due timer not of aiocop's own."""
    monkeypatch.setattr(_tripwire, "PROFILE", False)
    watch = watch_of(armable)
    woken: list[int] = []
    _tripwire.arm(watch, lambda: woken.append(1))
    [(install, args)] = armable.calls
    install(*args)  # the arming callback, run "on the loop's thread"
    selector = armable._selector  # type: ignore[attr-defined]
    assert watch.watchdog.armed and watch.watchdog.tripwire_set == 200.0 and "select" in vars(selector)
    own = _tripwire.step_seen  # a function of aiocop's tripwire module: its own
    if pending == "own-ready":
        armable.call_soon(own, watch)
    elif pending == "own-timer-due":
        armable.call_at(armable.time() - 1.0, own, watch)
    elif pending == "app-timer-later":
        armable.call_at(armable.time() + 3600.0, _apps_callback)
    elif pending == "app-ready":
        armable.call_soon(_apps_callback)
    elif pending == "app-timer-due":
        armable.call_at(armable.time() - 1.0, _apps_callback)
    elif pending == "cancelled-app-ready":
        armable.call_soon(_apps_callback).cancel()
    monkeypatch.setattr(_tripwire, "perf_counter", lambda: 201.0)
    assert selector.select(0) == []
    trips = pending.startswith(("app-ready", "app-timer-due"))
    assert watch.watchdog.armed is not trips
    assert woken == ([1] if trips else [])
    assert watch.watchdog.tripped == (201.0 if trips else 0.0)
    assert ("select" in vars(selector)) is not trips  # removed as it trips


@pytest.mark.skipif(not _tripwire.PROFILE, reason="the profile-function tripwire is used up to 3.11 only")
class TestProfileTripwire:
    """Up to 3.11: a profile function on the loop's thread, driven here event by event with scripted clocks."""

    @pytest.fixture
    def tripwire(self, monkeypatch: pytest.MonkeyPatch) -> tuple[ScriptedWatch, list[float], list[int]]:
        clock = [200.0, 5.0]  # [perf_counter, thread_time]
        monkeypatch.setattr(_tripwire, "perf_counter", lambda: clock[0])
        monkeypatch.setattr(_tripwire, "thread_time", lambda: clock[1])
        watch = watch_of()
        watch.watchdog.armed = True
        woken: list[int] = []
        try:
            assert _tripwire._set_profile(watch.watchdog, lambda: woken.append(1), 5.0)
        finally:
            sys.setprofile(None)  # driven by hand below, not by this thread's own events
        return watch, clock, woken

    def test_trips_at_the_first_app_frame_after_a_sleep(self, rec: Recorded, frames: Frames, tripwire: Any) -> None:
        watch, clock, woken = tripwire
        loops_own = frames.idle.f_back  # asyncio's _run_once
        fn = watch.watchdog.tripwire
        clock[0] += 0.5  # 500 ms off the CPU: the thread slept in its selector
        fn(loops_own, "return", None)
        assert watch.watchdog.armed and not woken  # the loop's own frame: it woke, nothing of the app's yet
        clock[0] += 0.001
        clock[1] += 0.001
        fn(frames.steps[0], "call", None)
        assert not watch.watchdog.armed and woken == [1]
        assert watch.watchdog.tripped == 200.5  # timed from the wake-up, not from this event

    def test_app_frame_without_a_sleep_does_not_trip(self, rec: Recorded, frames: Frames, tripwire: Any) -> None:
        watch, clock, woken = tripwire
        clock[0] += 0.001
        clock[1] += 0.001  # on its CPU all along: not a wake-up
        watch.watchdog.tripwire(frames.steps[0], "call", None)
        assert watch.watchdog.armed and not woken

    def test_own_callback_passes(self, rec: Recorded, frames: Frames, tripwire: Any) -> None:
        watch, clock, woken = tripwire
        clock[0] += 0.5
        watch.watchdog.own = True
        watch.watchdog.tripwire(frames.steps[0], "call", None)
        assert watch.watchdog.armed and not woken

    def test_busy_loop_trips_after_max_events(self, rec: Recorded, frames: Frames, tripwire: Any) -> None:
        watch, clock, woken = tripwire
        loops_own = frames.idle.f_back
        for _ in range(_tripwire._MAX_EVENTS - 8):
            clock[0] += 0.00001
            clock[1] += 0.00001
            watch.watchdog.tripwire(loops_own, "call", None)
        assert watch.watchdog.armed
        for _ in range(8):
            watch.watchdog.tripwire(loops_own, "call", None)
        assert not watch.watchdog.armed and woken == [1]
        assert watch.watchdog.tripped == clock[0]  # no wake-up seen: tripped now


def test_probe_tick_too_young_is_no_step(rec: Recorded, monkeypatch: pytest.MonkeyPatch) -> None:
    """A look landing in the loop-delay probe's tick: aiocop's own step while younger than arm_after;
    past that, a step of the loop's, timed from the tick's own start."""
    base, inner = c_loop_frames()
    monkeypatch.setattr(_stacks, "in_tick", lambda root: root is inner)
    watch = watch_of(None, base)
    looks = Looks(watch)
    watch.watchdog.probe_started = (100.000, 1.000)
    watch.watchdog.own = True
    looks.at(100.010, 1.010, inner)  # 10 ms: the probe's own
    assert watch.watchdog.step is None and looks.dog._tick_due == near(100.015)
    looks.at(100.020, 1.020, inner)
    s = looks.step
    assert s.began == 100.000 and s.start() == 100.000 and s.cpu_prev == 1.000


# --- a step whose C call held the GIL (issue 37) -------------------------------------------------
#
# The watchdog's thread needs the GIL to look. A C call that never releases it
# (json.dumps, a backtracking regex, sum(range(...))) keeps the watchdog out
# until it returns; the eval loop then hands the GIL over at the call's return,
# and the look sees the step at the calling line, for the first time, late.
# Scripted: the look was due at `due` (the watchdog's sleep's planned end) and
# came at `now`; the loop thread's CPU clock moved by `ran` since its last
# look, the process's but the watchdog's by `proc` (the loop's and everyone else's).


def late_look(
    looks: Looks,
    due: float,
    now: float,
    cpu: float,
    proc: float,
    frame: FrameType,
    kept: tuple[float, int] | None = None,
) -> bool:
    # `kept`: what the watchdog's thread was told of its own scheduling since its last look (_sched).
    looks.dog._due = due
    looks.dog._proc_ran = proc
    looks.dog._kept = kept
    looks.dog._kept_read = True  # (scripted: not read from /proc)
    try:
        return looks.at(now, cpu, frame)
    finally:
        looks.dog._due = 0.0  # (the next looks on time)
        looks.dog._proc_ran = None
        looks.dog._kept = None
        looks.dog._kept_read = False


def test_held_from_decision(rec: Recorded, monkeypatch: pytest.MonkeyPatch) -> None:
    """`timing.held_from`: late by 3 switch intervals, the loop's thread ran (a tenth of a CPU or more), nobody else.

    Its start: where its CPU clock puts it at full speed, or the moment the
    watchdog asked for the GIL if that is earlier (the thread got less than a
    CPU), never before the loop's last look.
    """
    monkeypatch.setattr(sys, "getswitchinterval", lambda: 0.005)
    held = _timing.held_from
    # Quiet machine: 299.5 ms of CPU in a look 296 ms late: began at 100.0005.
    assert held(100.004, 100.300, 100.000, 1.000, 1.2995, 0.001) == near(100.0005)
    # Loaded machine (a fifth of a CPU): no later than the watchdog asked.
    assert held(100.004, 100.300, 100.000, 1.000, 1.060, 0.001) == near(100.004)
    # Never before the loop's last look.
    assert held(100.004, 100.300, 100.010, 1.000, 1.2995, 0.001) == near(100.010)
    # Late by less than 3 switch intervals (15 ms): a GIL handed over as usual.
    assert held(100.004, 100.0189, 100.000, 1.000, 1.0189, 0.0) == 0.0
    assert held(100.004, 100.0191, 100.000, 1.000, 1.0191, 0.0) == near(100.000)
    # Nobody ran: a paused process, a machine that starved every thread.
    assert held(100.004, 100.300, 100.000, 1.000, 1.029, 0.0) == 0.0
    # Another thread ran too (a quarter of what the loop's did, plus 2 ms, at most): the GIL was shared.
    assert held(100.004, 100.300, 100.000, 1.000, 1.200, 0.0521) == 0.0
    assert held(100.004, 100.300, 100.000, 1.000, 1.200, 0.0519) == near(100.004)
    # A clock not read: nothing is known.
    assert held(100.004, 100.300, 100.000, None, 1.200, 0.0) == 0.0
    assert held(100.004, 100.300, 100.000, 1.000, 1.200, None) == 0.0


def test_held_from_decision_where_the_watchdog_knows_why_it_was_late(
    rec: Recorded, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Linux: the watchdog's own schedstat (`kept`: its time running or waiting for a CPU, and how many
    times it got one) replaces the loop thread's share of the delay, which a busy machine pushes below a
    tenth: it was blocked on the GIL for 3 switch intervals, woke every 4 of them at least (a stopped
    process does not wake), and the loop's thread ran 3 of them (Python code hands the GIL over within one).
    """
    monkeypatch.setattr(sys, "getswitchinterval", lambda: 0.005)
    held = _timing.held_from
    # Eight threads wanting two cores: the loop's thread got 7 % of a CPU; the watchdog woke 50 times.
    assert held(100.004, 100.300, 100.000, 1.000, 1.020, 0.001, (0.100, 50)) == near(100.004)
    assert held(100.004, 100.300, 100.000, 1.000, 1.020, 0.001) == 0.0  # (the share alone: too little)
    # Late because the watchdog's thread waited for a CPU, not for the GIL (blocked 6 ms).
    assert held(100.004, 100.300, 100.000, 1.000, 1.020, 0.001, (0.290, 3)) == 0.0
    # Stopped (SIGSTOP): 286 ms blocked, and it woke twice.
    assert held(100.004, 100.300, 100.000, 1.000, 1.020, 0.001, (0.010, 2)) == 0.0
    assert held(100.004, 100.300, 100.000, 1.000, 1.020, 0.001, (0.010, 15)) == near(100.004)
    # The loop's thread ran less than 3 switch intervals: Python code preempted while it held the GIL.
    assert held(100.004, 100.300, 100.000, 1.000, 1.0149, 0.001, (0.100, 50)) == 0.0
    assert held(100.004, 100.300, 100.000, 1.000, 1.0151, 0.001, (0.100, 50)) == near(100.004)
    # Another thread ran as much: the GIL was shared, whatever the watchdog was told.
    assert held(100.004, 100.300, 100.000, 1.000, 1.020, 0.010, (0.100, 50)) == 0.0


def test_held_from_counts_only_the_cpu_a_busy_loop_used_after_the_watchdog_asked(
    rec: Recorded, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loop in a step at its last look may have run Python code all the way to the watchdog's ask: only the CPU
    beyond that (`asked - seen`) shows a C call holding the GIL. Python code hands the GIL over within a switch
    interval of running; one whose thread a busy machine preempted while it held the GIL kept the watchdog out as
    long, and was taken for a hold (5 ms steps reported as 31-49 ms stalls with two `yes` beside the tests)."""
    monkeypatch.setattr(sys, "getswitchinterval", lambda: 0.005)
    held = _timing.held_from
    kept = (0.005, 8)  # the watchdog blocked on the GIL 31 ms and more, waking every few ms to ask again
    # Seen idle: all 16 ms of the thread's CPU since count (its wake is not known), as before.
    assert held(100.004, 100.040, 100.000, 1.000, 1.016, 0.001, kept) == near(100.004)
    # Seen in a step 4 ms before the ask: 12 ms of CPU after it, less than 3 switch intervals.
    assert held(100.004, 100.040, 100.000, 1.000, 1.016, 0.001, kept, busy_since_seen=True) == 0.0
    assert held(100.004, 100.040, 100.000, 1.000, 1.0191, 0.001, kept, busy_since_seen=True) == near(100.004)
    # Looks 40 ms apart (a busy thread starving the watchdog), the loop spinning in 2 ms steps throughout:
    # 45 ms of CPU by a look 35 ms late is 5 ms after the ask. No hold.
    assert held(100.040, 100.075, 100.000, 1.000, 1.045, 0.001, (0.005, 8)) == near(100.030)  # (seen idle)
    assert held(100.040, 100.075, 100.000, 1.000, 1.045, 0.001, (0.005, 8), busy_since_seen=True) == 0.0


@pytest.mark.parametrize("tail", ["short", "long", "still"])
def test_a_late_look_after_a_look_that_saw_no_step_counts_all_the_cpu(
    rec: Recorded, frames: Frames, monkeypatch: pytest.MonkeyPatch, tail: str
) -> None:
    """A look saw step a, the next one no step, a's tail of 2 or 8 ms in the 10 ms gap moving the clock (or none):
    the loop waits again, and a 44 ms GIL hold right after, found by a late look, counts all its CPU and is
    reported. A look between two steps of a busy loop looks the same by the clock; taken for one (the clock moved
    since the look before), the CPU up to the ask was left out and this hold was missed (review), so it is not:
    docs/concepts/watchdog.md, "Its limits"."""
    monkeypatch.setattr(sys, "getswitchinterval", lambda: 0.005)
    looks = Looks()
    a, b = frames.steps[0], frames.steps[1]
    looks.at(99.990, 0.999, frames.idle)
    looks.at(100.000, 1.000, a)
    ran = {"short": 0.002, "long": 0.008, "still": 0.0}[tail]
    looks.at(100.010, 1.000 + ran, frames.idle)
    late_look(looks, 100.040, 100.075, 1.044 + ran, 0.045, b, kept=(0.005, 8))
    assert looks.step.held == near(100.031)
    looks.at(100.077, 1.046 + ran, frames.idle)
    [stall] = rec.stalls
    assert (stall.start, stall.end) == (near(100.031), near(100.076))


def test_a_step_first_seen_after_a_look_after_a_step_ended_is_timed_from_its_own_cpu(
    rec: Recorded, frames: Frames
) -> None:
    """Step a seen, then a look with no step after a's 3 ms tail, then step b on a whole CPU from 100.011 to
    100.052: b is timed from its own CPU, not from the gap's middle (review: dated 100.020 at the earliest, as
    after a busy loop's look between two steps, it was reported 9 ms short, or not at all)."""
    looks = Looks()
    a, b = frames.steps[0], frames.steps[1]
    looks.at(99.990, 0.999, frames.idle)
    looks.at(100.000, 1.000, a)
    looks.at(100.010, 1.003, frames.idle)
    looks.at(100.030, 1.022, b)
    assert looks.step.after_other is False
    for t, cpu in ((100.040, 1.032), (100.050, 1.042)):
        looks.at(t, cpu, b)
    looks.at(100.055, 1.044, frames.idle)
    [stall] = rec.stalls
    assert (stall.start, stall.end) == (near(100.011), near(100.052))


def test_gil_held_step_on_a_machine_eight_times_oversubscribed(rec: Recorded, frames: Frames) -> None:
    """The loop's thread held the GIL 296 ms on 7 % of a CPU (21 ms of its clock); the watchdog, told it
    was blocked 196 ms and woke 50 times, takes it for a hold: one stall from when it asked."""
    looks = Looks()
    a = frames.steps[0]
    looks.at(100.000, 1.000, frames.idle)
    assert late_look(looks, 100.004, 100.300, 1.021, 0.022, a, kept=(0.100, 50))
    assert looks.step.held == near(100.004) and looks.step.stalled
    looks.at(100.302, 1.0211, frames.idle)
    [stall] = rec.stalls
    assert (stall.start, stall.end) == (near(100.004), near(100.301))


def test_late_look_of_a_stopped_process_is_no_stall(rec: Recorded, frames: Frames) -> None:
    """SIGSTOP for 290 ms while a step ran: the watchdog's thread did not wake to ask for the GIL
    meanwhile (twice in all), so the delay is no hold, whatever the loop's clock did around it."""
    looks = Looks()
    a = frames.steps[0]
    looks.at(100.000, 1.000, frames.idle)
    late_look(looks, 100.004, 100.300, 1.040, 0.041, a, kept=(0.004, 2))
    assert not looks.step.held and not looks.step.stalled
    looks.at(100.302, 1.0401, frames.idle)
    assert not rec.stalls


def test_own_scheduling_is_read_only_by_a_late_look_after_the_step_is_walked(
    rec: Recorded, frames: Frames, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read of the watchdog's schedstat lets go of the GIL: never on a look on time, and at a late
    look only once the held step's stack was walked (read first, the loop finished the step meanwhile and
    the suspended frame led nowhere: a held step missed one look in ten)."""
    calls: list[str] = []

    class Told:
        def since(self) -> tuple[float, int]:
            calls.append("since")
            return (0.0, 60)  # woke every switch interval: waiting for the GIL

    walk = _stacks.step_of

    def walked(frame: FrameType, watch: ScriptedWatch, now: float) -> object:
        calls.append("walk")
        return walk(frame, watch, now)

    monkeypatch.setattr(_stacks, "step_of", walked)
    looks = Looks()
    looks.dog._own = Told()  # type: ignore[assignment]
    a = frames.steps[0]
    looks.at(100.000, 1.000, frames.idle)
    looks.dog._due, looks.dog._proc_ran, looks.dog._kept_read = 100.004, 0.0, False
    looks.at(100.004, 1.000, frames.idle)  # on time
    assert calls == ["walk", "walk"]
    looks.dog._due, looks.dog._proc_ran = 100.008, 0.3005  # late: kept out 292 ms
    assert looks.at(100.300, 1.2995, a)
    assert calls == ["walk", "walk", "walk", "since"]
    assert looks.step.held == near(100.004)  # (never before the loop's last look)


def test_a_hold_past_the_sample_cap_is_still_weighed(rec: Recorded, frames: Frames) -> None:
    """A step samples Python code in a for 400 ms (40 looks, past the cap of 32 samples), then a C call at b holds
    the GIL 2.4 s: the late look at its end, which walked b's stack already, still weighs it, counted once, so the
    flame graphs rank b first (review: dropped past the cap, all 2.8 s went to a). Any other look past the cap,
    on time or late only because the watchdog was kept waiting, weighs nothing."""
    looks = Looks()
    a, b = frames.steps[0], frames.idle  # (b: any other stack; the steps' frames share their line)
    s = step(99.999, 100.000, 100.000, 1.0, 1.0, 1.0)
    s.root = a
    for i in range(40):
        looks.dog._sample(looks.watch, s, a, 100.015 + i * 0.010, None)
    stack_a = _stacks.stack_of(a, a)
    assert _stacks.full(s) and s.samples == {stack_a: sampling.max_samples_per_slice}
    looks.dog._walked = (b, _stacks.stack_of(b, b))  # (as _held walks a late look's stack)
    looks.dog._sample(looks.watch, s, b, 100.415, None)  # late only for a starved watchdog: weighs nothing
    looks.dog._sample(looks.watch, s, b, 100.415 + 2.4, None, held=True)
    looks.dog._walked = None
    looks.dog._sample(looks.watch, s, a, 102.825, None)
    by_stack = {stack: (count, ms) for stack, count, ms in _timing.stall_of(s, 100.0, 102.83, looks.watch).samples}
    assert by_stack == {stack_a: (32, near(0.325)), _stacks.stack_of(b, b): (1, near(2.4))}


def test_gil_held_step_seen_once_is_a_stall_of_its_whole_length(rec: Recorded, frames: Frames) -> None:
    """asyncio: idle at 100.000; the look due at 100.004 comes at 100.300, the loop's thread having used
    299.5 ms of CPU and nobody else any: one stall from 100.0005 to where its clock puts the end at the
    hold's pace (a whole CPU: 0.1 ms after the late look), at the line the look saw. Before issue 37 this
    step, seen once with no CPU rate, was no stall at all."""
    looks = Looks()
    a = frames.steps[0]
    assert not looks.at(100.000, 1.000, frames.idle)
    assert late_look(looks, 100.004, 100.300, 1.2995, 0.3005, a)
    s = looks.step
    assert s.held == near(100.0005) and s.stalled
    assert isinstance(s.task, StalledTask) and s.samples == {((a.f_code, a.f_lasti),): 1}  # the calling line
    assert not looks.at(100.302, 1.2996, frames.idle)
    [stall] = rec.stalls
    assert (stall.start, stall.end) == (near(100.0005), near(100.3001))
    # Its one sample, taken by the look the hold kept out, stands for the whole hold (the flame graphs' weight).
    assert not stall.waiting and stall.samples == [(((a.f_code, a.f_lasti),), 1, near(0.2995))]
    assert not rec.hangs


@pytest.mark.parametrize(
    ("due", "late", "cpu_late", "cpu_next", "start", "end"),
    [
        # Quiet: 149.5 ms of CPU in the look 146 ms late, from 100.0005 at a whole CPU; then 10 ms more.
        (100.004, 100.150, 1.1495, 1.1595, 100.0005, 100.160),
        # Half a CPU (the machine's other jobs): from when the watchdog asked; 10 ms of CPU more is 20 ms.
        (100.004, 100.204, 1.100, 1.110, 100.004, 100.224),
    ],
    ids=["quiet", "half-a-cpu"],
)
def test_gil_held_step_seen_once_holding_again_after_the_late_look_ends_where_its_clock_says(
    rec: Recorded, frames: Frames, due: float, late: float, cpu_late: float, cpu_next: float, start: float, end: float
) -> None:
    """uvloop: sorted() of millions of ints held the GIL; the late look saw the step at the calling line,
    once, and its own reads let go of the GIL; the loop's thread took it back and freed the call's result
    (another hold, 15-20 % of the call's time), so the next look, on time after those reads, found the loop
    idle. Timed at the pace of the hold its look waited on, not to the middle of that gap (5-13 ms early,
    the step 6-9 % short one round in four before)."""
    base, inner = c_loop_frames()
    looks = Looks(watch_of(StubLoop(running=True), base))
    looks.at(100.000, 1.000, base)
    assert late_look(looks, due, late, cpu_late, cpu_late - 1.000 + 0.0005, inner)
    assert looks.step.held == near(start)
    assert not looks.at(late + 0.030, cpu_next, base)
    [stall] = rec.stalls
    assert (stall.start, stall.end) == (near(start), near(end))
    assert not stall.waiting


@pytest.mark.parametrize(
    ("cpu_next", "end"),
    [
        # 17 ms of CPU in the 26 ms gap: at the hold's half a CPU, 34 ms, through the gap: up to the heartbeat.
        (1.117, 100.226),
        # 5 ms of CPU: 10 ms at the hold's pace, an end the clock tells, before the heartbeat.
        (1.105, 100.214),
    ],
    ids=["ran-through-the-gap", "ended-within-it"],
)
def test_gil_held_step_seen_once_on_a_c_loop_ends_by_its_heartbeat(rec: Recorded, cpu_next: float, end: float) -> None:
    """uvloop, half a CPU (a busy machine): the late look sees the held step once and posts a heartbeat;
    the step holds the GIL again (its call's result freed) and the next look finds the loop idle, the
    heartbeat answered at 100.226. The thread's share of a CPU is uneven on a busy machine, and where its
    clock at the hold's pace runs through the whole gap, the step ran up to the heartbeat, which runs as
    soon as the loop is back (0.1 ms after the step's end, measured), not to the middle of the gap (10-22
    ms early before)."""
    base, inner = c_loop_frames()
    loop = StubLoop(running=True)
    looks = Looks(watch_of(loop, base))
    looks.at(100.000, 1.000, base)
    assert late_look(looks, 100.004, 100.204, 1.100, 0.1005, inner)
    assert looks.step.held == near(100.004) and len(loop.calls) == 1
    looks.watch.watchdog.beat_done = 100.226  # (what the posted callback does on the loop's thread)
    assert not looks.at(100.230, cpu_next, base)
    [stall] = rec.stalls
    assert (stall.start, stall.end) == (near(100.004), near(end))


def test_gil_held_step_on_a_c_loop_needs_no_heartbeat(rec: Recorded) -> None:
    """uvloop, rloop: a step first seen at a late look is proven stuck by the hold itself (no heartbeat
    could have run meanwhile): one stall, timed as on asyncio."""
    base, inner = c_loop_frames()
    loop = StubLoop(running=True)
    looks = Looks(watch_of(loop, base))
    looks.at(100.000, 1.000, base)
    assert late_look(looks, 100.015, 100.300, 1.2995, 0.3005, inner)
    assert looks.step.stalled and len(loop.calls) == 1  # (a heartbeat for the looks that follow)
    looks.at(100.304, 1.2997, base)
    [stall] = rec.stalls
    assert (stall.start, stall.end) == (near(100.0005), near(100.3002))


def test_gil_held_step_on_a_loaded_machine_starts_when_the_watchdog_asked(rec: Recorded, frames: Frames) -> None:
    """The loop's thread got a fifth of a CPU: its clock alone would time 60 ms of a 296 ms hold. The hold
    began no later than the watchdog asked for the GIL (the tripwire woke it at 100.001, before its sleep's
    end): the stall runs from there, and ends where its clock says at the hold's pace (60 ms of CPU in the
    299 ms since: 0.1 ms of CPU after the late look is 0.498 ms)."""
    looks = Looks()
    a = frames.steps[0]
    looks.at(100.000, 1.000, frames.idle)
    looks.watch.watchdog.tripped = 100.001
    late_look(looks, 100.100, 100.300, 1.060, 0.061, a)
    looks.at(100.302, 1.0601, frames.idle)
    [stall] = rec.stalls
    assert (stall.start, stall.end) == (near(100.001), near(100.300 + 0.0001 * 0.299 / 0.060))


@pytest.mark.parametrize(
    ("ran", "proc"),
    [(0.002, 0.002), (0.150, 0.300)],
    ids=["nobody-ran", "another-thread-shared-the-gil"],
)
def test_late_look_without_a_hold_is_no_stall(rec: Recorded, frames: Frames, ran: float, proc: float) -> None:
    """A paused process (SIGSTOP), a machine that starved every thread, or a loop sharing the GIL with
    another Python thread: the late look proves nothing; the step, seen once, is no stall."""
    looks = Looks()
    a = frames.steps[0]
    looks.at(100.000, 1.000, frames.idle)
    late_look(looks, 100.004, 100.300, 1.000 + ran, proc, a)
    assert not looks.step.held and not looks.step.stalled
    looks.at(100.302, 1.000 + ran, frames.idle)
    assert not rec.stalls


def test_hold_before_the_step_ran_is_not_the_steps(
    rec: Recorded, frames: Frames, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The look sees a step's outermost frame at its entry: the GIL was held before the step ran (a C
    function the loop itself called, on a loop written in C), not by the step: no stall of its."""
    monkeypatch.setattr(_stacks, "entering", lambda frame: True)
    looks = Looks()
    a = frames.steps[0]
    looks.at(100.000, 1.000, frames.idle)
    late_look(looks, 100.004, 100.300, 1.2995, 0.3005, a)
    assert not looks.step.held and not looks.step.stalled
    looks.at(100.302, 1.2996, frames.idle)
    assert not rec.stalls


def test_entering_reads_the_frames_instruction(rec: Recorded) -> None:
    """A frame at a call (the GIL handed over as a C call returns) is not entering; one suspended at a yield is."""

    def caller() -> FrameType:
        return callee()

    def callee() -> FrameType:
        return sys._getframe(1)

    assert not _stacks.entering(caller())

    def gen() -> Generator[int, None, None]:
        yield 1

    g = gen()
    next(g)
    assert isinstance(g, GeneratorType)
    assert g.gi_frame is not None and _stacks.entering(g.gi_frame)


def test_gil_held_hang_is_one_stall_not_half_a_hang(rec: Recorded, frames: Frames) -> None:
    """A C call of 2 s (hang_after 1 s), looked at once midway (the GIL dropped by a callback it ran) and
    once as it returned, both looks late: no hang report (the hold had ended, or was waited on, at each),
    one stall of the whole 2 s. Before issue 37: a hang report 1 s late, and a stall of the second half."""
    looks = Looks()
    a = frames.steps[0]
    looks.at(100.000, 1.000, frames.idle)
    late_look(looks, 100.004, 101.000, 1.9995, 1.0005, a)
    late_look(looks, 101.004, 102.000, 2.9995, 1.0005, a)
    assert not rec.hangs and looks.step.stalled
    looks.at(102.002, 2.9996, frames.idle)
    [stall] = rec.stalls
    assert (stall.start, stall.end) == (near(100.0005), near(102.0001))  # (its end from the CPU clock)
    assert stall.hang_reports == 0


def test_gil_held_step_that_runs_on_hangs_after_hang_after_more(rec: Recorded, frames: Frames) -> None:
    """After the hold, the step runs on (waiting): a hang is reported once it has run hang_after past the
    look that waited for the hold, not at that look."""
    looks = Looks()
    a = frames.steps[0]
    looks.at(100.000, 1.000, frames.idle)
    late_look(looks, 100.004, 101.500, 2.4995, 1.5005, a)
    for k in range(1, 9):
        looks.at(101.500 + k * 0.125, 2.4996, a)
    assert [age for _, age, _ in rec.hangs] == [near(1.0)]  # (ages from the first sighting, 101.5)
    assert rec.hangs[0][2] == near(2.4995)  # it had run that long, from 100.0005


class MovingLoop:
    """A loop's thread that runs on, from the call at `held_line` to `await_line`, when `run_on()` is called.

    The stand-in for a read that lets go of the GIL: the loop's thread, whose
    C call handed the GIL over as it returned, takes it back and finishes the
    step. Driven by events, not by time: the thread is at one line, then at
    the other, whatever the machine's load. (The one test here with a thread.)
    """

    def __init__(self) -> None:
        self.at_call = threading.Event()
        self.go = threading.Event()
        self.moved = threading.Event()
        self.done = threading.Event()
        self.frames: dict[str, FrameType] = {}
        self.thread = threading.Thread(target=self.run_forever, name="moving-loop")

    def run_forever(self) -> None:  # stands for the frame that called into a loop written in C
        self.frames["base"] = sys._getframe()
        self.step()

    def step(self) -> None:
        self.held()  # HELD LINE
        self.moved.set()  # (the step went on: its callee returned, it is at the next line)
        self.done.wait(10.0)  # AWAIT LINE

    def held(self) -> None:
        self.at_call.set()
        self.go.wait(10.0)

    def run_on(self) -> None:
        self.go.set()
        assert self.moved.wait(10.0)

    def line_of(self, marker: str) -> int:
        lines, first = inspect.getsourcelines(MovingLoop.step)
        return first + next(i for i, line in enumerate(lines) if marker in line)

    def __enter__(self) -> MovingLoop:
        self.thread.start()
        assert self.at_call.wait(10.0)
        return self

    def __exit__(self, *exc: object) -> None:
        self.go.set()
        self.done.set()
        self.thread.join(10.0)


@pytest.mark.parametrize("read", ["own-scheduling", "queued"])
def test_a_late_looks_sample_is_the_stack_the_loop_had_at_the_look(
    rec: Recorded, monkeypatch: pytest.MonkeyPatch, read: str
) -> None:
    """The look that first sees a held step reads what lets go of the GIL (the watchdog's schedstat, the
    loop thread's): the loop's thread, handed the GIL back, finishes its step meanwhile. The sample is the
    stack the look saw, at the calling line, not a walk of the returned frames made after (their callers
    had moved on: the stall was placed at the next line, one run in three, issue 37)."""
    with MovingLoop() as loop_thread:
        innermost = sys._current_frames()[loop_thread.thread.ident]  # type: ignore[index]

        class Told:
            def since(self) -> tuple[float, int]:
                if read == "own-scheduling":
                    loop_thread.run_on()
                return (0.0, 60)  # woke every switch interval: waiting for the GIL

        asked: list[object] = []

        def queued(watch: object) -> tuple[float, int] | None:
            asked.append(watch)
            if read == "queued":
                loop_thread.run_on()
            return None

        monkeypatch.setattr(_watchdog, "_queued", queued)
        base = loop_thread.frames["base"]
        looks = Looks(watch_of(StubLoop(), base))
        looks.dog._own = Told()  # type: ignore[assignment]
        looks.at(100.000, 1.000, base)
        looks.dog._due, looks.dog._proc_ran, looks.dog._kept_read = 100.004, 0.3005, False
        assert looks.at(100.300, 1.2995, innermost)
        if read == "queued":
            # The loop thread's wait for a CPU is read only where its clock
            # stood still (_stacks.sample): not for a held step, whose clock
            # ran. Run on as a read would have, after the look.
            assert asked == []
            loop_thread.run_on()
        assert loop_thread.moved.is_set()  # (the read ran the loop on)
        assert looks.step.held and looks.step.stalled
        [stack] = looks.step.samples
        lines = {code.co_name: _line(code, lasti) for code, lasti in stack}
        assert lines["step"] == loop_thread.line_of("# HELD LINE"), (lines, loop_thread.line_of("# AWAIT LINE"))
        assert "held" in lines  # (the callee, as it was: the frames a walk after the move found returned)


class HeldTaskLoop:
    """A real asyncio loop in a thread whose task's one step waits at its call until `run_on()`, then the task ends.

    The stand-in for a task whose last step ends in a C call holding the GIL
    (`return json.dumps(...)`): handed the GIL back while the late look reads
    its scheduling, the loop's thread finishes the step, and the task with it.
    Driven by events, not by time.
    """

    def __init__(self) -> None:
        self.at_call = threading.Event()
        self.go = threading.Event()
        self.finished = threading.Event()
        self.stop = threading.Event()
        self.loop = asyncio.new_event_loop()
        self.task: asyncio.Task[None] | None = None
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self._main(),), name="held-task")

    async def _main(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._held_step(), name="held-task")
        await self.task
        self.finished.set()
        await asyncio.get_running_loop().run_in_executor(None, self.stop.wait, 10.0)

    async def _held_step(self) -> None:
        self.at_call.set()
        self.go.wait(10.0)  # the C call, holding the GIL; the task ends as it returns

    def run_on(self) -> None:
        self.go.set()
        assert self.finished.wait(10.0)

    def __enter__(self) -> HeldTaskLoop:
        self.thread.start()
        assert self.at_call.wait(10.0)
        return self

    def __exit__(self, *exc: object) -> None:
        self.go.set()
        self.stop.set()
        self.thread.join(10.0)
        self.loop.close()


def test_a_held_step_names_its_task_though_the_task_ended_during_the_look(rec: Recorded, frames: Frames) -> None:
    """The late look reads the watchdog's schedstat (it lets go of the GIL) after it walked the held step:
    the loop's thread finishes the step and its task meanwhile. The task is the one the look saw, read
    with the walk: asked for after the read, a finished task is in no task list, and the stall was
    reported with no task, one time in three with the machine busy (issue 37)."""
    with HeldTaskLoop() as held:
        innermost = sys._current_frames()[held.thread.ident]  # type: ignore[index]

        class Told:
            def since(self) -> tuple[float, int]:
                held.run_on()
                return (0.0, 60)  # woke every switch interval: waiting for the GIL

        looks = Looks(watch_of(held.loop))
        looks.dog._own = Told()  # type: ignore[assignment]
        looks.at(100.000, 1.000, frames.idle)
        looks.dog._due, looks.dog._proc_ran, looks.dog._kept_read = 100.004, 0.3005, False
        assert looks.at(100.300, 1.2995, innermost)
        assert held.task is not None and held.task.done()  # (the read ran the task to its end)
        assert looks.step.held and looks.step.stalled
        stalled = looks.step.task
        assert stalled is not None and stalled.task is held.task


@pytest.mark.parametrize("held_s", [0.0, 0.380])
def test_a_look_kept_out_as_it_ends_is_followed_at_once(monkeypatch: pytest.MonkeyPatch, held_s: float) -> None:
    """The end of a look reads the watchdog's schedstat (Own.mark), which lets go of the GIL. A loop thread
    that took it and ran a C call holding it (a 380 ms sum(range(...))) kept the watchdog out to the
    call's end: the next look, due a few milliseconds after the first, is then made at once, late, and
    finds the step at the line after the call. Slept for first, it let the loop finish the step unseen
    between two looks that both found the loop idle: a stall missed once in forty (issue 37)."""
    clock = [100.0]
    monkeypatch.setattr(_watchdog, "perf_counter", lambda: clock[0])
    dog = _watchdog.Watchdog()  # (its thread is never started: its loop runs here)
    me = threading.current_thread()
    dog._thread = me
    looks: list[tuple[float, float]] = []

    def poll() -> tuple[bool, bool]:
        looks.append((clock[0], dog._due))
        if len(looks) == 2:
            dog._thread = None  # (the second look ends the run)
        return False, False

    class Own:
        def mark(self) -> None:
            clock[0] += held_s  # the read waited that long for the GIL

    slept: list[float] = []

    def acquire(lock: object, blocking: bool, timeout: float) -> bool:
        slept.append(timeout)
        clock[0] += timeout
        return False

    monkeypatch.setattr(dog, "poll", poll)
    monkeypatch.setattr(dog, "_next_interval", lambda busy, active: 0.004)
    monkeypatch.setattr(_watchdog, "_acquire", acquire)
    monkeypatch.setattr(_loops, "watches", {1: watch_of()})
    dog._loop(me, Own())  # type: ignore[arg-type]
    [(_, _), (second, due)] = looks
    assert due == near(100.004)  # due from the first look's end, whatever kept the watchdog out after it
    if held_s:
        assert slept[:1] == [] and second == near(100.380)  # made at once, late by the hold
    else:
        assert slept[:1] == [near(0.004)] and second == near(100.004)


# --- how long the watchdog sleeps between looks (issue 39) ----------------------------------------


class Intervals:
    """A fresh Watchdog's choice of its next sleep, on a scripted clock, with one idle loop whose arming is scripted."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, armable: bool, timer: float = float("inf")) -> None:
        self.now = 100.0
        self.dog = _watchdog.Watchdog()  # (its thread is never started)
        self.watch = watch_of()
        monkeypatch.setattr(_watchdog, "perf_counter", lambda: self.now)
        monkeypatch.setattr(_loops, "watches", {1: self.watch})
        monkeypatch.setattr(_tripwire, "can_arm", lambda watch: armable)
        # Armed at once, and in place at once (the arming callback's own timing is _tripwire's).
        monkeypatch.setattr(_tripwire, "arm", lambda watch, wake: armable)
        monkeypatch.setattr(_tripwire, "in_place", lambda watch: True)
        monkeypatch.setattr(_watchdog, "_read_waits", lambda watches: None)
        # When a loop not armed can wake for its next timer, as _waits planned it.
        monkeypatch.setattr(_watchdog, "_unarmed_look", lambda watch, now: timer)

    def after(self, seconds: float, *, busy: bool = False, active: bool = False) -> float:
        """The sleep chosen by a look `seconds` from the last one, that saw a step (`busy`) or activity."""
        self.now += seconds
        return self.dog._next_interval(busy, active)


@pytest.fixture
def intervals(rec: Recorded, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(sampling, "precise_idle", None)
    monkeypatch.setattr(sampling, "precise_by_default", False)
    return lambda **kwargs: Intervals(monkeypatch, **kwargs)


def test_armed_loops_sleep_long_a_look_or_two_after_a_step(intervals: Any) -> None:
    """Not half a second of looks every 4 ms after each step (125 wake-ups, 30 ms of CPU on a VM): 100 ms."""
    dog = intervals(armable=True)
    assert dog.after(0.0, busy=True) == near(0.002)  # in a step: the busy rate
    assert dog.after(0.002) == near(0.004)  # ended: a look soon, the next step may follow at once
    assert dog.after(0.004) == near(0.004)
    assert dog.after(0.005) == near(0.25)  # 11 ms after the step: armed, asleep for the armed idle interval


def test_loops_busy_with_short_gaps_are_not_armed_between_their_steps(intervals: Any) -> None:
    """A tripwire that trips soon after the looks slowed down: fast looks for 100 ms after the next steps."""
    dog = intervals(armable=True)
    assert dog.after(0.0, busy=True) == near(0.002)
    assert dog.after(0.011) == near(0.25)  # quiet: armed
    dog.dog.trip()  # a request 20 ms after the step
    assert dog.after(0.009) == near(0.004)
    assert dog.after(0.002, busy=True) == near(0.002)
    assert dog.after(0.05) == near(0.004)  # 50 ms after that step: still looking fast, not arming
    assert dog.after(0.051) == near(0.25)  # 101 ms: a longer gap, armed
    dog.dog.trip()  # the next request after a quiet second: the looks slow down 10 ms after steps again
    assert dog.after(1.0) == near(0.004)
    assert dog.after(0.002, busy=True) == near(0.002)
    assert dog.after(0.011) == near(0.25)


def test_a_loop_start_keeps_the_looks_fast_for_half_a_second(intervals: Any) -> None:
    """Loop starts in quick succession find the watchdog awake, and do not wake it (issue 31)."""
    dog = intervals(armable=True)
    dog.dog.loop_started()  # (the thread is not started: the watchdog is not enabled)
    assert dog.after(0.3) == near(0.004)
    assert dog.after(0.21) == near(0.25)


def test_a_tripwire_that_woke_the_watchdog_gets_one_more_look_soon(intervals: Any) -> None:
    dog = intervals(armable=True)
    assert dog.after(1.0) == near(0.25)
    dog.dog.trip()
    assert dog.after(0.001) == near(0.004)
    assert dog.after(0.004) == near(0.25)


@pytest.mark.parametrize("armable", [True, False])
def test_an_idle_interval_set_is_kept_for_every_loop(
    intervals: Any, monkeypatch: pytest.MonkeyPatch, armable: bool
) -> None:
    monkeypatch.setattr(sampling, "idle_interval_ms", 60.0)
    dog = intervals(armable=armable)
    assert dog.after(1.0) == near(0.06)


def test_a_loop_that_cannot_be_armed_is_looked_at_every_idle_interval_by_default(intervals: Any) -> None:
    """The production default: the cheap looks (start_cpu_sampling's precise_idle)."""
    dog = intervals(armable=False)
    assert dog.after(0.0, busy=True) == near(0.002)
    assert dog.after(0.002) == near(0.004)
    assert dog.after(0.011) == near(0.1)
    assert dog.after(1.0) == near(0.1)


def test_a_loop_that_cannot_be_armed_busy_with_short_gaps_is_looked_at_fast_between_its_steps(
    intervals: Any,
) -> None:
    """Cheap idle looks: a step seen at the first slow look keeps the looks fast for 100 ms after the next ones."""
    dog = intervals(armable=False)
    assert dog.after(0.0, busy=True) == near(0.002)
    assert dog.after(0.011) == near(0.1)  # quiet: slow looks
    assert dog.after(0.1, busy=True) == near(0.002)  # the first slow look finds a step
    assert dog.after(0.06) == near(0.004)  # 60 ms after it: still fast
    assert dog.after(0.041) == near(0.1)
    assert dog.after(0.1) == near(0.1)
    assert dog.after(0.1, active=True) == near(0.004)  # found by the second slow look: a long quiet spell
    assert dog.after(0.011) == near(0.1)


def test_a_loop_whose_arming_callback_never_ran_gets_the_shorter_idle_interval(
    intervals: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its tripwire is not in place: the looks are its only guard, every 100 ms, not the armed loops' 250."""
    dog = intervals(armable=True)
    monkeypatch.setattr(_tripwire, "in_place", lambda watch: False)
    assert dog.after(1.0) == near(0.004)  # waiting for the arming callback: looks every few ms
    assert dog.after(0.05) == near(0.004)
    assert dog.after(0.06) == near(0.1)  # waited one idle interval in vain


@pytest.mark.parametrize("how", ["asked", "by default"])
def test_precise_idle_looks_at_a_loop_that_cannot_be_armed_every_half_threshold(
    intervals: Any, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """As under the pytest plugin and `python -m aiocop run`: fast for half a second after a step, then every 15 ms."""
    monkeypatch.setattr(sampling, "precise_idle" if how == "asked" else "precise_by_default", True)
    dog = intervals(armable=False)
    assert dog.after(0.0, busy=True) == near(0.002)
    assert dog.after(0.4) == near(0.004)
    assert dog.after(0.11) == near(0.015)  # (half a second after the step, not 100 ms)
    assert dog.after(1.0) == near(0.015)


def test_precise_idle_false_wins_over_the_default(intervals: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sampling, "precise_by_default", True)
    monkeypatch.setattr(sampling, "precise_idle", False)
    dog = intervals(armable=False)
    assert dog.after(1.0) == near(0.1)


@pytest.mark.parametrize("precise", [False, True])
def test_a_loop_that_cannot_be_armed_is_looked_at_as_its_next_timer_ends(
    intervals: Any, monkeypatch: pytest.MonkeyPatch, precise: bool
) -> None:
    """In both modes: a step begun as a C loop's timer ends is seen from its start (_waits)."""
    monkeypatch.setattr(sampling, "precise_idle", precise)
    dog = intervals(armable=False, timer=101.008)
    assert dog.after(1.0) == near(0.008)  # asleep until the timer's earliest end
    assert dog.after(0.008) == near(0.004)  # then every few milliseconds until the loop's thread runs


@pytest.mark.parametrize("precise", [False, True])
def test_with_no_loop_known_an_unannounced_loops_first_step_is_looked_for_every_half_threshold(
    intervals: Any, monkeypatch: pytest.MonkeyPatch, precise: bool
) -> None:
    """A loop that announces nothing (Leviathan) is found by no other look: in both modes."""
    monkeypatch.setattr(sampling, "precise_idle", precise)
    dog = intervals(armable=False)
    monkeypatch.setattr(_loops, "watches", {})
    monkeypatch.setattr(_loops, "unannounced_loops_possible", lambda: True)
    assert dog.after(1.0) == near(0.015)
    monkeypatch.setattr(_loops, "unannounced_loops_possible", lambda: False)
    assert dog.after(1.0) == near(0.25)


# --- a trio run (issue 41): its steps bounded by trio's dispatch frame, seen live from inside a real run --


def test_a_trio_step_is_the_tasks_frames_up_to_trios_dispatch_and_trios_own_work_is_none(rec: Recorded) -> None:
    """A look inside a trio task's step finds the step up to the task's coroutine (trio's `unrolled_run`
    below it is the edge), with that frame as identity; trio's own work under the same frame (an
    instrument's hook, the delivery aiocop runs at a step's end) is no step of the application's,
    unless it runs the application's code (a user's instrument holds the loop as any step does)."""
    trio = pytest.importorskip("trio")
    from aiocop._interception import trio_runs
    from aiocop._interception.trio_runs import TrioRun

    watch = watch_of()
    found: dict[str, Any] = {}

    class Instrument(trio.abc.Instrument):  # type: ignore[misc, name-defined]
        def before_task_step(self, task: Any) -> None:
            found.setdefault("user instrument", _stacks.step_of(sys._getframe(), watch, 100.0))

    def delivered() -> None:  # run by aiocop's instrument at the step's end, as a step's blocking calls are
        found.setdefault("aiocop's delivery", _stacks.step_of(sys._getframe(), watch, 100.0))

    async def main() -> None:
        found["task"] = (sys._getframe(), _stacks.step_of(sys._getframe(), watch, 100.0))
        TrioRun(trio_runs.current_runner()).call_soon(delivered)
        await trio.sleep(0)

    trio.run(main, instruments=[Instrument()])
    frame, (ident, root, innermost) = found["task"]
    assert root is frame and ident is frame and innermost is frame
    assert found["aiocop's delivery"] is None
    user = found["user instrument"]
    assert user is not None and user[1].f_code.co_name == "call"  # trio's Instruments.call: the step's root


def test_a_trio_tasks_steps_share_its_frame_and_the_heartbeat_tells_them_apart(rec: Recorded) -> None:
    """As on a loop written in C: one task's steps share its coroutine's frame, so a step is proven stuck by
    the heartbeat posted at its first sighting, unanswered; the heartbeat run, the same frame is a new step."""
    trio = pytest.importorskip("trio")
    loop = StubLoop(running=True)
    looks = Looks(watch_of(loop))
    idle = sys._getframe()  # (no trio frame under it: what a look sees while the run waits)
    seen: dict[str, Any] = {}

    async def task() -> None:
        here = sys._getframe()
        assert not looks.at(100.000, 1.000, idle)
        assert looks.at(100.010, 1.010, here)
        assert len(loop.calls) == 1 and looks.watch.watchdog.beat_posted == 100.010
        looks.at(100.050, 1.050, here)
        seen["first"] = looks.step
        await trio.sleep(0)
        looks.watch.watchdog.beat_done = 100.052  # (what the posted callback does on the run's thread)
        looks.at(100.060, 1.055, sys._getframe())
        seen["second"] = looks.step

    trio.run(task)
    first, second = seen["first"], seen["second"]
    assert first.stalled and first.ident is first.root
    [stall] = rec.stalls
    assert (stall.start, stall.end) == (near(100.000), near(100.052))
    assert second is not first and second.root is first.root
    assert (second.t_prev, second.cpu_prev) == (100.052, 1.050)
    assert len(loop.calls) == 2


def test_a_trio_run_is_armed_by_an_instrument_that_trips_as_the_run_wakes(rec: Recorded) -> None:
    """_tripwire.arm on a trio run: its entry queue adds an instrument (any Python, no profile function)
    whose after_io_wait, as the run comes back from a wait, removes it and wakes the watchdog once."""
    trio = pytest.importorskip("trio")
    from aiocop._interception import trio_runs

    wakes: list[float] = []
    seen: dict[str, Any] = {}

    async def main() -> None:
        runner: Any = trio_runs.current_runner()
        run = trio_runs.TrioRun(runner)
        run.running = True
        watch = seen["watch"] = watch_of(run)
        assert _tripwire.can_arm(watch)
        assert _tripwire.arm(watch, lambda: wakes.append(watch.watchdog.tripped))
        assert watch.watchdog.armed and not wakes
        # The entry queue's task runs the arming in a step of its own; the run's next pass through
        # its wait comes back and trips it. Waited for by its wake, not for a time: a fixed sleep
        # ran out, on a busy CI machine, in the very batch the arming ran in, before any wait
        # came back with the instrument in place.
        with trio.fail_after(30):
            while not wakes:
                await trio.sleep(0.001)
        seen["left"] = "after_io_wait" in runner.instruments
        run.running = False

    trio.run(main)
    watch = seen["watch"]
    assert watch.watchdog.tripwire_set > 0 and type(watch.watchdog.tripwire).__name__ == "_TrioTripwire"
    assert (
        not watch.watchdog.armed
        and wakes == [watch.watchdog.tripped]
        and watch.watchdog.tripped >= watch.watchdog.tripwire_set
    )
    assert not seen["left"], "it removed itself: no instrument runs on the run's later passes"


# --- the gap between two steps, when a look waited on a hold (issue 37's review) ----------------------


def test_a_hold_ending_a_step_before_the_next_ones_entry_is_the_first_steps(
    rec: Recorded, frames: Frames, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`return json.dumps(...)` ends a's step holding the GIL; the late look it kept out lands at b's entry.

    b has run nothing yet (its frame at its entry): what the thread ran since
    the last look at a was a's, up to this look. One stall of a's 46 ms, not
    a gap shared with b and counted for neither (that lost it whole).
    """
    monkeypatch.setattr(sys, "getswitchinterval", lambda: 0.005)
    a, b = frames.steps
    monkeypatch.setattr(_stacks, "entering", lambda frame: frame is b)
    looks = Looks()
    looks.at(100.000, 1.000, frames.idle)
    for i in range(1, 12):
        looks.at(100.000 + 0.002 * i, 1.000 + 0.002 * i, a)  # a at full speed to 100.022
    late_look(looks, 100.024, 100.0462, 1.0462, 0.0242, b)  # held from 100.022 (24.2 ms of CPU)
    [stall] = rec.stalls
    assert stall.ident is a.f_back
    assert (stall.start, stall.end) == (near(100.000), near(100.0462))
    assert not looks.step.held and looks.step.start() == near(100.0462)  # b: nothing of it ran before


def test_a_hold_ending_a_step_then_the_loop_idle_times_it_to_the_look(
    rec: Recorded, frames: Frames, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step's last 28 ms a C call holding the GIL, the loop idle after it: timed to the late look, not
    to the middle of the gap (its thread's CPU rate, taken while the looks shared the GIL, overshoots)."""
    monkeypatch.setattr(sys, "getswitchinterval", lambda: 0.005)
    a = frames.steps[0]
    looks = Looks()
    looks.at(100.000, 1.000, frames.idle)
    for i in range(6):
        now = 100.002 + 0.003 * i
        looks.at(now, 1.002 + 0.98 * (now - 100.002), a)  # 98 % of a CPU: the looks take the rest
    cpu = 1.002 + 0.98 * 0.015
    late_look(looks, 100.019, 100.0451, cpu + 0.0281, 0.0281, frames.idle)
    [stall] = rec.stalls
    assert stall.end == near(100.0451) and (stall.end - stall.start) * 1000.0 > 44.0


def test_a_loop_stopping_on_its_thread_times_its_last_step_by_the_clock(rec: Recorded, frames: Frames) -> None:
    """The loop's thread finishes its last step as the loop stops: what it ran since the last look was that
    step's, whatever the rate the looks measured (no gap shared with anything)."""
    a = frames.steps[0]
    looks = Looks()
    looks.at(100.000, 1.000, frames.idle)
    for i in range(6):
        now = 100.002 + 0.007 * i
        looks.at(now, 1.002 + 0.98 * (now - 100.002), a)
    looks.dog.finish(looks.watch, 100.04501, 1.002 + 0.98 * 0.035 + 0.00801)
    [stall] = rec.stalls
    assert (stall.end - stall.start) * 1000.0 > 44.0


def test_an_io_event_ends_no_later_than_a_later_step_is_known_to_run(rec: Recorded, frames: Frames) -> None:
    """a's blocking call at 100.0015, then C work holding the GIL to 100.050; the late look sees b once. a's
    event ends where b is known to have run (its sighting), not at b's guessed start (the gap's middle)."""
    from aiocop._interception.hook import StepGroup
    from aiocop._reporting import delivery as _delivery

    a, b = frames.steps
    looks = Looks()
    looks.at(100.000, 1.000, frames.idle)
    looks.at(100.001, 1.001, a)
    looks.at(100.003, 1.0025, a)
    looks.at(100.0502, 1.0497, b)
    group = StepGroup()
    group.ident, group.t_first, group.t_end = a.f_back, 100.0015, 100.052  # (t_end: its delivery's time)
    _delivery._take_stall_of(group, looks.watch, looks.watch.watchdog)
    assert group.t_end == near(100.0502)


def test_a_samples_wait_for_a_cpu_is_read_only_where_its_thread_had_less_than_a_whole_cpu(rec: Recorded) -> None:
    """The read lets go of the GIL, which a loop thread spinning in Python then keeps for a switch interval:
    a sample whose thread had a whole CPU does without it; one with less reads it, and counts its thread's
    wait for a CPU as work from the next such sample on (a sample with no earlier reading: its clock)."""
    s = step(100.000, 100.010, 100.010, 1.000, 1.010, 1.010)
    reads: list[tuple[float, int]] = []
    told = iter(((0.100, 7), (0.109, 8), (0.110, 9)))

    def queued() -> tuple[float, int] | None:
        reads.append(next(told))
        return reads[-1]

    stack = ((step.__code__, 0),)
    _stacks.sample(s, stack, 100.020, 1.020, queued)  # 10 ms of CPU in 10 ms: working, no read
    assert reads == [] and s.sample_queued is None and not s.waiting
    _stacks.sample(s, stack, 100.030, 1.0201, queued)  # the clock stood still: read; no earlier reading
    assert len(reads) == 1 and s.waiting == {stack: 1}
    _stacks.sample(s, stack, 100.040, 1.0202, queued)  # still again, 9 ms of it queued: a starved spin
    assert len(reads) == 2 and s.waiting == {stack: 1}
    _stacks.sample(s, stack, 100.050, 1.0252, queued)  # half a CPU: working by its clock, read for the next
    assert len(reads) == 3 and s.sample_queued == (0.110, 9) and s.waiting == {stack: 1}


def test_a_sample_whose_thread_was_never_given_a_cpu_is_told_by_its_state(rec: Recorded) -> None:
    """Linux adds a wait for a CPU to the queued time only as the thread gets one: a thread kept off the CPUs
    through a whole gap between samples shows neither, and only its state (runnable) tells it from a wait.
    Not where it was given a CPU meanwhile: a thread waiting for the GIL wakes to ask every switch interval,
    and is runnable at the very read that lets go of it."""
    s = step(100.000, 100.010, 100.010, 1.000, 1.010, 1.010)
    asked: list[bool] = []
    states = iter((True, False))

    def runnable() -> bool | None:
        asked.append(next(states))
        return asked[-1]

    stack = ((step.__code__, 0),)
    _stacks.sample(s, stack, 100.020, 1.011, lambda: (0.100, 5), runnable)  # a tenth of a CPU: working, read
    assert asked == [] and not s.waiting
    _stacks.sample(s, stack, 100.030, 1.011, lambda: (0.100, 5), runnable)  # never given a CPU, runnable
    assert asked == [True] and not s.waiting
    _stacks.sample(s, stack, 100.040, 1.011, lambda: (0.100, 5), runnable)  # never given one, blocked: a wait
    assert asked == [True, False] and s.waiting == {stack: 1}
    _stacks.sample(s, stack, 100.050, 1.011, lambda: (0.100, 7), runnable)  # given a CPU twice (a GIL waiter)
    assert asked == [True, False] and s.waiting == {stack: 2}  # its state not asked: a wait
    _stacks.sample(s, stack, 100.060, 1.011, lambda: (0.100, 7), lambda: None)  # not told (off Linux)
    assert s.waiting == {stack: 3}


# --- the CPU of the watchdog's own thread is no other thread's (issue 37, a missed hold under load) -----


def test_the_others_cpu_leaves_out_the_watchdogs_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """held_from's `others` (another thread sharing the GIL) is measured without the watchdog's own CPU.

    Its looks and its wake-ups while it waits for a GIL held for a second
    are no other thread's: the process's CPU clock less the calling
    thread's (the watchdog's), scripted clocks.
    """
    clocks = {"process": 10.0, "thread": 3.0}
    monkeypatch.setattr(_watchdog, "process_time", lambda: clocks["process"])
    monkeypatch.setattr(_watchdog, "thread_time", lambda: clocks["thread"])
    before = _watchdog._others_cpu()
    clocks["process"] += 0.8  # 0.8 s of the process's CPU since, 0.5 s of it the watchdog's own
    clocks["thread"] += 0.5
    assert _watchdog._others_cpu() - before == pytest.approx(0.3)


def test_a_watchdog_whose_thread_cannot_start_keeps_no_thread_and_stops_and_starts_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A process with no thread left: the start fails, and no thread that never ran is kept, so that
    stopping does not try to join it (RuntimeError) and a later start makes a new one (attach's undo)."""
    dog = _watchdog.Watchdog()
    started: list[str] = []

    def refuse(thread: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(dog, "_unseen_loops_possible", lambda: True)  # (so that start() spawns at once)
    monkeypatch.setattr(threading.Thread, "start", refuse)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        dog.start()
    assert not dog.thread_alive and dog._thread is None
    dog.stop()  # joins nothing
    monkeypatch.setattr(threading.Thread, "start", lambda thread: started.append(thread.name))
    dog.start()
    assert started == ["aiocop-watchdog"] and dog._thread is not None
    dog._thread = None  # (the stand-in thread never ran: nothing to join)
    dog.stop()
