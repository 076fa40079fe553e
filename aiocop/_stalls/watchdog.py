"""The stall watchdog: one background thread that notices stuck event loops.

Call interception cannot see blocking that raises no audit event: CPU-bound
code, C extensions, functions bound before patching. The watchdog polls the
stacks of every registered loop thread (`sys._current_frames`). A loop is in
a step when its stack reaches above the step's edge (the same edges the audit
hook uses: `stacks`); a step that is still running after `threshold_ms` is a
stall. While it lasts, the loop thread's stack is sampled every
`interval_ms`; when it ends, one `SlowTaskEvent(reason="cpu_blocking")` is
reported (`attribution`), or the samples join the io event of the same step.

Timing without wrapping anything: a stall's start and end are bracketed by
polls (every `busy_poll_ms` while a loop is busy, `idle_interval_ms` while all
are idle, each idle loop armed to wake the watchdog as it wakes: _tripwire;
one that cannot be armed is looked at every half threshold, and as its next
timer ends: _waits)
and refined by the loop thread's CPU clock (`timing`). On loops written in C,
where one task's consecutive steps share a root frame, a heartbeat
(`call_soon_threadsafe`) sent only when the same root is seen twice in a row
tells "still stuck" from "busy but iterating".

This module is the thread: when it looks, what a look does with each loop,
when it sleeps and when it ends. The watchdog never touches a loop that is
not stuck and adds nothing to the work of a step; its own cost is a few
microseconds per poll.

May import: aiocop._common, aiocop._model, aiocop._interception, and the rest of aiocop._stalls.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import os
import sys
import threading
from _thread import LockType, allocate_lock
from types import CodeType
from typing import TYPE_CHECKING

from aiocop._common import forksafe as _forksafe
from aiocop._common.clock import perf_counter, process_time, thread_time
from aiocop._interception import hook as _hook
from aiocop._interception import loops as _loops
from aiocop._model import state as _state
from aiocop._stalls import attribution as _attribution
from aiocop._stalls import discovery as _discovery
from aiocop._stalls import probe as _probe
from aiocop._stalls import sched as _sched
from aiocop._stalls import stacks as _stacks
from aiocop._stalls import timing as _timing
from aiocop._stalls import tripwire as _tripwire
from aiocop._stalls import waits as _waits
from aiocop._stalls.settings import sampling
from aiocop._stalls.state import LoopState, state_of

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType

    from aiocop._interception.loops import LoopWatch
    from aiocop._stalls.attribution import Stall
    from aiocop._stalls.sink import StallSink
    from aiocop._stalls.timing import Step

logger = logging.getLogger("aiocop")

# How often threads not known to run a loop are looked at for an idle one
# (one that runs a step is found at any look: _discovery); also the longest
# a full look is skipped while every loop is quiet.
_DISCOVERY_S = 1.0
# Polling stays at _FAST_IDLE_S this long after a loop started, or last did
# anything while a loop that cannot be armed runs (_tripwire), then slows to
# `idle_interval_ms` (see Watchdog._next_interval).
_FAST_FOR_S = 0.5
_FAST_IDLE_S = 0.004
# After a step while every loop can be armed (or with cheap idle looks): a
# few looks, then the loops are armed and the watchdog sleeps long. Each look
# costs its thread's wake-up, 0.1-0.3 ms of CPU on a VM: half a second of
# looks every 4 ms after each step was 125 looks (about 30 ms of CPU) per
# quiet spell (issue 39).
_FAST_AFTER_STEP_S = 0.01
# The same while the loops are busy with short gaps: the last quiet spell
# ended within _BUSY_GAP_S of its start (a tripwire tripped), or at the first
# slow look (a loop that cannot be armed). Arming costs a callback on the loop
# (0.3 ms of its thread's CPU) and the tripwire's wake-up of this thread: with
# a request every 20 or 50 ms, arming after each used 10-20 % more CPU than
# the looks it saved; from 100 ms apart it uses 40 % less. And a loop that
# cannot be armed is then watched as closely as while it runs.
_FAST_WHILE_BUSY_S = 0.1
_BUSY_GAP_S = 0.1
# A probe's tick seen under way is looked at again this long after it would
# be a step (_tick_seen): the sleep's own wake-up can come a hair early.
_TICK_LATE_S = 0.0005
# The watchdog's thread ends once no loop has been running for this long
# (it starts again with the next loop).
_IDLE_STOP_S = 5.0
# The C method, taken before aiocop wraps lock methods: the watchdog sleeps on it.
_acquire = LockType.acquire


# Lock for handing a stall to an io event or reporting it alone (exactly once).
merge_lock = _forksafe.lock()
# Where stalls and hangs go (install_sink): None until detection starts, and nothing is reported.
_sink: StallSink | None = None


def install_sink(sink: StallSink) -> None:
    """Hand stalls and hangs to `sink` from now on (`_api`, as detection starts).

    Each loop registered from now on holds the watchdog's state of it (`state.LoopState`).
    """
    global _sink
    _sink = sink
    _loops.use_watchdog_state(LoopState)


# The longest time between two hang reports of one step.
_HANG_REPEAT_MAX_S = 300.0


class Watchdog:
    def __init__(self) -> None:
        self._thread: threading.Thread | None = None  # the one watchdog thread; another that sees itself replaced ends
        # start() and stop() from any threads at once: one thread, and never a
        # join of a thread not yet started. The watchdog thread never takes it.
        self._control = _forksafe.lock()
        # Held while the watchdog sleeps on it; released to wake it early.
        self._waker = allocate_lock()
        self._waker.acquire()
        self._last_scan = 0.0
        self._last_active = 0.0  # last loop start or wake-up (loop_started, wake)
        self._last_step = 0.0  # last poll that saw a loop do something
        # The fast looks after a step (_FAST_AFTER_STEP_S, or _FAST_WHILE_BUSY_S
        # while the loops are busy with short gaps), when the current quiet
        # spell's slow looks began (0: none since the last step), and how many
        # slow sleeps it has had.
        self._after_step = _FAST_AFTER_STEP_S
        self._quiet_from = 0.0
        self._slow_looks = 0
        # Whether the sleep under way (or about to begin) is the long idle one:
        # only then does a loop's start cut it short (loop_started).
        self._sleeping_long = True
        self.polls = 0  # polls completed, and whether one is under way: what sync() waits on
        self._polling = False
        self._enabled = False  # start() until stop(): the thread runs while loops do
        self._leaving = False  # the thread has decided to end (no loop for _IDLE_STOP_S)
        self._idle_since = 0.0  # first look of the current spell with no loop registered (0: a loop is)
        self._started_off_main = False  # start() was called from a thread other than the main one
        # Threads running no known loop, walked for one that steps (_discovery).
        self._finder = _discovery.Finder()
        # A loop's tripwire woke this thread (_tripwire): look again soon, whatever the look it woke for saw.
        self._tripped = False
        self._arming_since = 0.0  # when this quiet spell's arming began (see _next_interval)
        self._tick_due = 0.0  # when a probe's tick seen under way would be a step (_tick_seen; 0: none)
        self._ticks_only = False  # the last look's steps were all probe ticks that had not stalled (see poll)
        # A GIL held by one C call of a loop's thread keeps this thread out
        # until the call returns (_timing.held_from): when the look under way
        # was due (the end of the sleep before it; 0: not known), and the CPU
        # the process used but this thread (_others_cpu) at the last look and
        # what it moved by since.
        self._due = 0.0
        self._proc_cpu: float | None = None
        self._proc_ran: float | None = None
        # Why a look came late: this thread's own scheduling since the last
        # look ended (_sched; None off Linux), read as the look begins.
        self._own: _sched.Own | None = None
        self._kept: tuple[float, int] | None = None
        self._kept_read = False
        self._pause_read = False
        self._pause = 0.0
        # The stack a late look walked before it let go of the GIL (innermost frame, stack: _held, _sample).
        self._walked: tuple[FrameType, tuple[tuple[CodeType, int], ...]] | None = None

    @property
    def running(self) -> bool:
        """Whether stall detection is on (its thread runs only while a loop does: see `loop_started`)."""
        return self._enabled

    @property
    def thread_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        with self._control:
            self._enabled = True
            if _on_gc not in gc.callbacks:
                gc.callbacks.append(_on_gc)
            self._started_off_main = threading.current_thread() is not threading.main_thread()
            if _loops.watches or _loops.retired or self._unseen_loops_possible():
                self._spawn()

    def _spawn(self) -> None:
        # Under _control. No aiocop thread while no loop runs (issue 24): a
        # program that never starts one, or forks before it does, sees the
        # threads it would see without aiocop.
        if self.thread_alive and self._thread is not None and not self._leaving:
            return
        self._leaving = False
        thread = threading.Thread(target=self._run, name="aiocop-watchdog", daemon=True)
        self._thread = thread
        self._idle_since = 0.0
        # Its first look is asked for now: a loop's first step holding the GIL
        # keeps the new thread from running, and that look is timed from here (_held).
        self._due = perf_counter()
        # (What that look measures the others' CPU from: the new thread has used none yet.)
        self._proc_cpu, self._proc_ran = process_time(), None
        try:
            thread.start()
        except BaseException:
            # No thread left in the process: the failure is the caller's to report (`start` raises it), and
            # a thread that never started is not kept, so that stopping, or starting again, does not wait on it.
            self._thread = None
            raise

    def loop_started(self) -> None:
        """A loop started (any thread): start the thread if it is not running, and have the loop looked at.

        A running watchdog is woken only from its long idle sleep. Already
        looking every few milliseconds, it sees the new loop at its next look
        anyway, and a wake-up at every start made it take the GIL just as the
        loop's thread reached its next blocking call: two rloop threads
        starting and stopping loops in step met rloop 0.5's self-pipe double
        close (issue 31, docs/how-to/loops.md) up to five times as often.
        """
        if self._enabled and (not self.thread_alive or self._leaving):
            state = _hook.current_state()
            was_busy, state.busy = state.busy, True  # a thread's start waits on an Event: not the app's
            try:
                with self._control:
                    if self._enabled:
                        self._spawn()
            finally:
                state.busy = was_busy
        self._last_active = perf_counter()  # written before _sleeping_long is read (see _next_interval)
        if self._sleeping_long:
            self.wake()

    def stop(self) -> None:
        with self._control:
            self._enabled = False
            self._retire_thread()
            if _on_gc in gc.callbacks:
                gc.callbacks.remove(_on_gc)

    def _retire_thread(self) -> None:
        # Under _control.
        thread = self._thread
        self._thread = None  # the thread sees it is no longer the watchdog, and ends
        self.wake()
        if thread is not None and thread is not threading.current_thread():
            thread.join(2.0)

    def _before_fork(self) -> None:
        # A fork while no loop runs (a pre-fork server's master, a process
        # pool made at start-up): the idle thread ends first, so that the
        # child is made by a single-threaded process (3.12+ warns otherwise).
        # It starts again with the next loop.
        # Never waits: a thread holding it (starting or stopping the watchdog,
        # or a thread the fork will leave behind) must not hold up the fork.
        if not _acquire(self._control, False):
            return
        try:
            if self.thread_alive and not _loops.watches and not self._unseen_loops_possible():
                thread = self._thread
                self._retire_thread()  # (which finishes the steps of loops that stopped, as it ends)
                _gone_from_the_os(thread)
        finally:
            self._control.release()

    def _after_fork_in_parent(self) -> None:
        # The thread _before_fork ended, if loops that announce nothing must still be looked for.
        if self._enabled and not self.thread_alive and self._unseen_loops_possible():
            if not _acquire(self._control, False):
                return  # (busy: whoever holds it starts or stops the thread)
            try:
                self._spawn()
            finally:
                self._control.release()

    def wake(self) -> None:
        """Look at the loops now (a loop started, or the watchdog is stopping)."""
        now = self._last_active = perf_counter()
        # The look is asked for now: one that comes late was kept out from
        # here (_held: a loop's first step that holds the GIL from its start).
        self._due = min(self._due, now)
        with contextlib.suppress(RuntimeError):  # already released, not yet slept on again
            self._waker.release()

    def trip(self) -> None:
        """An armed loop woke (called from its thread, by its tripwire): look at it now.

        Unlike `wake`, not taken for activity: the look decides (a tick of
        the loop-delay probe is none).
        """
        self._tripped = True
        with contextlib.suppress(RuntimeError):  # already released, not yet slept on again
            self._waker.release()

    def _idle_for_long(self) -> bool:
        # No loop registered, none stopped unseen, for _IDLE_STOP_S: the thread ends.
        now = perf_counter()
        if not self._idle_since:
            self._idle_since = now
            return False
        return now - self._idle_since >= _IDLE_STOP_S and not self._unseen_loops_possible()

    def _unseen_loops_possible(self) -> bool:
        """Whether a loop may be running that aiocop was not told of: only the thread's looks would find it.

        One that binds its start signals at import (Leviathan), or one
        started before aiocop was set up, in another thread (attach's case:
        set up from its own thread while the main thread runs a loop). A
        process with no thread but aiocop's and the one that set it up has
        none: its thread waits for the first loop.
        """
        if _loops.unannounced_loops_possible():
            return True
        main = threading.main_thread()
        for thread in threading.enumerate():
            if thread.name.startswith("aiocop-") or (thread is main and not self._started_off_main):
                continue
            return True
        return False

    def _leave_if_idle(self, me: threading.Thread) -> bool:
        # Decided under _control: a loop registering now either is seen here
        # (watches is set before loop_started is called) or finds _leaving set
        # and starts a new thread.
        with self._control:
            if self._thread is not me or _loops.watches or _loops.retired:
                return False
            self._leaving = True
            self._thread = None
            return True

    def _run(self) -> None:
        # Sleeps are timed waits on a held lock: as cheap as time.sleep (each
        # wake-up of this thread is its main cost, tens of microseconds of CPU
        # on a VM), with no Python-level Condition machinery, and wake() can cut
        # them short.
        me = threading.current_thread()
        own = self._own = _sched.Own()  # (this thread's own file)
        try:
            self._loop(me, own)
        finally:
            own.close()

    def _loop(self, me: threading.Thread, own: _sched.Own) -> None:
        while self._thread is me:
            self._polling = True
            try:
                busy, active = self.poll()
            except Exception:
                logger.exception("aiocop: watchdog poll failed (ignored)")
                busy, active = False, False
            self.polls += 1  # only this thread writes both, in this order (see sync)
            self._polling = False
            ended = perf_counter()  # (before the reads below that let go of the GIL: see the sleep)
            if not (_loops.watches or _loops.retired):  # (a loop runs: nothing more to check, the usual case)
                if self._idle_for_long() and self._leave_if_idle(me):
                    return
            elif self._idle_since:
                self._idle_since = 0.0
            try:
                interval = self._next_interval(busy, active)
            except Exception:
                logger.exception("aiocop: watchdog could not choose its next look (ignored)")
                interval = unarmed_interval()
            if self._tick_due:
                interval = min(interval, max(self._tick_due - perf_counter(), 0.0) + _TICK_LATE_S)
                self._tick_due = 0.0
            self._due = ended + interval
            own.mark()
            # That read (os.pread), and _next_interval's of a C loop's wait,
            # let go of the GIL. A loop's thread that took it and began a C
            # call that holds it (json.dumps, a regex) kept this thread out
            # until the call returned: the loop's thread now waits for the
            # GIL at the line after the call, and a sleep here let it finish
            # its step unseen, between two looks that both found the loop
            # idle (a 380 ms stall missed once in about forty, asyncio, load
            # 3-4). The look is then overdue, and made at once: it finds the
            # step at that line, late (_held).
            remaining = self._due - perf_counter()
            if remaining > 0.0:
                _acquire(self._waker, True, remaining)
        # stop() right after a loop's last step: finish that step, whose stall
        # stop() then delivers (drain), rather than leave it in the queue.
        try:
            self._finish_retired()
        except Exception:
            logger.exception("aiocop: watchdog could not finish a stopped loop's step (ignored)")

    def sync(self, timeout: float = 1.0) -> bool:
        """Wait until the watchdog has looked at every loop once since this call.

        Every stall that had ended by the call has then been reported (handed
        to its loop, or to the delivery worker if the loop has stopped: follow
        with `_delivery.drain()`). For the pytest plugin, which closes a test's
        books when the test ends. Returns False if the watchdog is not running
        or did not look within `timeout` seconds. Never call it from a loop's
        thread while the loop runs: it waits.
        """
        thread = self._thread
        if thread is threading.current_thread():
            return False
        if thread is None or not thread.is_alive():
            # Its thread runs only while loops do: with none running or
            # stopped unseen, there is nothing to wait for.
            return self._enabled and not _loops.watches and not _loops.retired
        # Read before `polls`: if no poll was under way then, the next one to
        # complete began after the call; if one was, it may have looked before.
        polling = self._polling
        if not polling and not _loops.watches and not _loops.retired:
            return True  # no loop is running or has stopped unseen: no stall can be pending
        target = self.polls + (2 if polling else 1)
        deadline = perf_counter() + timeout
        pause = allocate_lock()
        pause.acquire()
        while self.polls < target:
            if not self.running or perf_counter() >= deadline:
                return False
            self.wake()
            _acquire(pause, True, 0.0001)  # the C method: no audit event, no wrapper
        return True

    def _quiet_ended(self, now: float, resumed: bool, tripped: bool) -> None:
        # The first activity since the looks slowed down: a short quiet spell
        # keeps the looks fast after the next steps (no arming between them),
        # a long one makes them slow down soon again.
        if not (resumed and self._quiet_from):
            return
        short = now - self._quiet_from < _BUSY_GAP_S if tripped else self._slow_looks <= 1
        self._after_step = _FAST_WHILE_BUSY_S if short else _FAST_AFTER_STEP_S
        self._quiet_from = 0.0

    def _fast_after_step(self, precise: bool) -> float:
        # After a step, the looks stay fast for half a second while a loop
        # that cannot be armed runs, and precise idle looks are asked for: its
        # next step is found by looks alone.
        if precise and any(not _tripwire.can_arm(watch) for watch in _loops.watches.values()):
            return _FAST_FOR_S
        return self._after_step

    def _next_interval(self, busy: bool, active: bool) -> float:
        now = perf_counter()
        self._sleeping_long = False
        tripped, self._tripped = self._tripped, False
        self._quiet_ended(now, (busy and not self._ticks_only) or active or tripped, tripped)
        if busy:
            self._last_step = self._last_step if self._ticks_only else now
            return sampling.busy_poll_ms / 1000.0
        if active:
            self._last_step = now
        watches = _loops.watches
        precise = sampling.precise()
        # (After a loop's start the looks stay fast for half a second, always:
        # loop starts in quick succession do not wake a watchdog that is not
        # sleeping long, issue 31.)
        if now - self._last_active < _FAST_FOR_S or now - self._last_step < self._fast_after_step(precise) or tripped:
            # Woken by a tripwire, the look may have come before the step
            # it woke for began: one more look, soon.
            _read_waits(_loops.watches)
            return _FAST_IDLE_S
        # Published before _last_active is read again: a loop_started() that
        # saw the short sleep (and woke nobody) wrote _last_active before,
        # and is seen here.
        self._sleeping_long = True
        if perf_counter() - self._last_active < _FAST_FOR_S:
            self._sleeping_long = False
            return _FAST_IDLE_S
        # Nothing has run for a while: look less often (each wake-up of this
        # thread is its main cost). A stall that starts and ends between two
        # such looks would go unseen (the CPU clock cannot tell it from many
        # short steps): each idle loop is armed to wake this thread as it
        # wakes (_tripwire), and is looked at while its first step runs.
        if not self._quiet_from:
            self._quiet_from, self._slow_looks = now, 0
        waiting = unarmed = False
        timer = float("inf")  # the earliest a loop not armed can wake for its next timer (_waits)
        for watch in watches.values():
            if state_of(watch).step is None:
                if not _tripwire.arm(watch, self.trip):
                    unarmed = True
                    timer = min(timer, _unarmed_look(watch, now))
                waiting = waiting or not _tripwire.in_place(watch)
        if self._arming_since <= max(self._last_active, self._last_step):
            self._arming_since = now  # the first arming of this quiet spell
        if waiting and now - self._arming_since < sampling.idle_s():
            # The long sleep begins once each loop's tripwire is in place (see
            # _tripwire.in_place), a look or two later; a loop that never runs
            # the arming callback is waited for one idle interval at most.
            self._sleeping_long = False
            return _FAST_IDLE_S
        if timer <= now:
            # A loop not armed can be waking for its timer: a look every few
            # milliseconds until its thread runs, which `_waits.woke_at` times.
            # (A short sleep: a loop's start does not cut it short, issue 31.)
            self._sleeping_long = False
            return _FAST_IDLE_S
        if unarmed or (not watches and _loops.unannounced_loops_possible()):
            # A loop that cannot be armed (written in C, on Python 3.12+; its
            # thread's profile slot taken), or, with no loop known, one that
            # announces nothing may start (and cannot be armed before it is
            # found): its first step is found by a look, at a rate bound by
            # the threshold (a wake-up for I/O is not told in advance; for a
            # known loop, only if precise idle looks are asked for: a loop
            # that announces nothing is rare, and its first step is found by
            # no other look), and one begun as its next timer ends is seen as
            # it ends (_waits).
            bound = unarmed_interval() if precise or not unarmed else math.inf
            self._slow_looks += 1
            return min(sampling.idle_s(), bound, timer - now)
        self._slow_looks += 1
        # (Armed, unless a loop's arming callback was waited for in vain.)
        return sampling.idle_s(armed=not waiting)

    def poll(self) -> tuple[bool, bool]:
        """Look at every registered loop once.

        Returns whether any is in a step, and whether any did anything since
        the last look (its thread's CPU clock moved).
        """
        self._finish_retired()
        watches = _loops.watches
        now = perf_counter()
        if now - self._last_scan < _DISCOVERY_S and _timing.all_quiet(watches) and self._finder.quiet(watches):
            self._proc_cpu, self._proc_ran = _others_cpu(), None  # (what a late look measures from)
            return False, False
        frames = sys._current_frames()
        # The time and each loop thread's CPU clock, read with the snapshot:
        # the walks below can lose the GIL to the loops for milliseconds (two
        # CPU-bound loops and this thread share it), and what they find is
        # the stacks as they were at the snapshot (a frame that has returned
        # since keeps its callers), so that is the moment they describe. Read
        # after the walks, they timed an old picture as a new one: one step
        # seen as two, stalls cut short or missed.
        now = perf_counter()
        self._kept_read = False  # (read by the first late look at a step: _held, _paused)
        self._pause_read = False
        # Whether each loop's tripwire guards it (armed, in place since a look
        # saw it idle: _tripwire.guards) and the CPU the probe's ticks told,
        # read before the clocks; whether a tick is under way, read after.
        # What the clocks moved by is no activity of the loop's when a tick
        # was under way at their read (its CPU is told only at its end) or
        # ended since (taken for activity, it kept the watchdog looking every
        # 4 ms for half a second, one idle spell in three), nor when the loop
        # was guarded and is still armed after the read: it ran nothing of the
        # application's (up to _GUARDED_SLACK_S more than its ticks told).
        # Counted against the ticks' allowance instead, the loop's own work
        # around a tick took up to 1.2 ms (0.1-0.3 ms quiet) with the test
        # suite running beside it, and fast looks followed.
        guarded = [_tripwire.guards(watch) for watch in watches.values()]
        states = [state_of(watch) for watch in watches.values()]
        probes = [state.probe_cpu for state in states]
        clocks = [watch.cpu_time() for watch in watches.values()]
        proc = _others_cpu()
        self._proc_ran = proc - self._proc_cpu if self._proc_cpu is not None else None
        self._proc_cpu = proc
        own_only = [
            state.own or state.probe_cpu != seen or (was_guarded and state.armed and _within_slack(state, cpu, seen))
            for state, seen, was_guarded, cpu in zip(states, probes, guarded, clocks, strict=True)
        ]
        # Includes this thread's own frame, this very function's: left in,
        # this frame and the dict would hold each other, and with them every
        # frame of the loops' stacks at this look (and the tasks and locals
        # those hold) until the next garbage collection.
        frames.pop(threading.get_ident(), None)
        # Once a second, every thread (the parked ones too, and idle loops: scan).
        scan = now - self._last_scan > _DISCOVERY_S
        others = self._finder.read(frames, watches, now, scan=scan)
        busy = active = False
        ticks_only = True
        for (thread_id, watch), state, cpu, probe, own in zip(
            watches.items(), states, clocks, probes, own_only, strict=True
        ):
            frame = frames.get(thread_id)
            if frame is None or (watch.discovered and not _discovery.still_running(watch)):
                if frame is not None:
                    # Its thread runs on, maybe already in the next loop's
                    # first step: that step began after the last look that
                    # saw this loop, and is looked for now.
                    self._finder.adopt(thread_id, *_timing.last_seen(watch))
                    others[thread_id] = cpu
                self._finish(watch, now)
                _loops.unregister(thread_id)
                continue
            idle_cpu = state.idle_cpu
            if self._poll_one(watch, frame, now, cpu):
                busy = True
                step = state.step
                # (A probe's tick kept from a CPU past arm_after is a step, looked at fast while it
                # lasts; unless it stalled, it does not start the half second of fast looks after.)
                ticks_only = ticks_only and step is not None and bool(step.began) and not step.stalled
            active |= not own and _timing.moved(idle_cpu, state.idle_cpu, probe - state.probe_seen)
            state.probe_seen = probe
        # Threads running no known loop: one stepping is registered now, and
        # its step looked at in this same look (timed from the thread's last look).
        # (A thread with no known loop that uses CPU is no activity: a busy
        # thread of the application's would keep the watchdog from ever
        # slowing down, and so from arming the known loops' tripwires. With
        # no loop known, the quiet looks come every half threshold instead:
        # _next_interval.)
        for watch in self._finder.look(frames, others, now):
            if self._poll_one(watch, frames[watch.thread_id], now, others.get(watch.thread_id)):
                busy, ticks_only = True, False
        if scan:
            self._last_scan = now
            self._finder.scan(frames, watches)
        self._ticks_only = busy and ticks_only
        return busy, active

    def _finish_retired(self) -> None:
        # Loops that stopped since the last look: the step each was in ended
        # no later than the stop (see _loops.retired).
        retired = _loops.retired
        while retired:
            try:
                watch, stopped, cpu = retired.popleft()
            except IndexError:  # cleared meanwhile by stop()
                return
            self._finish(watch, stopped, cpu, sure=True)

    def _poll_one(self, watch: LoopWatch, frame: FrameType, now: float, cpu: float | None) -> bool:
        # `now` and `cpu`: the time and the thread's CPU clock at the snapshot
        # `frame` comes from, read together (estimates divide one by the
        # other, so a skew between them would show up as speed).
        found = _stacks.step_of(frame, watch, now)
        # (Its task read with it, before _held's read lets go of the GIL.)
        seen_task = _attribution.running_task(watch.loop, found[1]) if found is not None else None
        state = state_of(watch)
        step = state.step
        self._walked = None
        # Where nothing of the step it found has run yet (at its entry), a
        # hold this look waited on was the step's before it: what the loop's
        # thread ran since the last look was that step's tail, to this look.
        entering = found is None or (found[2] is found[1] and _stacks.entering(found[2]))
        # (Whether the loop was in a step at the last look: read before _held's reads let go of the GIL, as a loop
        # stopping meanwhile clears its step.)
        hold = self._held(watch, found, entering, now, cpu, step is not None) if self._due and (found or step) else 0.0
        held = 0.0 if entering else hold
        if found is None:
            if state.own:
                self._tick_seen(state)
            before = _timing.last_seen(watch)[0]  # (read before the step is dropped)
            if step is not None:
                self._finish(watch, now, cpu, sure=bool(hold))
            state.step = None
            state.beat_posted = 0.0
            _timing.remember_idle(watch, now, cpu, before)
            return False
        ident, root, innermost = found
        came_back = step is not None and _timing.loop_came_back(watch, now)
        if step is not None and step.ident is ident and not came_back:
            step.t_last = now
            step.cpu_last = cpu
        else:
            step = self._new_step(watch, step, came_back, ident, root, now, cpu, entering, hold)
            if held:
                # (On asyncio, no earlier than its iteration woke: a step of
                # a busy loop seen after a late look began after that.)
                step.held = max(held, step.t_prev, _timing.woke_at(ident, step.t_prev, now))
        age = now - step.known_since()
        if age >= sampling.arm_after_s():
            if step.task is None:
                # Seen now, while the step runs: a stall in a task's last step
                # is reported after the task finished, by when its scopes
                # (sampling, request keys) have been left. Armed steps only:
                # one that ends before any look sees it past the threshold
                # can still be one (see _finish).
                step.task = _attribution.StalledTask.of(watch.loop, root, seen_task)
            if now >= step.next_sample:
                self._sample(watch, step, innermost, now, cpu, bool(held))
        self._walked = None  # (keeps no frame of the loop's alive until the next look)
        proven = True
        if ident is root:
            # On loops written in C one task's consecutive steps share this
            # frame, and polls can be far apart (a busy thread starves the
            # watchdog of the GIL). A heartbeat sent at the first sighting and
            # still unanswered proves the loop has not iterated since.
            # (Sent after the sample: a loop's wake-up can let go of the GIL.)
            if not state.beat_posted:
                _send_heartbeat(watch, state, now)
            proven = bool(state.beat_posted) or watch.loop is None or bool(held)
        if proven and age >= _state.config.threshold_ms / 1000.0:
            self._stalled(watch, step, innermost, now, age, bool(held))
        return True

    def _sample(
        self, watch: LoopWatch, step: Step, innermost: FrameType, now: float, cpu: float | None, held: bool = False
    ) -> None:
        # One sample of the stack the look saw: walked before anything lets
        # go of the GIL, or walked already by a late look (_held), and the
        # loop thread's wait for a CPU (an os.pread) read only after, and
        # only if its CPU clock stood still (_stacks.sample).
        step.next_sample = now + sampling.interval_ms / 1000.0
        walked = self._walked
        if _stacks.full(step):
            # Past the cap, a look that waited on a hold (`held`) still weighs
            # it, walked already (_held); any other walks nothing, and its time
            # goes unweighed as its sample goes uncounted (a look late only
            # because the machine kept the watchdog waiting stands for no hold).
            if held and walked is not None and walked[0] is innermost:
                _stacks.weigh_hold(step, walked[1], now)
            else:
                step.weighed_t = now
            return
        stack = walked[1] if walked is not None and walked[0] is innermost else _stacks.stack_of(innermost, step.root)
        _stacks.sample(step, stack, now, cpu, lambda: _queued(watch), lambda: _runnable(watch))

    def _stalled(self, watch: LoopWatch, step: Step, innermost: FrameType, now: float, age: float, held: bool) -> None:
        # A look saw `step` running for the threshold: a stall, and a hang while it runs past hang_after_ms.
        step.stalled = True
        hang_after = _state.config.hang_after_ms
        if hang_after is None:
            return
        paused = self._paused(now)
        if paused:
            step.paused_s += paused
        age -= step.paused_s  # (a stopped process is not a hung loop)
        if held:
            # The hold has ended (this look waited for it): no hang now,
            # one stall of its whole length when the step ends; a hang
            # only if the step runs on for hang_after_ms from here.
            step.hang_next = max(step.hang_next, age + hang_after / 1000.0)
        elif age >= (step.hang_next or hang_after / 1000.0):
            self._hang(watch, step, innermost, now, age, hang_after / 1000.0)

    def _paused(self, now: float) -> float:
        # How long the process was stopped (SIGSTOP then SIGCONT: Ctrl-Z and
        # fg, a container paused, a throttled cgroup) before this look, which
        # it made late: the watchdog's thread was blocked (neither running
        # nor waiting for a CPU, _sched) and did not wake meanwhile, as it
        # does every switch interval while it waits for the GIL. Once per look
        # (0 off Linux: not told, every late look's delay is the step's).
        if not self._pause_read:
            self._pause_read = True
            self._pause = _timing.stopped_for(now - self._due if self._due else 0.0, self._own_scheduling)
        return self._pause

    def _own_scheduling(self) -> tuple[float, int] | None:
        # Why this look came late (_sched), read once per look and only once
        # the loops' stacks it needs were walked: the read (os.pread) lets go
        # of the GIL, and a loop thread whose C call had just handed it over
        # took it back and finished its step, whose suspended frame then led
        # nowhere: a held step missed, one look in ten (asyncio, 3.12, a quiet
        # machine), when it was read first.
        if not self._kept_read:
            told = self._own
            self._kept = told.since() if told is not None else None
            self._kept_read = True
        return self._kept

    def _held(
        self,
        watch: LoopWatch,
        found: tuple[object, FrameType, FrameType] | None,
        entering: bool,
        now: float,
        cpu: float | None,
        busy: bool,
    ) -> float:
        # When the loop's thread began holding the GIL in the C call this
        # look waited on (0: none; _timing.held_from): in the step the look
        # sees, or, where it sees none or one at its entry (`entering`: it has
        # not run yet), before it: in the step before's last C call (a
        # `return json.dumps(...)` that ends a task), or a C function the loop
        # ran as a callback, on a loop written in C.
        seen, cpu_seen = _timing.last_seen(watch)
        asked = self._due
        tripped = _timing.tripped_at(watch, seen, now)
        if tripped:
            asked = min(asked, tripped)  # (the tripwire woke this thread then)
        if now - asked < _timing.HELD_LATE_SWITCHES * sys.getswitchinterval():
            return 0.0  # on time: no hold kept this look out (the usual case, no read)
        # A late look, the one that first sees a held step: the read below
        # lets go of the GIL, and so may a report of the step before
        # (_new_step). The loop's thread, handed it back at the first
        # instruction after its C call, runs on and finishes the step, and a
        # walk made then reads frames it has returned from under callers that
        # have moved on: the stall was placed at the line after the call
        # (json.dumps then print: the print's line, one run in three). The
        # step's sample is walked now, at the snapshot's moment (_sample).
        if found is not None and not entering:
            _ident, root, innermost = found
            self._walked = (innermost, _stacks.stack_of(innermost, root))
        kept = self._own_scheduling()
        proc = self._proc_ran
        others = None if proc is None or cpu is None or cpu_seen is None else proc - (cpu - cpu_seen)
        # `busy`: in a step at its last look (read before this look let go of
        # the GIL), the loop's thread may have run Python code up to the ask:
        # a thread preempted while that code held the GIL kept this look out as
        # a C call would (a 31-49 ms stall of 5 ms steps, with the timing tests
        # and two `yes` beside them).
        return _timing.held_from(asked, now, seen, cpu_seen, cpu, others, kept, busy_since_seen=busy)

    def _new_step(
        self,
        watch: LoopWatch,
        step: Step | None,
        came_back: bool,
        ident: object,
        root: FrameType,
        now: float,
        cpu: float | None,
        entering: bool = False,
        hold: float = 0.0,
    ) -> Step:
        # A step first seen at `now`, after the loop was idle (`step` None) or
        # in `step`; at its entry (`entering`: nothing of it has run yet), and
        # after the loop's thread held the GIL since `hold` (0: no such hold),
        # in it or, entering, in the step before.
        prev, cpu_prev = _timing.last_other(watch, step, came_back, now)
        woke = _woke_at(watch, ident, prev, now) if step is None else 0.0
        # (A look that saw no step may have fallen between two steps of a busy
        # loop, or after a step's tail, the loop waiting again: its thread's
        # clock cannot tell which, and the gap's CPU is this step's, as after
        # a waiting loop; see docs/concepts/watchdog.md, "Its limits".)
        after_other = step is not None and not entering
        if step is not None:
            # Seen in another step, the gap is shared (Step.after_other),
            # unless this one has not begun: then it is all the step
            # before's, up to this look if its thread held the GIL to it.
            # One that began with a hold ended before it.
            self._finish(
                watch, now, cpu, by_other=after_other, sure=entering and bool(hold), end_by=0.0 if entering else hold
            )
        if entering:
            prev, cpu_prev = now, cpu  # (nothing of it ran before this look)
        _tripwire.step_seen(watch)  # (one it did not trip on: not trusted again)
        state = state_of(watch)
        state.beat_posted = 0.0
        if not _stacks.in_tick(root):
            step = state.step = _timing.Step(ident, root, now, woke or prev, cpu, cpu_prev)
            step.woke = bool(woke)
            step.after_other = after_other
            return step
        # The probe's tick, holding the loop (_stacks.tick_held), timed from
        # the start it noted. Under merge_lock: the tick, as it ends, reports
        # itself unless it finds it is this step (_tick_ending).
        with merge_lock:
            tick = state.probe_started
            step = state.step = _timing.Step(ident, root, now, prev if tick is None else tick[0], cpu, cpu_prev)
            if tick is not None:
                step.cpu_prev = tick[1]
                step.began = tick[0]
        return step

    def _tick_seen(self, state: LoopState) -> None:
        # A look landed in the probe's tick, too young to be a step of the
        # loop's (_stacks.tick_held): looked at again once it would be one,
        # should it last that long. (One look, not the fast looks a step
        # brings: a tick is over in well under a millisecond.)
        started = state.probe_started
        if started is not None:
            due = started[0] + _stacks.tick_grace_s()
            self._tick_due = min(self._tick_due, due) if self._tick_due else due

    def _hang(self, watch: LoopWatch, step: Step, innermost: FrameType, now: float, age: float, after: float) -> None:
        # Still running past hang_after_ms: reported now, from this thread
        # (the loop can run nothing), and again after twice as long each
        # time, up to _HANG_REPEAT_MAX_S apart.
        step.hangs += 1
        step.hang_next = max(age, step.hang_next) + min(after * 2 ** (step.hangs - 1), _HANG_REPEAT_MAX_S)
        sink = _sink
        if sink is None:
            return
        if step.task is None:
            step.task = _attribution.StalledTask.of(watch.loop, step.root)
        step.hung_s = max(step.hung_s, now - step.start() - step.paused_s)
        try:
            sink.hang(watch, step, innermost, now)
        except Exception:
            logger.exception("aiocop: could not report a hung loop (ignored)")

    def _finish(
        self,
        watch: LoopWatch,
        now: float,
        cpu: float | None = None,
        *,
        by_other: bool = False,
        sure: bool = False,
        end_by: float = 0.0,
    ) -> None:
        # `now`: the look that found the step over, in another step if
        # `by_other`; `sure`: what the thread ran since the last look was this
        # step's (the loop stopped on its own thread, or a hold it waited on
        # ended in this step); `end_by`: the step after began by then (0: not known).
        state = state_of(watch)
        step = state.step
        state.step = None
        if step is None or step.merged:
            return
        if not step.stalled and (step.task is None or not step.cpu_bound()):
            # No look saw it past the threshold while it ran. A CPU-bound step
            # whose clock-timed length reaches the threshold is a stall all
            # the same (its ends are known to a millisecond: a 36 ms stall
            # leaves 6 ms to be seen in, less than the GIL can keep this
            # thread waiting); a wait is not, its ends being guesses.
            return
        end = step.end(now, cpu, by_other=by_other, sure=sure)
        if end_by > step.t_last:
            end = min(end, end_by)
        beat = state.beat_done
        if beat and step.t_last <= beat <= now:
            # The heartbeat, queued while the step ran, ran as soon as the
            # loop was back: the step ended by then. Where its thread's clock
            # ran through the whole gap (the step's pace is a guess on a busy
            # machine, as a hold's seen once is), the step ran up to it: its
            # middle was 10-22 ms early where sorted() freed its result after
            # the late look, the heartbeat 0.1 ms late (uvloop, 3.12, load 5-7).
            end = beat if step.ran_through(now, cpu) and not by_other else min(end, beat)
        start = step.start()
        # Decided on what is known of its length, timed by the best estimate:
        # where a neighbouring step shares a gap between two looks, the gap
        # counts for neither (Step.after_other).
        known = min(end, step.known_end(now, cpu, by_other=by_other, sure=sure)) - step.known_since()
        if known * 1000.0 < _state.config.threshold_ms:
            return
        stall = _timing.stall_of(step, start, end, watch)
        with merge_lock:
            if step.merged:
                return
            step.merged = True
        self._report(stall)

    def finish(self, watch: LoopWatch, stopped: float, cpu: float | None) -> None:
        """Finish the step `watch`'s loop was in, which ended by `stopped` (the loop stopped).

        Called by the loop's own thread as it stops: a stall in the loop's
        last step is reported then, before the loop's run returns, instead of
        at the watchdog's next look. Exactly once, whoever finishes it first.
        """
        self._finish(watch, stopped, cpu, sure=True)

    def _report(self, stall: Stall) -> None:
        # (Also on a loop's thread, from a tick of the probe: the lock's C
        # methods, which no wrapper of aiocop's passes through.)
        watch, sink = stall.watch, _sink
        _forksafe.acquire(merge_lock)
        try:
            state = state_of(watch)
            io_start, io_end = state.last_io
            if state.last_io_ident == hash(stall.ident) and io_start <= stall.end and io_end >= stall.middle():
                return  # its io event was delivered already (this look began before): one report per stall
            if sink is not None and sink.attach_to_io(watch, stall):
                return
        finally:
            _forksafe.release(merge_lock)
        if sink is not None:
            sink.stall(stall)


def _on_gc(phase: str, info: dict[str, int]) -> None:
    thread = watchdog._thread
    if thread is not None and threading.get_ident() == thread.ident:
        _timing.note_gc(phase)


# How much more CPU than its ticks told a guarded loop's thread may use in
# one look's time before it counts as activity after all. Its own work around
# a tick took up to 1.2 ms with the other core busy, and a look can span two
# ticks. Beyond it, a tripwire taken away without tripping (a profiler's
# `sys.setprofile` run as a loop callback, on 3.10-3.11) would leave a loop
# that runs the application's code looking armed: its CPU, once past this,
# sends the watchdog into its fast looks, which then see a step and disarm it.
_GUARDED_SLACK_S = 0.005


def _within_slack(state: LoopState, cpu: float | None, probe_now: float) -> bool:
    # (The ticks' own test, _timing.moved, with the slack added to what they told.)
    return not _timing.moved(state.idle_cpu, cpu, probe_now - state.probe_seen + _GUARDED_SLACK_S)


def _queued(watch: LoopWatch) -> tuple[float, int] | None:
    # How long the loop's thread has waited for a CPU (_sched.queued), for a
    # stall's sample to tell a starved spin from a wait.
    native = _waits.native_id(watch.thread_id)
    return None if native is None else _sched.queued(native)


def _runnable(watch: LoopWatch) -> bool | None:
    # Whether the loop's thread is runnable now (_sched.runnable), for a
    # stall's sample whose thread showed neither CPU nor queued time.
    native = _waits.native_id(watch.thread_id)
    return None if native is None else _sched.runnable(native)


def _gone_from_the_os(thread: threading.Thread | None) -> None:
    # A joined thread's OS thread can outlive the join by a moment, and
    # CPython 3.12+ counts the OS's threads when it warns at a fork: the
    # warning came once in ten runs of the fork test. Waited for, briefly.
    native = getattr(thread, "native_id", None)
    if native is None or not os.path.isdir("/proc/self/task"):
        return
    deadline = perf_counter() + 0.05
    while os.path.exists(f"/proc/self/task/{native}") and perf_counter() < deadline:
        _acquire(_pause, True, 0.001)


_pause = allocate_lock()
_pause.acquire()  # (held for good: acquiring it with a timeout is a short sleep)


def _read_waits(watches: dict[int, LoopWatch]) -> None:
    # While the looks come every few milliseconds, the wait of each idle loop
    # that cannot be armed is read as it settles (once per wait): a step
    # begun as its timer ends is then timed from that end when the next look
    # comes a little late (the watchdog's thread waiting for a CPU, on a busy
    # machine), within _waits.ON_TIME_S of the timer's end.
    for watch in watches.values():
        if state_of(watch).step is None and not _tripwire.can_arm(watch):
            _waits.plan(watch)


def _unarmed_look(watch: LoopWatch, now: float) -> float:
    # When to look next at an idle loop that cannot be armed (inf: at the
    # threshold-bound rate): as its timer can end (_waits), or now if its
    # thread ran since this look saw it idle (its CPU clock, read with the
    # look's snapshot, moved): woken for its timer just as the look planned
    # for that end came, or for I/O. Left to the threshold-bound sleep, a wait
    # begun then was seen half a threshold late, or never where that sleep is
    # long (issue 36).
    wakes = _waits.plan(watch)
    state = state_of(watch)
    wait = state.wait
    if wakes is not None and wait is not None and wait.latest is not None and now <= wait.latest + _waits.LATE_S:
        return wakes  # (wait and its latest end known: planned)
    cpu = watch.cpu_time()
    return now if cpu is not None and state.idle_cpu is not None and cpu != state.idle_cpu else float("inf")


def _others_cpu() -> float:
    # The CPU the process has used but the calling thread's (the watchdog's):
    # what tells a thread sharing the GIL with a loop's from one C call of the
    # loop's holding it (_timing.held_from's `others`). This thread's own
    # CPU is none of that: its looks, and its wake-ups every switch interval
    # while it waits for a GIL held for seconds. (Counted, they were up to 78
    # ms, by its schedstat, of 145 ms against a 492 ms hold on a busy
    # machine; the rest there was veloxloop's runtime threads', which still
    # count: see docs/concepts/watchdog.md, "Its limits".)
    return process_time() - thread_time()


def _woke_at(watch: LoopWatch, ident: object, idle_since: float, now: float) -> float:
    # When the loop, idle at `idle_since`, woke for the step `ident` first
    # seen at `now` (0: not known): noted by asyncio's iteration, by the
    # loop's tripwire, or, for a loop that cannot be armed, its timer's end.
    return (
        _timing.woke_at(ident, idle_since, now)
        or _timing.tripped_at(watch, idle_since, now)
        or _waits.woke_at(watch, idle_since, now)
    )


def _tick_ending(watch: LoopWatch, began: tuple[float, float], record: Callable[[float], None]) -> None:
    # The probe's tick that began at `began` ends (on the loop's thread, still
    # in it). One that held the loop for the threshold is a stall: the step
    # the looks made of it if they saw it old enough (_stacks.tick_held), or
    # else reported from here, whole (a tick does not trip the tripwire, so
    # on an idle loop a slow look landed in one 4 to 10 times in 10, by phase).
    try:
        ended = perf_counter()
        if (ended - began[0]) * 1000.0 < _state.config.threshold_ms:
            return
        cpu = thread_time()
        # The step as the looks name it (the tick's frame, or asyncio's
        # dispatch frame around it), read while the tick still holds: an io
        # event of the tick's own (a blocking call in `record`, the SDK's
        # lock) takes the stall, as it would theirs.
        found = _stacks.step_of(sys._getframe(1), watch, ended)
        _forksafe.acquire(merge_lock)  # (the C method: `with` would pass through aiocop's wrapper on a loop's thread)
        try:
            state = state_of(watch)
            step = state.step
            if step is not None and step.began == began[0]:
                # Known now, whether or not a look saw it past the threshold; and its end, exactly.
                step.stalled = True
                step.ended = ended
                return
            state.probe_started = None  # no look takes the tick for a step from here (_new_step)
        finally:
            _forksafe.release(merge_lock)
        # Named by its `record`, or by the probe's call of it (one written in C).
        code = getattr(getattr(record, "__func__", record), "__code__", None)
        if not isinstance(code, CodeType):
            code = _probe.DelayProbe._settle.__code__
        stall = _timing.held_tick(watch, began, ended, cpu, code, found[0] if found is not None else None)
        watchdog._report(stall)
    except Exception:
        logger.exception("aiocop: could not report a tick of the loop-delay probe that held the loop (ignored)")


def _send_heartbeat(watch: LoopWatch, state: LoopState, now: float) -> None:
    loop = watch.loop
    # Only a running loop: some loops (rloop 0.5) replace their wake-up pipe
    # on every run, and a wake-up sent between runs could reach a reused fd.
    if loop is None or not loop.is_running():
        return
    state.beat_posted = now

    def beat() -> None:
        state.beat_done = perf_counter()

    try:
        loop.call_soon_threadsafe(beat)
    except RuntimeError:  # closed meanwhile
        state.beat_posted = 0.0


watchdog = Watchdog()


def unarmed_interval() -> float:
    """The idle looks' interval (s) while a loop cannot be armed: half the threshold.

    A step that waits (not CPU-bound) is a stall only once a look has seen
    it run for the threshold (`timing.Step.known_since`): a wait of 1.5x the
    threshold must be first seen within half the threshold of its start. A
    CPU-bound step is timed by its thread's CPU clock from its start, and
    needs only to be seen while it runs.
    """
    return _state.config.threshold_ms / 2000.0


def _after_fork_in_child() -> None:
    watchdog._thread = None
    watchdog._leaving = False
    watchdog._control = _forksafe.lock()  # (reset by _forksafe too: this one is new and free)
    watchdog._waker = allocate_lock()
    watchdog._waker.acquire()
    watchdog._finder = _discovery.Finder()
    _tripwire.after_fork_in_child()
    _loops.reinit_after_fork()
    # Forked by a thread running a loop, which runs on in the child (or loops
    # that announce nothing may start).
    if watchdog._enabled and (_loops.watches or watchdog._unseen_loops_possible()):
        with watchdog._control:
            watchdog._spawn()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=watchdog._before_fork,
        after_in_parent=watchdog._after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )
_probe.tick_ending = _tick_ending
