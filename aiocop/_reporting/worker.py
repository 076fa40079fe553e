"""The delivery thread: events delivered off the loops' threads, from a bounded queue.

With `delivery="thread"`, and for what a stopped loop can no longer run
(stall reports after its last step, steps whose delivery callback never
ran), groups and calls are queued here and delivered by one daemon thread.
The queue is bounded (`MAX_PENDING`): a callback slower than events arrive
makes aiocop drop, count and log events, never grow without bound.
`drain` (at `stop()` and at exit) delivers what is queued within `DRAIN_S`,
then drops (counts, logs once) the rest: no callback starts after it returns.
Hang reports have a thread of their own (`hangs._Reporter`, which says why).

May import: aiocop._common, aiocop._interception.
"""

from __future__ import annotations

import logging
import threading
from queue import SimpleQueue
from typing import TYPE_CHECKING

from aiocop._common import forksafe as _forksafe
from aiocop._common.clock import monotonic, perf_counter
from aiocop._interception import hook as _hook

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from aiocop._interception.hook import StepGroup

logger = logging.getLogger("aiocop")


# How long a stopping loop waits for the delivery thread to report its last
# steps (delivery="thread"): every event reaches its callback before
# `asyncio.run()` returns, unless a callback is this slow.
STOP_WAIT_S = 2.0


# Steps queued for the delivery thread at most (its documented capacity). A
# callback slower than the events arrive (a network exporter) must not make
# memory grow without bound: past this, new steps are dropped, counted and
# logged, never silently.
MAX_PENDING = 10_000


_DROP_LOG_INTERVAL_S = 10.0


# stop() (and the exit) delivers what is queued for DRAIN_S; what is left
# then is dropped, counted and logged once, and no callback starts after
# stop() returns. The callback running at that moment is waited for up to
# _CALLBACK_WAIT_S more: stop() returns within DRAIN_S + _CALLBACK_WAIT_S
# (1.5 s), whatever the shape of the flood (one batch of 10 000 steps, or
# 10 000 batches of one).
DRAIN_S = 1.0


_CALLBACK_WAIT_S = 0.5


# A queue item: its sequence number (drain() drops every item up to one), and
# the groups to deliver, a stall report (a call), or an Event to set once
# everything queued before it has been handled.
_Item = tuple[int, "list[StepGroup] | threading.Event | Callable[[], None]"]


class Worker:
    """A daemon thread that delivers groups off the loop threads, from a bounded queue."""

    def __init__(
        self, deliver: Callable[[StepGroup], None], claim_all: Callable[[list[StepGroup]], list[StepGroup]]
    ) -> None:
        # What delivering a group and claiming stranded groups are (delivery's own functions: it sits above).
        self._deliver = deliver
        self._claim_all = claim_all
        self._queue: SimpleQueue[_Item] = SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = _forksafe.lock()
        # Notified by the worker each time a delivery ends (drain() waits for the running one).
        self._idle = threading.Condition(self._lock)
        self._seq = 0  # the last item's sequence number, under _lock (items are put under it: in order)
        self._queued = 0  # steps put, under _lock
        self._handled = 0  # steps delivered or dropped by the worker, under _lock
        # Set by drain() when out of time (under _lock): the worker drops every
        # item numbered up to it, step by step, without delivering it. The
        # worker reads it under _lock before each step: nothing queued before
        # stop() gave up starts after it.
        self._drop_through = 0
        self._running_since: float | None = None  # when the delivery running now began, under _lock
        self.dropped = 0  # steps dropped, since the process started
        self._dropped_logged = 0
        self._last_drop_log = 0.0

    def pending(self) -> int:
        return self._queued - self._handled

    def _put(self, payload: list[StepGroup] | threading.Event | Callable[[], None], steps: int) -> int:
        # Under _lock, as the count: the queue's order is the numbers' order.
        with self._lock:
            self._seq += 1
            self._queued += steps
            self._queue.put((self._seq, payload))
            return self._seq

    def submit(self, groups: list[StepGroup]) -> None:
        if self._thread is None:
            self._start()
        with self._lock:
            room = MAX_PENDING - (self._queued - self._handled)
            kept = groups if len(groups) <= room else groups[: max(room, 0)]
            self.dropped += len(groups) - len(kept)
        if kept:
            self._put(kept, len(kept))
        if len(kept) < len(groups):
            self._log_dropped(at_most_every=_DROP_LOG_INTERVAL_S)

    def submit_call(self, call: Callable[[], None]) -> None:
        if self._thread is None:
            self._start()
        with self._lock:
            full = self._queued - self._handled >= MAX_PENDING
            if full:
                self.dropped += 1
        if full:
            self._log_dropped(at_most_every=_DROP_LOG_INTERVAL_S)
        else:
            self._put(call, 1)

    def _log_dropped(self, at_most_every: float = 0.0) -> None:
        now = monotonic()
        new = self.dropped - self._dropped_logged
        if new <= 0 or now - self._last_drop_log < at_most_every:
            return
        self._dropped_logged, self._last_drop_log = self.dropped, now
        logger.warning(
            "aiocop: %d event(s) dropped (%d in all): the slow-task callbacks run slower than events arrive "
            "(delivery='thread' keeps at most %d waiting); make them faster, or sample fewer requests",
            new,
            self.dropped,
            MAX_PENDING,
        )

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="aiocop-delivery", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _SHUTDOWN:
                return
            self._take(*item)
            # Not held while the queue waits for the next item, which can be
            # long: a step or stall report holds its task, and so its loop,
            # closed or not (a closed veloxloop loop, kept alive, keeps its
            # runtime threads running).
            del item

    def _take(self, seq: int, payload: list[StepGroup] | threading.Event | Callable[[], None]) -> None:
        if isinstance(payload, threading.Event):
            payload.set()
            return
        # One step at a time, each let through the gate on its own: a
        # batch of thousands of steps stops at drain()'s word, not at its end.
        steps: Sequence[StepGroup | Callable[[], None]] = [payload] if callable(payload) else payload
        for index, step in enumerate(steps):
            with self._lock:
                if seq <= self._drop_through:
                    self._handled += len(steps) - index  # drain() counted them as dropped
                    break
                self._running_since = monotonic()
            try:
                self._handle(step)
            except BaseException:  # this thread must outlive anything a delivery raises
                _hook.internal_error("delivering off the loop")
            finally:
                with self._lock:
                    self._handled += 1
                    self._running_since = None
                    self._idle.notify_all()

    def _handle(self, step: StepGroup | Callable[[], None]) -> None:
        if callable(step):
            step()
            return
        if not step.t_end:
            step.t_end = perf_counter()
        # A copy: the loop thread may still be inside the original.
        step.context.copy().run(self._deliver, step)

    def wait(self, timeout: float) -> bool:
        """Wait until what is queued now has been handled; False if `timeout` passed first."""
        thread = self._thread
        if thread is None or not thread.is_alive() or thread is threading.current_thread():
            return False
        done = threading.Event()
        self._put(done, 0)
        return done.wait(timeout)

    def drain(self, timeout: float | None = None) -> None:
        """Deliver what is queued, within `timeout`; drop what is left, with one warning; no callback starts after.

        The callback running when time is up is waited for up to
        `_CALLBACK_WAIT_S`: returns within `timeout` plus that. What was
        never scheduled is delivered on this thread within the same time.
        """
        if timeout is None:
            timeout = DRAIN_S  # read now: a test may shorten it
        started = monotonic()
        deadline = started + timeout + _CALLBACK_WAIT_S
        left = 0
        running_for: float | None = None
        thread = self._thread
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            done = threading.Event()
            self._put(done, 0)
            if not done.wait(timeout):
                left, running_for = self._give_up(deadline)
        stranded = self._claim_all(list(_hook.unclaimed))
        for index, group in enumerate(stranded):
            if monotonic() >= deadline:
                with self._lock:
                    self.dropped += len(stranded) - index
                left += len(stranded) - index
                break
            if not group.t_end:
                group.t_end = perf_counter()
            group.context.copy().run(self._deliver, group)
        self._log_drained(left, timeout, running_for)

    def _give_up(self, deadline: float) -> tuple[int, float | None]:
        # Out of time: every step queued so far, not started, is dropped (the
        # worker skips them, quickly), and counted here and now; the delivery
        # running now is waited for until `deadline`. Returns how many were
        # dropped, and how long the delivery still running has run (None: none is).
        with self._lock:
            self._drop_through = self._seq
            running = self._running_since is not None
            left = self._queued - self._handled - (1 if running else 0)
            self.dropped += left
            self._dropped_logged += left  # logged by _log_drained, with its reason
            self._idle.wait_for(lambda: self._running_since is None, max(deadline - monotonic(), 0.0))
            since = self._running_since
        return left, None if since is None else monotonic() - since

    def _log_drained(self, left: int, limit: float, running_for: float | None) -> None:
        self._log_dropped()  # the queue's overflow, not logged yet: its own reason
        if left:
            logger.warning(
                "aiocop: stop() dropped %d event(s) not delivered: the slow-task callbacks (delivery='thread') "
                "had not delivered them after %.1f s, stop()'s limit; they are counted, and no callback starts "
                "after stop() returns (make the callbacks faster, or sample fewer requests)",
                left,
                limit,
            )
        if running_for is not None:
            logger.warning(
                "aiocop: a slow-task callback has been running for %.1f s; stop() returns without waiting "
                "for it (no other callback will start)",
                running_for,
            )

    def shutdown(self) -> None:
        """End the thread once what is queued has been handled (an attach session leaving its target)."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            self._queue.put(_SHUTDOWN)  # type: ignore[arg-type]
            thread.join(STOP_WAIT_S)

    def reinit_after_fork(self) -> None:
        self.__init__(self._deliver, self._claim_all)  # type: ignore[misc]


_SHUTDOWN = object()
